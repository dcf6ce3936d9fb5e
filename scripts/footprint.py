"""The series' footprint on upstream: the upstream files its patches edit and how many of their
lines (added plus removed, as the patches' diffs count them). Files a patch creates are counted
apart: they are not edits of upstream code (the overlay is where new files belong). ``nox -s lint``
prints it and the rebase report carries it, so it can be watched release by release."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scripts.series import Patch, parse_diff


@dataclass(frozen=True)
class PatchFootprint:
    name: str
    files: tuple[str, ...]
    """Upstream files the patch edits (files it creates are in ``new_files``)."""
    added: int
    removed: int
    new_files: tuple[str, ...] = ()

    @property
    def edited(self) -> int:
        return self.added + self.removed


@dataclass(frozen=True)
class Footprint:
    patches: tuple[PatchFootprint, ...]

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(sorted({f for p in self.patches for f in p.files}))

    @property
    def edited(self) -> int:
        return sum(p.edited for p in self.patches)

    def headline(self) -> str:
        added, removed = sum(p.added for p in self.patches), sum(p.removed for p in self.patches)
        return (
            f"footprint: {len(self.patches)} patch(es) edit {len(self.files)} upstream file(s), "
            f"{self.edited} upstream line(s) (+{added}/-{removed})"
        )

    def rows(self) -> list[str]:
        """One line per patch: edited lines, files, and the files it creates."""
        width = max((len(p.name) for p in self.patches), default=0)
        out = []
        for p in self.patches:
            new = f", creates {', '.join(p.new_files)}" if p.new_files else ""
            out.append(f"{p.name:<{width}}  {p.edited:>4} line(s) in {', '.join(p.files) or 'no upstream file'}{new}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "patches": len(self.patches),
            "upstream_files": list(self.files),
            "edited_upstream_lines": self.edited,
            "per_patch": [
                {
                    "name": p.name,
                    "files": list(p.files),
                    "added": p.added,
                    "removed": p.removed,
                    "new_files": list(p.new_files),
                }
                for p in self.patches
            ],
        }


def footprint(patches: Iterable[Patch]) -> Footprint:
    rows = []
    for patch in patches:
        files, new, added, removed = [], [], 0, 0
        for changed in parse_diff(patch):
            if changed.is_added_file:
                new.append(changed.path)
                continue
            files.append(changed.path)
            added += changed.added
            removed += changed.removed
        rows.append(PatchFootprint(patch.name, tuple(sorted(set(files))), added, removed, tuple(sorted(new))))
    return Footprint(tuple(rows))


__all__ = ["Footprint", "PatchFootprint", "footprint"]
