"""Static and applied checks of the series, before anything touches the work tree."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from scripts.errors import ToolError
from scripts.footprint import footprint
from scripts.log import detail, info, step
from scripts.series import REQUIRED_FIELDS, read_series
from scripts.wheel_contents import construction_problems, standin_problems
from scripts.worktree import Layout, build_tree, load_inputs

_NUMBER = re.compile(r"^(\d{4})-")


def lint_static(layout: Layout) -> list[str]:
    """Problems found without upstream sources; an empty list when clean."""
    problems: list[str] = []
    names = read_series(layout.patches)
    on_disk = sorted(p.name for p in layout.patches.glob("*.patch"))
    for name in on_disk:
        if name not in names:
            problems.append(f"patches/{name} is not listed in patches/series")
    numbers = []
    for name in names:
        match = _NUMBER.match(name)
        numbers.append(int(match.group(1)) if match else -1)
    if numbers != sorted(numbers) or len(set(numbers)) != len(numbers):
        problems.append("patches/series: patch numbers are not strictly increasing in series order")
    inputs = load_inputs(layout)  # parses pins, series, patch headers, overlay paths, overlay.toml
    for patch in inputs.patches:
        for key in REQUIRED_FIELDS + ("Effect-Check",):
            if not patch.fields.get(key):
                problems.append(f"{patch.name}: header field '{key}:' is missing or empty")
        if "\nindex " in patch.raw.decode("utf-8", "replace"):
            for line in patch.raw.decode("utf-8", "replace").splitlines():
                if line.startswith("index ") and len(line.split()[1].split("..")[0]) != 40:
                    problems.append(f"{patch.name}: abbreviated 'index' line (export with --full-index)")
                    break
        for path in patch.files:
            if path.startswith(tuple(f"{o.relpath}" for o in inputs.overlay)):
                problems.append(f"{patch.name}: edits {path}, which is an overlay file")
    for edits in footprint(inputs.patches).patches:
        for path in edits.new_files:
            problems.append(
                f"{edits.name}: creates {path} (a new file belongs in overlay/{path}; patches edit upstream files)"
            )
    problems += standin_problems(inputs)  # the wheel carries no test stand-ins
    problems += construction_problems(inputs)  # nor an environment write or generated source
    return problems


def lint(layout: Layout | None = None, offline: bool = False, static_only: bool = False) -> None:
    layout = layout or Layout()
    with step("lint: series, headers, paths, overlay manifest, no test stand-ins, env writes or exec in the wheel"):
        problems = lint_static(layout)
        for problem in problems:
            detail(problem)
        if problems:
            raise ToolError(f"lint found {len(problems)} problem(s); first: {problems[0]}")
    inputs = load_inputs(layout)
    edits = footprint(inputs.patches)
    info(edits.headline())
    for row in edits.rows():
        detail(row)
    if static_only:
        return
    with tempfile.TemporaryDirectory(prefix="vxl-lint-") as tmp:
        with step("lint: strict application on a scratch tree"):
            build_tree(inputs, Path(tmp) / "tree", source="sdist", offline=offline)
    info(f"lint: clean ({len(inputs.patches)} patch(es), {len(inputs.overlay)} overlay file(s))")


__all__ = ["lint", "lint_static"]
