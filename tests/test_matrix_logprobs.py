"""The matrix's logprob-level gate (pure: no vLLM needed)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from scripts.matrix.evaluate import evaluate
from scripts.matrix.legs import LEGS
from scripts.matrix.logprobs import collect_logprobs, compare_logprobs, gate

LEG = {leg.name: leg for leg in LEGS}


def _pos(token: int, value: float, top: list[tuple[int, float]]) -> list:
    return [token, value.hex(), [[t, v.hex()] for t, v in top]]


TEACHER = [
    [_pos(5, -0.25, [(5, -0.25), (9, -1.5)]), _pos(7, -0.5, [(7, -0.5), (2, -1.0)])],
    [_pos(3, -0.125, [(3, -0.125), (4, -3.0)])],
]


def test_collect_logprobs_keeps_sampled_first_and_top_k_in_rank_order() -> None:
    lp = SimpleNamespace
    entry = {11: lp(logprob=-2.5, rank=3), 4: lp(logprob=-0.1, rank=1), 8: lp(logprob=-1.0, rank=2)}
    assert collect_logprobs([entry], top_k=2) == [[11, (-2.5).hex(), [[4, (-0.1).hex()], [8, (-1.0).hex()]]]]


def test_identical_logprobs_are_bitwise_equal_everywhere() -> None:
    result = compare_logprobs(TEACHER, copy.deepcopy(TEACHER))
    assert (result.positions, result.tokens_equal, result.logprobs_bitwise_equal) == (3, 3, 3)
    assert result.all_equal and result.first_difference is None


def test_one_ulp_in_a_top_k_value_is_a_difference() -> None:
    leg = copy.deepcopy(TEACHER)
    leg[0][1][2][1][1] = (-1.0 + 2.0**-52).hex()  # one ulp off, tokens unchanged
    result = compare_logprobs(TEACHER, leg)
    assert (result.tokens_equal, result.logprobs_bitwise_equal) == (3, 2)
    assert result.first_difference is not None
    assert (result.first_difference["prompt"], result.first_difference["position"]) == (0, 1)
    assert result.first_difference["what"] == "top-k"


def test_sampled_logprob_and_token_differences_are_named() -> None:
    leg = copy.deepcopy(TEACHER)
    leg[1][0][1] = (-0.125000001).hex()
    assert compare_logprobs(TEACHER, leg).first_difference["what"] == "sampled-token logprob"
    leg = copy.deepcopy(TEACHER)
    leg[0][0][0] = 6
    result = compare_logprobs(TEACHER, leg)
    assert result.tokens_equal == 2 and result.first_difference["what"] == "token"


def test_gate_requires_bitwise_equality_on_cpu_for_exact_legs() -> None:
    equal = compare_logprobs(TEACHER, copy.deepcopy(TEACHER))
    leg = copy.deepcopy(TEACHER)
    leg[0][0][1] = (-0.26).hex()
    differs = compare_logprobs(TEACHER, leg)
    assert gate(equal, expect_equal=True, require_bitwise=True)[1] == []
    assert gate(differs, expect_equal=True, require_bitwise=True)[1]
    # on a device: reported, not gated
    assert gate(differs, expect_equal=True, require_bitwise=False) == ("reported (device: not gated)", [])


def test_negative_control_fails_when_the_diagnostic_leg_becomes_equal() -> None:
    """The diagnostic leg (exact verify off) must differ; equal means the gate is blind."""
    equal = compare_logprobs(TEACHER, copy.deepcopy(TEACHER))
    verdict, problems = gate(equal, expect_equal=False, require_bitwise=True)
    assert verdict == "negative control FAILED" and problems
    leg = copy.deepcopy(TEACHER)
    leg[0][0][1] = (-0.26).hex()
    assert gate(compare_logprobs(TEACHER, leg), expect_equal=False, require_bitwise=True)[1] == []


def _out(prompts: list[list[list]]) -> dict:
    return {
        "rows": [
            {
                "token_ids": [p[0] for p in rows],
                "cached_tokens": 0,
                "seconds": 0.1,
                "prompt_tokens": 4100,
                "logprobs": rows,
            }
            for rows in prompts
        ],
        "draft_tokens": 7,
        "accepted_tokens": 1,
        "acceptance_rate": 1 / 7,
    }


def test_evaluate_gates_exact_and_diagnostic_legs() -> None:
    differs = copy.deepcopy(TEACHER)
    differs[1][0][1] = (-0.1251).hex()
    legs = (
        LEG["teacher"],
        LEG["dflash-graph0-meta0"],
        LEG["dflash-exact0-diagnostic"],
        LEG["dflash-noplan-diagnostic"],
    )
    outputs = {
        "teacher": _out(TEACHER),
        "dflash-graph0-meta0": _out(copy.deepcopy(TEACHER)),
        "dflash-exact0-diagnostic": _out(differs),
        "dflash-noplan-diagnostic": _out(copy.deepcopy(TEACHER)),
    }
    results = {r.name: r for r in evaluate(outputs, legs, 2, require_bitwise=True)}
    assert results["dflash-graph0-meta0"].status == "passed"
    assert results["dflash-graph0-meta0"].logprobs["logprobs_bitwise_equal"] == 3
    assert results["dflash-graph0-meta0"].longest_context == 4102
    assert results["dflash-exact0-diagnostic"].status == "passed"  # differs: the control holds
    # a diagnostic leg's own figures are reported like any leg's (they were left at 0)
    diagnostic = results["dflash-exact0-diagnostic"]
    assert diagnostic.seconds == pytest.approx(0.1 * len(TEACHER))  # its rows' seconds, summed
    assert (diagnostic.draft_tokens, diagnostic.accepted_tokens) == (7, 1)
    # the no-plan leg is a negative control too: equal to the teacher means the gate is blind
    assert results["dflash-noplan-diagnostic"].status == "failed"
    assert results["dflash-noplan-diagnostic"].logprobs["verdict"] == "negative control FAILED"
    outputs["dflash-noplan-diagnostic"] = _out(differs)
    results = {r.name: r for r in evaluate(outputs, legs, 2, require_bitwise=True)}
    assert results["dflash-noplan-diagnostic"].status == "passed"
    # an exact leg that differs fails
    outputs["dflash-graph0-meta0"] = _out(differs)
    results = {r.name: r for r in evaluate(outputs, legs, 2, require_bitwise=True)}
    assert results["dflash-graph0-meta0"].status == "failed"
    assert any("logprobs: 2/3 bitwise" in m for m in results["dflash-graph0-meta0"].mismatches)


def test_long_context_prompts_are_gated_and_reported_on_their_own() -> None:
    differs = copy.deepcopy(TEACHER)
    differs[1][0][1] = (-0.1251).hex()  # prompt 1 (the long-context one) differs
    legs = (LEG["teacher"], LEG["dflash-graph0-meta0"])
    outputs = {"teacher": _out(TEACHER), "dflash-graph0-meta0": _out(differs)}
    result = evaluate(outputs, legs, 2, require_bitwise=True, long_context=frozenset({1}))[1]
    assert result.status == "failed"
    assert any("logprobs: 2/3 bitwise" in m for m in result.mismatches)
    assert result.logprobs["positions"] == 3 and result.logprobs["logprobs_bitwise_equal"] == 2
    assert result.logprobs["long_context"]["positions"] == 1
    assert result.logprobs["long_context"]["logprobs_bitwise_equal"] == 0
    # equal everywhere: passes, and the long-context breakdown says so
    outputs["dflash-graph0-meta0"] = _out(copy.deepcopy(TEACHER))
    result = evaluate(outputs, legs, 2, require_bitwise=True, long_context=frozenset({1}))[1]
    assert result.status == "passed" and result.logprobs["long_context"]["logprobs_bitwise_equal"] == 1
