"""The analyzer: every number of a crossover, from raw rows only (pure).

Input: the rows of legs A1, B1, B2, A2 (same prompts, same order, fresh server per leg) and of
the non-speculative teacher leg, plus :class:`AnalysisConfig` and :class:`Gates`. Output: a
JSON-able dict (``analysis.json``) from which the record is assembled.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from scripts.errors import ToolError
from scripts.measure import metrics
from scripts.measure.gates import Gates
from scripts.measure.schema import (
    CANDIDATE_LEGS,
    LEG_ORDER,
    PAIRS,
    AnalysisConfig,
    Row,
    fraction,
    pair_name,
)
from scripts.measure.timing import find_burst
from scripts.tokens import first_difference


def _check_row(row: Row, leg: str, index: int, window: int) -> None:
    where = f"leg {leg} row {index}"
    if row.leg != leg or row.index != index:
        raise ToolError(f"{where}: file holds leg {row.leg!r} row {row.index} (out of order)")
    if row.error is not None:
        raise ToolError(f"{where}: request failed ({row.error}); no retries: rerun the crossover")
    if len(row.token_ids) < window:
        raise ToolError(f"{where}: {len(row.token_ids)} output tokens < window {window}")
    if any(b < a for a, b in zip(row.token_times_s, row.token_times_s[1:])):
        raise ToolError(f"{where}: token times go backwards")
    if row.token_times_s[window - 1] == row.token_times_s[0]:
        raise ToolError(
            f"{where} ({row.kind}): output tokens 1..{window} arrived at one instant, a burst row "
            f"(plausible_chunk_timing: the stream stalled and flushed its backlog); no throughput "
            f"exists for it and the run is not a record: rerun the crossover on a quieter machine"
        )


def leg_stats(rows: Sequence[Row], window: int) -> dict[str, Any]:
    """Per-leg medians, p10, mean, stdev and the totals the record's summary carries."""
    conventional = [metrics.tok_s_conventional(r.token_times_s, window) for r in rows]
    legacy = [metrics.tok_s_legacy(r.token_times_s, window) for r in rows]
    decode_s = [r.token_times_s[-1] - r.token_times_s[0] for r in rows]
    deltas = [r.spec_delta for r in rows]
    have_spec = all(d is not None for d in deltas)
    drafts = sum(d.drafts for d in deltas if d is not None) if have_spec else None
    draft_tokens = sum(d.draft_tokens for d in deltas if d is not None) if have_spec else None
    accepted = sum(d.accepted_tokens for d in deltas if d is not None) if have_spec else None
    per_row = []
    for row, conv, leg_value, decode in zip(rows, conventional, legacy, decode_s):
        delta = row.spec_delta
        per_row.append(
            {
                "index": row.index,
                "prompt_id": row.prompt_id,
                "kind": row.kind,
                "tokens": len(row.token_ids),
                "ttft_ms": row.token_times_s[0] * 1000,
                "decode_s": decode,
                "tok_s_conventional": conv,
                "tok_s_legacy": leg_value,
                "drafts": None if delta is None else delta.drafts,
                "draft_tokens": None if delta is None else delta.draft_tokens,
                "accepted_tokens": None if delta is None else delta.accepted_tokens,
            }
        )
    return {
        "rows": len(rows),
        "tok_s_conventional": metrics.summarize(conventional).to_json(),
        "tok_s_legacy": metrics.summarize(legacy).to_json(),
        "tok_s_full_after_ttft_median": statistics.median(metrics.tok_s_full_after_ttft(r.token_times_s) for r in rows),
        "tok_s_wall_full_median": statistics.median(metrics.tok_s_wall_full(r.token_times_s) for r in rows),
        "ttft_ms_median": statistics.median(r.token_times_s[0] * 1000 for r in rows),
        "decode_s_total": sum(decode_s),
        "draft_cycles": drafts,
        "draft_tokens": draft_tokens,
        "accepted_draft_tokens": accepted,
        "draft_acceptance_rate": (accepted / draft_tokens if accepted is not None and draft_tokens else None),
        "cycle_ms": 1000 * sum(decode_s) / drafts if drafts else None,
        "per_row": per_row,
    }


