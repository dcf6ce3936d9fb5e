"""Each patch-test file of the patched tree run alone, in an interpreter of its own.

``nox -s cpu_tests`` runs the patch tests (``build/worktree/tests/xpu_laguna``) in one pytest
process, so a file that passes only because another file ran before it (a process-wide decision
left behind, a monkeypatch another test installed) passes there too. A test that passes only after
another file ran is a defect: this command runs every file alone, ``--jobs`` at a time, each in a
fresh pytest process with one torch thread per process (``OMP_NUM_THREADS``, so that the files
side by side do not spin-wait for each other's threads), and names every file that fails alone
with the last lines of its output. ``nox -s cpu_tests_ci`` runs it.

CLI: ``python -m scripts.patch_tests [--python PY] [--tests DIR] [--jobs N]``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from scripts import procs
from scripts.cpu_slots import THREADS_ENV, slot_count
from scripts.errors import ToolError, exit_status
from scripts.layout import Layout
from scripts.log import detail, info, step

TIMEOUT_S = 1200.0
TAIL_LINES = 30


@dataclass(frozen=True)
class Alone:
    """One file's run on its own."""

    path: Path
    returncode: int
    seconds: float
    summary: str  # pytest's last line
    tail: str  # the last lines of its output

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def patch_test_files(folder: Path) -> list[Path]:
    """The test files of ``folder`` (``test_*.py``), sorted; one line if there are none."""
    files = sorted(folder.glob("test_*.py"))
    if not files:
        raise ToolError(f"{folder}: no test_*.py files (is the work tree applied? nox -s apply)")
    return files


def run_alone(python: str, path: Path, timeout_s: float = TIMEOUT_S) -> Alone:
    """``path`` alone in a fresh pytest process of ``python``, run from outside the tree (so that
    ``import vllm`` is the runtime's), without conftest files, with one torch thread."""
    env = {**os.environ, "PYTHONPATH": "", THREADS_ENV: "1"}
    argv = [python, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider", f"--timeout={int(timeout_s)}"]
    done = procs.run([*argv, str(path)], timeout_s=timeout_s + 60, env=env, cwd=path.parent.parent, capture=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    summary = lines[-1] if lines else f"no output (exit {done.returncode})"
    return Alone(path, done.returncode, done.seconds, summary, "\n".join(lines[-TAIL_LINES:]))


def run_all(python: str, files: Sequence[Path], jobs: int) -> list[Alone]:
    """Every file alone, ``jobs`` at a time; each result said as it comes."""
    results: list[Alone] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for result in pool.map(lambda p: run_alone(python, p), files):
            mark = "ok" if result.passed else f"FAILED alone (exit {result.returncode})"
            detail(f"{mark:<24} {result.seconds:6.1f}s  {result.path.name}: {result.summary}")
            results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.patch_tests",
        description="Run each patch-test file of the patched tree alone, in a fresh pytest process: "
        "a file that passes only after another file ran fails here.",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter whose vllm is the patched tree (the CPU runtime's; default: this one)",
    )
    parser.add_argument(
        "--tests",
        type=Path,
        default=None,
        help="folder of the patch tests (default: build/worktree/tests/xpu_laguna)",
    )
    parser.add_argument("--jobs", type=int, default=None, help="files at once (default: one per CPU slot)")
    args = parser.parse_args(argv)

    def run() -> None:
        if args.jobs is not None and args.jobs < 1:
            raise ToolError(f"--jobs {args.jobs}: expected at least 1")
        found = shutil.which(args.python)
        if found is None:
            raise ToolError(f"--python {args.python}: no such interpreter")
        python = os.path.abspath(found)  # the files run from their own folder
        folder = args.tests or Layout().patch_tests
        files = patch_test_files(folder)
        jobs = args.jobs or slot_count()
        with step(f"patch tests alone: {len(files)} file(s) in {folder}, {jobs} at once"):
            results = run_all(python, files, jobs)
        failed = [r for r in results if not r.passed]
        for result in failed:
            info(f"{result.path.name} fails alone; the last lines of its output:\n{result.tail}")
        if failed:
            names = ", ".join(r.path.name for r in failed)
            raise ToolError(f"{len(failed)} of {len(files)} patch-test file(s) fail when run alone: {names}")
        info(f"patch tests alone: all {len(files)} file(s) pass on their own")

    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
