"""The fixed rank order at TP 4 on CPU, and its negative control (docs/matrix-tp.md, "TP 4").

One matrix run (the real driver, real 4-process engines through vLLM's mp executor, the tiny
pair's ``tp4`` variant) with four legs: ``teacher-tp4`` and ``dflash-graph0-meta1-tp4`` (fixed
rank order on, XCCL ring stand-in on) must be bitwise equal at every logprob position;
``teacher-ring-tp4`` and ``dflash-ring-tp4-diagnostic`` (fixed order off, the stand-in's ring on
every all-reduce) must NOT be: the ring's order of an element depends on the message size at 4
ranks, so an M=8 verify row and the teacher's M=1 decode of the same token sum the ranks in
other orders. At TP 2 the same switch changes no bit (the TP 2 ring diagnostic is equal by
arithmetic), so this is the only run that shows the fixed order is needed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from matrix_runs import TP4_RUN_LEGS, run_matrix

from scripts.matrix.legs import STANDIN_OPTION, TP_REDUCE_OPTION

EXACT, RING = "dflash-graph0-meta1-tp4", "dflash-ring-tp4-diagnostic"

pytestmark = pytest.mark.ci  # CI only (nox -s cpu_tests_ci): tests/e2e/conftest.py CI_ONLY


@pytest.fixture(scope="module")
def tp4_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The four TP 4 legs on 3 prompts (the matrix's minimum: long, long-then-next, plain) of 32, 8
    and 32 generated tokens (16 tokens show the same verdicts, but the bonus row of a verify step,
    used only when all 7 drafts are accepted, then produced output once)."""
    return run_matrix(
        tmp_path_factory.mktemp("tp4"), "--prompts", "3", "--max-tokens", "32", "--long-prompt-tokens", "0",
        "--max-model-len", "1024", "--kv-cache-bytes", str(64 << 20), "--seed", "0",
        "--legs", ",".join(TP4_RUN_LEGS),
    )  # fmt: skip


def _legs(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {leg["name"]: leg for leg in data["legs"]}


def _logprobs(data: dict[str, Any], leg: str) -> list[list[Any]]:
    """The leg's raw logprob rows per prompt (sampled token, its logprob, top-5; floats as hex)."""
    return [row["logprobs"] for row in data["outputs"][leg]["rows"]]


def test_tp4_legs_run_the_tp4_variant_in_four_ranks(tp4_run: tuple[Any, dict[str, Any]]) -> None:
    proc, data = tp4_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert Path(data["models"]["4"]["target"]).parent.name == "tp4"  # the default pair cannot split at TP 4
    target = json.loads((Path(data["models"]["4"]["target"]) / "config.json").read_text())
    assert target["num_attention_heads_per_layer"] == [8, 8, 8, 4] and target["num_key_value_heads"] == 2
    legs = _legs(data)
    assert [legs[n]["tp"] for n in ("teacher-tp4", "teacher-ring-tp4")] == [4, 4]
    for name in (EXACT, RING):
        leg = legs[name]
        assert leg["tp"] == 4 and leg["teacher_exact"] == "3/3", leg
        assert leg["options"][STANDIN_OPTION] is True
        assert leg["cpu_bind"] in ("0|0|0|0", "1|1|1|1")  # the 4 ranks on the leg's CPU slot (scripts/cpu_slots.py)
        ranks = leg["attention"]["ranks"]  # the series' attention ran in all four worker processes
        assert len(ranks) == 4 and all(r["exact_calls_by_width"].get("8", 0) > 0 for r in ranks)
        # tiny target 4 layers, drafter 1: 2L + 1 all-reduces per forward step
        assert (leg["collectives_per_step"]["target"], leg["collectives_per_step"]["drafter"]) == (9, 3)
        assert len(leg["accepted_per_depth"]) == 7 and leg["accepted_per_depth"][6] > 0, leg["accepted_per_depth"]
    assert (legs[EXACT]["options"][TP_REDUCE_OPTION], legs[RING]["options"][TP_REDUCE_OPTION]) == (True, False)
    assert (legs[EXACT]["teacher"], legs[RING]["teacher"]) == ("teacher-tp4", "teacher-ring-tp4")


def test_tp4_exact_leg_is_bitwise_equal_to_its_teacher(tp4_run: tuple[Any, dict[str, Any]]) -> None:
    _, data = tp4_run
    leg = _legs(data)[EXACT]
    lp = leg["logprobs"]
    assert leg["status"] == "passed", leg["mismatches"]
    assert lp["positions"] == 32 + 8 + 32 and lp["logprobs_bitwise_equal"] == lp["positions"], lp  # 3 prompts
    # and from the raw rows, not through the matrix's own comparison
    assert _logprobs(data, EXACT) == _logprobs(data, "teacher-tp4")


def test_tp4_ring_without_the_fixed_order_is_not_bitwise_equal(tp4_run: tuple[Any, dict[str, Any]]) -> None:
    """Negative control: the same leg with the fixed rank order off differs from its ring teacher
    (tokens still equal here; a diagnostic leg passes when it differs)."""
    _, data = tp4_run
    leg = _legs(data)[RING]
    lp = leg["logprobs"]
    assert leg["status"] == "passed", leg["mismatches"]
    assert lp["positions"] > 0 and lp["logprobs_bitwise_equal"] < lp["positions"], lp
    ring, teacher = _logprobs(data, RING), _logprobs(data, "teacher-ring-tp4")
    assert ring != teacher
    # the first position of every prompt comes from the prefill, the same message sizes in both legs
    assert [rows[0] for rows in ring] == [rows[0] for rows in teacher]