def pair_stats(candidate: Mapping[str, Any], control: Mapping[str, Any], gates: Gates) -> dict[str, Any]:
    cand_rows = [r["tok_s_legacy"] for r in candidate["per_row"]]
    ctrl_rows = [r["tok_s_legacy"] for r in control["per_row"]]
    paired = [metrics.pct_change(b, a) for b, a in zip(cand_rows, ctrl_rows)]
    wins = sum(1 for b, a in zip(cand_rows, ctrl_rows) if b > a)
    headline = metrics.pct_change(candidate["tok_s_legacy"]["median"], control["tok_s_legacy"]["median"])
    median_paired = statistics.median(paired)
    saving = (
        control["cycle_ms"] - candidate["cycle_ms"]
        if control["cycle_ms"] is not None and candidate["cycle_ms"] is not None
        else None
    )
    rates = (candidate["draft_acceptance_rate"], control["draft_acceptance_rate"])
    return {
        "row_wins": fraction(wins, len(paired)),
        "headline_delta_pct": headline,
        "median_paired_delta_pct": median_paired,
        "aggregate_cycle_saving_ms": saving,
        "acceptance_rate_delta": None if None in rates else rates[0] - rates[1],
        "paired_delta_pct": paired,
        "passed": gates.pair_passes(wins, len(paired), headline, median_paired),
    }


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    diff = first_difference(a, b)
    return None if diff is None else diff[0]


