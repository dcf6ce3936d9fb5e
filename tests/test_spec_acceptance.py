"""scripts.spec_acceptance on synthetic metric objects shaped like vLLM 0.32.0's
(``vllm/v1/metrics/reader.py``: Counter with ``value``, Vector with ``values``); no vLLM needed."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from scripts import REPO_ROOT
from scripts.spec_acceptance import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    PER_POS,
    SpecAcceptance,
    SpecAcceptanceError,
    format_line,
    from_metrics,
)


@dataclass
class Counter:
    name: str
    value: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Vector:
    name: str
    values: list[int]
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Gauge:
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


def _snapshot(drafts: int, per_pos: list[int], engine: str = "0", suffix: str = "") -> list[Counter | Vector | Gauge]:
    return [
        Counter(DRAFTS + suffix, drafts, {"engine": engine}),
        Counter(DRAFT_TOKENS + suffix, drafts * len(per_pos), {"engine": engine}),
        Counter(ACCEPTED + suffix, sum(per_pos), {"engine": engine}),
        Vector(PER_POS, per_pos, {"engine": engine}),
        Gauge("vllm:kv_cache_usage_perc", 0.5),
        Counter("vllm:prompt_tokens", 999),
    ]


def test_per_depth_and_rates() -> None:
    acc = from_metrics(_snapshot(100, [90, 80, 70, 60, 50, 40, 30]))
    assert acc == SpecAcceptance(drafts=100, draft_tokens=700, accepted=420, per_depth=(90, 80, 70, 60, 50, 40, 30))
    assert acc.rate == pytest.approx(0.6)
    assert acc.mean_accepted_length == pytest.approx(5.2)
    assert acc.depth_rates == pytest.approx((0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3))


def test_sums_engines_and_accepts_total_suffix() -> None:
    metrics = _snapshot(10, [5, 2, 1, 0, 0, 0, 0], "0") + _snapshot(20, [10, 6, 3, 1, 1, 0, 0], "1", "_total")
    acc = from_metrics(metrics)
    assert (acc.drafts, acc.draft_tokens, acc.accepted) == (30, 210, 29)
    assert acc.per_depth == (15, 8, 4, 1, 1, 0, 0)


def test_missing_counters_are_an_error() -> None:
    with pytest.raises(SpecAcceptanceError, match="missing: vllm:spec_decode_num_accepted_tokens_per_pos"):
        from_metrics([m for m in _snapshot(3, [1] * 7) if m.name != PER_POS])
    with pytest.raises(SpecAcceptanceError, match="missing"):
        from_metrics([Gauge("vllm:kv_cache_usage_perc", 0.1)])


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        (_snapshot(10, [5, 4, 3]), "3 positions, expected 7"),
        (_snapshot(10, [1, 2, 0, 0, 0, 0, 0]), "increase with depth"),
        (_snapshot(3, [4, 0, 0, 0, 0, 0, 0]), "4 accepted at depth 1 in 3 drafts"),
    ],
)
def test_inconsistent_counts_are_an_error(metrics: list[Counter | Vector | Gauge], message: str) -> None:
    with pytest.raises(SpecAcceptanceError, match=message):
        from_metrics(metrics)


def test_accepted_total_must_match_the_vector() -> None:
    metrics = _snapshot(10, [5, 4, 3, 2, 1, 0, 0])
    metrics[2] = Counter(ACCEPTED, 99)
    with pytest.raises(SpecAcceptanceError, match="sum to 15, accepted is 99"):
        from_metrics(metrics)


def test_other_depth_count() -> None:
    assert from_metrics(_snapshot(4, [3, 1, 0]), depths=3).per_depth == (3, 1, 0)


def test_format_line() -> None:
    line = format_line("leg-a", from_metrics(_snapshot(100, [90, 80, 70, 60, 50, 40, 30])))
    assert line == (
        "leg-a: 100 drafts, accepted 420/700 = 60.0%, mean length 5.20; "
        "accepted per depth d1=90 d2=80 d3=70 d4=60 d5=50 d6=40 d7=30"
    )
    empty = SpecAcceptance(0, 0, 0, (0,) * 7)
    assert format_line("none", empty).startswith("none: 0 drafts, accepted 0/0 = -, mean length -;")


def test_module_imports_no_vllm() -> None:
    code = "import sys, scripts.spec_acceptance; assert 'vllm' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_cli_rejects_a_folder_without_models(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.matrix.acceptance", "--tiny", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: --tiny {tmp_path}: no target/ and draft/ model there"]
