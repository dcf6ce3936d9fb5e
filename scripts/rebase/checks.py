"""Checks on the replayed tree: overlay twins, a compile check of what the series touches, and each
patch's ``Effect-Check`` command, run in an exported copy of the tree with the overlay laid."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from scripts.errors import ToolError
from scripts.git import archive_to, blob_at, git
from scripts.layout import Layout
from scripts.overlay import OverlayFile, check_against_tree, list_overlay, read_replaces
from scripts.rebase.evidence import upstream_change
from scripts.rebase.state import Json, PatchEntry, RebaseState
from scripts.series import parse_fields

EFFECT_TIMEOUT_S = 120


def run_checks(state: RebaseState, tree: Path, layout: Layout) -> list[str]:
    """Overlay drift, compile check, effect checks; returns the failures (empty when all pass)."""
    overlay = list_overlay(layout.overlay)
    failures = overlay_twins(state, tree, overlay, read_replaces(layout.overlay_manifest))
    with tempfile.TemporaryDirectory(prefix="vxl-rebase-check-") as tmp:
        check_tree = Path(tmp) / "tree"
        check_tree.mkdir(parents=True)
        archive_to(tree, "HEAD", check_tree)
        for item in overlay:
            target = check_tree / item.relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item.source, target)
        failures += compile_check(state, tree, check_tree)
        failures += effect_checks(state, check_tree, tree)
    return failures


def overlay_twins(state: RebaseState, tree: Path, overlay: list[OverlayFile], replaces: dict[str, str]) -> list[str]:
    """Overlay files whose upstream twin appeared, changed or vanished between the two bases."""
    failures: list[str] = []
    old_base, new_base = state.from_.pristine, state.onto.pristine
    mirror = Path(state.git_mirror) if state.git_mirror else None
    results = []
    for item in overlay:
        old_blob = blob_at(tree, old_base, item.relpath)
        new_blob = blob_at(tree, new_base, item.relpath)
        status = "ok"
        if old_blob is None and new_blob is not None:
            status = "twin-appeared"
        elif old_blob is not None and new_blob is None:
            status = "twin-removed"
        elif old_blob != new_blob:
            status = "twin-changed"
        rel_replaces = {k: v for k, v in replaces.items() if k == item.relpath}
        try:
            check_against_tree([item], rel_replaces, lambda p: blob_at(tree, "HEAD", p))
            problem = None
        except ToolError as exc:
            problem = str(exc)
        entry: Json = {
            "file": item.relpath,
            "status": status,
            "old_blob": old_blob,
            "new_blob": new_blob,
            "problem": problem,
        }
        if status != "ok":
            entry["upstream"] = upstream_change(
                tree, old_base, new_base, item.relpath, [], mirror, state.from_.git_commit, state.onto.git_commit
            )
        if problem:
            failures.append(f"overlay/{item.relpath}: {status}")
        results.append(entry)
    state.overlay = results
    return failures


def _compile_errors(check_tree: Path, files: list[str]) -> list[str]:
    errors = []
    for rel in files:
        path = check_tree / rel
        if not path.is_file():
            continue
        try:
            compile(path.read_bytes(), rel, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", None)
            errors.append(f"{rel}:{line}: {exc.__class__.__name__}: {getattr(exc, 'msg', exc)}")
    return errors


def compile_check(state: RebaseState, tree: Path, check_tree: Path) -> list[str]:
    """Byte-compile every Python file the series touches (in memory: nothing is written)."""
    failures = []
    touched = git(tree, "diff", "--name-only", "--no-renames", state.onto.pristine, "HEAD")
    covered = {f for entry in state.patches for f in entry.files}
    extra = sorted(f for f in touched.splitlines() if f.endswith(".py") and f not in covered)
    for entry in state.patches:
        files = [f for f in entry.files if f.endswith(".py")]
        errors = _compile_errors(check_tree, files)
        entry.compile = {"checked": files, "errors": errors, "ok": not errors}
        if errors:
            failures.append(f"{entry.name}: does not compile ({errors[0]})")
    if extra:  # files only commits made during the rebase touched
        errors = _compile_errors(check_tree, extra)
        state.extra_commits_compile = {"checked": extra, "errors": errors, "ok": not errors}
        if errors:
            failures.append(f"commits added during the rebase do not compile ({errors[0]})")
    return failures


def _effect_note(entry: PatchEntry, ok: bool) -> str | None:
    if entry.status == "already-upstream":
        return (
            "retired patch: upstream has the effect"
            if ok
            else "WARNING: retired patch, but its check fails on the new tree: "
            "the effect may be absent upstream; review before retiring"
        )
    if entry.dry_run_skipped:
        return "the patch was skipped (conflict) in this dry run"
    if entry.dry_run_resolution:
        return "measured with the dry run's keep-both resolution of the conflict"
    return None


def current_effect_check(entry: PatchEntry, tree: Path) -> str | None:
    """The patch's Effect-Check as it stands now: from the message of its replayed commit (a resolution
    committed by hand may have rewritten the header, e.g. for a file upstream moved), else the old patch's."""
    for commit in reversed(entry.commit_new or []):
        fields = parse_fields(git(tree, "log", "-1", "--format=%b", commit))
        if "Effect-Check" in fields:
            return fields["Effect-Check"]
    return entry.effect_check


def effect_checks(state: RebaseState, check_tree: Path, tree: Path) -> list[str]:
    """Run each patch's Effect-Check command in the checked tree."""
    failures = []
    for entry in state.patches:
        entry.effect_check = current_effect_check(entry, tree)
        command = entry.effect_check
        if not command:
            entry.effect = {"command": None, "ok": None, "note": "no Effect-Check field"}
            continue
        started = time.monotonic()
        try:
            proc = subprocess.run(
                command,
                shell=True,
                cwd=check_tree,
                capture_output=True,
                text=True,
                timeout=EFFECT_TIMEOUT_S,
                check=False,
            )
            rc, out = proc.returncode, (proc.stdout + proc.stderr).strip()
        except subprocess.TimeoutExpired:
            rc, out = 124, f"timed out after {EFFECT_TIMEOUT_S}s"
        ok = rc == 0
        entry.effect = {
            "command": command,
            "ok": ok,
            "rc": rc,
            "output": out[-2000:],
            "seconds": round(time.monotonic() - started, 2),
        }
        note = _effect_note(entry, ok)
        if note:
            entry.effect["note"] = note
        if not ok and entry.status != "already-upstream" and not entry.dry_run_skipped:
            failures.append(f"{entry.name}: Effect-Check failed (exit {rc}): {command}")
    return failures
