"""Raw-row and record data shapes, and the small parsers they need.

A *row* is one streamed request as the driver saw it; rows are the only input of the analyzer.
Legs are named ``A1``, ``B1``, ``B2``, ``A2`` (run in that order) plus ``teacher`` (no
speculation). Raw files are JSON Lines, one row per line, written in request order.
"""

from __future__ import annotations

import hashlib
import json
import re
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from scripts.errors import ToolError
from scripts.typed_data import ShapeError, build, read_jsonl

SCHEMA_VERSION = 2
"""Version of the record layout written by this package. The reference records (no
``schema_version`` field) are version 1; version 2 keeps every version-1 field and adds
``schema_version``, ``metric_conventional``, ``starts_conventional``, ``legs``, ``config``,
``gates``, ``artifacts``, ``speculative`` and ``treatment`` (always)."""

LEG_ORDER = ("A1", "B1", "B2", "A2")
CONTROL_LEGS = ("A1", "A2")
CANDIDATE_LEGS = ("B1", "B2")
PAIRS = (("B1", "A1"), ("B2", "A2"))
TEACHER = "teacher"
RowKind = Literal["normal", "long", "rollover"]
ROW_KINDS: tuple[str, ...] = typing.get_args(RowKind)

_FRACTION = re.compile(r"^(\d+)/(\d+)$")


def pair_name(candidate: str, control: str) -> str:
    return f"{candidate}_vs_{control}"


def parse_fraction(text: object, where: str) -> tuple[int, int]:
    """``"12/13"`` -> ``(12, 13)``; anything else is an error naming ``where``."""
    if not isinstance(text, str):
        raise ToolError(f"{where}: expected a 'k/n' string, got {text!r}")
    match = _FRACTION.match(text)
    if match is None:
        raise ToolError(f"{where}: expected a 'k/n' string, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def fraction(numerator: int, denominator: int) -> str:
    return f"{numerator}/{denominator}"


@dataclass(frozen=True)
class SpecCounters:
    """Cumulative speculative-decoding counters scraped from ``/metrics``."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted_tokens - earlier.accepted_tokens,
        )


@dataclass
class Row:
    """One request of one leg, exactly as measured (no derived numbers)."""

    leg: str
    index: int
    prompt_id: str
    kind: RowKind
    prompt_sha256: str
    prompt_tokens: int | None
    max_tokens: int
    token_times_s: list[float]
    """Arrival time of every output token, seconds after the request was sent (tokens that
    arrive in one streamed chunk share its time)."""
    token_ids: list[int]
    finish_reason: str | None
    cached_tokens: int | None
    spec_before: SpecCounters | None = None
    spec_after: SpecCounters | None = None
    sent_unix: float = 0.0
    requests_before: int | None = None
    """Requests the server had finished (``/metrics``) when this row was sent: ``index`` for
    every row of a fresh server means no warm-up generation, no retry and one active request."""
    error: str | None = None
    chunks: int = 0

    @property
    def spec_delta(self) -> SpecCounters | None:
        if self.spec_before is None or self.spec_after is None:
            return None
        return self.spec_after.minus(self.spec_before)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Any, where: str) -> Row:
        """A raw row as :func:`dump_rows` writes it: every field typed (:mod:`scripts.typed_data`),
        unknown ones refused, as many token times as token ids."""
        row = build(Row, data, where)
        if len(row.token_times_s) != len(row.token_ids):
            problem = f"{len(row.token_times_s)} token times but {len(row.token_ids)} token ids"
            raise ShapeError(where, "token_times_s", problem)
        return row


def dump_rows(rows: list[Row], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row.to_json(), sort_keys=True) + "\n")


def load_rows(path: Path) -> list[Row]:
    """A raw-rows file (``rows-<leg>.jsonl``), one :class:`Row` a line; a line of the wrong shape
    is one line naming ``file:line`` and the field."""
    return read_jsonl(path, Row.from_json, "raw rows")


def dump_json(data: object, path: Path) -> None:
    """Deterministic JSON (sorted keys, fixed indent, trailing newline) so hashes are stable."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class AnalysisConfig:
    """What the analyzer needs besides rows; stored in the run manifest and the record."""

    window: int = 100
    num_speculative_tokens: int | None = None
    rollover_at: int | None = None
    legs: dict[str, str] = field(default_factory=dict)
    """Leg -> start label, e.g. ``{"A1": "A1_eager", "B1": "B1_graph", ...}``."""

    def start_key(self, leg: str) -> str:
        return self.legs.get(leg, leg)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Any, where: str = "analysis config", path: str = "") -> AnalysisConfig:
        """The config as stored in a run manifest (``run.json`` ``config``) or a record: every
        field typed, unknown ones refused."""
        return build(AnalysisConfig, data, where, path)
