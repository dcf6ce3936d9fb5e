"""Throughput per row and summary statistics over rows (pure functions).

The headline metric is tokens per second over output tokens ``1..W`` (``W = 100``) counted from
the first streamed token (TTFT), i.e. over the span ``t[W-1] - t[0]``:

* conventional: ``(W - 1) / span`` (``W`` tokens have ``W - 1`` intervals);
* legacy: ``W / span`` (``W`` events over ``W - 1`` intervals). For ``W = 100`` this is
  ``conventional / 0.99``; the reference records carry the legacy value.

The headline of a leg is the median over its rows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scripts.errors import ToolError


def window_span_s(token_times_s: Sequence[float], window: int) -> float:
    """Seconds from output token 1 to output token ``window``."""
    if window < 2:
        raise ToolError(f"throughput window must be >= 2 tokens, got {window}")
    if len(token_times_s) < window:
        raise ToolError(f"row has {len(token_times_s)} output tokens, window needs {window}")
    span = token_times_s[window - 1] - token_times_s[0]
    if not span > 0:
        raise ToolError(f"tokens 1..{window} arrived in zero time (span {span!r} s)")
    return span


def tok_s_conventional(token_times_s: Sequence[float], window: int = 100) -> float:
    return (window - 1) / window_span_s(token_times_s, window)


def tok_s_legacy(token_times_s: Sequence[float], window: int = 100) -> float:
    return window / window_span_s(token_times_s, window)


def tok_s_full_after_ttft(token_times_s: Sequence[float]) -> float:
    """All output tokens after TTFT, legacy convention (n events over the n-1 intervals)."""
    n = len(token_times_s)
    return tok_s_legacy(token_times_s, n)


def tok_s_wall_full(token_times_s: Sequence[float]) -> float:
    """All output tokens over the wall time from sending the request to the last token."""
    if not token_times_s or not token_times_s[-1] > 0:
        raise ToolError("row has no output tokens or a non-positive last-token time")
    return len(token_times_s) / token_times_s[-1]


def p10(values: Sequence[float]) -> float:
    """10th percentile, linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ToolError("p10 of no values")
    ordered = sorted(values)
    position = 0.1 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    median: float
    p10: float
    mean: float
    stdev: float
    """Sample standard deviation (n - 1); 0.0 for a single row."""
    n: int

    def to_json(self) -> dict[str, float | int]:
        return {
            "median": self.median,
            "p10": self.p10,
            "mean": self.mean,
            "stdev": self.stdev,
            "n": self.n,
        }


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ToolError("no rows to summarize")
    return Summary(
        median=statistics.median(values),
        p10=p10(values),
        mean=statistics.fmean(values),
        stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
        n=len(values),
    )


def pct_change(new: float, old: float) -> float:
    """(new - old) / old * 100, the formula the reference records' pair deltas use."""
    return (new - old) / old * 100
