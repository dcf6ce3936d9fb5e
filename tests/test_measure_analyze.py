"""The analyzer over raw rows: golden values worked out by hand in ``_measure_synth``."""

from __future__ import annotations

import dataclasses

import pytest

from _measure_synth import CONFIG, clean_legs, legs, teacher
from scripts.errors import ToolError
from scripts.measure.analyze import analyze
from scripts.measure.gates import load_gates
from scripts.measure.schema import dump_rows, load_rows

GATES = load_gates()
A = pytest.approx


def run() -> dict:
    return analyze(legs(), teacher(), CONFIG, GATES)


def test_per_leg_statistics() -> None:
    result = run()["legs"]
    a1 = result["A1"]
    assert a1["rows"] == 3
    assert a1["tok_s_legacy"]["median"] == A(40 / 3)
    assert a1["tok_s_conventional"]["median"] == A(10.0)
    assert a1["tok_s_legacy"]["p10"] == A(20 / 3 + 0.2 * 20 / 3)
    assert a1["tok_s_legacy"]["mean"] == A(40 / 3)
    assert a1["tok_s_legacy"]["stdev"] == A(20 / 3)
    assert result["B1"]["tok_s_legacy"]["median"] == A(25.0)
    assert result["B1"]["tok_s_conventional"]["median"] == A(18.75)
    b2 = result["B2"]
    assert b2["tok_s_legacy"]["median"] == A(40 / 3)
    assert b2["tok_s_legacy"]["mean"] == A(160 / 9)
    assert b2["tok_s_legacy"]["stdev"] == A(4800**0.5 / 9)
    assert b2["tok_s_full_after_ttft_median"] == A(12.5)  # 5 tokens / 0.4 s
    assert b2["tok_s_wall_full_median"] == A(50 / 9)  # 5 tokens / 0.9 s
    assert b2["ttft_ms_median"] == A(500.0)
    assert (b2["draft_cycles"], b2["draft_tokens"], b2["accepted_draft_tokens"]) == (30, 90, 36)
    assert b2["draft_acceptance_rate"] == A(0.4)
    assert a1["cycle_ms"] == A(1400 / 30)  # decode 0.4 + 0.7 + 0.3 s over 30 cycles


def test_pairs() -> None:
    pairs = run()["pairs"]
    b1 = pairs["B1_vs_A1"]
    assert b1["row_wins"] == "3/3"
    assert b1["paired_delta_pct"] == [A(100.0), A(100.0), A(25.0)]
    assert b1["median_paired_delta_pct"] == A(100.0)
    assert b1["headline_delta_pct"] == A(87.5)
    assert b1["aggregate_cycle_saving_ms"] == A(1400 / 30 - 910 / 30)
    assert b1["acceptance_rate_delta"] == A(0.1)
    assert b1["passed"] is True
    b2 = pairs["B2_vs_A2"]
    assert b2["row_wins"] == "2/3"
    assert b2["paired_delta_pct"] == [A(100.0), A(100.0), A(-100 / 3)]
    assert b2["headline_delta_pct"] == A(0.0)
    assert b2["aggregate_cycle_saving_ms"] == A(1400 / 30 - 1050 / 30)
    assert b2["passed"] is False  # 2/3 wins < 0.9 and a zero headline delta


def test_quality_counts() -> None:
    quality = run()["quality"]
    assert quality["teacher_exact"] == "11/12"  # A2 row 2 differs
    assert quality["cross_leg_exact"] == "8/9"  # B1, B2, A2 against A1
    assert quality["cached_tokens_zero"] == "11/12"  # B2 row 1 hit the cache
    assert quality["long_then_next"] == "4/4"
    assert quality["rollover"] == "3/4"
    assert quality["fresh_unique_prompts"] is True
    assert quality["single_active_generation"] is True
    assert quality["no_warmup_generation"] is True
    assert quality["no_retry"] is True
    assert quality["no_cache_history_ngram_or_response_reuse"] is False


def test_detail_documents_locate_the_difference() -> None:
    result = run()
    a2 = result["all_vs_teacher"]["legs"]["A2"]
    assert [r["exact"] for r in a2] == [True, True, False]
    assert a2[2]["first_difference"] == 3
    assert result["cross_leg"]["legs"]["A2"][2]["first_difference"] == 3


def test_record_value_and_gates() -> None:
    result = run()
    assert result["record_value"] == {
        "policy": "lower of two candidate starts",
        "leg": "B2",
        "tok_s": A(40 / 3),
    }
    assert set(result["failing_gates"]) == {
        "B2_vs_A2",
        "teacher_exact",
        "cross_leg_exact",
        "cached_tokens_zero",
        "rollover",
        "no_cache_history_ngram_or_response_reuse",
    }


def test_clean_run_has_no_failing_gates() -> None:
    result = analyze(clean_legs(), teacher(), CONFIG, GATES)
    assert result["failing_gates"] == []
    assert result["quality"]["teacher_exact"] == "12/12"
    assert result["quality"]["cross_leg_exact"] == "9/9"
    assert result["record_value"]["leg"] == "B1"  # tie: the first candidate start


def test_rollover_that_did_not_cross_fails() -> None:
    config = dataclasses.replace(CONFIG, rollover_at=100)
    assert analyze(clean_legs(), teacher(), config, GATES)["quality"]["rollover"] == "0/4"


def test_warmup_or_retry_is_seen_in_the_server_counter() -> None:
    data = clean_legs()
    for row in data["B1"]:
        row.requests_before = (row.requests_before or 0) + 1  # one request before row 0
    quality = analyze(data, teacher(), CONFIG, GATES)["quality"]
    assert quality["no_warmup_generation"] is False
    assert quality["single_active_generation"] is False
    assert quality["no_retry"] is False


def test_without_teacher_nothing_is_teacher_exact() -> None:
    assert analyze(clean_legs(), None, CONFIG, GATES)["quality"]["teacher_exact"] == "0/12"


def test_row_errors_are_refused() -> None:
    data = clean_legs()
    data["B1"][1].error = "HTTP 500"
    with pytest.raises(ToolError, match="leg B1 row 1: request failed"):
        analyze(data, teacher(), CONFIG, GATES)
    data = clean_legs()
    data["A2"] = data["A2"][:2]
    with pytest.raises(ToolError, match="same non-zero number of rows"):
        analyze(data, teacher(), CONFIG, GATES)
    data = clean_legs()
    data["A1"][0].token_ids = data["A1"][0].token_ids[:3]
    data["A1"][0].token_times_s = data["A1"][0].token_times_s[:3]
    with pytest.raises(ToolError, match="3 output tokens < window 4"):
        analyze(data, teacher(), CONFIG, GATES)


def test_rows_round_trip_through_jsonl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = legs()["B2"]
    dump_rows(rows, tmp_path / "rows.jsonl")
    assert load_rows(tmp_path / "rows.jsonl") == rows
    (tmp_path / "bad.jsonl").write_text('{"leg": "A1"}\n')
    with pytest.raises(ToolError, match="bad.jsonl:1: index: missing required field"):
        load_rows(tmp_path / "bad.jsonl")
