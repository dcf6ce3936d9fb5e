"""The resumable state of a rebase (``build/rebase-state.json``) as typed dataclasses.

The JSON shape is the one the first rebase tool wrote (schema ``vxl-rebase-state/1``), so a
state file left by it is read as is; anything else (another schema, a missing or mistyped field,
an unknown one) is refused with one line (:mod:`scripts.typed_data`). Fields a patch gets while
it is replayed are absent from the JSON until they are set, exactly as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from scripts.errors import ToolError
from scripts.typed_data import KEY, ShapeError, build

STATE_SCHEMA = "vxl-rebase-state/1"
STAGE_REPLAY = "replay"
STAGE_CHECKS = "checks"

Json = dict[str, Any]


def write_json(path: Path, data: Json) -> None:
    """Write ``data`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class _Record:
    """A dataclass of the state file: saved field by field, read back with every field checked."""

    def to_json(self) -> Json:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str, path: str = "") -> Self:
        return build(cls, data, where, path)


@dataclass
class Base(_Record):
    """One upstream release: where the series comes from, or where it goes."""

    version: str
    commit: str
    sdist_sha256: str | None
    pristine: str  # its pristine commit in the work repository
    git_commit: str | None  # the full upstream commit, when known (git source)


@dataclass
class Restore(_Record):
    """What ``--abort`` puts back."""

    head: str
    branch: str | None
    version_py: str | None
    worktree_state: str | None


@dataclass
class PatchEntry(_Record):
    """One patch of the series and what its replay found (the report's per-patch entry)."""

    name: str
    subject: str
    sha256: str
    status: str  # pending, clean, merged, conflict, already-upstream, resolved
    commit_old: str
    files: list[str]
    effect_check: str | None
    drop_when: str | None
    upstream_status: str | None
    # set during the replay; absent from the JSON while None
    head_before: str | None = None
    after_skipping: list[str] | None = None
    shares_files_with_skipped: list[str] | None = None
    conflict: Json | None = None
    note: str | None = None
    head_at_stop: str | None = None
    commit_new: list[str] | None = None
    moved_hunks: list[Json] | None = None
    context_changed: list[Json] | None = None
    regrouped: list[Json] | None = None
    edits_differ: list[str] | None = None
    auto_resolved: str | None = None
    dry_run_resolution: str | None = None
    dry_run_skipped: bool | None = None
    already_upstream: Json | None = None
    resolved_by_user: bool | None = None
    compile: Json | None = None
    effect: Json | None = None

    def set_comparison(self, comparison: Json) -> None:
        """Store :func:`scripts.rebase.hunks.compare_hunks`' result."""
        self.moved_hunks = comparison["moved_hunks"]
        self.context_changed = comparison["context_changed"]
        self.regrouped = comparison["regrouped"]
        self.edits_differ = comparison["edits_differ"]

    def to_json(self) -> Json:
        out: Json = {}
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if value is not None or spec.default is dataclasses.MISSING:
                out[spec.name] = value
        return out


@dataclass
class RebaseState:
    """Everything a later ``--continue`` or ``--abort`` needs, saved after every step."""

    schema: str
    stage: str  # STAGE_REPLAY or STAGE_CHECKS
    dry_run: bool
    keep_both_inserts: bool
    source: str  # sdist or git
    pins_path: str
    git_mirror: str | None
    from_: Base = field(metadata={KEY: "from"})
    onto: Base
    restore: Restore
    patches: list[PatchEntry]
    current: int  # index of the patch being replayed (len(patches) once all are through)
    pins_update: Json | None = None
    cpu_runtime: Json | None = None
    overlay: list[Json] | None = None
    skipped: list[str] | None = None  # dry run: patches left out after a conflict
    extra_commits_compile: Json | None = None

    @property
    def entry(self) -> PatchEntry:
        return self.patches[self.current]

    def to_json(self) -> Json:
        out: Json = {}
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if value is None and spec.default is not dataclasses.MISSING:
                continue
            if isinstance(value, (Base, Restore)):
                value = value.to_json()
            elif spec.name == "patches":
                value = [p.to_json() for p in value]
            out[spec.metadata.get(KEY, spec.name)] = value
        return out

    @staticmethod
    def from_json(data: Any, where: str) -> RebaseState:
        if isinstance(data, dict) and data.get("schema") != STATE_SCHEMA:
            raise ToolError(
                f"{where}: unknown state schema {data.get('schema')!r} (this tool reads "
                f"{STATE_SCHEMA}); finish or abort that rebase with the tool that started it, "
                "or delete the file"
            )
        state = build(RebaseState, data, where)
        if state.stage not in (STAGE_REPLAY, STAGE_CHECKS):
            raise ShapeError(where, "stage", f"unknown stage {state.stage!r}")
        if not 0 <= state.current <= len(state.patches):
            raise ShapeError(where, "current", f"current patch {state.current} out of range")
        return state


def save_state(path: Path, state: RebaseState) -> None:
    write_json(path, state.to_json())


def load_state(path: Path) -> RebaseState:
    if not path.exists():
        raise ToolError("no rebase in progress (nothing to continue or abort)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):  # UnicodeDecodeError is a ValueError
        raise ToolError(f"{path}: unreadable rebase state") from None
    return RebaseState.from_json(data, str(path))


__all__ = ["Base", "PatchEntry", "RebaseState", "Restore", "STATE_SCHEMA", "load_state", "save_state"]
