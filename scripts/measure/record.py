"""Assemble a record file (reference-record layout + version-2 additions) from an analysis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scripts.measure.gates import Gates
from scripts.measure.schema import CANDIDATE_LEGS, LEG_ORDER, SCHEMA_VERSION

DEFAULT_SCHEMA_NAME = "vllm-xpu-laguna-crossover-record"
SUMMARY_SUFFIX = "_submission_summary"
FIXED_DRAFT_METHODS = ("dflash", "eagle", "eagle3", "draft_model", "mtp")
"""Methods that always propose ``num_speculative_tokens`` tokens per cycle (ngram may propose
fewer)."""


@dataclass(frozen=True)
class Prior:
    tok_s: float
    id: str | None


@dataclass(frozen=True)
class RecordMeta:
    """Everything in a record that is not derived from raw rows."""

    schema: str
    date: str
    run_root: str
    source: dict[str, str | None]
    treatment: dict[str, Any]
    speculative: dict[str, Any] | None
    artifacts: dict[str, str]
    sha256: dict[str, str]
    prior: Prior | None = None
    graph: dict[str, Any] | None = None
    recipe: dict[str, str] | None = None
    """``crossover --recipe``: the recipe's path and the sha256 of its YAML and env file (None: the
    servers' options came from ``--server-args``)."""
    runtime: dict[str, Any] | None = None
    """On CPU: what the runtime is, which parts are the release's own and which stand in
    (:func:`scripts.cpu_stand_in.this_runtime`, its ``line`` among them); None elsewhere. A record
    without it has no ``runtime`` key."""


def metric_name(window: int) -> str:
    return f"median_tok_s_1_{window}_after_ttft"


def summary_key(leg: str) -> str:
    return f"{leg.lower()}{SUMMARY_SUFFIX}"


def record_section(candidate: float, prior: Prior | None, gates: Gates) -> dict[str, Any]:
    section: dict[str, Any] = {
        "submitted_value_policy": "lower of two candidate starts",
        "candidate_lower_start_tok_s": candidate,
        "prior_approved_tok_s": None,
        "prior_approved_id": None,
        "delta_tok_s": None,
        "delta_pct": None,
        "multiple": None,
        "strict_practical_floor_tok_s": None,
    }
    if prior is not None:
        section.update(
            prior_approved_tok_s=prior.tok_s,
            prior_approved_id=prior.id,
            delta_tok_s=candidate - prior.tok_s,
            delta_pct=(candidate / prior.tok_s - 1) * 100,
            multiple=candidate / prior.tok_s,
            strict_practical_floor_tok_s=gates.practical_floor(prior.tok_s),
        )
    return section


def disposition(analysis: dict[str, Any], prior: Prior | None, gates: Gates) -> list[str]:
    """Reasons the run is not a record candidate (empty: it is one)."""
    reasons = list(analysis["failing_gates"])
    value = analysis["record_value"]["tok_s"]
    if prior is not None and not value > gates.practical_floor(prior.tok_s):
        reasons.append("below_strict_practical_floor")
    return reasons


def empty_graph() -> dict[str, Any]:
    """Graph facts are reported by the XPU graph patches; on other runs they are not measured."""
    return {
        "measured": False,
        "mode": None,
        "cudagraph_mode": None,
        "capture_sizes": [],
        "max_capture_size": None,
        "graphs_per_rank": None,
        "eager_breaks_per_rank": None,
    }


