"""``scripts.device.moe_invariance_check`` on CPU (bad command lines:
tests/test_tool_usage_errors.py): the smoke run's table (every row count with both forms, the rows
form equal to one-row calls), the Laguna-S TP4 per-rank INT4 shapes it would run on XPU, and a
negative control: an experts function whose result depends on the rows of the call is reported NOT
row-invariant plain and row-invariant in the rows form."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from scripts.device import moe_invariance_check as mc
from tests.tool_run import run_module


def _run(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return run_module("scripts.device.moe_invariance_check", *argv, timeout=timeout)


def test_laguna_s_tp4_shapes() -> None:
    s = mc.SHAPES["laguna-s-tp4"]
    assert (s.experts, s.top_k, s.hidden, s.inter, s.group) == (256, 10, 3072, 256, 32)
    assert mc.int4_shapes(s) == {
        "w13": (256, 512, 1536),  # N=512, K=3072
        "w13_scales": (256, 512, 96),
        "w2": (256, 3072, 128),  # N=3072, K=256
        "w2_scales": (256, 3072, 8),
    }


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("moeinv") / "rows.json"
    proc = _run("--device", "cpu", "--shapes", "small", "--trials", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())["rows"]


def test_smoke_table(smoke) -> None:
    stdout, rows = smoke
    assert [(r["rows"], r["form"]) for r in rows] == [(m, f) for m in (1, 8, 12) for f in ("plain", "rows")]
    for r in rows:
        assert r["compared"] == 2 * r["rows"]
    for r in rows:
        if r["form"] == "rows":
            assert r["equal"] == r["compared"] and r["verdict"] == "row-invariant"
            assert r["experts_read"] == r["rows"] * 4 and r["repeat_equal"] is None
        else:
            assert r["experts_read"] <= min(16, r["rows"] * 4)
    header = next(ln for ln in stdout.splitlines() if ln.startswith("M "))
    for col in ("form", "rows compared", "rows bitwise equal", "verdict", "experts read", "plain repeat equal", "ms"):
        assert col in header
    assert "a smoke test of this script, not a measurement of the XPU kernel" in stdout
    assert "rows form: " in stdout


def test_negative_control_m_dependent_experts() -> None:
    """A stand-in whose rows depend on how many rows the call has (the modelled policy change of the
    grouped GEMM: K in one pass for one row, two halves for more): plain fails, rows passes."""
    torch = pytest.importorskip("torch")
    s = mc.SHAPES["small"]
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(s.hidden, s.hidden, generator=gen).to(torch.bfloat16)
    F = torch.nn.functional

    def apply(x: Any, topk_weights: Any, topk_ids: Any) -> Any:
        if x.shape[0] == 1:
            return F.linear(x, w)
        k = s.hidden // 2
        return F.linear(x[:, :k], w[:, :k]) + F.linear(x[:, k:], w[:, k:])

    per_row, _ = mc.series_form()
    bench = mc.Bench(torch, "cpu", s, 2, apply)
    plain, rows = bench.run(8, "plain", per_row), bench.run(8, "rows", per_row)
    assert plain.verdict == "NOT row-invariant" and plain.equal < plain.compared
    assert rows.verdict == "row-invariant" and rows.equal == rows.compared == 16


def test_the_rows_form_calls_the_experts_with_quant_method_apply_keywords() -> None:
    """The series' ``experts_per_row`` (when vLLM with the series is importable) and this script's
    loop call ``apply_one(x=..., topk_weights=..., topk_ids=...)``; the script's experts take those
    keywords (a positional-only stand-in made the day-one self-test fail in the CPU runtime)."""
    torch = pytest.importorskip("torch")
    per_row, _ = mc.series_form()
    seen: list[tuple[int, int, int]] = []

    def apply_one(*, x: Any, topk_weights: Any, topk_ids: Any) -> Any:
        seen.append((x.shape[0], topk_weights.shape[0], topk_ids.shape[0]))
        return x

    x, weights, ids = torch.zeros(3, 4), torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.int32)
    assert len(per_row(apply_one, x, weights, ids)) == 3 and seen == [(1, 1, 1)] * 3
    experts = mc.cpu_experts(torch, mc.SHAPES["small"])
    x = torch.zeros(2, mc.SHAPES["small"].hidden, dtype=torch.bfloat16)
    assert experts(x=x, topk_weights=torch.ones(2, 1), topk_ids=torch.zeros(2, 1, dtype=torch.int64)).shape == x.shape
