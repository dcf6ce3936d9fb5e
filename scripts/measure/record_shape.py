"""The declared shape of a record file (version 1: the reference records; version 2: what
:func:`scripts.measure.record.build_record` writes), checked by :mod:`scripts.typed_data` before
``verify-record`` derives anything: a wrong type, a missing or an unknown field is one line naming
the field. Sections whose keys vary (``graph``, ``audits``, ``treatment``) are checked as objects;
the relations between values are :mod:`scripts.measure.verify_record`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scripts.measure.gates import Gates
from scripts.measure.record import SUMMARY_SUFFIX
from scripts.measure.schema import SCHEMA_VERSION, AnalysisConfig
from scripts.typed_data import ShapeError, check

Scalar = str | int | float | bool | None


@dataclass(kw_only=True)
class RecordSection:
    submitted_value_policy: str
    candidate_lower_start_tok_s: float
    prior_approved_tok_s: float | None
    prior_approved_id: str | None
    delta_tok_s: float | None
    delta_pct: float | None
    multiple: float | None
    strict_practical_floor_tok_s: float | None = None


@dataclass(kw_only=True)
class Pair:
    row_wins: str
    headline_delta_pct: float | None = None
    median_paired_delta_pct: float
    aggregate_cycle_saving_ms: float | None = None
    acceptance_rate_delta: float | None = None
    passed: bool


@dataclass(kw_only=True)
class SubmissionSummary:
    tok_s_out: float
    tok_s_out_p10: float
    tok_s_out_mean: float
    tok_s_out_stdev: float
    tok_s_full_after_ttft_median: float
    tok_s_wall_full_median: float
    ttft_ms_median: float
    draft_cycles: int | None = None
    draft_tokens: int | None = None
    accepted_draft_tokens: int | None = None
    draft_acceptance_rate: float | None = None


@dataclass(kw_only=True)
class Localmaxxing:
    submission_status: str
    id: str | None
    queue_path: str | None
    response_path: str | None
    http_status: int | None
    submitted_at_utc: str | None


@dataclass(kw_only=True)
class Leg:
    start_key: str
    rows: int
    tok_s_legacy: dict[str, float]
    tok_s_conventional: dict[str, float]
    cycle_ms: float | None
    draft_cycles: int | None
    draft_tokens: int | None
    accepted_draft_tokens: int | None
    draft_acceptance_rate: float | None


@dataclass(kw_only=True)
class RecordV1:
    """A reference record (no ``schema_version``)."""

    schema: str
    date: str
    status: str
    source: dict[str, str | None]
    run_root: str
    metric: str
    starts: dict[str, float]
    record: RecordSection
    pairs: dict[str, Pair]
    quality: dict[str, str | bool]
    graph: dict[str, Any]
    audits: dict[str, Any]
    sha256: dict[str, str]
    localmaxxing: Localmaxxing
    treatment: dict[str, Scalar] | None = None
    recipe: dict[str, Scalar] | None = None
    gates: Gates | None = None
    """Thresholds it was judged with (version 1: optional, else ``gates.toml``'s)."""


@dataclass(kw_only=True)
class RecordV2(RecordV1):
    """Every version-1 field plus the version-2 additions (``treatment`` always)."""

    schema_version: int
    metric_conventional: str
    starts_conventional: dict[str, float]
    treatment: dict[str, Scalar] | None
    speculative: dict[str, Any] | None
    legs: dict[str, Leg]
    config: AnalysisConfig
    gates: Gates
    artifacts: dict[str, str]
    runtime: dict[str, Scalar] | None = None
    """On CPU: what stands in (``scripts.cpu_stand_in.this_runtime``: ``mode``, ``line``, ...);
    optional, so records written before it still read."""


SHAPES: dict[int, type[RecordV1]] = {1: RecordV1, SCHEMA_VERSION: RecordV2}


def check_record(record: Any, where: str) -> None:
    """Raise :class:`ShapeError` on the first field of ``record`` that does not have its shape
    (``where``: the file, for the message). The record itself is not changed."""
    if not isinstance(record, dict):
        raise ShapeError(where, "", "a record is a JSON object")
    version = record.get("schema_version", 1)
    shape = SHAPES.get(version) if type(version) is int else None
    if shape is None:
        known = ", ".join(str(v) for v in SHAPES)
        raise ShapeError(where, "schema_version", f"unknown schema version {version!r} (this tool reads {known})")
    summaries = {key for key in record if isinstance(key, str) and key.endswith(SUMMARY_SUFFIX)}
    check({k: v for k, v in record.items() if k not in summaries}, shape, where)
    for key in sorted(summaries):
        check(record[key], SubmissionSummary, where, key)
    if record.get("gates") is not None:
        Gates.from_json(record["gates"], where, "gates")  # the gates' own bounds
