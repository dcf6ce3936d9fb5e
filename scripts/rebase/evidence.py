"""What upstream did under a patch, read from the work repository (git, no writes to the tree)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from scripts.git import blob_at, git, run_git
from scripts.rebase.hunks import header, move_probes, overlaps, parse_hunks
from scripts.rebase.state import Json

UPSTREAM_DIFF_MAX_LINES = 400
UPSTREAM_HUNK_MAX_LINES = 150  # each upstream hunk under a patch hunk is kept whole up to this


def files_of(tree: Path, commit: str) -> list[str]:
    out = git(tree, "diff-tree", "--no-commit-id", "--name-only", "--no-renames", "-r", "--root", commit)
    return sorted(line for line in out.splitlines() if line)


def diff_hunks(tree: Path, parent: str, commit: str) -> dict[str, list[Json]]:
    text = run_git(tree, "diff", "--no-color", "--no-renames", "--full-index", "-U3", parent, commit).stdout
    return parse_hunks(text, commit[:12])


def upstream_change(
    tree: Path,
    old_base: str,
    new_base: str,
    path: str,
    patch_hunks: list[Json],
    mirror: Path | None,
    old_full: str | None,
    new_full: str | None,
) -> Json:
    """What upstream changed in ``path`` between the two bases (and, from git, which commits)."""
    old_blob, new_blob = blob_at(tree, old_base, path), blob_at(tree, new_base, path)
    out: Json = {
        "old_blob": old_blob,
        "new_blob": new_blob,
        "changed": old_blob != new_blob,
        "state": "unchanged"
        if old_blob == new_blob
        else "added"
        if old_blob is None
        else "removed"
        if new_blob is None
        else "modified",
    }
    if old_blob != new_blob:
        text = run_git(tree, "diff", "--no-color", "--no-renames", "-U3", old_base, new_base, "--", path).stdout
        lines = text.splitlines()
        out["diff"] = "\n".join(lines[:UPSTREAM_DIFF_MAX_LINES])
        out["diff_truncated"] = len(lines) > UPSTREAM_DIFF_MAX_LINES
        out["diff_lines"] = len(lines)
        out["upstream_hunks_under_patch_hunks"] = _hunks_under(text, patch_hunks)
    if new_blob is None and old_blob is not None:
        out["possibly_moved_to"] = moved_candidates(tree, new_base, patch_hunks)
    if mirror is not None and old_full and new_full and old_blob != new_blob:
        log = run_git(
            mirror, "log", "--no-color", "--format=%h %s", f"{old_full}..{new_full}", "--", path, check=False
        ).stdout.splitlines()
        out["upstream_commits"] = log[:50]
        out["upstream_commits_total"] = len(log)
    else:
        out["upstream_commits"] = None  # an sdist carries no history
    return out


def _hunks_under(upstream_diff: str, patch_hunks: list[Json]) -> list[Json]:
    try:
        upstream = list(PatchSet(upstream_diff))
    except UnidiffParseError:
        upstream = []
    under = []
    for ufile in upstream:
        for uh in ufile:
            for ph in patch_hunks:
                if overlaps(uh.source_start, uh.source_length, ph["source_start"], ph["source_length"]):
                    lines = str(uh).splitlines()
                    under.append(
                        {
                            "upstream": header(uh.source_start, uh.source_length, uh.target_start, uh.target_length),
                            "patch": ph["header"],
                            "upstream_hunk": "\n".join(lines[:UPSTREAM_HUNK_MAX_LINES]),
                            "upstream_hunk_truncated": len(lines) > UPSTREAM_HUNK_MAX_LINES,
                        }
                    )
    return under


def moved_candidates(tree: Path, new_base: str, patch_hunks: list[Json], limit: int = 3) -> list[Json]:
    """Files of the new base holding most of a removed file's patch context (where the code went)."""
    probes = move_probes(patch_hunks)
    if not probes:
        return []
    args = ["grep", "-F", "-o", "--no-color"] + [x for p in probes for x in ("-e", p)] + [new_base, "--", "*.py"]
    proc = run_git(tree, *args, check=False)
    found: dict[str, set[str]] = {}
    prefix = f"{new_base}:"
    for line in proc.stdout.splitlines():
        if not line.startswith(prefix):
            continue
        rest = line[len(prefix) :]
        for probe in probes:  # the path ends where a probe's text begins
            if rest.endswith(":" + probe):
                found.setdefault(rest[: -len(probe) - 1], set()).add(probe)
                break
    ranked = sorted(found.items(), key=lambda item: (-len(item[1]), item[0]))
    return [{"file": path, "matching_lines": len(hit), "probes": len(probes)} for path, hit in ranked[:limit]]


def reverse_applies(tree: Path, commit: str, base: str) -> bool:
    """Does the patch's own diff apply in reverse to ``base`` (i.e. is its result already there)?"""
    diff = run_git(tree, "diff", "--no-color", "--no-renames", "--full-index", "--binary", f"{commit}^", commit).stdout
    with tempfile.TemporaryDirectory(prefix="vxl-rev-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        run_git(tree, "read-tree", f"--index-output={index['GIT_INDEX_FILE']}", base, env=index)
        proc = run_git(tree, "apply", "--check", "--cached", "--reverse", "-", env=index, input=diff, check=False)
    return proc.returncode == 0
