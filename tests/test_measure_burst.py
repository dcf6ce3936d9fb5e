"""Burst gate: rows whose chunks arrive faster than an engine step can emit them."""

from __future__ import annotations

import dataclasses

import pytest

from _measure_synth import CONFIG, clean_legs, teacher
from scripts.measure.analyze import analyze
from scripts.measure.gates import load_gates
from scripts.measure.record import RecordMeta, build_record
from scripts.measure.timing import find_burst

GATES = load_gates()
STEP_MS = GATES.min_engine_step_ms


def issue_row() -> list[float]:
    """The CPU crossover row of the issue: TTFT 0.2007 s, then 33 chunks (one token each)
    within 0.41 ms."""
    return [0.2007] + [0.2007 + 0.00041 * (i + 1) / 33 for i in range(33)]


def clean_row() -> list[float]:
    """TTFT 0.2 s, then a chunk every 25 ms carrying 1..3 tokens (DFlash on CPU: low acceptance)."""
    times = [0.2]
    for step in range(1, 40):
        times += [0.2 + 0.025 * step] * (1 + step % 3)
    return times


def test_threshold_is_the_documented_one() -> None:
    assert STEP_MS == 1.0


def test_issue_row_is_a_burst_and_a_clean_row_is_not() -> None:
    burst = find_burst(issue_row(), 7, STEP_MS)
    assert burst is not None
    assert burst.tokens == 34 and burst.start == 0  # the first token is within 0.41 ms of the rest
    assert burst.span_ms == pytest.approx(0.41)
    assert "one engine step emits at most 8" in burst.describe()
    assert find_burst(clean_row(), 7, STEP_MS) is None


def test_normal_row_of_the_issue_is_a_burst_too() -> None:
    # 11 chunks within 0.15 ms after the first token
    times = [0.19] + [0.19 + 0.00015 * (i + 1) / 11 for i in range(11)]
    assert find_burst(times, 7, STEP_MS) is not None


def test_boundary_one_step_worth_of_tokens_passes() -> None:
    # k + 1 = 8 tokens at one instant is one verify step: plausible; 9 is not
    assert find_burst([0.1] + [0.2] * 8, 7, STEP_MS) is None
    assert find_burst([0.1] + [0.2] * 9, 7, STEP_MS) is not None
    # a late chunk followed 0.5 ms later by the next: fine while both fit one step's worth
    assert find_burst([0.1, 0.2, 0.2, 0.2, 0.2005, 0.2005, 0.2005, 0.2005, 0.2005], 7, STEP_MS) is None
    # without speculation one token per step: two tokens 0.5 ms apart cannot be the engine's
    assert find_burst([0.1, 0.2, 0.2005], None, STEP_MS) is not None
    assert find_burst([0.1, 0.2, 0.202], None, STEP_MS) is None


def test_gate_off_for_records_judged_before_it() -> None:
    assert find_burst(issue_row(), 7, 0.0) is None


def burst_legs() -> dict:
    data = clean_legs()
    row = data["B1"][1]
    # 5 tokens within 0.4 ms after an outsized TTFT; the synthetic config drafts k = 3 tokens
    row.token_times_s = [2.0 + 0.0001 * i for i in range(5)]
    return data


def test_a_burst_row_fails_a_named_quality_check_and_is_not_a_record() -> None:
    result = analyze(burst_legs(), teacher(), CONFIG, GATES)
    assert result["quality"]["plausible_chunk_timing"] == "11/12"
    assert "plausible_chunk_timing" in result["failing_gates"]
    assert result["burst_rows"] == [
        {
            "leg": "B1",
            "index": 1,
            "kind": "normal",
            "burst": "5 tokens from position 0 within 0.400 ms (one engine step emits at most 4)",
        }
    ]
    assert result["legs"]["B1"]["per_row"][1]["burst"].startswith("5 tokens")
    meta = RecordMeta("s", "2026-01-01", "/r", {}, {}, None, {}, {})
    assert build_record(result, meta)["status"] == "UNSUBMITTED_NOT_A_RECORD"


def test_clean_run_passes_the_burst_gate() -> None:
    result = analyze(clean_legs(), teacher(), CONFIG, GATES)
    assert result["quality"]["plausible_chunk_timing"] == "12/12"
    assert result["failing_gates"] == []
    meta = RecordMeta("s", "2026-01-01", "/r", {}, {}, None, {}, {})
    assert build_record(result, meta)["status"] == "UNSUBMITTED_RECORD_CANDIDATE"


def test_negative_control_without_the_gate_the_burst_reads_as_a_record() -> None:
    off = dataclasses.replace(GATES, min_engine_step_ms=0.0)
    result = analyze(burst_legs(), teacher(), CONFIG, off)
    assert "plausible_chunk_timing" not in result["quality"]
    assert result["failing_gates"] == [] or "plausible_chunk_timing" not in result["failing_gates"]
    assert result["legs"]["B1"]["per_row"][1]["tok_s_legacy"] > 9000  # the artifact's "throughput"


def test_gate_applies_even_when_completeness_is_not_required() -> None:
    lax = dataclasses.replace(GATES, require_complete=False)
    assert "plausible_chunk_timing" in analyze(burst_legs(), teacher(), CONFIG, lax)["failing_gates"]


def test_a_row_flushed_at_one_instant_is_named_as_a_burst() -> None:
    from scripts.errors import ToolError

    data = clean_legs()
    data["B2"][2].token_times_s = [0.3] * 5  # the whole row in one chunk (seen on a loaded CPU)
    with pytest.raises(
        ToolError,
        match=r"leg B2 row 2 \(rollover\): output tokens 1..4 arrived at one "
        r"instant, a burst row \(plausible_chunk_timing",
    ):
        analyze(data, teacher(), CONFIG, GATES)
