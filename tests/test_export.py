"""``export``: work-tree commits back to patches/ and overlay/, deterministically; apply then
export is a fixpoint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import synthetic
from scripts.export import export
from scripts.lint import lint_static
from scripts.series import load_patch
from scripts.worktree import apply
from synthetic import ENVS, tool_error


def _inputs(project: synthetic.SyntheticProject) -> dict[str, bytes]:
    out = {}
    for folder in (project.patches, project.overlay):
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                out[path.relative_to(project.root).as_posix()] = path.read_bytes()
    return out


def _commit(
    project: synthetic.SyntheticProject,
    edits: dict[str, str],
    subject: str,
    body: str = "What and why.\n\n" + synthetic.HEADER,
) -> str:
    for rel, text in edits.items():
        path = project.tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    project.tree_git("add", "--", *edits)
    project.tree_git("commit", "-q", "-m", f"{subject}\n\n{body}")
    return project.head()


def _rebuild(project: synthetic.SyntheticProject):
    """A rebuild from scratch (apply --force leaves an up-to-date tree alone)."""
    shutil.rmtree(project.tree)
    return apply(project.layout())


def test_apply_then_export_is_a_fixpoint(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    before = _inputs(project)
    assert export(project.layout(), check=True) is False
    assert export(project.layout()) is False
    assert _inputs(project) == before


def test_export_ignores_the_users_git_configuration(vxl_project, tmp_path: Path, monkeypatch) -> None:
    project = vxl_project
    apply(project.layout())
    config = tmp_path / "gitconfig"
    config.write_text(
        "[diff]\n\tnoprefix = true\n\tmnemonicPrefix = true\n\talgorithm = histogram\n"
        "[format]\n\tsignature = someone\n\tnumbered = true\n[core]\n\tabbrev = 7\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    assert export(project.layout(), check=True) is False


def test_new_commit_becomes_the_next_patch(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    envs = (project.tree / ENVS).read_text().replace('"VLLM_TOY_22", "22"', '"VLLM_TOY_22", "220"')
    _commit(project, {ENVS: envs}, "envs: change a default")
    # --check refuses and writes nothing
    before = _inputs(project)
    message = tool_error(export, project.layout(), check=True)
    assert "would change" in message and "patches/" in message
    assert _inputs(project) == before
    assert export(project.layout()) is True
    names = project.series_names()
    assert len(names) == 3 and names[2] == "0003-envs-change-a-default.patch"
    patch = load_patch(project.patches / names[2])
    assert patch.subject == "envs: change a default"
    assert patch.author == f"{synthetic.PATCH_AUTHOR_NAME} <{synthetic.PATCH_AUTHOR_EMAIL}>"
    assert patch.fields["Why"] == "the synthetic series needs it."
    assert patch.raw.startswith(b"From 0000000000000000000000000000000000000000 ")  # --zero-commit
    assert (project.patches / "series").read_text().startswith("# synthetic series\n")  # header kept
    # the first two patches are byte-identical
    for name in names[:2]:
        assert (project.patches / name).read_bytes() == before[f"patches/{name}"]
    # the tree now matches the repository: apply is a no-op, export --check passes, lint is clean
    head = project.head()
    assert apply(project.layout()).head == head
    assert export(project.layout(), check=True) is False
    assert lint_static(project.layout()) == []
    # a rebuild from scratch gives the same tree content
    tree_id = project.tree_git("rev-parse", "HEAD^{tree}")
    rebuilt = _rebuild(project)
    assert len(rebuilt.patch_commits) == 3
    assert project.tree_git("rev-parse", "HEAD^{tree}") == tree_id


def test_overlay_only_commit_folds_back_into_overlay(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    patches_before = {k: v for k, v in _inputs(project).items() if k.startswith("patches/")}
    _commit(
        project,
        {"vllm/toy_overlay.py": "VALUE = 7\n", "tests/toy/test_toy.py": "def test_toy():\n    assert 7\n"},
        "tweak the overlay",
    )
    assert export(project.layout()) is True
    assert (project.overlay / "vllm/toy_overlay.py").read_text() == "VALUE = 7\n"
    assert (project.overlay / "tests/toy/test_toy.py").read_text() == "def test_toy():\n    assert 7\n"
    assert {k: v for k, v in _inputs(project).items() if k.startswith("patches/")} == patches_before
    assert export(project.layout(), check=True) is False
    tree_id = project.tree_git("rev-parse", "HEAD^{tree}")
    _rebuild(project)
    assert project.tree_git("rev-parse", "HEAD^{tree}") == tree_id


def test_overlay_file_mode_is_exported(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    path = project.tree / "tests/toy/test_toy.py"
    path.write_text("#!/usr/bin/env python3\n")
    path.chmod(0o755)
    project.tree_git("commit", "-q", "-am", "make it executable")
    export(project.layout())
    assert os.access(project.overlay / "tests/toy/test_toy.py", os.X_OK)


def test_mixed_commit_is_refused(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    before = _inputs(project)
    sha = _commit(
        project,
        {"vllm/toy_overlay.py": "VALUE = 8\n", "vllm/utils.py": "def helper():\n    return 8\n"},
        "mixed change",
    )
    message = tool_error(export, project.layout())
    assert sha[:12] in message and "mixes overlay files and upstream files" in message
    assert _inputs(project) == before


def test_export_refuses_a_dirty_tree(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    (project.tree / ENVS).write_text("uncommitted\n")
    assert "uncommitted change" in tool_error(export, project.layout())


def test_export_without_a_tree_is_an_error(vxl_project) -> None:
    assert "run nox -s apply first" in tool_error(export, vxl_project.layout())


def test_rewritten_patch_commit_updates_only_that_patch(vxl_project) -> None:
    project = vxl_project
    state = apply(project.layout())
    before = _inputs(project)
    envs = (project.tree / ENVS).read_text().replace('"VLLM_TOY_XPU", "0"', '"VLLM_TOY_XPU", "1"')
    (project.tree / ENVS).write_text(envs)
    project.tree_git("commit", "-q", "-a", "--fixup", state.patch_commits[0])
    env = dict(synthetic.git_env(), GIT_SEQUENCE_EDITOR="true")
    synthetic.git(project.tree, "rebase", "-q", "-i", "--autosquash", state.pristine, env=env)
    assert export(project.layout()) is True
    after = _inputs(project)
    names = project.series_names()
    assert names == [Path(n).name for n in sorted(before) if n.endswith(".patch")]
    assert after[f"patches/{names[0]}"] != before[f"patches/{names[0]}"]
    assert b'"VLLM_TOY_XPU", "1"' in after[f"patches/{names[0]}"]
    assert after[f"patches/{names[1]}"] == before[f"patches/{names[1]}"]
    assert export(project.layout(), check=True) is False


def test_dropped_patch_commit_removes_the_patch(vxl_project) -> None:
    project = vxl_project
    state = apply(project.layout())
    second = project.tree_git("log", "-1", "--format=%s", state.patch_commits[1])
    env = dict(synthetic.git_env(), GIT_SEQUENCE_EDITOR=f"sed -i '/ {second}$/d'")
    synthetic.git(project.tree, "rebase", "-q", "-i", state.pristine, env=env)
    assert export(project.layout()) is True
    assert project.series_names() == ["0001-envs-declare-the-toy-XPU-toggle.patch"]
    assert sorted(p.name for p in project.patches.glob("*.patch")) == ["0001-envs-declare-the-toy-XPU-toggle.patch"]


def test_export_is_deterministic(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    _commit(project, {"vllm/utils.py": "def helper():\n    return 5\n"}, "utils: return five")
    export(project.layout())
    first = _inputs(project)
    _rebuild(project)
    export(project.layout())
    assert _inputs(project) == first


@pytest.mark.parametrize("check", [True, False])
def test_export_after_a_rebuild_stays_a_fixpoint(check: bool, vxl_project) -> None:
    """A rebuild from scratch reproduces the same commits, and exports identically."""
    project = vxl_project
    first = apply(project.layout())
    assert _rebuild(project).head == first.head
    before = _inputs(project)
    assert export(project.layout(), check=check) is False
    assert _inputs(project) == before


def _renumber_second_patch(project: synthetic.SyntheticProject, number: int) -> str:
    """Give patch 2 a pre-assigned number with a gap (as helpers' patches have, e.g. 0006)."""
    names = project.series_names()
    second = project.patches / names[1]
    renamed = f"{number:04d}-{names[1].split('-', 1)[1]}"
    text = second.read_text()
    second.unlink()
    (project.patches / renamed).write_text(text)
    project.write_series([names[0], renamed])
    return renamed


def test_gapped_patch_numbers_are_a_fixpoint(vxl_project) -> None:
    """Pre-assigned numbers (0001, 0006, ...) survive apply then export unchanged."""
    project = vxl_project
    renamed = _renumber_second_patch(project, 6)
    apply(project.layout())
    before = _inputs(project)
    assert export(project.layout(), check=True) is False
    export(project.layout())
    assert project.series_names()[1] == renamed
    assert _inputs(project) == before


def test_new_patch_after_a_gap_is_numbered_after_the_last(vxl_project) -> None:
    project = vxl_project
    renamed = _renumber_second_patch(project, 6)
    apply(project.layout())
    _commit(project, {"vllm/utils.py": "def helper():\n    return 6\n"}, "utils: return six")
    export(project.layout())
    assert project.series_names() == [
        "0001-envs-declare-the-toy-XPU-toggle.patch",
        renamed,
        "0007-utils-return-six.patch",
    ]


def test_empty_commit_does_not_corrupt_patches(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    before = _inputs(project)
    project.tree_git("commit", "-q", "--allow-empty", "-m", "empty")
    try:
        export(project.layout())
    except Exception as exc:  # refusing is fine, as long as it is a one-line error and nothing was written
        from scripts.errors import ToolError

        assert isinstance(exc, ToolError)
        assert _inputs(project) == before
        return
    _rebuild(project)


def test_mode_change_commit_round_trips(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    (project.tree / "setup.py").chmod(0o755)
    project.tree_git("commit", "-q", "-am", "setup: executable\n\n" + synthetic.HEADER)
    export(project.layout())
    _rebuild(project)
    assert os.access(project.tree / "setup.py", os.X_OK)


def test_apply_advice_on_a_dirty_tree_is_a_step_that_works(vxl_project) -> None:
    """apply refuses a dirty tree and says: commit, then export. Following it works; the advice
    it gave before (export straight away) does not."""
    project = vxl_project
    apply(project.layout())
    (project.tree / ENVS).write_text((project.tree / ENVS).read_text() + "# kept work\n")
    advice = tool_error(apply, project.layout())
    assert "commit it in the work tree" in advice and "then nox -s export" in advice
    # negative control: exporting first (the old advice) is refused
    assert "commit them first" in tool_error(export, project.layout())
    _commit(project, {ENVS: (project.tree / ENVS).read_text()}, "Keep my work")
    export(project.layout())
    apply(project.layout())  # no longer refuses
    assert "# kept work" in (project.tree / ENVS).read_text()
    assert any("# kept work" in p.read_text() for p in project.patches.glob("*.patch"))
