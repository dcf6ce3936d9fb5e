"""``scripts.device.op_invariance_check`` on CPU with small shapes: its options (bad command lines:
tests/test_tool_usage_errors.py), the table
(every op has its rows; what cannot run here is an honest "not run" row with no counts), a
detected non-invariance (negative control) and the 4-rank all-reduce on gloo."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scripts.device import op_invariance_check as oc
from tests.tool_run import assert_help_names, run_module

KINDS = ("qkv_proj", "o_proj", "g_proj", "dense_mlp", "shared_expert", "router", "lm_head")


def _run(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return run_module("scripts.device.op_invariance_check", *argv, timeout=timeout)


def test_help() -> None:
    options = ("--device", "--shapes", "--rows", "--trials", "--ops", "--ranks", "--json", "--onednn-verbose")
    options += ("--series-options",)
    assert_help_names(_run("--help"), *options)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("opinv") / "rows.json"
    proc = _run("--device", "cpu", "--shapes", "small", "--ranks", "0", "--trials", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())["rows"]


def test_table_has_every_op(smoke) -> None:
    stdout, rows = smoke
    ops = {r["op"] for r in rows}
    want = {"qk_norm", "int4", "fused_moe", "all_reduce", "softplus", "sigmoid", "silu"}
    assert want | {f"linear:{k}" for k in KINDS} == ops
    header = next(ln for ln in stdout.splitlines() if ln.startswith("op "))
    for col in ("shape", "switch", "rows compared", "rows bitwise equal", "verdict", "change default?"):
        assert col in header
    assert {r["switch"] for r in rows if r["op"] == "qk_norm"} == {"off", "tokens", "pad"}
    assert {r["switch"] for r in rows if r["op"] == "linear:lm_head"} == {"plain", "rows", "batch_invariant"}
    assert {r["switch"] for r in rows if r["op"] == "all_reduce"} == {"dist.all_reduce", "gather+rank-sum"}
    assert "smoke test of this script, not Laguna-S measurements" in stdout


def test_not_run_rows_are_honest(smoke) -> None:
    stdout, rows = smoke
    skipped = [r for r in rows if r["compared"] is None]
    assert {r["op"] for r in skipped} == {"int4", "fused_moe", "all_reduce"} | {f"linear:{k}" for k in KINDS}
    for r in skipped:
        assert r["verdict"].startswith("not run: ") and r["equal"] is None and r["change"] == "-"
    linear = [r for r in skipped if r["op"].startswith("linear:")]
    assert {r["switch"] for r in linear} == {"batch_invariant"}
    assert all("needs a device" in r["verdict"] for r in linear)
    assert all(
        r["verdict"] == "not run: needs XPU (device is cpu)" for r in skipped if r["op"] in ("int4", "fused_moe")
    )
    assert all(r["verdict"] == "not run: --ranks 0" for r in skipped if r["op"] == "all_reduce")
    assert "passed" not in stdout.lower()
    for r in rows:
        if r["compared"] is not None:
            assert r["compared"] == 8 * 2 and 0 <= r["equal"] <= r["compared"]
            assert r["verdict"] in ("row-invariant", "NOT row-invariant")
    ran, total = len([r for r in rows if r["compared"] is not None]), len(rows)
    assert f"summary: {ran} of {total} rows measured, {total - ran} not run" in stdout


def test_forms_are_row_invariant_by_construction(smoke) -> None:
    """The per-row forms call the one-row op, so they must come out row-invariant; a checker bug
    (wrong reference, wrong slicing) would show here."""
    _, rows = smoke
    for r in rows:
        if r["switch"] in ("tokens", "rows") and r["compared"] is not None:
            assert r["verdict"] == "row-invariant", r


def test_detects_non_invariance(smoke) -> None:
    """Negative control: plain CPU softplus on 8x4 values (SIMD loop) vs 1x4 (scalar tail) differs,
    and the table says so; patch 0009's form does not."""
    _, rows = smoke
    softplus = {r["switch"]: r for r in rows if r["op"] == "softplus" and "[8,4]" in r["shape"]}
    assert softplus["off"]["verdict"] == "NOT row-invariant"
    assert softplus["off"]["change"] == "no: plain differs"
    assert softplus["apply"]["verdict"] == "row-invariant"


