"""The device checks' output: their header lines, one table in aligned columns, and (``--json``)
the same header and rows as a JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any


def print_table(header: list[str], cols: tuple[str, ...], cells: list[list[str]], pad_last: bool = True) -> None:
    """``header`` line by line, then ``cols`` and ``cells`` left-aligned (the last column unpadded
    to its title's width when ``pad_last`` is off)."""
    for line in header:
        print(line)
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    if not pad_last:
        widths[-1] = len(cols[-1])
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for cell in cells:
        print("  ".join(x.ljust(w) for x, w in zip(cell, widths)).rstrip())


def write_json(path: str | None, header: list[str], rows: list[Any]) -> None:
    """``{"header": [...], "rows": [row as a dict, ...]}`` into ``path`` (nothing when None)."""
    if path:
        Path(path).write_text(
            json.dumps({"header": header, "rows": [asdict(r) for r in rows]}, indent=1), encoding="utf-8"
        )
