"""Fast subset of the equivalence matrix on CPU (the full one is `nox -s matrix`).

Runs the real driver end to end: teacher, DFlash M8 with prebuilt metadata off and on (fresh
engine each) and the diagnostic legs (exact verify off; no KV split plan), on 6 prompts plus one
long-context prompt (>= 4200 tokens, 16 generated tokens, prefilled in one chunk in every leg).
Every exact leg must equal the teacher token for token and its logprobs (sampled + top-5)
bitwise at every position of every prompt, the long-context one included; the diagnostic legs
must NOT be bitwise equal (the logprob gate's negative controls). The same run carries the TP 2
legs (the graph one through emulated device graphs) and the last-verify-row mutation leg; the
TP 1 graph legs and the stale-input controls are test_matrix_graphs.py (matrix_runs.CI_MATRIX_RUNS).
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from matrix_runs import FAST_MIN_REPLAYS, FAST_PROMPTS, FAST_RUN_LEGS

from scripts.matrix.legs import EMULATED_GRAPH_CLASS, PASSED_EMULATED_GRAPHS

ALL = f"{FAST_PROMPTS + 1}/{FAST_PROMPTS + 1}"  # the prompts and the long-context one


@pytest.fixture(scope="module")
def fast_run(
    fast_matrix_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The one fast matrix run (conftest.py ``fast_matrix_run``, shared with test_exact_verify_e2e.py)."""
    return fast_matrix_run


