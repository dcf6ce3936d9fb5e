"""``scripts.bench.verify_step_cost`` with every part, collectives included (2 gloo ranks), in the
CPU runtime where the patched tree imports (the tooling tests check its options and tables
without it: tests/test_bench_verify_step_cost.py). Nothing is timed."""

from __future__ import annotations

from scripts.bench import verify_step_cost as vsc
from tests.test_bench_verify_step_cost import TINY, _run, problems


def test_full_run_with_the_collectives() -> None:
    proc = _run(*TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert problems(proc.stdout, vsc.PARTS) == []