def build_record(analysis: dict[str, Any], meta: RecordMeta) -> dict[str, Any]:
    gates = Gates.from_json(analysis["gates"])
    window = analysis["config"]["window"]
    labels = analysis["config"]["legs"]
    legs = analysis["legs"]
    key = {leg: labels.get(leg, leg) for leg in LEG_ORDER}
    lower = analysis["record_value"]["leg"]
    assert lower in CANDIDATE_LEGS
    reasons = disposition(analysis, meta.prior, gates)
    lower_stats = legs[lower]
    summary = {
        "tok_s_out": lower_stats["tok_s_legacy"]["median"],
        "tok_s_out_p10": lower_stats["tok_s_legacy"]["p10"],
        "tok_s_out_mean": lower_stats["tok_s_legacy"]["mean"],
        "tok_s_out_stdev": lower_stats["tok_s_legacy"]["stdev"],
        "tok_s_full_after_ttft_median": lower_stats["tok_s_full_after_ttft_median"],
        "tok_s_wall_full_median": lower_stats["tok_s_wall_full_median"],
        "ttft_ms_median": lower_stats["ttft_ms_median"],
        "draft_cycles": lower_stats["draft_cycles"],
        "draft_tokens": lower_stats["draft_tokens"],
        "accepted_draft_tokens": lower_stats["accepted_draft_tokens"],
        "draft_acceptance_rate": lower_stats["draft_acceptance_rate"],
    }
    pairs = {
        name: {k: v for k, v in pair.items() if k != "paired_delta_pct"} for name, pair in analysis["pairs"].items()
    }
    candidate = analysis["record_value"]["tok_s"]
    return {
        "schema": meta.schema,
        "schema_version": SCHEMA_VERSION,
        "date": meta.date,
        "status": "UNSUBMITTED_RECORD_CANDIDATE" if not reasons else "UNSUBMITTED_NOT_A_RECORD",
        "source": meta.source,
        "run_root": meta.run_root,
        "metric": metric_name(window),
        "metric_conventional": metric_name(window) + "_conventional",
        "starts": {key[leg]: legs[leg]["tok_s_legacy"]["median"] for leg in LEG_ORDER},
        "starts_conventional": {key[leg]: legs[leg]["tok_s_conventional"]["median"] for leg in LEG_ORDER},
        "record": record_section(candidate, meta.prior, gates),
        "pairs": pairs,
        "quality": analysis["quality"],
        "treatment": meta.treatment,
        "speculative": meta.speculative,
        "recipe": meta.recipe,
        **({"runtime": meta.runtime} if meta.runtime is not None else {}),
        "graph": meta.graph if meta.graph is not None else empty_graph(),
        "legs": {
            leg: {
                "start_key": key[leg],
                "rows": legs[leg]["rows"],
                "tok_s_legacy": legs[leg]["tok_s_legacy"],
                "tok_s_conventional": legs[leg]["tok_s_conventional"],
                "cycle_ms": legs[leg]["cycle_ms"],
                "draft_cycles": legs[leg]["draft_cycles"],
                "draft_tokens": legs[leg]["draft_tokens"],
                "accepted_draft_tokens": legs[leg]["accepted_draft_tokens"],
                "draft_acceptance_rate": legs[leg]["draft_acceptance_rate"],
            }
            for leg in LEG_ORDER
        },
        summary_key(lower): summary,
        "audits": {
            "committed_analyzer_disposition": "record_candidate" if not reasons else "not_a_record",
            "failing_gates": reasons,
            "formal_raw_performance_and_exactness": ("CLEAN" if not analysis["failing_gates"] else "FAILED"),
            "operational_identity_topology_idle_and_sealing": "NOT_AUDITED",
            "qualification_or_stopped_root_contamination": False,
        },
        "config": analysis["config"],
        "gates": analysis["gates"],
        "artifacts": meta.artifacts,
        "sha256": meta.sha256,
        "localmaxxing": {
            "submission_status": "NOT_SUBMITTED",
            "id": None,
            "queue_path": None,
            "response_path": None,
            "http_status": None,
            "submitted_at_utc": None,
        },
    }


def meta_from_record(record: dict[str, Any]) -> RecordMeta:
    """The non-derived inputs of an existing version-2 record (to rebuild it from raw rows)."""
    section = record["record"]
    prior = (
        Prior(section["prior_approved_tok_s"], section["prior_approved_id"])
        if section.get("prior_approved_tok_s") is not None
        else None
    )
    return RecordMeta(
        schema=record["schema"],
        date=record["date"],
        run_root=record["run_root"],
        source=record["source"],
        treatment=record["treatment"],
        speculative=record["speculative"],
        artifacts=record["artifacts"],
        sha256=record["sha256"],
        prior=prior,
        graph=record["graph"],
        recipe=record.get("recipe"),
        runtime=record.get("runtime"),
    )
