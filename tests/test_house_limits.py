"""House limit: no Python file under scripts/, overlay/ or tests/ has more than 700 lines.

``OVER_LIMIT_PENDING`` names the files that are over the limit while their split is under way
on another branch; the test fails as soon as one of them is back under the limit (or gone), so
the list cannot go stale. (Import cycles: tests/test_import_cycles.py.)"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 700
CHECKED = ("scripts", "overlay", "tests")
OVER_LIMIT_PENDING: frozenset[str] = frozenset()


def line_counts(root: Path) -> dict[str, int]:
    """Lines of every .py file under the checked folders, by path relative to ``root``."""
    counts = {}
    for folder in CHECKED:
        for path in sorted((root / folder).rglob("*.py")):
            counts[path.relative_to(root).as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    return counts


def limit_problems(root: Path, pending: frozenset[str]) -> list[str]:
    """One line per file over the limit that is not pending, and per pending file that is not."""
    counts = line_counts(root)
    problems = [
        f"{path}: {lines} lines, more than {LIMIT}"
        for path, lines in sorted(counts.items())
        if lines > LIMIT and path not in pending
    ]
    for path in sorted(pending):
        if counts.get(path, 0) <= LIMIT:
            state = f"{counts[path]} lines" if path in counts else "no such file"
            problems.append(f"{path}: in OVER_LIMIT_PENDING but {state}: take it off the list")
    return problems


def _write(root: Path, relative: str, lines: int) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"x{i} = {i}\n" for i in range(lines)))


def test_no_python_file_is_over_the_limit() -> None:
    counts = line_counts(ROOT)
    assert "scripts/matrix/cli.py" in counts and "overlay/vllm/xpu_laguna/graphs/wrapper.py" in counts
    assert limit_problems(ROOT, OVER_LIMIT_PENDING) == []


def test_negative_control_a_file_one_line_over_is_reported(tmp_path: Path) -> None:
    _write(tmp_path, "scripts/pkg/big.py", LIMIT + 1)
    _write(tmp_path, "tests/at_the_limit.py", LIMIT)
    _write(tmp_path, "overlay/vllm/huge.py", 2 * LIMIT)
    _write(tmp_path, "build/worktree/vllm/unchecked.py", 2 * LIMIT)  # not a checked folder
    assert limit_problems(tmp_path, frozenset()) == [
        f"overlay/vllm/huge.py: {2 * LIMIT} lines, more than {LIMIT}",
        f"scripts/pkg/big.py: {LIMIT + 1} lines, more than {LIMIT}",
    ]


def test_negative_control_a_stale_pending_entry_is_reported(tmp_path: Path) -> None:
    _write(tmp_path, "overlay/vllm/still_big.py", LIMIT + 1)
    _write(tmp_path, "overlay/vllm/split_already.py", LIMIT)
    pending = frozenset({"overlay/vllm/still_big.py", "overlay/vllm/split_already.py", "overlay/vllm/gone.py"})
    assert limit_problems(tmp_path, pending) == [
        "overlay/vllm/gone.py: in OVER_LIMIT_PENDING but no such file: take it off the list",
        f"overlay/vllm/split_already.py: in OVER_LIMIT_PENDING but {LIMIT} lines: take it off the list",
    ]