def quality(
    legs: Mapping[str, Sequence[Row]], teacher: Sequence[Row] | None, config: AnalysisConfig
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Quality counts plus the two detail artifacts (all-vs-teacher, cross-leg)."""
    teacher_by_prompt = {r.prompt_sha256: r for r in teacher or []}
    vs_teacher: dict[str, list[dict[str, Any]]] = {}
    exact_total = exact_ok = 0
    cached_ok = cached_total = 0
    long_ok = long_total = roll_ok = roll_total = 0
    single_active = True
    for leg in LEG_ORDER:
        rows = legs[leg]
        results: list[dict[str, Any]] = []
        for row in rows:
            reference = teacher_by_prompt.get(row.prompt_sha256)
            diff = None if reference is None else _first_difference(row.token_ids, reference.token_ids)
            exact = reference is not None and diff is None
            results.append(
                {
                    "index": row.index,
                    "prompt_id": row.prompt_id,
                    "exact": exact,
                    "first_difference": diff,
                    "teacher_row": None if reference is None else reference.index,
                }
            )
            exact_total += 1
            exact_ok += exact
            cached_total += 1
            cached_ok += row.cached_tokens == 0
            if row.requests_before != row.index:
                single_active = False
        for i, row in enumerate(rows):
            if row.kind == "long" and i + 1 < len(rows):
                long_total += 1
                long_ok += results[i]["exact"] and results[i + 1]["exact"]
            if row.kind == "rollover":
                roll_total += 1
                crossed = (
                    config.rollover_at is None
                    or row.prompt_tokens is not None
                    and row.prompt_tokens < config.rollover_at <= row.prompt_tokens + len(row.token_ids)
                )
                roll_ok += results[i]["exact"] and crossed
        vs_teacher[leg] = results
    cross: dict[str, list[dict[str, Any]]] = {}
    cross_ok = cross_total = 0
    base = legs[LEG_ORDER[0]]
    for leg in LEG_ORDER[1:]:
        cross[leg] = []
        for row, ref in zip(legs[leg], base):
            diff = _first_difference(row.token_ids, ref.token_ids)
            cross[leg].append({"index": row.index, "exact": diff is None, "first_difference": diff})
            cross_total += 1
            cross_ok += diff is None
    prompts = [[r.prompt_sha256 for r in legs[leg]] for leg in LEG_ORDER]
    unique = all(len(set(p)) == len(p) for p in prompts) and all(p == prompts[0] for p in prompts)
    teacher_prompts = [r.prompt_sha256 for r in teacher or []]
    unique = unique and len(set(teacher_prompts)) == len(teacher_prompts)
    first_rows = [legs[leg][0] for leg in LEG_ORDER if legs[leg]]
    no_warmup = all(r.requests_before == 0 for r in first_rows) and all(
        (t.requests_before == t.index) for t in teacher or []
    )
    no_retry = single_active and all(r.error is None for leg in LEG_ORDER for r in legs[leg])
    counts = {
        "teacher_exact": fraction(exact_ok, exact_total),
        "cross_leg_exact": fraction(cross_ok, cross_total),
        "cached_tokens_zero": fraction(cached_ok, cached_total),
        "long_then_next": fraction(long_ok, long_total),
        "rollover": fraction(roll_ok, roll_total),
        "fresh_unique_prompts": unique,
        "single_active_generation": single_active,
        "no_warmup_generation": no_warmup,
        "no_retry": no_retry,
        "no_cache_history_ngram_or_response_reuse": unique and cached_ok == cached_total and no_warmup,
    }
    return counts, {"teacher_rows": len(teacher or []), "legs": vs_teacher}, {"legs": cross}


def burst_rows(legs: Mapping[str, Sequence[Row]], config: AnalysisConfig, gates: Gates) -> list[dict[str, Any]]:
    """Rows of the timed legs whose chunks arrive faster than the engine can emit them
    (:mod:`scripts.measure.timing`); empty when the gate is off."""
    found = []
    for leg in LEG_ORDER:
        for row in legs[leg]:
            burst = find_burst(row.token_times_s, config.num_speculative_tokens, gates.min_engine_step_ms)
            if burst is not None:
                found.append({"leg": leg, "index": row.index, "kind": row.kind, "burst": burst.describe()})
    return found


def _with_timing(counts: Mapping[str, Any], legs: Mapping[str, Sequence[Row]], bursts: Sequence[Any]) -> dict[str, Any]:
    """``counts`` with ``plausible_chunk_timing`` (rows without a burst / timed rows) after
    the other counts."""
    total = sum(len(legs[leg]) for leg in LEG_ORDER)
    out: dict[str, Any] = {}
    for key, value in counts.items():
        out[key] = value
        if key == "rollover":
            out["plausible_chunk_timing"] = fraction(total - len(bursts), total)
    return out


def quality_complete(counts: Mapping[str, Any]) -> list[str]:
    """Names of quality items that are not complete (k < n, or a false flag)."""
    failing = []
    for key, value in counts.items():
        if isinstance(value, bool):
            if not value:
                failing.append(key)
        else:
            k, n = (int(x) for x in str(value).split("/"))
            if k != n:
                failing.append(key)
    return failing


def analyze(
    legs: Mapping[str, Sequence[Row]],
    teacher: Sequence[Row] | None,
    config: AnalysisConfig,
    gates: Gates,
) -> dict[str, Any]:
    missing = [leg for leg in LEG_ORDER if leg not in legs]
    if missing:
        raise ToolError(f"missing leg(s): {', '.join(missing)}")
    counts = {len(legs[leg]) for leg in LEG_ORDER}
    if len(counts) != 1 or 0 in counts:
        sizes = ", ".join(f"{leg}={len(legs[leg])}" for leg in LEG_ORDER)
        raise ToolError(f"legs must have the same non-zero number of rows ({sizes})")
    for leg in LEG_ORDER:
        for index, row in enumerate(legs[leg]):
            _check_row(row, leg, index, config.window)
    for index, row in enumerate(teacher or []):
        if row.error is not None:
            raise ToolError(f"teacher row {index}: request failed ({row.error})")
    stats = {leg: leg_stats(legs[leg], config.window) for leg in LEG_ORDER}
    pairs = {pair_name(cand, ctrl): pair_stats(stats[cand], stats[ctrl], gates) for cand, ctrl in PAIRS}
    quality_counts, vs_teacher, cross = quality(legs, teacher, config)
    bursts = burst_rows(legs, config, gates)
    if gates.min_engine_step_ms > 0:
        quality_counts = _with_timing(quality_counts, legs, bursts)
        for burst in bursts:
            stats[burst["leg"]]["per_row"][burst["index"]]["burst"] = burst["burst"]
    lower = min(CANDIDATE_LEGS, key=lambda leg: stats[leg]["tok_s_legacy"]["median"])
    failing = [name for name, pair in pairs.items() if not pair["passed"]]
    failing += quality_complete(quality_counts) if gates.require_complete else []
    if bursts and "plausible_chunk_timing" not in failing:
        failing.append("plausible_chunk_timing")  # never a record, whatever require_complete
    return {
        "config": config.to_json(),
        "gates": gates.to_json(),
        "legs": stats,
        "pairs": pairs,
        "quality": quality_counts,
        "record_value": {
            "policy": "lower of two candidate starts",
            "leg": lower,
            "tok_s": stats[lower]["tok_s_legacy"]["median"],
        },
        "failing_gates": failing,
        "burst_rows": bursts,
        "all_vs_teacher": vs_teacher,
        "cross_leg": cross,
    }
