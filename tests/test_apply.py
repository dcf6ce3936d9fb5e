"""``apply``: commit structure, idempotence, stale rebuilds, strict application (no fuzz, no
offset, no drift), series and patch validation, overlay rules, and never clobbering work."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import synthetic
from scripts.worktree import OVERLAY_SUBJECT, apply, read_state, state_path
from synthetic import ENVS, HUNK_HEADER, INDEX_LINE, Change, hunk_moved, moved_path, replace_first, tool_error


def _apply(project: synthetic.SyntheticProject, **kw):
    return apply(project.layout(), **kw)


def _no_staging(project: synthetic.SyntheticProject) -> None:
    assert not (project.build / "worktree.new").exists()
    assert not (project.build / "worktree.old").exists()


def _failed_first_apply(project: synthetic.SyntheticProject, **kw) -> str:
    message = tool_error(_apply, project, **kw)
    assert not project.tree.exists()
    _no_staging(project)
    return message


# --------------------------------------------------------------------------- structure


def test_commit_structure(vxl_project) -> None:
    project = vxl_project
    state = _apply(project)
    log = project.tree_git("log", "--reverse", "--format=%H%x00%an <%ae>%x00%aI%x00%s").splitlines()
    commits = [line.split("\0") for line in log]
    assert len(commits) == 1 + 2 + 1
    # 1. the pristine upstream, named by version and commit, with the source described
    pristine_msg = project.tree_git("log", "-1", "--format=%B", commits[0][0])
    assert pristine_msg.splitlines()[0] == "upstream vLLM 9.9.9 (abc1234) pristine"
    assert f"Source: sdist vllm-9.9.9.tar.gz sha256 {project.sha}" in pristine_msg
    assert state.pristine == commits[0][0]
    pristine_files = set(project.tree_git("ls-tree", "-r", "--name-only", state.pristine).splitlines())
    assert pristine_files == set(project.files) - {"vllm/_version.py"}
    # 2. one commit per patch, in series order, author/date/subject from the patch
    names = project.series_names()
    assert [c[3] for c in commits[1:3]] == ["envs: declare the toy XPU toggle", "init: import the overlay module"]
    for (sha, author, date, _subject), name in zip(commits[1:3], names):
        assert author == f"{synthetic.PATCH_AUTHOR_NAME} <{synthetic.PATCH_AUTHOR_EMAIL}>"
        assert date == "2001-02-03T04:05:06+00:00"
        body = project.tree_git("log", "-1", "--format=%B", sha)
        assert "Why: the synthetic series needs it." in body, name
    assert state.patch_commits == [c[0] for c in commits[1:3]]
    assert project.tree_git("diff-tree", "--no-commit-id", "--name-only", "-r", commits[1][0]) == ENVS
    # 3. the overlay commit is last and lays exactly the overlay files
    assert commits[3][3] == OVERLAY_SUBJECT
    assert set(project.tree_git("diff-tree", "--no-commit-id", "--name-only", "-r", commits[3][0]).splitlines()) == set(
        synthetic.OVERLAY_FILES
    )
    assert state.head == commits[3][0] == project.head()
    # the files
    assert synthetic.TOGGLE_LINE in (project.tree / ENVS).read_text()
    for rel, text in synthetic.OVERLAY_FILES.items():
        assert (project.tree / rel).read_text() == text
    # upstream's _version.py is present (the build needs it) but not part of any commit
    assert (project.tree / "vllm/_version.py").read_text() == synthetic.version_py()
    assert project.tree_git("status", "--porcelain", "--untracked-files=all") == ""
    _no_staging(project)


def test_tool_commits_are_reproducible(vxl_project) -> None:
    first = _apply(vxl_project)
    shutil.rmtree(vxl_project.tree)
    second = _apply(vxl_project)
    assert (first.pristine, first.patch_commits, first.head) == (second.pristine, second.patch_commits, second.head)


def test_apply_is_idempotent_and_fast(vxl_project, capfd) -> None:
    project = vxl_project
    state = _apply(project)
    inode = project.tree.stat().st_ino
    marker = project.tree / ".git" / "vxl-test-marker"
    marker.write_text("still here")
    capfd.readouterr()
    start = time.monotonic()
    again = _apply(project)
    took = time.monotonic() - start
    assert took < 2.0, f"no-op apply took {took:.2f}s"
    assert again.head == state.head == project.head()
    assert project.tree.stat().st_ino == inode and marker.exists()  # not rebuilt
    assert "up to date" in capfd.readouterr().err


def test_stale_tree_is_rebuilt_when_a_patch_changes(vxl_project) -> None:
    project = vxl_project
    old = _apply(project)
    changes = synthetic.default_changes(project.files)
    changes[0].edits[ENVS] = changes[0].edits[ENVS].replace('"VLLM_TOY_XPU", "0"', '"VLLM_TOY_XPU", "1"')
    project.set_patches(changes)
    new = _apply(project)
    assert new.head != old.head and new.input_hash != old.input_hash
    assert '"VLLM_TOY_XPU", "1"' in (project.tree / ENVS).read_text()
    assert new.pristine == old.pristine
    _no_staging(project)


@pytest.mark.parametrize("change", ["overlay-edit", "overlay-new-file", "patch-dropped", "pins"])
def test_stale_tree_is_rebuilt_when_inputs_change(change: str, vxl_project) -> None:
    project = vxl_project
    old = _apply(project)
    if change == "overlay-edit":
        project.write_overlay({"vllm/toy_overlay.py": "VALUE = 43\n"})
    elif change == "overlay-new-file":
        project.write_overlay({"vllm/toy_more.py": "X = 1\n"})
    elif change == "patch-dropped":
        project.write_series(project.series_names()[:1])
        project.patch_file(2).unlink()
    else:
        (project.root / "pins.toml").write_text(
            (project.root / "pins.toml").read_text().replace('torch = "2.11.0"', 'torch = "2.11.1"')
        )
    new = _apply(project)
    assert new.input_hash != old.input_hash
    if change == "overlay-edit":
        assert (project.tree / "vllm/toy_overlay.py").read_text() == "VALUE = 43\n"
    elif change == "overlay-new-file":
        assert (project.tree / "vllm/toy_more.py").read_text() == "X = 1\n"
    elif change == "patch-dropped":
        assert len(new.patch_commits) == 1
        assert "toy_overlay" not in (project.tree / "vllm/__init__.py").read_text()


# --------------------------------------------------------------------------- strict application


def _third_patch_on(project: synthetic.SyntheticProject, base: dict[str, str], edit) -> Path:
    """Patch 0003 made on ``base`` (normally the patched files) changing envs.py by ``edit``."""
    return project.add_patch(Change("envs: a third change", {ENVS: edit(base[ENVS])}), base, 3)


def _replace_line(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def test_conflicting_patch_is_rejected(vxl_project) -> None:
    project = vxl_project
    base = project.patched_files()
    # made against a tree whose context line differs from ours
    base[ENVS] = _replace_line(base[ENVS], '"VLLM_TOY_20", "20"', '"VLLM_TOY_20", "twenty"')
    _third_patch_on(project, base, lambda t: _replace_line(t, '"VLLM_TOY_21", "21"', '"VLLM_TOY_21", "x"'))
    message = _failed_first_apply(project)
    assert "0003-" in message and ENVS in message and "hunk #1" in message and "no fuzz or offset" in message


def test_offset_only_patch_is_rejected(vxl_project, tmp_path: Path) -> None:
    project = vxl_project
    patch = _third_patch_on(
        project, project.patched_files(), lambda t: _replace_line(t, '"VLLM_TOY_21", "21"', '"VLLM_TOY_21", "x"')
    )
    patch.write_text(replace_first(patch.read_text(), HUNK_HEADER, hunk_moved(start=2)))
    # plain git would apply it (with an offset): it is a pure offset, context and blob are right
    check = tmp_path / "check"
    synthetic.patch_repo(check, project.patched_files())
    proc = subprocess.run(["git", "apply", "--check", "-v", str(patch)], cwd=check, capture_output=True, text=True)
    assert proc.returncode == 0 and "offset" in proc.stderr, proc.stderr
    message = _failed_first_apply(project)
    assert "0003-" in message and "hunk #1" in message and "no fuzz or offset" in message


def test_drifted_pre_image_blob_is_rejected(vxl_project) -> None:
    project = vxl_project
    original = dict(project.files)
    # upstream moved on far from the hunks: every hunk still matches at its line, the blob differs
    project.set_upstream(dict(original, **{ENVS: synthetic.envs_py(tail="# upstream added this later")}))
    project.set_patches(synthetic.default_changes(original), base=original)
    message = _failed_first_apply(project)
    assert "0001-" in message and "drifted" in message
    assert synthetic.blob_id(original[ENVS])[:12] in message
    assert synthetic.blob_id(project.files[ENVS])[:12] in message


def test_patch_creating_an_existing_file_is_rejected(vxl_project) -> None:
    project = vxl_project
    base = project.patched_files()
    del base["vllm/utils.py"]
    project.add_patch(Change("add utils", {"vllm/utils.py": "def other():\n    return 2\n"}), base, 3)
    message = _failed_first_apply(project)
    assert "creates vllm/utils.py, which already exists" in message


def test_patch_editing_a_missing_file_is_rejected(vxl_project) -> None:
    project = vxl_project
    base = dict(project.patched_files(), **{"vllm/gone.py": "A = 1\n"})
    project.add_patch(Change("edit gone", {"vllm/gone.py": "A = 2\n"}), base, 3)
    assert "vllm/gone.py does not exist in the tree" in _failed_first_apply(project)


def test_abbreviated_index_line_is_rejected(vxl_project) -> None:
    project = vxl_project
    project.edit_patch(1, lambda text: replace_first(text, INDEX_LINE, lambda m: f"index {m[1][:7]}..{m[2][:7]}"))
    assert "abbreviated index" in _failed_first_apply(project)


def test_binary_patch_is_rejected(vxl_project) -> None:
    project = vxl_project
    project.add_patch(Change("add a blob", {"vllm/blob.bin": "\x00\x01\x02binary\x00"}), project.patched_files(), 3)
    assert "binary change" in _failed_first_apply(project)


@pytest.mark.parametrize("bad", ["../envs.py", ".git/config", "vllm/./envs.py"])
def test_unsafe_path_in_a_patch_is_rejected(bad: str, vxl_project) -> None:
    project = vxl_project
    project.edit_patch(1, lambda text: moved_path(text, ENVS, bad))
    message = _failed_first_apply(project)
    assert "unsafe path" in message and bad.split("/")[0] in message


def test_absolute_path_in_a_patch_is_rejected(vxl_project) -> None:
    project = vxl_project
    project.edit_patch(1, lambda text: text.replace(f"a/{ENVS}", "/etc/passwd").replace(f"b/{ENVS}", "/etc/passwd"))
    assert "unsafe path '/etc/passwd'" in _failed_first_apply(project)


# --------------------------------------------------------------------------- series and patch files


@pytest.mark.parametrize(
    "entry,expect",
    [
        ("patch1.patch", "malformed entry"),
        ("0003_bad name.patch", "malformed entry"),
        ("0003-x.diff", "malformed entry"),
        ("../0003-x.patch", "malformed entry"),
        ("0003-missing.patch", "does not exist"),
    ],
)
def test_malformed_series_entry_is_rejected(entry: str, expect: str, vxl_project) -> None:
    project = vxl_project
    (project.patches / "series").write_text((project.patches / "series").read_text() + entry + "\n")
    message = _failed_first_apply(project)
    assert expect in message and entry.split()[0] in message


def test_duplicate_series_entry_is_rejected(vxl_project) -> None:
    project = vxl_project
    names = project.series_names()
    project.write_series(names + names[:1])
    message = _failed_first_apply(project)
    assert "listed twice" in message and names[0] in message


def test_missing_series_file_is_rejected(vxl_project) -> None:
    (vxl_project.patches / "series").unlink()
    assert "missing series file" in _failed_first_apply(vxl_project)


def test_series_comments_and_blank_lines_are_ignored(vxl_project) -> None:
    project = vxl_project
    names = project.series_names()
    (project.patches / "series").write_text(f"# header\n\n{names[0]}  # trailing comment\n\n# x\n{names[1]}\n")
    assert len(_apply(project).patch_commits) == 2


def test_plain_diff_is_not_a_format_patch(vxl_project) -> None:
    project = vxl_project
    patch = project.edit_patch(2, lambda text: text[text.index("diff --git ") :])
    message = _failed_first_apply(project)
    assert patch.name in message and "not a git format-patch file" in message


def test_format_patch_without_a_diff_is_rejected(vxl_project) -> None:
    project = vxl_project
    patch = project.edit_patch(2, lambda text: text[: text.index("diff --git ")])
    message = _failed_first_apply(project)
    assert patch.name in message and "no diff" in message


def test_patch_without_subject_is_rejected(vxl_project) -> None:
    project = vxl_project
    project.edit_patch(2, lambda text: replace_first(text, r"^Subject: .*$", lambda m: "Subject: "))
    assert "missing Subject" in _failed_first_apply(project)


def test_garbled_hunk_is_rejected(vxl_project) -> None:
    project = vxl_project
    patch = project.edit_patch(2, lambda text: replace_first(text, HUNK_HEADER, hunk_moved(length=5)))
    message = _failed_first_apply(project)
    assert patch.name in message


# --------------------------------------------------------------------------- overlay rules


def test_overlay_shadowing_upstream_without_declaration_is_rejected(vxl_project) -> None:
    project = vxl_project
    project.write_overlay({"vllm/utils.py": "def helper():\n    return 2\n"})
    message = _failed_first_apply(project)
    assert "overlay/vllm/utils.py shadows upstream file vllm/utils.py" in message
    assert synthetic.blob_id(project.files["vllm/utils.py"]) in message and "overlay.toml" in message


def test_declared_overlay_replacement_is_laid(vxl_project) -> None:
    project = vxl_project
    project.write_overlay({"vllm/utils.py": "def helper():\n    return 2\n"})
    blob = synthetic.blob_id(project.files["vllm/utils.py"])
    (project.root / "overlay.toml").write_text(f'[replaces]\n"vllm/utils.py" = "{blob}"\n')
    state = _apply(project)
    assert (project.tree / "vllm/utils.py").read_text() == "def helper():\n    return 2\n"
    assert "vllm/utils.py" in project.tree_git("show", "--name-only", "--format=", state.head).splitlines()


def test_overlay_declaration_drift_is_rejected(vxl_project) -> None:
    project = vxl_project
    project.write_overlay({"vllm/utils.py": "def helper():\n    return 2\n"})
    stale = synthetic.blob_id("def helper():\n    return 0\n")  # what upstream had before it moved
    (project.root / "overlay.toml").write_text(f'[replaces]\n"vllm/utils.py" = "{stale}"\n')
    message = _failed_first_apply(project)
    assert "upstream twin changed" in message and stale[:12] in message
    assert synthetic.blob_id(project.files["vllm/utils.py"])[:12] in message


def test_overlay_declaration_of_a_file_upstream_lacks_is_rejected(vxl_project) -> None:
    project = vxl_project
    blob = "1" * 40
    (project.root / "overlay.toml").write_text(f'[replaces]\n"vllm/toy_overlay.py" = "{blob}"\n')
    assert "upstream no longer has that file" in _failed_first_apply(project)


def test_overlay_declaration_without_overlay_file_is_rejected(vxl_project) -> None:
    project = vxl_project
    (project.root / "overlay.toml").write_text(f'[replaces]\n"vllm/envs.py" = "{"1" * 40}"\n')
    assert "not in overlay/" in _failed_first_apply(project)


@pytest.mark.parametrize(
    "text,expect",
    [
        ("[replaces\n", "not valid TOML"),
        ('[other]\n"a" = "b"\n', "overlay.toml: other: unknown field"),
        ('replaces = "vllm/utils.py"\n', "overlay.toml: replaces: expected an object, got string"),
        (
            '[replaces]\n"vllm/utils.py" = 40\n',
            "overlay.toml: replaces.vllm/utils.py: expected a string, got integer 40",
        ),
        ('[replaces]\n"vllm/utils.py" = "abc"\n', "40-hex git blob id"),
        (f'[replaces]\n"../utils.py" = "{"1" * 40}"\n', "unsafe path"),
    ],
)
def test_malformed_overlay_manifest_is_rejected(text: str, expect: str, vxl_project) -> None:
    (vxl_project.root / "overlay.toml").write_text(text)
    assert expect in _failed_first_apply(vxl_project)


def test_overlay_symlink_is_rejected(vxl_project) -> None:
    project = vxl_project
    (project.overlay / "vllm" / "link.py").symlink_to("/etc/passwd")
    assert "symbolic links are not allowed" in _failed_first_apply(project)


def test_overlay_file_created_by_a_patch_is_shadowing(vxl_project) -> None:
    """A file a patch adds counts as upstream for the overlay: shadowing it undeclared is an error."""
    project = vxl_project
    project.add_patch(Change("add a module", {"vllm/toy_overlay.py": "VALUE = 1\n"}), project.patched_files(), 3)
    assert "shadows upstream file vllm/toy_overlay.py" in _failed_first_apply(project)


# --------------------------------------------------------------------------- never clobber work


def _make_stale(project: synthetic.SyntheticProject) -> None:
    project.write_overlay({"vllm/toy_overlay.py": "VALUE = 43\n"})


@pytest.mark.parametrize("stale", [True, False], ids=["stale", "up-to-date"])
def test_uncommitted_edit_is_not_clobbered(stale: bool, vxl_project) -> None:
    project = vxl_project
    state = _apply(project)
    (project.tree / ENVS).write_text("# my work in progress\n")
    if stale:
        _make_stale(project)
    message = tool_error(_apply, project)
    assert "uncommitted change" in message and ENVS in message and "--force" in message
    assert (project.tree / ENVS).read_text() == "# my work in progress\n"
    assert project.head() == state.head
    _no_staging(project)


def test_untracked_file_is_not_clobbered(vxl_project) -> None:
    project = vxl_project
    _apply(project)
    (project.tree / "vllm" / "new_idea.py").write_text("IDEA = 1\n")
    _make_stale(project)
    message = tool_error(_apply, project)
    assert "uncommitted change" in message and "vllm/new_idea.py" in message
    assert (project.tree / "vllm" / "new_idea.py").read_text() == "IDEA = 1\n"


def test_unexported_commit_is_not_clobbered(vxl_project) -> None:
    project = vxl_project
    state = _apply(project)
    (project.tree / "vllm" / "utils.py").write_text("def helper():\n    return 3\n")
    project.tree_git("commit", "-q", "-am", "my unexported work")
    mine = project.head()
    _make_stale(project)
    message = tool_error(_apply, project)
    assert "1 commit(s) not exported" in message and state.head[:12] in message
    assert project.head() == mine


def test_force_on_an_up_to_date_clean_tree_is_a_no_op(vxl_project) -> None:
    project = vxl_project
    state = _apply(project)
    inode = project.tree.stat().st_ino
    assert _apply(project, force=True).head == state.head
    assert project.tree.stat().st_ino == inode


def test_force_discards_local_work(vxl_project, capfd) -> None:
    project = vxl_project
    state = _apply(project)
    (project.tree / "vllm" / "utils.py").write_text("changed\n")
    project.tree_git("commit", "-q", "-am", "unexported")
    (project.tree / ENVS).write_text("dirty\n")
    (project.tree / "untracked.txt").write_text("x\n")
    again = _apply(project, force=True)
    assert again.head == state.head == project.head()
    assert synthetic.TOGGLE_LINE in (project.tree / ENVS).read_text()
    assert not (project.tree / "untracked.txt").exists()
    assert project.tree_git("status", "--porcelain", "--untracked-files=all") == ""
    assert "--force: discarding" in capfd.readouterr().err
    _no_staging(project)


def test_foreign_directory_is_not_clobbered(vxl_project) -> None:
    project = vxl_project
    project.tree.mkdir(parents=True)
    (project.tree / "precious.txt").write_text("mine\n")
    message = tool_error(_apply, project)
    assert "not made by this tool" in message
    assert (project.tree / "precious.txt").read_text() == "mine\n"
    _apply(project, force=True)
    assert not (project.tree / "precious.txt").exists()


def test_corrupt_state_file_is_named_and_force_rebuilds(vxl_project) -> None:
    project = vxl_project
    _apply(project)
    path = state_path(project.tree)
    path.write_text("{not json")
    message = tool_error(_apply, project)
    assert f"{path}: not JSON" in message and "pass --force to rebuild" in message
    state = json.loads(json.dumps(_apply(project, force=True).__dict__))
    state["head"] = 7
    path.write_text(json.dumps(state))
    assert f"{path}: head: expected a string, got integer 7" in tool_error(_apply, project)
    _apply(project, force=True)
    assert read_state(project.tree) is not None


@pytest.mark.parametrize("failure", ["conflicting-patch", "overlay-shadowing", "malformed-patch"])
def test_failed_apply_leaves_the_old_tree_untouched(failure: str, vxl_project) -> None:
    project = vxl_project
    state = _apply(project)
    before = synthetic.tree_snapshot(project.tree)
    state_text = state_path(project.tree).read_text()
    if failure == "conflicting-patch":
        base = project.patched_files()
        base[ENVS] = _replace_line(base[ENVS], '"VLLM_TOY_20", "20"', '"VLLM_TOY_20", "twenty"')
        _third_patch_on(project, base, lambda t: _replace_line(t, '"VLLM_TOY_21", "21"', '"VLLM_TOY_21", "x"'))
        # a good change earlier in the inputs, so the rebuild gets past the first patches
        project.write_overlay({"vllm/toy_overlay.py": "VALUE = 44\n"})
    elif failure == "overlay-shadowing":
        project.write_overlay({"vllm/utils.py": "shadow\n"})
    else:
        project.edit_patch(2, lambda text: text.replace("Subject: ", "Subject:\n", 1).replace("From ", "Frm ", 1))
    tool_error(_apply, project)
    assert project.head() == state.head
    assert synthetic.tree_snapshot(project.tree) == before
    assert state_path(project.tree).read_text() == state_text
    _no_staging(project)


def test_leftover_staging_dir_is_replaced(vxl_project) -> None:
    project = vxl_project
    (project.build / "worktree.new" / "junk").mkdir(parents=True)
    _apply(project)
    assert project.tree.is_dir()
    _no_staging(project)


def test_switching_source_rebuilds(vxl_project, tmp_path: Path) -> None:
    project = vxl_project
    sdist_state = _apply(project)
    sdist_tree = project.tree_git("rev-parse", f"{sdist_state.pristine}^{{tree}}")
    work = synthetic.patch_repo(tmp_path / "upstream-work", project.files)
    first = synthetic.git(work, "rev-parse", "HEAD")
    bare = tmp_path / "upstream.git"
    synthetic.git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    text = (project.root / "pins.toml").read_text()
    (project.root / "pins.toml").write_text(
        text.replace('commit = "abc1234"', f'commit = "{first[:9]}"').replace(
            "file:///nonexistent/vllm.git", f"file://{bare}"
        )
    )
    git_state = _apply(project, source="git")
    assert git_state.source == "git" and git_state.head != sdist_state.head
    # the same upstream content either way: only the pristine commit message differs
    assert project.tree_git("rev-parse", f"{git_state.pristine}^{{tree}}") == sdist_tree
    assert f"Source: git file://{bare} commit {first}" in project.tree_git(
        "log", "-1", "--format=%B", git_state.pristine
    )
    assert synthetic.TOGGLE_LINE in (project.tree / ENVS).read_text()
