"""Strict application checks (no fuzz, no offset), done before a patch touches the tree.

Two checks per patched file, in the spirit of b4 and ungoogled-chromium's validator:
the ``index <old>..<new>`` pre-image blob must be the blob in the tree, and every hunk's
context and removed lines must match the tree at exactly the line the hunk states.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from scripts.errors import ToolError
from scripts.series import Patch, parse_diff, safe_relpath

_INDEX = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", re.MULTILINE)
_ZERO = re.compile(r"^0+$")


def check_patch(
    patch: Patch,
    blob_of: Callable[[str], str | None],
    read: Callable[[str], bytes | None],
    require_full_index: bool = True,
) -> None:
    """Raise ToolError naming the file and hunk that would not apply exactly."""
    diff = parse_diff(patch)
    if not len(diff):
        raise ToolError(f"{patch.name}: contains no file changes")
    for pfile in diff:
        source = pfile.source_file[2:] if pfile.source_file.startswith("a/") else pfile.source_file
        target = pfile.target_file[2:] if pfile.target_file.startswith("b/") else pfile.target_file
        for path in (source, target):
            if path != "/dev/null":
                safe_relpath(path, patch.name)
        path = pfile.path
        info = "".join(str(line) for line in pfile.patch_info)
        match = _INDEX.search(info)
        if pfile.is_binary_file:
            raise ToolError(f"{patch.name}: binary change to {path} is not allowed (put whole files in overlay/)")
        if match is None:
            if not len(pfile):  # mode-only change or pure rename: no content to check
                continue
            raise ToolError(f"{patch.name}: {path} has no 'index' line (export with --full-index)")
        old, _new = match.groups()
        if require_full_index and len(old) != 40:
            raise ToolError(f"{patch.name}: {path}: abbreviated index {old} (export with --full-index)")
        current = blob_of(path) if not pfile.is_added_file else blob_of(target)
        if pfile.is_added_file or _ZERO.match(old):
            if current is not None:
                raise ToolError(f"{patch.name}: creates {target}, which already exists in the tree")
            continue
        if current is None:
            raise ToolError(f"{patch.name}: {path} does not exist in the tree")
        if not current.startswith(old) and current != old:
            drift = f"patch expects blob {old[:12]}, tree has {current[:12]}"
        else:
            drift = ""
        data = read(source)
        lines = (data or b"").decode("utf-8", "replace").splitlines()
        for number, hunk in enumerate(pfile, 1):
            expected = [line.value.rstrip("\r\n") for line in hunk if line.is_context or line.is_removed]
            start = hunk.source_start - 1 if hunk.source_length else hunk.source_start
            actual = lines[start : start + len(expected)]
            if actual != expected:
                where = f"{patch.name}: {path} hunk #{number} (@@ -{hunk.source_start},{hunk.source_length})"
                raise ToolError(
                    f"{where} does not match the tree at that line"
                    f"{' (' + drift + ')' if drift else ''}; no fuzz or offset is allowed"
                )
        if drift:
            raise ToolError(f"{patch.name}: {path} drifted: {drift}")
