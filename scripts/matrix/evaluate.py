"""Verdicts per leg (pure): teacher-exact and cross-leg tokens, zero cached tokens, the logprob
gate and the graph legs' accounting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scripts.matrix.graphs import GraphExpectation, check_graph_accounting, graph_leg_is_emulated
from scripts.matrix.legs import EQUAL_BY_ARITHMETIC, PASSED_EMULATED_GRAPHS, Leg
from scripts.matrix.logprobs import LogprobComparison, compare_logprobs, gate
from scripts.tokens import first_difference


@dataclass
class LegResult:
    name: str
    status: str  # "passed", "failed", NOT_RUN_NO_GRAPHS, "error: ..."
    options: dict[str, object] = field(default_factory=dict)  # the series' options of its engine (Leg.options)
    acceptance_rate: float | None = None
    draft_tokens: int = 0
    accepted_tokens: int = 0
    teacher_exact: str = ""
    cross_leg_exact: str = ""
    cached_tokens_zero: str = ""
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0  # generation: the prompts' generate calls
    startup_seconds: float = 0.0  # the engine's construction (weights, KV cache, warm-up, graphs)
    wall_seconds: float = 0.0  # the leg's process, start to exit
    interpreter_seconds: float | None = None  # interpreted Triton launches (rank 0), CPU runtime only
    attention: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[str, Any] = field(default_factory=dict)  # see logprob_verdict()
    longest_context: int = 0  # prompt + generated tokens of the longest request
    graphs: dict[str, Any] = field(default_factory=dict)
    teacher: str = ""  # the leg this one is compared with
    tp: int = 1
    # all-reduces per forward step, target and drafter, and where the count comes from
    collectives_per_step: dict[str, Any] = field(default_factory=dict)
    accepted_per_depth: list[int] = field(default_factory=list)  # depth 1..7 (scripts.spec_acceptance)
    drafts: int = 0  # verify steps with drafted tokens
    cpu_bind: str = ""  # VLLM_CPU_OMP_THREADS_BIND of the leg's CPU slot (scripts.cpu_slots); "" off CPU
    leg_start: str = ""  # how the leg's process started: "preloaded" or "fresh" (scripts.matrix.preloaded)
    threads: list[int] = field(default_factory=list)  # torch's threads per model process (rank order)


def logprob_verdict(
    result: LegResult,
    leg: Leg,
    teacher_rows: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    require_bitwise: bool,
    long_context: frozenset[int] = frozenset(),
    default_tp: int = 1,
) -> None:
    """The logprob gate for one leg (:mod:`.logprobs`): fills ``result.logprobs`` and
    adds any problem to ``result.mismatches``.

    Every prompt is gated. The prompts in ``long_context`` are also reported on their own under
    ``long_context``: the leg without the split plan differs from the teacher only there, so it
    is that leg's negative control.
    """
    comparison: LogprobComparison = compare_logprobs(
        [r.get("logprobs", []) for r in teacher_rows], [r.get("logprobs", []) for r in rows]
    )
    by_arithmetic = leg.equal_by_arithmetic(default_tp)
    verdict, problems = gate(
        comparison, expect_equal=by_arithmetic or not leg.diagnostic, require_bitwise=require_bitwise
    )
    if by_arithmetic and not problems and require_bitwise:
        verdict = EQUAL_BY_ARITHMETIC
    result.logprobs = {
        "verdict": verdict,
        "positions": comparison.positions,
        "tokens_equal": comparison.tokens_equal,
        "logprobs_bitwise_equal": comparison.logprobs_bitwise_equal,
        "first_difference": comparison.first_difference,
    }
    if long_context:
        extra = compare_logprobs(
            [r.get("logprobs", []) for i, r in enumerate(teacher_rows) if i in long_context],
            [r.get("logprobs", []) for i, r in enumerate(rows) if i in long_context],
        )
        result.logprobs["long_context"] = {
            "positions": extra.positions,
            "tokens_equal": extra.tokens_equal,
            "logprobs_bitwise_equal": extra.logprobs_bitwise_equal,
            "first_difference": extra.first_difference,
        }
    result.mismatches += problems


def longest_context(rows: list[dict[str, Any]]) -> int:
    return max((r["prompt_tokens"] + len(r["token_ids"]) for r in rows), default=0)


def compare(teacher: list[list[int]], leg: list[list[int]], what: str) -> tuple[int, list[str]]:
    """Count equal prompts; describe each mismatch with its first differing position."""
    equal, notes = 0, []
    for index, (t, got) in enumerate(zip(teacher, leg, strict=True)):
        diff = first_difference(t, got)
        if diff is None:
            equal += 1
        else:
            pos, x, y = diff
            notes.append(f"{what}: prompt {index} differs first at token {pos}: expected {x}, got {y}")
    return equal, notes


def collectives_per_step(
    leg: Leg, tp: int, graphs: dict[str, Any], expectation: GraphExpectation | None
) -> dict[str, Any]:
    """All-reduces per forward step of target and drafter: a graph leg's own accounting
    (collective breaks per capture); an eager leg's from the models' layer counts (2L + 1 at
    TP > 1, :func:`scripts.matrix.graphs.decoder_topology`)."""
    if leg.graph and graphs:
        out: dict[str, Any] = {"source": "graph accounting (collective breaks per capture)"}
        for label in ("target", "drafter"):
            if label not in graphs:
                continue  # an eager drafter (V2's DFlash under PIECEWISE): counted below
            caps = graphs.get(label, {}).get("captures", [])
            counts = sorted({c.get("breaks_by_kind", {}).get("collective", 0) for c in caps})
            out[label] = counts[0] if len(counts) == 1 else counts
        if "drafter" not in out and leg.speculative and expectation is not None:
            out["drafter"] = expectation.drafter.collective
            out["source"] += "; eager drafter: derived 2L + 1" if tp > 1 else "; eager drafter"
        return out
    if expectation is None:
        return {}
    out = {"source": "derived 2L + 1 from the models' num_hidden_layers" if tp > 1 else "TP 1: none"}
    out["target"] = expectation.target.collective
    if leg.speculative:
        out["drafter"] = expectation.drafter.collective
    return out


def evaluate(
    outputs: dict[str, dict[str, Any]],
    legs: tuple[Leg, ...],
    n_prompts: int,
    require_bitwise: bool = True,
    long_context: frozenset[int] = frozenset(),
    graph_expectation: dict[int, GraphExpectation] | None = None,
    default_tp: int = 1,
    series_options: Mapping[str, object] | None = None,
) -> list[LegResult]:
    """Verdicts per leg; each leg is compared with its own teacher (``Leg.teacher``), a teacher
    leg with itself. ``graph_expectation``: the expected topology by TP size; ``series_options``:
    the run's ``--series-options`` (recorded with each leg's own options)."""
    reference_leg: dict[str, list[list[int]]] = {}
    results = []
    for leg in legs:
        data = outputs.get(leg.name)
        tp = leg.tp_size(default_tp)
        expectation = (graph_expectation or {}).get(tp)
        teacher_name = leg.teacher if leg.speculative else leg.name
        result = LegResult(
            leg.name,
            status="",
            options=leg.options(default_tp, series_options),
            teacher=teacher_name,
            tp=tp,
            cpu_bind=str((data or {}).get("cpu_bind", "")),
            leg_start=str((data or {}).get("leg_start", "")),
            threads=[int(t) for t in (data or {}).get("threads", [])],
        )
        if data is None or "status" in data:
            result.status = (data or {}).get("status", "error: no output")
            results.append(result)
            continue
        teacher = outputs.get(teacher_name, {})
        if "rows" not in teacher:
            result.status = f"error: its teacher {teacher_name} did not run"
            results.append(result)
            continue
        teacher_tokens = [r["token_ids"] for r in teacher["rows"]]
        tokens = [r["token_ids"] for r in data["rows"]]
        equal, notes = compare(teacher_tokens, tokens, "teacher-exact")
        result.teacher_exact = f"{equal}/{n_prompts}"
        result.longest_context = longest_context(data["rows"])
        result.collectives_per_step = collectives_per_step(leg, tp, data.get("graphs", {}), expectation)
        acceptance = data.get("acceptance") or {}
        result.accepted_per_depth = list(acceptance.get("per_depth", []))
        result.drafts = int(acceptance.get("drafts", 0))
        result.acceptance_rate = data.get("acceptance_rate")
        result.draft_tokens = data.get("draft_tokens", 0)
        result.accepted_tokens = data.get("accepted_tokens", 0)
        result.seconds = sum(r["seconds"] for r in data["rows"])
        result.startup_seconds = float(data.get("startup_seconds", 0.0))
        result.wall_seconds = float(data.get("wall_seconds", 0.0))
        interpreter = data.get("interpreter") or {}
        result.interpreter_seconds = float(interpreter["seconds"]) if "seconds" in interpreter else None
        if leg.diagnostic and not leg.equal_by_arithmetic(default_tp):
            # tokens reported, only its negative control gates
            logprob_verdict(result, leg, teacher["rows"], data["rows"], require_bitwise, long_context, default_tp)
            result.attention = data.get("attention", {})
            result.status = "failed" if result.mismatches else "passed"
            results.append(result)
            continue
        result.mismatches += notes
        if leg.speculative:
            if teacher_name not in reference_leg:
                reference_leg[teacher_name] = tokens
                result.cross_leg_exact = f"{n_prompts}/{n_prompts} (reference)"
            else:
                equal_x, notes_x = compare(reference_leg[teacher_name], tokens, "cross-leg")
                result.cross_leg_exact = f"{equal_x}/{n_prompts}"
                result.mismatches += notes_x
            logprob_verdict(result, leg, teacher["rows"], data["rows"], require_bitwise, long_context, default_tp)
        zero = sum(1 for r in data["rows"] if r["cached_tokens"] == 0)
        result.cached_tokens_zero = f"{zero}/{n_prompts}"
        if zero != n_prompts:
            result.mismatches.append(f"cached tokens: {n_prompts - zero} prompt(s) reused cached tokens")
        result.attention = data.get("attention", {})
        emulated = False
        if leg.graph:
            result.graphs = data.get("graphs", {})
            result.mismatches += check_graph_accounting(result.graphs, expectation)
            emulated = graph_leg_is_emulated(result.graphs)
        result.status = "failed" if result.mismatches else (PASSED_EMULATED_GRAPHS if emulated else "passed")
        results.append(result)
    return results
