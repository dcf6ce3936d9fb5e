"""Each engine-side module of ``scripts/bench/`` run in a tiny configuration in the CPU runtime
(where the patched tree imports): it exits 0 and prints its table with a figure in every cell.
Nothing is timed: the figures are the benches' business (``verify_step_cost`` has its own test,
``tooling`` builds wheels and is checked in the tooling tests)."""

from __future__ import annotations

import re

import pytest

from tests.tool_run import run_module

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"


def _rows(stdout: str, first_cells: tuple[str, ...]) -> dict[str, list[float]]:
    """The numbers of each table row that starts with one of ``first_cells``."""
    out = {}
    for line in stdout.splitlines():
        name, *rest = re.split(r"\s{2,}", line.strip())  # the benches' columns are 2+ spaces apart
        if name in first_cells:
            out[name] = [float(x) for x in re.findall(_NUMBER, " ".join(rest))]
    return out


@pytest.mark.parametrize("guards", ["tiered", "all views"])
def test_metadata_microbench_measures_inline_against_prebuilt(guards: str) -> None:
    """The bench builds a Laguna target's configuration per mode, the series' options in its
    ``additional_config``, so the prebuilt metadata is active in its prebuilt mode only, with the
    guard mode asked for (else it ends in "the prebuilt_metadata option did not take effect" or
    the full-guard one; before, on a Llama, it ended so)."""
    extra = ("--full-guards",) if guards == "all views" else ()
    proc = run_module(
        "scripts.bench.metadata_microbench", "--steps", "20", "--rounds", "2", "--cols", "64", *extra, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"drift guards: {guards})" in proc.stdout, proc.stdout
    rows = _rows(proc.stdout, ("exact metadata [us]", "step metadata [us]"))
    assert set(rows) == {"exact metadata [us]", "step metadata [us]"}, proc.stdout
    for inline, prebuilt, ratio in rows.values():
        assert inline > 0 and prebuilt > 0 and ratio > 0
    off = _rows(proc.stdout, ("build [us]",))
    assert set(off) == {"build [us]"} and all(v > 0 for v in off["build [us]"]), proc.stdout


def test_graph_host_overhead_times_every_mode() -> None:
    proc = run_module("scripts.bench.graph_host_overhead", "--steps", "20", "--rounds", "2", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(proc.stdout, ("upstream", "upstream debug", "series", "series debug"))
    assert len(rows) == 4, proc.stdout
    assert rows["upstream"][-1] == 1.0  # the reference row: 1.00x
    assert all(len(cells) == 3 and min(cells) > 0 for cells in rows.values())


def test_tp_collectives_times_both_forms_and_counts_bytes() -> None:
    args = ("--hidden", "64", "--rows", "1,8", "--steps", "5", "--rounds", "2")
    proc = run_module("scripts.bench.tp_collectives", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    timed = _rows(proc.stdout, ("1x64", "8x64"))
    assert len(timed) == 2 and all(len(cells) == 10 and min(cells) > 0 for cells in timed.values()), proc.stdout
    assert "bytes per rank and reduction" in proc.stdout