def test_matrix_fast_subset(fast_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    proc, data = fast_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    legs = {leg["name"]: leg for leg in data["legs"]}
    assert data["device"] == "cpu" and len(data["prompts"]) == FAST_PROMPTS + 1  # and the long-context prompt
    (long_context,) = data["long_context_prompts"]
    assert long_context["prompt_tokens"] >= 4200
    assert legs["teacher"]["status"] == "passed"
    # every leg that ran is a fork of the preloaded interpreter (scripts/matrix/preloaded.py)
    assert sorted(legs) == sorted(FAST_RUN_LEGS)
    assert {leg["leg_start"] for leg in legs.values()} == {"preloaded"}
    # every process that ran a model did so on its CPU slot's thread count (scripts/cpu_slots.py:
    # without it a TP 1 engine takes one thread per core of the machine, and two legs side by side
    # spin-wait for each other's threads, 6.5x slower)
    for leg in legs.values():
        per_rank = len(leg["cpu_bind"].split("|")[0].split(","))
        assert leg["threads"] == [per_rank] * leg["tp"], (leg["name"], leg["cpu_bind"], leg["threads"])
    for name in ("dflash-graph0-meta0", "dflash-graph0-meta1"):
        assert legs[name]["status"] == "passed", legs[name]["mismatches"]
        assert legs[name]["teacher_exact"] == ALL
        assert legs[name]["cached_tokens_zero"] == ALL
        lp = legs[name]["logprobs"]
        assert lp["positions"] > 0 and lp["logprobs_bitwise_equal"] == lp["positions"], lp
        assert legs[name]["longest_context"] >= long_context["prompt_tokens"] + 8
        # the long-context prompt: gated like the short ones (one prefill chunk in every leg)
        lc = lp["long_context"]
        assert lc["positions"] >= 8 and lc["logprobs_bitwise_equal"] == lc["positions"], lc
        assert legs[name]["acceptance_rate"] and legs[name]["acceptance_rate"] > 0
    for name in ("dflash-exact0-diagnostic", "dflash-noplan-diagnostic"):
        diagnostic = legs[name]
        assert diagnostic["status"] == "passed", diagnostic["mismatches"]  # a diagnostic passes when it differs
        lp = diagnostic["logprobs"]
        assert lp["logprobs_bitwise_equal"] < lp["positions"], f"negative control {name} matched bitwise"
    assert data["rollover_prompts"], "no prompt crossed a KV block boundary"
    print(f"acceptance rates: { {n: legs[n]['acceptance_rate'] for n in legs if legs[n]['acceptance_rate']} }")


def test_matrix_tp2_legs_run_the_series_in_every_rank(fast_run: tuple[Any, dict[str, Any]]) -> None:
    """Real TP 2 (mp executor, 2 worker processes each, the XCCL ring stand-in on), in the fast
    run: the prompts and the long-context one."""
    _, data = fast_run
    legs = {leg["name"]: leg for leg in data["legs"]}
    leg = legs["dflash-graph0-meta1-tp2"]
    assert leg["tp"] == 2 and leg["teacher"] == "teacher-tp2"
    assert leg["options"]["exact_tp_reduce"] is True and leg["options"]["debug_xccl_standin"] is True
    assert leg["teacher_exact"] == ALL and leg["cached_tokens_zero"] == ALL
    assert leg["cpu_bind"] in ("0|0", "1|1")  # both ranks on the leg's CPU slot (scripts/cpu_slots.py)
    ranks = leg["attention"]["ranks"]  # the series' attention ran in both worker processes
    assert len(ranks) == 2 and all(r["exact_calls_by_width"].get("8", 0) > 0 for r in ranks)
    assert all(r["prebuilt_calls"] > 0 for r in ranks)
    assert leg["collectives_per_step"]["target"] == 2 * 4 + 1  # tiny target: 4 layers
    assert len(leg["accepted_per_depth"]) == 7 and leg["accepted_per_depth"][0] > 0


def test_matrix_tp2_exact_legs_are_bitwise_equal_to_their_teacher(fast_run: tuple[Any, dict[str, Any]]) -> None:
    """Was a strict xfail until patch 0009 made LagunaMLP's SiLU row-invariant (the shared expert
    has 16 columns per rank at TP 2): docs/matrix-tp.md. The long-context prompt included."""
    proc, data = fast_run
    legs = {leg["name"]: leg for leg in data["legs"]}
    for name in ("dflash-graph0-meta0-tp2", "dflash-graph0-meta1-tp2", "dflash-graph1-meta1-tp2"):
        lp = legs[name]["logprobs"]
        assert lp["positions"] > 0 and lp["logprobs_bitwise_equal"] == lp["positions"], (name, lp)
        lc = lp["long_context"]
        assert lc["positions"] >= 8 and lc["logprobs_bitwise_equal"] == lc["positions"], (name, lc)
    assert proc.returncode == 0


def test_matrix_catches_a_one_ulp_fault_in_the_last_verify_row(fast_run: tuple[Any, dict[str, Any]]) -> None:
    """Negative control of the gate's reach: every logit of verify row M-1 one ulp up (the
    row used only when all 7 drafts are accepted) must make the leg differ from the teacher."""
    proc, data = fast_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    leg = {leg["name"]: leg for leg in data["legs"]}["dflash-lastrow-mutation"]
    assert leg["status"] == "passed", leg["mismatches"]  # a diagnostic leg passes when it differs
    assert leg["accepted_per_depth"][6] > 0  # full acceptance happened: row M-1 was used
    lp = leg["logprobs"]
    assert lp["logprobs_bitwise_equal"] < lp["positions"], lp


def test_matrix_tp2_graph_leg_runs_emulated_graphs_in_a_preloaded_leg(fast_run: tuple[Any, dict[str, Any]]) -> None:
    """The default leg that broke unseen (its preloaded leg process never ran the graph hook, so
    its in-process engine core refused the breakable graphs on CPU): real TP 2 with the
    emulated device graphs in the leg process and in both ranks, labelled as emulated."""
    _, data = fast_run
    leg = {leg["name"]: leg for leg in data["legs"]}["dflash-graph1-meta1-tp2"]
    assert leg["leg_start"] == "preloaded" and leg["tp"] == 2
    assert leg["status"] == PASSED_EMULATED_GRAPHS, leg["mismatches"]
    assert leg["teacher_exact"] == ALL
    # the target (tiny_laguna: 4 layers) under the series' wrapper; the DFlash drafter eager (Model
    # Runner V2 gives it FULL decode graphs or none, never PIECEWISE: docs/rebase/0.32.0-to-0.34.0.md)
    assert set(leg["graphs"]) == {"target"}
    acc = leg["graphs"]["target"]
    assert EMULATED_GRAPH_CLASS in acc["graph_class"]
    # one capture; a break at every attention and every all-reduce (2 per layer, plus 1 more)
    assert [c["breaks_by_kind"] for c in acc["captures"]] == [{"attention": 4, "collective": 2 * 4 + 1}]
    assert acc["replays"] >= FAST_MIN_REPLAYS