def test_all_reduce_on_four_gloo_ranks(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "rows.json"
    proc = _run("--device", "cpu", "--shapes", "small", "--ops", "all_reduce", "--trials", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["switch"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"dist.all_reduce", "gather+rank-sum"}
    for r in rows.values():
        assert r["compared"] == 8 and "ranks agree 1/1" in r["verdict"]
        assert r["shape"] == "[8,64] bf16 x 4 ranks"
    # the rank-order sum reduces each row alone, in a fixed order
    assert rows["gather+rank-sum"]["verdict"].startswith("row-invariant")


def test_series_form_follows_the_defaults() -> None:
    defaults = {"qk_norm": "pad", "linears": "router,lm_head", "linear_form": "none", "int4": "true"}
    assert oc.series_form("qk_norm", defaults, "xpu") == "pad"
    # unset form: batch_invariant on XPU, rows elsewhere (patch 0011's default)
    assert oc.series_form("linear:router", defaults, "xpu") == "batch_invariant"
    assert oc.series_form("linear:router", defaults, "cpu") == "rows"
    assert oc.series_form("linear:router", {**defaults, "linear_form": "rows"}, "xpu") == "rows"
    assert oc.series_form("linear:qkv_proj", defaults, "xpu") == "plain"
    assert oc.series_form("int4", {**defaults, "int4": "false"}, "xpu") == "off"
    assert oc.series_form("all_reduce", None, "xpu") == "dist.all_reduce"
    assert oc.series_form("qk_norm", None, "xpu") is None


def test_series_defaults_are_the_options_defaults_under_the_given_options() -> None:
    defaults, source = oc.series_defaults()
    assert defaults == {"qk_norm": "pad", "linears": "all", "linear_form": "none", "int4": "true"}
    assert "overlay/vllm/xpu_laguna/options.py" in source
    given = {"row_invariant_qk_norm": "tokens", "row_invariant_int4": False, "row_invariant_linear_form": "rows"}
    defaults, source = oc.series_defaults(given)
    assert defaults == {"qk_norm": "tokens", "linears": "all", "linear_form": "rows", "int4": "false"}
    assert "--series-options" in source
    assert oc.series_form("int4", defaults, "xpu") == "off"
    assert oc.series_form("linear:router", defaults, "xpu") == "rows"


def test_recommendation() -> None:
    rows = [
        oc.measured("qk_norm", "s", "off", (8, 5)),
        oc.measured("qk_norm", "s", "tokens", (8, 8)),
        oc.measured("qk_norm", "s", "pad", (8, 3)),
        oc.measured("all_reduce", "a", "dist.all_reduce", (8, 0)),
        oc.measured("all_reduce", "a", "gather+rank-sum", (8, 8)),
        oc.not_run("fused_moe", "m", "off", "needs XPU"),
    ]
    oc.recommend(rows, {"qk_norm": "pad", "linears": "all", "linear_form": "none", "int4": "1"}, "xpu")
    change = [r.change for r in rows]
    assert change[0] == "no: plain differs"
    assert change[1] == "YES: use tokens"
    assert change[2] == "YES: the series' form differs; use tokens"
    assert change[3] == "YES: the series' form differs (no switch in the series); use gather+rank-sum"
    assert change[4] == "YES: use gather+rank-sum"
    assert change[5] == "-"


def _ctx(trials: int = 2) -> oc.Ctx:
    torch = pytest.importorskip("torch")
    forms, _ = oc.load_forms()
    return oc.Ctx(torch, "cpu", trials, 8, oc.SHAPES["small"], forms)


def test_int4_check_with_a_cpu_stand_in_kernel() -> None:
    """The int4 rows' plumbing (weight/scale layout, per-row form) with a stand-in of
    int4_gemm_w4a16 whose accumulation order depends on M, as oneDNN's; the XPU op runs only on
    a device."""
    ctx = _ctx()
    t = ctx.torch
    calls: list[int] = []

    def fake(x, weight, bias, scales, zero, group, g_idx):  # type: ignore[no-untyped-def]
        k, n = x.shape[1], scales.shape[1]
        assert weight.dtype == t.int32 and weight.shape == (k // 8, n) and weight.stride(0) == 1
        assert scales.shape == (k // group, n) and zero.dtype == t.int8 and bias is None and g_idx is None
        calls.append(x.shape[0])
        w = scales.float().repeat_interleave(group, 0)
        xf = x.float()
        if x.shape[0] == 1:
            return xf @ w
        half = k // 2
        return xf[:, :half] @ w[:half] + xf[:, half:] @ w[half:]

    rows = oc.check_int4(ctx, gemm=fake)
    assert len(rows) == 2 * (len(oc.linear_shapes(ctx.s)) - 1)  # lm_head is BF16
    assert all(r.verdict == "row-invariant" for r in rows if r.switch == "rows")
    assert any(r.verdict == "NOT row-invariant" for r in rows if r.switch == "off")
    assert 1 in calls and 8 in calls


@pytest.mark.parametrize("cross_row", [False, True])
def test_fused_moe_check_with_a_cpu_stand_in(cross_row: bool) -> None:
    """The fused-MoE row's plumbing with a stand-in of XpuFusedMoe: row-local math is reported
    row-invariant; a stand-in that mixes rows (as a kernel whose tiles span rows could) is not."""
    ctx = _ctx()
    seen: dict[str, Any] = {}

    class FakeMoe:
        def __init__(self, w13, s13, b13, w2, s2, b2, top_k, activation, experts):  # type: ignore[no-untyped-def]
            seen.update(w13=tuple(w13.shape), w2=tuple(w2.shape), top_k=top_k, experts=experts)

        def apply(self, output, hidden_states, topk_weights, topk_ids):  # type: ignore[no-untyped-def]
            assert topk_ids.shape == (hidden_states.shape[0], ctx.s.top_k)
            out = hidden_states * topk_weights.sum(-1, keepdim=True).to(hidden_states.dtype)
            if cross_row:
                out = out + hidden_states.mean(0, keepdim=True)
            output.copy_(out)

    (row,) = oc.check_fused_moe(ctx, moe_cls=FakeMoe)
    s = ctx.s
    assert seen == {
        "w13": (s.local_experts, 2 * s.moe_inter, s.hidden // 2),
        "w2": (s.local_experts, s.hidden, s.moe_inter // 2),
        "top_k": s.top_k,
        "experts": s.local_experts,
    }
    assert row.compared == 16
    assert row.verdict == ("NOT row-invariant" if cross_row else "row-invariant")


def test_onednn_verbose_marks_each_case() -> None:
    """``--onednn-verbose`` sets ONEDNN_VERBOSE before torch loads and prints a ``== case`` line
    before each (op, shape, switch), so oneDNN's primitive lines can be attributed."""
    pytest.importorskip("torch")
    proc = _run(
        "--device", "cpu", "--shapes", "small", "--ops", "linear", "--ranks", "0", "--trials", "1", "--onednn-verbose"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== case linear:qkv_proj | qkv_proj full [8,64]x[64,256] | plain" in proc.stdout
    assert "== case linear:lm_head" in proc.stdout
