"""Every leg `nox -s matrix` can run is started by at least one matrix run of the CPU e2e tests.

The README's `nox -s matrix` once failed on a default leg (the TP 2 graph leg) for a whole round
because CI ran only subsets of the matrix and none of them started that leg. The e2e runs name
their legs in ``tests/e2e/matrix_runs.CI_MATRIX_RUNS``; this tooling test (no vLLM needed) fails
as soon as a leg exists that none of them starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scripts.matrix.legs import ALL_LEGS, LEGS, TP4_LEGS
from tests.e2e.matrix_runs import CI_MATRIX_RUNS


def not_started(legs: Iterable[str], runs: Mapping[str, Iterable[str]]) -> list[str]:
    started = {name for names in runs.values() for name in names}
    return [name for name in legs if name not in started]


def test_every_matrix_leg_is_started_by_a_ci_run() -> None:
    assert not_started((leg.name for leg in ALL_LEGS), CI_MATRIX_RUNS) == []


def test_ci_runs_name_only_known_legs_with_their_teachers() -> None:
    known = {leg.name: leg for leg in ALL_LEGS}
    for run, names in CI_MATRIX_RUNS.items():
        assert set(names) <= set(known), run
        teachers = {known[n].teacher for n in names if known[n].speculative}
        assert teachers <= set(names), (run, teachers - set(names))


def test_the_gate_fails_when_a_run_is_dropped() -> None:
    """Negative control: without the fast run, the default legs only it starts are reported."""
    runs = {name: legs for name, legs in CI_MATRIX_RUNS.items() if name != "fast"}
    missing = not_started((leg.name for leg in LEGS), runs)
    assert "dflash-graph1-meta1-tp2" in missing and "dflash-noplan-diagnostic" in missing
    runs = {name: legs for name, legs in CI_MATRIX_RUNS.items() if name != "tp4"}
    assert not_started((leg.name for leg in TP4_LEGS), runs) == [leg.name for leg in TP4_LEGS]
