"""Turn work-tree commits back into ``patches/`` and ``overlay/`` deterministically.

Every commit after the pristine one becomes a patch, except the overlay commit. A later commit
that touches only overlay files folds back into ``overlay/``; one that mixes overlay and
upstream files is refused (split it with git first). ``apply`` then ``export`` is a fixpoint.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from scripts.errors import ToolError
from scripts.git import git, resolve_commit, run_git
from scripts.log import detail, info
from scripts.series import load_series, read_series
from scripts.worktree import OVERLAY_SUBJECT, Layout, State, load_inputs, read_state, write_state

FORMAT_PATCH_FLAGS = (
    "--zero-commit",  # "From 0000..." header: the work tree's commit ids change on every apply
    "--full-index",  # full pre-image blob ids: apply's b4-style check finds the exact upstream file
    "--no-signature",  # no "-- \n2.x.y" trailer: the installed git version must not show in patches
    "--no-stat",  # no diffstat: it repeats the diff and churns on every edit
    "--keep-subject",  # no "[PATCH]" prefix: the subject is the commit subject, which apply matches
    "--no-numbered",  # no "[PATCH n/m]": inserting a patch must not rewrite all the others
    "--no-renames",  # delete + add instead of rename detection, whose result depends on git's heuristics
    "--diff-algorithm=myers",  # pinned: a user's diff.algorithm config must not change the hunks
    "--abbrev=40",  # full ids in index lines, independent of the repository's abbreviation length
)


def _series_header(series: Path) -> list[str]:
    """Leading comment lines of the series file (kept across exports)."""
    header = []
    if series.exists():
        for line in series.read_text(encoding="utf-8").splitlines():
            if line.startswith("#") or not line.strip():
                header.append(line)
            else:
                break
    return header


def _known_numbers(layout: Layout, state: State) -> dict[str, int]:
    """Numbers of the patches in patches/series, keyed by applied commit id and by subject."""
    known: dict[str, int] = {}
    try:
        patches = load_series(layout.patches)
    except ToolError:
        return known
    for patch, sha in zip(patches, state.patch_commits):
        number = int(patch.name[:4])
        known.setdefault(patch.subject, number)
        known.setdefault(sha, number)
    return known


@dataclass
class SeriesCommits:
    """The work tree's commits after the pristine one, classified."""

    patches: list[str]  # become patches/NNNN-*.patch
    overlay: list[str]  # the overlay commit and later commits touching only overlay files
    overlay_paths: set[str]


def series_commits(tree: Path, pristine: str, overlay_paths: Iterable[str] = (), head: str = "HEAD") -> SeriesCommits:
    """Classify the commits of ``pristine..head``: every commit is a patch except the overlay commit
    and later commits that touch only overlay files (``overlay_paths`` seeds those); empty commits are
    skipped; a commit mixing overlay and upstream files is refused."""
    out = SeriesCommits([], [], set(overlay_paths))
    for sha in git(tree, "rev-list", "--reverse", f"{pristine}..{head}").split():
        subject = git(tree, "log", "-1", "--format=%s", sha)
        files = set(
            git(tree, "diff-tree", "--no-commit-id", "--name-only", "--no-renames", "-r", "--root", sha).splitlines()
        )
        if not files:
            detail(f"skipping empty commit {sha[:12]} ({subject}): nothing to export")
            continue
        if subject == OVERLAY_SUBJECT:
            out.overlay_paths |= files
            out.overlay.append(sha)
            continue
        touched = files & out.overlay_paths
        if touched and touched != files:
            raise ToolError(f"commit {sha[:12]} ({subject}) mixes overlay files and upstream files; split it")
        (out.overlay if touched else out.patches).append(sha)
    return out


def _blob_id(data: bytes) -> str:
    """git's blob id of ``data`` (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def overlay_baseline(tree: Path, state: State, split: SeriesCommits) -> dict[str, str]:
    """Blob id per overlay path of what overlay/ held when the tree last matched the repository: the
    overlay files at ``state.head``, the HEAD the last apply (right after its overlay commit) or export
    recorded; where that commit is gone, the overlay commit of the tree."""
    head = resolve_commit(tree, "HEAD")
    reference = resolve_commit(tree, state.head) if state.head else None
    if reference is None and split.overlay:
        reference = split.overlay[0]
    if reference is None:
        return {}
    paths = (
        split.overlay_paths if reference == head else series_commits(tree, state.pristine, head=reference).overlay_paths
    )
    out = {}
    for entry in git(tree, "ls-tree", "-r", "-z", "--full-tree", reference).split("\0"):
        meta, _, path = entry.partition("\t")
        if path in paths:
            out[path] = meta.split()[2]
    return out


def refuse_overlay_edits(
    tree: Path, state: State, split: SeriesCommits, current: dict[str, bytes], new: dict[str, bytes]
) -> None:
    """Refuse, in one line, when an overlay/ file of the repository changed after the last apply (or
    export) and export would overwrite it with the tree's copy: that edit exists nowhere else."""
    baseline = overlay_baseline(tree, state, split)
    now = {rel: _blob_id(data) for rel, data in current.items()}
    will = {rel: _blob_id(data) for rel, data in new.items()}
    lost = [
        rel
        for rel in sorted(set(now) | set(baseline))
        if now.get(rel) != baseline.get(rel) and now.get(rel) != will.get(rel)
    ]
    if not lost:
        return
    named = [
        f"overlay/{rel}" + (" (deleted)" if rel not in now else " (new)" if rel not in baseline else "") for rel in lost
    ]
    names = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    it = "it" if len(lost) == 1 else "them"
    if resolve_commit(tree, "HEAD") == resolve_commit(tree, state.head):
        fix = f"run `nox -s apply` to carry {it} into the tree (or commit {it} there), then export"
    else:  # apply would refuse the unexported commits
        fix = (
            f"the tree has unexported commits: commit the same change in {tree} (or move {it} aside, "
            f"export, put {it} back and run `nox -s apply`), then export"
        )
    raise ToolError(
        f"{names} {'was' if len(lost) == 1 else 'were'} edited after the last apply and export would "
        f"overwrite {it} with the work tree's copy; {fix}"
    )


