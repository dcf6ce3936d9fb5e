"""Whole new files laid over the patched tree (``overlay/``) and the manifest ``overlay.toml``.

An overlay file must not silently shadow an upstream file: one that replaces an upstream file
is declared in ``overlay.toml`` under ``[replaces]`` with the git blob id of the upstream file
it replaced, and a changed upstream blob is an error (the upstream twin moved).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from scripts.errors import ToolError
from scripts.series import safe_relpath
from scripts.typed_data import ShapeError, build, read_toml

_BLOB = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class OverlayFile:
    relpath: str  # path inside the upstream tree
    source: Path  # file in overlay/

    def read(self) -> bytes:
        return self.source.read_bytes()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.read()).hexdigest()


def list_overlay(overlay_dir: Path) -> list[OverlayFile]:
    if not overlay_dir.exists():
        return []
    out = []
    for path in sorted(overlay_dir.rglob("*")):
        if "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        if path.is_symlink():
            raise ToolError(f"overlay/{path.relative_to(overlay_dir)}: symbolic links are not allowed in the overlay")
        if path.is_file():
            rel = path.relative_to(overlay_dir).as_posix()
            out.append(OverlayFile(safe_relpath(rel, "overlay"), path))
    return out


@dataclass(frozen=True)
class OverlayManifest:
    """The layout of ``overlay.toml``."""

    replaces: dict[str, str] = field(default_factory=dict)
    """Upstream path -> git blob id of the upstream file the overlay file replaced."""


def read_replaces(manifest: Path) -> dict[str, str]:
    """``[replaces]`` of overlay.toml: upstream path -> blob id it replaced."""
    if not manifest.exists():
        return {}
    where = manifest.name
    replaces = build(OverlayManifest, read_toml(manifest, "overlay manifest"), where).replaces
    for path, blob in replaces.items():
        safe_relpath(path, where)
        if not _BLOB.match(blob):
            raise ShapeError(where, f"replaces.{path}", f"needs a 40-hex git blob id, got {blob!r}")
    return replaces


def check_against_tree(files: list[OverlayFile], replaces: dict[str, str], blob_of) -> None:
    """Each overlay file either is new upstream or is declared with the current upstream blob."""
    paths = {f.relpath for f in files}
    for path in sorted(set(replaces) - paths):
        raise ToolError(f"overlay.toml: [replaces] names {path}, which is not in overlay/")
    for item in files:
        upstream = blob_of(item.relpath)
        declared = replaces.get(item.relpath)
        if upstream is None and declared is not None:
            raise ToolError(
                f"overlay/{item.relpath}: declared as replacing upstream blob {declared[:12]}, "
                "but upstream no longer has that file"
            )
        if upstream is not None and declared is None:
            raise ToolError(
                f"overlay/{item.relpath} shadows upstream file {item.relpath} (blob {upstream}); "
                "declare it in overlay.toml [replaces] or move it"
            )
        if upstream is not None and declared != upstream:
            raise ToolError(
                f"overlay/{item.relpath}: upstream twin changed (declared blob {declared[:12]}, "
                f"upstream now {upstream[:12]}); review the upstream change, then update overlay.toml"
            )
