"""Speculative-decoding acceptance per draft depth, from vLLM's own spec-decode counters.

vLLM 0.32.0 counts, per engine (``vllm/v1/spec_decode/metrics.py``; read in process with
``LLM.get_metrics()``, ``vllm/v1/metrics/reader.py``):

* ``vllm:spec_decode_num_drafts``: verify steps that carried drafted tokens;
* ``vllm:spec_decode_num_draft_tokens``: drafted tokens (drafts x speculative tokens);
* ``vllm:spec_decode_num_accepted_tokens``: drafted tokens the target accepted;
* ``vllm:spec_decode_num_accepted_tokens_per_pos``: a ``Vector``, ``values[i]`` = drafts whose
  token at depth ``i + 1`` was accepted (a depth is accepted only with every depth before it).

:func:`from_metrics` turns them into accepted tokens per depth 1..N and an acceptance rate;
:func:`format_line` writes the one-line per-leg report. Metric objects are duck-typed (``name``
and ``value`` or ``values``), so nothing here imports vLLM.

``python -m scripts.matrix.acceptance --tiny DIR`` measures it on one matrix leg; every matrix
leg reports it too (``scripts.matrix.engine``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scripts.errors import ToolError

__all__ = ["SpecAcceptance", "SpecAcceptanceError", "format_line", "from_metrics"]

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
DEPTHS = 7  # DFlash M8: 7 drafted tokens per verify step


class SpecAcceptanceError(ToolError):
    """The counters are missing or do not add up."""


@dataclass(frozen=True)
class SpecAcceptance:
    """vLLM's spec-decode counters of one run."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_depth: tuple[int, ...]  # accepted tokens at depth 1, 2, ... (index 0 = depth 1)

    @property
    def rate(self) -> float | None:
        """Accepted / drafted tokens (None: nothing drafted)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def depth_rates(self) -> tuple[float, ...]:
        """Share of drafts accepted at each depth (unconditional)."""
        return tuple(n / self.drafts for n in self.per_depth) if self.drafts else ()

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per verify step: 1 (the target's own) + accepted drafted tokens."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    def problems(self) -> list[str]:
        """What does not add up (empty: consistent)."""
        notes = []
        if sum(self.per_depth) != self.accepted:
            notes.append(f"per-depth counts sum to {sum(self.per_depth)}, accepted is {self.accepted}")
        if any(b > a for a, b in zip(self.per_depth, self.per_depth[1:])):
            notes.append(f"per-depth counts increase with depth: {list(self.per_depth)}")
        if self.per_depth and self.per_depth[0] > self.drafts:
            notes.append(f"{self.per_depth[0]} accepted at depth 1 in {self.drafts} drafts")
        if self.draft_tokens != self.drafts * len(self.per_depth):
            notes.append(f"{self.draft_tokens} draft tokens != {self.drafts} drafts x {len(self.per_depth)} depths")
        return notes


def _name(metric: object) -> str:
    return str(getattr(metric, "name", "")).removesuffix("_total")


def from_metrics(metrics: Iterable[object], depths: int = DEPTHS) -> SpecAcceptance:
    """Sum the spec-decode counters over every label set (engine) in ``metrics``.

    Raises SpecAcceptanceError when a counter is missing, the per-depth vector is not ``depths``
    long, or the counts contradict each other (see :meth:`SpecAcceptance.problems`).
    """
    totals = {DRAFTS: 0, DRAFT_TOKENS: 0, ACCEPTED: 0}
    seen: set[str] = set()
    per_depth = [0] * depths
    for metric in metrics:
        name = _name(metric)
        if name in totals:
            totals[name] += int(getattr(metric, "value", 0))
            seen.add(name)
        elif name == PER_POS:
            values = [int(v) for v in getattr(metric, "values", [])]
            if len(values) != depths:
                raise SpecAcceptanceError(f"{PER_POS} has {len(values)} positions, expected {depths}")
            per_depth = [a + b for a, b in zip(per_depth, values)]
            seen.add(name)
    missing = sorted({DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS} - seen)
    if missing:
        raise SpecAcceptanceError(f"spec-decode metrics missing: {', '.join(missing)} (disable_log_stats=False?)")
    result = SpecAcceptance(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], tuple(per_depth))
    problems = result.problems()
    if problems:
        raise SpecAcceptanceError("; ".join(problems))
    return result


def format_line(label: str, acc: SpecAcceptance) -> str:
    """One line: drafts, acceptance rate, mean accepted length and accepted tokens per depth."""
    rate = f"{acc.rate:.1%}" if acc.rate is not None else "-"
    length = f"{acc.mean_accepted_length:.2f}" if acc.mean_accepted_length is not None else "-"
    depths = " ".join(f"d{i}={n}" for i, n in enumerate(acc.per_depth, 1))
    return (
        f"{label}: {acc.drafts} drafts, accepted {acc.accepted}/{acc.draft_tokens} = {rate}, "
        f"mean length {length}; accepted per depth {depths}"
    )
