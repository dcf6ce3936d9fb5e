"""Hunk comparison and conflict markers: pure functions of diff and file text."""

from __future__ import annotations

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from scripts.errors import ToolError
from scripts.rebase.state import Json

COMPARISON_KEYS = ("moved_hunks", "context_changed", "regrouped", "edits_differ")


def header(source_start: int, source_length: int, target_start: int, target_length: int) -> str:
    return f"@@ -{source_start},{source_length} +{target_start},{target_length} @@"


def parse_hunks(text: str, what: str) -> dict[str, list[Json]]:
    """Per file, the hunks of a unified diff: header, ranges, edit lines, context lines, section."""
    try:
        patch = PatchSet(text)
    except UnidiffParseError as exc:
        raise ToolError(f"cannot parse the diff of {what} ({exc})") from None
    out: dict[str, list[Json]] = {}
    for pfile in patch:
        hunks = []
        for hunk in pfile:
            hunks.append(
                {
                    "header": header(hunk.source_start, hunk.source_length, hunk.target_start, hunk.target_length),
                    "source_start": hunk.source_start,
                    "source_length": hunk.source_length,
                    "target_start": hunk.target_start,
                    "target_length": hunk.target_length,
                    "changes": [str(line) for line in hunk if line.is_added or line.is_removed],
                    "context": [str(line) for line in hunk if line.is_context],
                    "section": (hunk.section_header or "").strip(),
                }
            )
        out[pfile.path] = hunks
    return out


def compare_hunks(old: dict[str, list[Json]], new: dict[str, list[Json]]) -> Json:
    """How the replayed diff differs from the original: moved hunks, changed context, changed edits."""
    moved: list[Json] = []
    context: list[Json] = []
    regrouped: list[Json] = []
    edits_differ: list[str] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path, []), new.get(path, [])
        if [h["changes"] for h in a] != [h["changes"] for h in b]:
            if sum((h["changes"] for h in a), []) != sum((h["changes"] for h in b), []):
                edits_differ.append(path)
            regrouped.append({"file": path, "old": [h["header"] for h in a], "new": [h["header"] for h in b]})
            continue
        for number, (ha, hb) in enumerate(zip(a, b, strict=True), 1):
            offset = hb["source_start"] - ha["source_start"]
            if offset:
                moved.append({"file": path, "hunk": number, "old": ha["header"], "new": hb["header"], "offset": offset})
            if ha["context"] != hb["context"]:
                context.append({"file": path, "hunk": number, "old": ha["header"], "new": hb["header"]})
    return {"moved_hunks": moved, "context_changed": context, "regrouped": regrouped, "edits_differ": edits_differ}


def markers(text: str) -> list[Json]:
    """Line numbers of the conflict-marker blocks (diff3 style) in a file's text."""
    out: list[Json] = []
    block: Json | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("<<<<<<< "):
            block = {"start": number}
        elif block is not None and line.startswith("||||||| "):
            block["base"] = number
        elif block is not None and line == "=======":
            block["separator"] = number
        elif block is not None and line.startswith(">>>>>>> "):
            block["end"] = number
            sep = block.get("separator", number)
            base = block.get("base")
            block["upstream_lines"] = (base or sep) - block["start"] - 1  # "ours" = the new upstream side
            block["base_lines"] = sep - base - 1 if base else None
            block["patch_lines"] = number - sep - 1
            if base is not None:
                block["kind"] = "both-inserted" if block["base_lines"] == 0 else "overlapping-edit"
            out.append(block)
            block = None
    return out


def keep_both(text: str) -> str:
    """Resolve every conflict block by keeping both sides (upstream's lines first), dropping the base."""
    out, mode = [], None
    for line in text.splitlines(keepends=True):
        bare = line.rstrip("\r\n")
        if bare.startswith("<<<<<<< "):
            mode = "upstream"
        elif mode and bare.startswith("||||||| "):
            mode = "base"
        elif mode and bare == "=======":
            mode = "patch"
        elif mode and bare.startswith(">>>>>>> "):
            mode = None
        elif mode != "base":
            out.append(line)
    return "".join(out)


def keep_both_where_inserted(text: str) -> tuple[str, int]:
    """Resolve only the blocks where both sides only inserted lines (empty base) by keeping both, upstream's
    first; every other block is left as it is. Returns the text and how many blocks were resolved."""
    out: list[str] = []
    block: list[str] | None = None
    base_lines = 0
    resolved = 0
    in_base = False
    for line in text.splitlines(keepends=True):
        bare = line.rstrip("\r\n")
        if block is None:
            if bare.startswith("<<<<<<< "):
                block, base_lines, in_base = [line], 0, False
            else:
                out.append(line)
            continue
        block.append(line)
        if bare.startswith("||||||| "):
            in_base = True
        elif bare == "=======":
            in_base = False
        elif in_base:
            base_lines += 1
        elif bare.startswith(">>>>>>> "):
            if base_lines == 0 and any(b.startswith("||||||| ") for b in block):
                out.append(keep_both("".join(block)))
                resolved += 1
            else:
                out.extend(block)
            block = None
    if block is not None:
        out.extend(block)
    return "".join(out), resolved


def only_insertions(conflict_files: list[Json]) -> bool:
    """Is every conflict block one where both sides only inserted lines?"""
    return bool(conflict_files) and all(
        f["markers"] and all(m.get("kind") == "both-inserted" for m in f["markers"]) for f in conflict_files
    )


def overlaps(a_start: int, a_len: int, b_start: int, b_len: int) -> bool:
    return a_start <= b_start + max(b_len, 1) - 1 and b_start <= a_start + max(a_len, 1) - 1


def move_probes(patch_hunks: list[Json], limit: int = 16) -> list[str]:
    """Lines to look for in the new base when a patched file vanished (where did its code go?)."""
    probes: list[str] = []
    for hunk in patch_hunks:  # the enclosing definition first: the best clue where the code went
        section = hunk.get("section", "")
        if len(section) >= 8 and section not in probes:
            probes.append(section)
    for hunk in patch_hunks:
        for line in hunk["context"] + [c for c in hunk["changes"] if c.startswith("-")]:
            text = line[1:].strip()
            if len(text) >= 16 and text not in probes and not text.startswith("#"):
                probes.append(text)
    return probes[:limit]
