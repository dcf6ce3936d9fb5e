"""``export`` never loses work in ``overlay/``: an overlay file edited (added, deleted) in the
repository after the last apply, which export would overwrite with the work tree's copy, is refused
in one line before anything is written; following the advice keeps the edit."""

from __future__ import annotations

import json

import pytest

import synthetic
from scripts import export as export_module
from scripts.export import export
from scripts.worktree import apply, state_path
from synthetic import tool_error

TOY = "vllm/toy_overlay.py"
EDIT = "VALUE = 'edited in overlay/ after apply'\n"


def _repository_files(project: synthetic.SyntheticProject) -> dict[str, bytes]:
    """patches/ and overlay/ byte for byte (plus the files' modes)."""
    out = {}
    for folder in (project.patches, project.overlay):
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                out[path.relative_to(project.root).as_posix()] = path.read_bytes() + oct(path.stat().st_mode).encode()
    return out


@pytest.mark.parametrize("check", [False, True])
def test_overlay_edit_after_apply_is_refused_and_kept(check: bool, vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    (project.overlay / TOY).write_text(EDIT)
    before = _repository_files(project)
    message = tool_error(export, project.layout(), check=check)
    assert message.startswith(f"overlay/{TOY} was edited after the last apply"), message
    assert "run `nox -s apply` to carry it into the tree" in message, message
    assert _repository_files(project) == before  # nothing written, the edit is still there
    # following the advice: apply carries the edit into the tree, then export keeps it (a fixpoint)
    apply(project.layout())
    assert (project.tree / TOY).read_text() == EDIT
    assert export(project.layout(), check=True) is False
    assert export(project.layout()) is False
    assert (project.overlay / TOY).read_text() == EDIT


def test_without_the_check_the_edit_is_lost(vxl_project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the same export with the check taken out overwrites the edit, so the test
    above fails where the check is missing."""
    project = vxl_project
    apply(project.layout())
    laid = (project.overlay / TOY).read_text()
    (project.overlay / TOY).write_text(EDIT)
    monkeypatch.setattr(export_module, "refuse_overlay_edits", lambda *args, **kwargs: None)
    assert export(project.layout()) is True
    assert (project.overlay / TOY).read_text() == laid != EDIT


def test_new_and_deleted_overlay_files_are_refused(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    (project.overlay / "vllm/toy_new.py").write_text("NEW = 1\n")
    (project.overlay / "tests/toy/test_toy.py").unlink()
    before = _repository_files(project)
    message = tool_error(export, project.layout())
    assert "overlay/tests/toy/test_toy.py (deleted), overlay/vllm/toy_new.py (new) were edited" in message, message
    assert _repository_files(project) == before


def test_fresh_apply_and_tree_side_overlay_commits_still_export(vxl_project) -> None:
    """No false alarm: right after apply, and after an export that folded a tree commit into overlay/
    (the baseline is then what that export wrote); a later repository edit is refused again."""
    project = vxl_project
    apply(project.layout())
    assert export(project.layout()) is False
    (project.tree / TOY).write_text("VALUE = 'from the tree'\n")
    project.tree_git("commit", "-q", "-am", "tweak the overlay in the tree")
    assert export(project.layout()) is True
    assert (project.overlay / TOY).read_text() == "VALUE = 'from the tree'\n"
    assert export(project.layout(), check=True) is False
    (project.overlay / TOY).write_text(EDIT)
    assert "was edited after the last apply" in tool_error(export, project.layout())


def test_same_edit_in_overlay_and_tree_is_not_refused(vxl_project) -> None:
    """An edit the export would write anyway loses nothing."""
    project = vxl_project
    apply(project.layout())
    (project.overlay / TOY).write_text(EDIT)
    (project.tree / TOY).write_text(EDIT)
    project.tree_git("commit", "-q", "-am", "the same edit in the tree")
    assert export(project.layout()) is False
    assert (project.overlay / TOY).read_text() == EDIT


def test_with_unexported_commits_the_advice_is_to_commit_in_the_tree(vxl_project) -> None:
    """apply would refuse the tree's unexported commit, so the advice is a commit in the tree; following it works."""
    project = vxl_project
    apply(project.layout())
    (project.tree / "vllm/utils.py").write_text("def helper():\n    return 9\n")
    project.tree_git("commit", "-q", "-am", "utils: return nine\n\n" + synthetic.HEADER)
    (project.overlay / TOY).write_text(EDIT)
    message = tool_error(export, project.layout())
    assert "the tree has unexported commits: commit the same change in" in message, message
    assert "not exported" in tool_error(apply, project.layout())  # apply refuses: not the way out here
    (project.tree / TOY).write_text(EDIT)
    project.tree_git("commit", "-q", "-am", "carry the overlay edit")
    assert export(project.layout()) is True
    assert (project.overlay / TOY).read_text() == EDIT
    assert any("return 9" in p.read_text() for p in project.patches.glob("*.patch"))


def test_the_overlay_commit_is_the_reference_when_the_recorded_head_is_gone(vxl_project) -> None:
    project = vxl_project
    apply(project.layout())
    path = state_path(project.tree)
    state = json.loads(path.read_text())
    path.write_text(json.dumps(dict(state, head="0" * 40)))
    (project.overlay / TOY).write_text(EDIT)
    assert f"overlay/{TOY} was edited" in tool_error(export, project.layout())
