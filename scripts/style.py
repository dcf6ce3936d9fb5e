"""``nox -s style``, overlay part: overlay/ is vLLM code, so it is checked with vLLM's own ruff
settings (the pristine tree's pyproject.toml) inside a copy of the pristine tree with the overlay
laid on it, where ``vllm`` resolves as first-party exactly as it does upstream.

The tooling itself (scripts/, tests/, noxfile.py) is checked by the nox session with ruff.toml.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from scripts.errors import ToolError, exit_status
from scripts.git import archive_to
from scripts.layout import Layout
from scripts.log import detail, info
from scripts.worktree import load_inputs, pristine_repo

RUFF_RUNS = (("check", "--no-cache", "--output-format", "concise"), ("format", "--no-cache", "--check"))


def _overlay_paths(output: str, files: list[str]) -> list[str]:
    """ruff's lines about the laid copy, named as the overlay/ files they are about."""
    lines = []
    for line in output.splitlines():
        for rel in files:
            if line.startswith(rel + ":") or line == f"Would reformat: {rel}":
                line = line.replace(rel, f"overlay/{rel}", 1)
                break
        if line.strip():
            lines.append(line)
    return lines


def check_overlay(layout: Layout | None = None, offline: bool = False) -> int:
    """Run ruff check and ruff format --check on the overlay's Python files; returns how many were checked."""
    layout = layout or Layout()
    inputs = load_inputs(layout)
    files = [item.relpath for item in inputs.overlay if item.relpath.endswith(".py")]
    if not files:
        return 0
    cached = pristine_repo(inputs.pins, "sdist", offline)
    with tempfile.TemporaryDirectory(prefix="vxl-style-") as tmp:
        root = Path(tmp)
        archive_to(cached, "pristine", root)
        pyproject = root / "pyproject.toml"
        ruff_settings = (
            tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get("ruff")
            if pyproject.is_file()
            else None
        )
        if not ruff_settings:
            raise ToolError(f"vLLM {inputs.pins.vllm.version}'s pyproject.toml has no [tool.ruff] settings")
        for item in inputs.overlay:
            dest = root / item.relpath
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item.source, dest)
        problems: list[str] = []
        for args in RUFF_RUNS:
            proc = subprocess.run(
                [sys.executable, "-m", "ruff", *args, "--", *files],
                cwd=root,
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                problems += [
                    ln
                    for ln in _overlay_paths(proc.stdout + proc.stderr, files)
                    if ln.startswith(("overlay/", "Would reformat"))
                ] or [proc.stderr.strip()]
    for problem in problems:
        detail(problem)
    if problems:
        raise ToolError(
            f"overlay/ is not ruff-clean with vLLM {inputs.pins.vllm.version}'s settings: "
            f"{len(problems)} finding(s), first: {problems[0]}"
        )
    info(f"overlay/: {len(files)} Python file(s) ruff-clean with vLLM {inputs.pins.vllm.version}'s settings")
    return len(files)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.style",
        description="ruff check and ruff format --check of overlay/ with vLLM's own settings, inside a "
        "copy of the pristine upstream tree (the pinned sdist, from the cache or pip's index).",
    )
    parser.add_argument("--offline", action="store_true", help="use only the download cache (default: off)")
    args = parser.parse_args(argv)
    return exit_status(lambda: check_overlay(offline=args.offline))


if __name__ == "__main__":
    sys.exit(main())