def export(layout: Layout | None = None, check: bool = False) -> bool:
    """Write patches/ and overlay/ from the work tree; returns True when anything changed.

    With ``check`` nothing is written and a difference is an error (CI's fixpoint check).
    """
    layout = layout or Layout()
    tree = layout.worktree
    state = read_state(tree)
    if state is None:
        raise ToolError(f"{tree} is not a work tree made by this tool; run nox -s apply first")
    dirty = [ln for ln in run_git(tree, "status", "--porcelain").stdout.splitlines() if ln.strip()]
    if dirty:
        raise ToolError(
            f"{tree} has {len(dirty)} uncommitted change(s) (first: {dirty[0].strip()}); commit them "
            "first (git commit --fixup <patch commit>, or a new commit for a new patch), then export"
        )
    split = series_commits(tree, state.pristine)
    patch_commits, overlay_paths = split.patches, split.overlay_paths
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "patches"
        out.mkdir()
        names = []
        known = _known_numbers(layout, state)
        number = 0
        for sha in patch_commits:
            # keep a patch's number (numbers may have gaps); a new patch follows the one before it
            previous = known.get(sha) or known.get(git(tree, "log", "-1", "--format=%s", sha))
            number = previous if previous and previous > number else number + 1
            name = git(tree, "format-patch", *FORMAT_PATCH_FLAGS, f"--start-number={number}", "-o", str(out), "-1", sha)
            names.append(Path(name).name)
        new_files = {n: (out / n).read_bytes() for n in names}
        new_overlay = {}
        for rel in sorted(overlay_paths):
            data = run_git(tree, "cat-file", "-e", f"HEAD:{rel}", check=False)
            if data.returncode == 0:
                new_overlay[rel] = (tree / rel).read_bytes()
    series_path = layout.patches / "series"
    header = _series_header(series_path)
    series_text = "\n".join([*header, *names]) + "\n"
    old_names = read_series(layout.patches) if series_path.exists() else []
    old_files = {n: (layout.patches / n).read_bytes() for n in old_names if (layout.patches / n).exists()}
    old_overlay = {}
    if layout.overlay.exists():
        for path in layout.overlay.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                old_overlay[path.relative_to(layout.overlay).as_posix()] = path.read_bytes()
    # before anything is written (and with --check): an overlay/ edit made after the last apply is not lost
    refuse_overlay_edits(tree, state, split, old_overlay, new_overlay)
    changes = []
    if series_path.exists() and series_path.read_text(encoding="utf-8") != series_text:
        changes.append("patches/series")
    changes += [f"patches/{n}" for n in sorted(set(new_files) | set(old_files)) if new_files.get(n) != old_files.get(n)]
    changes += [
        f"overlay/{p}" for p in sorted(set(new_overlay) | set(old_overlay)) if new_overlay.get(p) != old_overlay.get(p)
    ]
    if check:
        if changes:
            raise ToolError(
                f"export would change {len(changes)} file(s) (first: {changes[0]}): apply/export is not a fixpoint"
            )
        info(f"export is a fixpoint: {len(names)} patch(es), {len(new_overlay)} overlay file(s) unchanged")
        return False
    for name in sorted(set(old_files) - set(new_files)):
        (layout.patches / name).unlink()
    for name, data in new_files.items():
        (layout.patches / name).write_bytes(data)
    series_path.write_text(series_text, encoding="utf-8")
    for rel in sorted(set(old_overlay) - set(new_overlay)):
        (layout.overlay / rel).unlink()
    for rel, data in new_overlay.items():
        dest = layout.overlay / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        mode = int(git(tree, "ls-files", "-s", "--", rel).split()[0], 8) & 0o777
        os.chmod(dest, mode)
    for change in changes:
        detail(f"updated {change}")
    info(f"exported {len(names)} patch(es) and {len(new_overlay)} overlay file(s); {len(changes)} file(s) changed")
    # the tree now matches the repository again: record that so apply sees it as up to date
    state.input_hash = load_inputs(layout).input_hash
    state.head = git(tree, "rev-parse", "HEAD")
    write_state(tree, state)
    return bool(changes)


__all__ = ["export", "series_commits", "refuse_overlay_edits", "FORMAT_PATCH_FLAGS"]
