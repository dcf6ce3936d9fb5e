"""Throughput per row and summary statistics: golden values computed by hand."""

from __future__ import annotations

import pytest

from scripts.errors import ToolError
from scripts.measure import metrics


def evenly(n: int, step: float, ttft: float = 0.5) -> list[float]:
    return [ttft + i * step for i in range(n)]


def test_window_100_conventional_and_legacy() -> None:
    # 100 tokens 10 ms apart: 99 intervals span 0.99 s.
    times = evenly(100, 0.01)
    assert metrics.tok_s_conventional(times, 100) == pytest.approx(100.0, rel=1e-12)
    # legacy counts 100 events over the same 0.99 s
    assert metrics.tok_s_legacy(times, 100) == pytest.approx(100 / 0.99, rel=1e-12)
    assert metrics.tok_s_legacy(times, 100) * 0.99 == pytest.approx(100.0, rel=1e-12)


def test_window_uses_tokens_1_to_w_only() -> None:
    # tokens after the window (slow tail) and the TTFT itself do not count
    times = evenly(100, 0.01, ttft=7.0) + [100.0, 200.0]
    assert metrics.tok_s_conventional(times, 100) == pytest.approx(100.0, rel=1e-12)
    assert metrics.tok_s_conventional([0.0, 0.5, 1.0, 1.5], 4) == pytest.approx(2.0)
    assert metrics.tok_s_legacy([0.0, 0.5, 1.0, 1.5], 4) == pytest.approx(8 / 3)


def test_chunked_arrivals_share_a_timestamp() -> None:
    # speculative decoding streams several tokens per chunk: 4 tokens at t=1.0, 4 at t=1.2
    times = [1.0] * 4 + [1.2] * 4
    assert metrics.tok_s_conventional(times, 8) == pytest.approx(7 / 0.2)


@pytest.mark.parametrize(
    ("times", "window", "fragment"),
    [
        ([0.0, 0.1], 3, "window needs 3"),
        ([1.0, 1.0, 1.0], 3, "zero time"),
        ([0.0, 1.0], 1, ">= 2"),
    ],
)
def test_window_errors(times: list[float], window: int, fragment: str) -> None:
    with pytest.raises(ToolError, match=fragment):
        metrics.tok_s_conventional(times, window)


def test_full_and_wall_rates() -> None:
    times = [2.0, 2.5, 3.0, 4.0]  # 4 tokens, first after 2 s, last at 4 s
    assert metrics.tok_s_full_after_ttft(times) == pytest.approx(4 / 2.0)
    assert metrics.tok_s_wall_full(times) == pytest.approx(4 / 4.0)


def test_summary_by_hand() -> None:
    values = [20 / 3, 40 / 3, 20.0]
    summary = metrics.summarize(values)
    assert summary.median == pytest.approx(40 / 3)
    # p10: position 0.1 * 2 = 0.2 between 20/3 and 40/3
    assert summary.p10 == pytest.approx(20 / 3 + 0.2 * 20 / 3)
    assert summary.mean == pytest.approx(40 / 3)
    # deviations 0, -20/3, +20/3 -> sample variance (800/9)/2 -> stdev 20/3
    assert summary.stdev == pytest.approx(20 / 3)
    assert summary.n == 3


def test_p10_matches_numpy_linear_definition() -> None:
    # 13 rows 1..13: position 1.2 -> 2 + 0.2 = 2.2
    assert metrics.p10([float(v) for v in range(13, 0, -1)]) == pytest.approx(2.2)
    assert metrics.p10([5.0]) == 5.0


def test_percent_formulas() -> None:
    assert metrics.pct_change(110.0, 100.0) == pytest.approx(10.0)
