"""``scripts.bench.verify_step_cost`` at tiny sizes: its options (its one-line errors:
tests/test_tool_usage_errors.py), and the structure of its tables (every part, mode and shape
present; calls per step as the model has them; ratios, sums and differences that follow from the
printed times). Nothing is timed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from scripts.bench import verify_step_cost as vsc
from scripts.device import op_invariance_check as oc
from tests.tool_run import assert_help_names, run_module

OPTIONS = ("--shapes", "--rows", "--parts", "--rounds", "--steps", "--host-steps", "--collective-steps")
TINY = ("--shapes", "small", "--rounds", "2", "--steps", "2", "--host-steps", "2", "--collective-steps", "2")
CELL = re.compile(r"^(\d+\.\d+) \((\d+\.\d+)\)$")


def _run(*argv: str, python: str = sys.executable, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ""}
    return run_module("scripts.bench.verify_step_cost", *argv, python=python, timeout=timeout, env=env)


def tables(text: str) -> dict[str, list[list[str]]]:
    """Heading -> rows of the markdown table under it (header first, the --- line left out)."""
    found: dict[str, list[list[str]]] = {}
    heading = None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:]
            found[heading] = []
        elif line.startswith("|") and heading is not None and not line.startswith("| ---"):
            found[heading].append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return {k: v for k, v in found.items() if v}


def _fastest(cell: str) -> float:
    match = CELL.match(cell)
    assert match, f"not a 'fastest (median)' cell: {cell!r}"
    assert float(match[1]) <= float(match[2]) + 0.005, f"fastest above median: {cell!r}"
    return float(match[1])


def _close(ratio: str, num: float, den: float) -> bool:
    """A printed ratio against the printed times it comes from (2-decimal rounding of each)."""
    value, exact = float(ratio.rstrip("x")), num / den
    return abs(value - exact) <= 0.006 + exact * (0.006 / num + 0.006 / den)


def problems(text: str, parts: tuple[str, ...], rows: int = 8) -> list[str]:
    """What is missing or does not follow from the printed times."""
    found, out = tables(text), []
    s = oc.SHAPES["small"]
    expected_labels = {
        "linears": [f"{kind} {label} [{rows},{k}]x[{k},{n}]" for kind, label, k, n in oc.linear_shapes(s)],
        "q/k norm": [f"q full [{rows},{s.q_heads[0]},", f"q sliding [{rows},{s.q_heads[1]},", f"k [{rows},2,"],
        "collectives": [f"all-reduce [{rows},{s.hidden}] bf16, 2 gloo ranks"],
    }
    modes = {"linears": vsc.LINEAR_MODES, "q/k norm": vsc.NORM_MODES, "collectives": vsc.COLLECTIVE_MODES}
    calls = {"linears": 336, "q/k norm": 96, "collectives": 97}
    part_tables = {"forms": ("linears", "q/k norm"), "collectives": ("collectives",)}
    wanted = [p for part in parts for p in part_tables[part]]
    for part in wanted:
        heads = [h for h in found if h.startswith(f"{part}, ")]
        if sorted("the host part" in h for h in heads) != [False, True]:
            out.append(f"{part}: tables {heads}, not one at the main shapes and one for the host part")
        for head in heads:
            header, *body = found[head]
            names = modes[part]
            if header != ["shape", "calls/step", *(f"{m} us" for m in names), *(f"{m}/plain" for m in names[1:])]:
                out.append(f"{head}: header {header}")
                continue
            labels = [row[0] for row in body]
            for label in expected_labels[part]:
                if not any(lab.startswith(label) for lab in labels):
                    out.append(f"{head}: no row for {label}")
            if labels[-1] != vsc.STEP_ROW or int(body[-1][1]) != calls[part]:
                out.append(f"{head}: last row {body[-1][:2]}, not per verify step with {calls[part]} calls")
            if sum(int(row[1]) for row in body[:-1]) != int(body[-1][1]):
                out.append(f"{head}: calls do not add up")
            for row in body:  # the last row in ms, the others in us: a ratio is one unit over itself
                times = {m: _fastest(row[2 + i]) for i, m in enumerate(names)}
                for i, m in enumerate(names[1:]):
                    if not _close(row[2 + len(names) + i], times[m], times["plain"]):
                        out.append(f"{head} {row[0]}: {m}/plain {row[2 + len(names) + i]} vs the times")
            for i, m in enumerate(names):  # the fastest round's sum is at least the sum of the fastest calls
                least = sum(int(row[1]) * _fastest(row[2 + i]) for row in body[:-1])
                if _fastest(body[-1][2 + i]) * 1000 < least * (1 - 1e-3) - 0.5:
                    out.append(f"{head}: per-step {m} below the sum of its calls")
    summary = found.get("per verify step, the parts measured summed per round")
    if not summary:
        return [*out, "no per-step summary"]
    header, *body = summary
    n = len(vsc.SERIES)
    if len(body) != 2 or len(header) != 3 + 3 * n:
        return [*out, f"summary: {len(body)} rows, {len(header)} columns"]
    for i, (name, modes_of) in enumerate(vsc.SERIES):
        if header[3 + i] != f"series {name} ({', '.join(modes_of.values())}) ms":
            out.append(f"summary: column {header[3 + i]!r}")
    for row in body:
        if row[1] != ", ".join(wanted):
            out.append(f"summary {row[0]}: parts {row[1]}")
        plain, *series = (_fastest(row[i]) for i in range(2, 3 + n))
        ratios, differences = row[3 + n : 3 + 2 * n], row[3 + 2 * n :]
        if not all(_close(r, v, plain) for r, v in zip(ratios, series, strict=True)):
            out.append(f"summary {row[0]}: ratios {ratios}")
        if any(abs(float(d) - (v - plain)) > 0.0011 for d, v in zip(differences, series, strict=True)):
            out.append(f"summary {row[0]}: differences {differences}")
    if "expected on the device: an ESTIMATE" not in text or "0.181520 ms (device)" not in text:
        out.append("no device estimate with the lab's rank-sum figure")
    return out


def test_help_names_every_option() -> None:
    assert_help_names(_run("--help"), *OPTIONS, "--world", "--threads")


@pytest.fixture(scope="module")
def forms_only() -> str:
    pytest.importorskip("torch")
    proc = _run(*TINY, "--parts", "forms")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_forms_tables_have_every_mode_and_shape(forms_only: str) -> None:
    assert problems(forms_only, ("forms",)) == []
    assert "collectives" not in tables(forms_only)["per verify step, the parts measured summed per round"][1][1]


def test_negative_control_a_changed_ratio_or_a_missing_shape_is_reported(forms_only: str) -> None:
    lines = forms_only.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("| router gate"))
    cells = lines[row].split("|")
    cells[-2] = f" {float(cells[-2].strip().rstrip('x')) + 0.5:.2f}x "
    altered = "\n".join([*lines[:row], "|".join(cells), *lines[row + 1 :]])
    assert any("router gate" in p and "batch_invariant/plain" in p for p in problems(altered, ("forms",)))
    dropped = "\n".join([*lines[:row], *lines[row + 1 :]])
    assert any("no row for router gate" in p for p in problems(dropped, ("forms",)))
