"""Per-op row invariance: each op of a Laguna verify step, 8 rows in one call vs 8 one-row calls.

Exact DFlash verify needs every op between attention calls to give row i of an M-row call the
bits the q=1 decode of that token gets (M=1). For each op at Laguna-S-2.1 TP 4 per-rank shapes
this runs one M-row call and M one-row calls (each on a fresh one-row tensor, as a decode has),
``--trials`` times with fresh random inputs, plain and in every row-invariant form the series
has, and prints one table row per (op, shape, switch): rows compared, rows bitwise equal
(``torch.equal``), verdict, and whether the series' default should change. An op that cannot
run here is one row "not run: <reason>"; nothing is reported for what did not run.

Ops: q/k RMSNorm over [M, heads, 128] views of the QKV output (vllm-xpu-kernels ``_C.rms_norm``
on XPU, vLLM's ``_C`` on CUDA, else a torch RMSNorm), switches off / tokens / pad; BF16 linears
(``F.linear``: qkv, o_proj, g_proj, dense MLP, shared expert, router gate, lm_head), forms
plain / rows / batch_invariant (upstream's batch-invariant Triton matmul on every call padded to
M rows, compared with itself at one row, as the series runs it for the q=1 decode too; needs an
importable vLLM and a device, Triton on CPU is only its interpreter); ``_xpu_C.int4_gemm_w4a16``
(group 32) off / rows; the XPU WNA16 fused MoE
(``vllm_xpu_kernels`` ``XpuFusedMoe``, 64 local experts, top-10); the TP all-reduce
(``dist.all_reduce`` vs all-gather + rank-order BF16 sum, needs ``--ranks`` processes: gloo on
CPU, one device each otherwise); softplus (gate), sigmoid (router), SiLU (MLPs), off / apply
(patch 0009's CPU padding; unchanged off CPU). The forms are the series' own
(overlay/vllm/xpu_laguna/row_invariant.py); the series' setting of each is
its option (``row_invariant_*``): the options' defaults (overlay/vllm/xpu_laguna/options.py)
under ``--series-options`` (the day-one run passes the recipe's).

Shapes (``--shapes laguna-s-tp4``), per rank at TP 4, from the Laguna-S-2.1 config (hidden 3072,
head_dim 128, 48 q heads on the 12 full and 72 on the 36 sliding layers, 8 KV heads, layer-0
dense intermediate 12288, shared-expert and expert intermediate 1024, 256 experts top-10,
vocab 100352, per-head gate; from a public config fixture, matching the reference lab's shape
notes: QKV 3072->2048/2816, O 1536/2304->3072, shared down 256->3072, EP4 64 local experts):
q/k norm rows 12/18 (q) and 2 (k) per token; qkv 3072->2048 and ->2816; o 1536/2304->3072;
g_proj 3072->12/18; dense gate/up 3072->3072, down 3072->3072; shared gate/up 3072->256, down
256->3072; router 3072->256 (replicated); lm_head 3072->25088; all-reduce [M, 3072];
elementwise [M, 12|18] softplus, [M, 256] sigmoid (fp32), [M, 3072|256] SiLU (bf16).
``--shapes small`` is a CPU smoke test of this script, not a measurement of Laguna shapes.

    python -m scripts.device.op_invariance_check                      # device run, all ops
    python -m scripts.device.op_invariance_check --ops linear --ranks 0 --onednn-verbose
    python -m scripts.device.op_invariance_check --device cpu --shapes small --ranks 0

``--onednn-verbose`` sets ``ONEDNN_VERBOSE=1`` before torch loads, so oneDNN prints one line per
primitive it creates and runs (its shape, e.g. ``8x3072:3072x2048``) under a ``== case`` line
naming the (op, shape, switch) that ran it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from scripts.device import _all_reduce_ranks as all_reduce_ranks
from scripts.device import _report as report
from scripts.series_options import options_argument

OPS = ("qk_norm", "linear", "int4", "fused_moe", "all_reduce", "elementwise")
NOT_RUN = "not run"
LINEAR_FORMS = ("plain", "rows", "batch_invariant")


@dataclass(frozen=True)
class Shapes:
    hidden: int
    head_dim: int
    q_heads: tuple[int, int]  # full, sliding layers, per rank
    kv_heads: int
    dense_inter: int  # per rank
    shared_inter: int  # per rank
    experts: int  # router outputs
    local_experts: int
    top_k: int
    moe_inter: int
    vocab: int  # per rank
    group: int = 32


SHAPES = {
    "laguna-s-tp4": Shapes(3072, 128, (12, 18), 2, 3072, 256, 256, 64, 10, 1024, 25088),
    "small": Shapes(64, 32, (4, 6), 2, 64, 32, 16, 4, 2, 32, 160),
}


@dataclass
class Row:
    op: str
    shape: str
    switch: str
    compared: int | None
    equal: int | None
    verdict: str
    change: str = "-"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_forms() -> tuple[ModuleType, str]:
    """The series' forms: the overlay file of this repository, else the installed vllm's."""
    from scripts.layout import Layout

    path = Layout().overlay / "vllm/xpu_laguna/row_invariant.py"
    if path.exists():
        return _load(path, "_vxl_row_forms"), str(path)
    module = importlib.import_module("vllm.xpu_laguna.row_invariant")
    return module, module.__name__


def series_defaults(given: Mapping[str, Any] | None = None) -> tuple[dict[str, str] | None, str]:
    """The row-invariant options the series runs with: ``given`` (``--series-options``) over the
    options' defaults; values as text (``none`` for an unset form)."""
    from scripts.series_options import DEFAULTS, OPTIONS_FILE

    values = {**DEFAULTS, **(given or {})}
    out = {
        key: "none" if values[f"row_invariant_{key}"] is None else str(values[f"row_invariant_{key}"]).lower()
        for key in ("qk_norm", "linears", "linear_form", "int4")
    }
    source = f"the options' defaults, overlay/{OPTIONS_FILE}"
    return out, source + (f", under --series-options {json.dumps(dict(given))}" if given else "")


# ------------------------------------------------------------------------------------ helpers


class Ctx:
    def __init__(self, torch: Any, device: str, trials: int, rows: int, shapes: Shapes, forms: ModuleType):
        self.torch, self.device, self.trials, self.rows, self.s, self.forms = torch, device, trials, rows, shapes, forms

    def randn(self, *shape: int, seed: int, dtype: Any = None, scale: float = 1.0) -> Any:
        t = self.torch
        x = t.randn(*shape, generator=t.Generator().manual_seed(seed)) * scale
        return x.to(dtype or t.bfloat16).to(self.device)

    def count(
        self, batch_fn: Callable[[Any], Any], one_fn: Callable[[Any], Any], make: Callable[[int], Any]
    ) -> tuple[int, int]:
        """(rows compared, rows equal): row i of batch_fn(x) vs one_fn(fresh copy of x[i:i+1])."""
        compared = equal = 0
        with self.torch.no_grad():
            for trial in range(self.trials):
                x = make(trial)
                out = batch_fn(x)
                for i in range(x.shape[0]):
                    ref = one_fn(x[i : i + 1].clone())
                    equal += bool(self.torch.equal(out[i], ref[0]))
                    compared += 1
        return compared, equal


def _verdict(compared: int, equal: int) -> str:
    return "row-invariant" if equal == compared else "NOT row-invariant"


def measured(op: str, shape: str, switch: str, counts: tuple[int, int]) -> Row:
    return Row(op, shape, switch, counts[0], counts[1], _verdict(*counts))


def not_run(op: str, shape: str, switch: str, reason: str) -> Row:
    return Row(op, shape, switch, None, None, f"{NOT_RUN}: {reason}")


def _guard(op: str, shape: str, switch: str, fn: Callable[[], tuple[int, int]]) -> Row:
    if os.environ.get("ONEDNN_VERBOSE"):  # attribute oneDNN's lines to the case that made them
        print(f"== case {op} | {shape} | {switch}", flush=True)
    try:
        return measured(op, shape, switch, fn())
    except Exception as e:  # noqa: BLE001 - one op's failure is that op's row
        return not_run(op, shape, switch, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")


def _kernel_module(name: str) -> str | None:
    try:
        importlib.import_module(name)
        return None
    except Exception as e:  # noqa: BLE001
        return f"{name} not importable ({type(e).__name__})"


# ----------------------------------------------------------------------------------- q/k norm


def rms_norm_impl(ctx: Ctx) -> tuple[Callable[[Any, Any], Any], str]:
    """vLLM's device RMSNorm kernel when importable, else a torch RMSNorm (fp32 math)."""
    t = ctx.torch
    module = {"xpu": "vllm_xpu_kernels._C", "cuda": "vllm._C"}.get(ctx.device)
    if module and _kernel_module(module) is None and hasattr(t.ops._C, "rms_norm"):

        def kernel(x: Any, w: Any) -> Any:
            out = t.empty(x.shape, dtype=x.dtype, device=x.device)
            t.ops._C.rms_norm(out, x, w, 1e-6)
            return out

        return kernel, f"{module} rms_norm"

    def native(x: Any, w: Any) -> Any:
        xf = x.float()
        return (xf * t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    return native, "torch (no device kernel)"


def check_qk_norm(ctx: Ctx) -> list[Row]:
    norm, impl = rms_norm_impl(ctx)
    s, d, f = ctx.s, ctx.s.head_dim, ctx.forms
    w = ctx.randn(d, seed=99)
    rows = []
    qf, qs = s.q_heads
    for label, q_heads, take in (
        (f"q full [{ctx.rows},{qf},{d}]", qf, "q"),
        (f"q sliding [{ctx.rows},{qs},{d}]", qs, "q"),
        (f"k [{ctx.rows},{s.kv_heads},{d}] (full)", qf, "k"),
    ):
        width = (q_heads + 2 * s.kv_heads) * d
        heads = q_heads if take == "q" else s.kv_heads
        start = 0 if take == "q" else q_heads * d

        def view(qkv: Any, start: int = start, heads: int = heads) -> Any:
            return qkv[:, start : start + heads * d].view(qkv.shape[0], heads, d)

        def plain(qkv: Any, view: Callable[[Any], Any] = view) -> Any:
            return norm(view(qkv), w)

        def make(trial: int, width: int = width) -> Any:
            return ctx.randn(ctx.rows, width, seed=trial)

        forms_by_switch = {
            "off": plain,
            "tokens": lambda qkv, view=view: f.per_row(lambda x: norm(x, w), view(qkv)),
            "pad": lambda qkv, view=view: f.norm_padded(lambda x: norm(x, w), view(qkv)),
        }
        for switch, fn in forms_by_switch.items():
            rows.append(
                _guard(
                    "qk_norm",
                    f"{label} {impl}",
                    switch,
                    lambda fn=fn, plain=plain, make=make: ctx.count(fn, plain, make),
                )
            )
    return rows


# ------------------------------------------------------------------------------------ linears


def linear_shapes(s: Shapes) -> list[tuple[str, str, int, int]]:
    """(kind, label, K, N) per rank."""
    qf, qs = s.q_heads
    d, kv = s.head_dim, 2 * s.kv_heads * s.head_dim
    return [
        ("qkv_proj", "full", s.hidden, qf * d + kv),
        ("qkv_proj", "sliding", s.hidden, qs * d + kv),
        ("o_proj", "full", qf * d, s.hidden),
        ("o_proj", "sliding", qs * d, s.hidden),
        ("g_proj", "full", s.hidden, qf),
        ("g_proj", "sliding", s.hidden, qs),
        ("dense_mlp", "gate/up", s.hidden, s.dense_inter),
        ("dense_mlp", "down", s.dense_inter, s.hidden),
        ("shared_expert", "gate/up", s.hidden, s.shared_inter),
        ("shared_expert", "down", s.shared_inter, s.hidden),
        ("router", "gate", s.hidden, s.experts),
        ("lm_head", "vocab shard", s.hidden, s.vocab),
    ]


def batch_invariant_linear(ctx: Ctx) -> tuple[Callable[[Any, Any], Any] | None, str | None]:
    """The series' ``batch_invariant`` form (every call padded to ``ctx.rows`` rows, upstream's
    ``linear_batch_invariant``), or why it cannot run here."""
    if ctx.device == "cpu":
        return None, "needs a device (Triton on CPU is its interpreter, not the device's code)"
    try:
        bi = importlib.import_module("vllm.model_executor.determinism.batch_invariant")
        allocation = importlib.import_module("vllm.triton_utils.allocation")
    except Exception as e:  # noqa: BLE001
        return None, f"vLLM's batch-invariant matmul not importable ({type(e).__name__})"
    pad = ctx.forms.PaddedRows(ctx.rows)

    def form(x: Any, w: Any) -> Any:
        allocation.set_triton_allocator(x.device)  # tensor descriptors (XPU)
        return pad(lambda rows: bi.linear_batch_invariant(rows, w), x)

    return form, None


def check_linears(ctx: Ctx) -> list[Row]:
    t, f = ctx.torch, ctx.forms
    F = t.nn.functional
    batch_invariant, why_not = batch_invariant_linear(ctx)
    rows = []
    for kind, label, k, n in linear_shapes(ctx.s):
        w = ctx.randn(n, k, seed=k * 7 + n, scale=k**-0.5)
        shape = f"{kind} {label} [{ctx.rows},{k}]x[{k},{n}]"

        def plain(x: Any, w: Any = w) -> Any:
            return F.linear(x, w)

        def make(trial: int, k: int = k) -> Any:
            return ctx.randn(ctx.rows, k, seed=100 + trial)

        # (batch form, one-row reference): plain and rows against the plain one-row GEMM (the q=1
        # decode's); batch_invariant against itself at one row (the series runs the decode in it).
        cases: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]] | None] = {
            "plain": (plain, plain),
            "rows": (lambda x, plain=plain: f.per_row(plain, x), plain),
            "batch_invariant": None,
        }
        if batch_invariant is not None:
            bi = lambda x, w=w: batch_invariant(x, w)  # noqa: E731
            cases["batch_invariant"] = (bi, bi)
        for switch, case in cases.items():
            if case is None:
                rows.append(not_run(f"linear:{kind}", shape, switch, why_not or "not available"))
                continue
            rows.append(
                _guard(
                    f"linear:{kind}",
                    shape,
                    switch,
                    lambda case=case, make=make: ctx.count(case[0], case[1], make),
                )
            )
    return rows


def _int4_op(ctx: Ctx) -> tuple[Callable[..., Any] | None, str | None]:
    """``torch.ops._xpu_C.int4_gemm_w4a16`` (vllm_xpu_kernels on XPU), or why not."""
    if ctx.device != "xpu":
        return None, f"needs XPU (device is {ctx.device})"
    reason = _kernel_module("vllm_xpu_kernels._xpu_C")
    if reason is None and not hasattr(ctx.torch.ops._xpu_C, "int4_gemm_w4a16"):
        reason = "torch.ops._xpu_C.int4_gemm_w4a16 not registered"
    return (None, reason) if reason else (ctx.torch.ops._xpu_C.int4_gemm_w4a16, None)


def check_int4(ctx: Ctx, gemm: Callable[..., Any] | None = None, reason: str | None = None) -> list[Row]:
    """``gemm`` has int4_gemm_w4a16's signature (x, weight [K/8, N] int32 in "ba" layout, bias,
    scales [K/group, N], zero points, group, g_idx); default: the XPU op."""
    t, f = ctx.torch, ctx.forms
    if gemm is None and reason is None:
        gemm, reason = _int4_op(ctx)
    rows = []
    for kind, label, k, n in linear_shapes(ctx.s):
        if kind == "lm_head":
            continue
        shape = f"{kind} {label} [{ctx.rows},{k}]x[{k},{n}] int4 g{ctx.s.group}"
        if reason or gemm is None:
            rows += [not_run("int4", shape, sw, reason or "no kernel") for sw in ("off", "rows")]
            continue
        gen = t.Generator().manual_seed(k + n)
        packed = t.randint(-(2**31), 2**31 - 1, (k // 8, n), generator=gen, dtype=t.int32)
        weight = packed.t().contiguous().t().to(ctx.device)  # the kernel's "ba" layout
        scales = ctx.randn(k // ctx.s.group, n, seed=n, scale=0.01)
        zero = t.tensor([8], dtype=t.int8).to(ctx.device)

        def plain(x: Any, weight: Any = weight, scales: Any = scales, zero: Any = zero) -> Any:
            return gemm(x, weight, None, scales, zero, ctx.s.group, None)

        def make(trial: int, k: int = k) -> Any:
            return ctx.randn(ctx.rows, k, seed=200 + trial)

        for switch, fn in {"off": plain, "rows": lambda x, plain=plain: f.per_row(plain, x)}.items():
            rows.append(_guard("int4", shape, switch, lambda fn=fn, plain=plain, make=make: ctx.count(fn, plain, make)))
    return rows


def check_fused_moe(ctx: Ctx, moe_cls: Any = None) -> list[Row]:
    """``moe_cls`` has vllm_xpu_kernels' ``XpuFusedMoe`` interface; default: that class (XPU)."""
    t, s = ctx.torch, ctx.s
    shape = f"E{s.local_experts} local top{s.top_k} [{ctx.rows},{s.hidden}] inter {s.moe_inter} int4 g{s.group}"
    if moe_cls is None:
        reason = None if ctx.device == "xpu" else f"needs XPU (device is {ctx.device})"
        reason = reason or _kernel_module("vllm_xpu_kernels.fused_moe_interface")
        if reason:
            return [not_run("fused_moe", shape, "off", reason)]
        moe_cls = importlib.import_module("vllm_xpu_kernels.fused_moe_interface").XpuFusedMoe

    def run() -> tuple[int, int]:
        e, h, i = s.local_experts, s.hidden, s.moe_inter
        gen = t.Generator().manual_seed(5)
        w13 = t.randint(0, 255, (e, 2 * i, h // 2), generator=gen, dtype=t.uint8).to(ctx.device)
        w2 = t.randint(0, 255, (e, h, i // 2), generator=gen, dtype=t.uint8).to(ctx.device)
        s13 = ctx.randn(e, 2 * i, h // s.group, seed=6, scale=0.01).abs()
        s2 = ctx.randn(e, h, i // s.group, seed=7, scale=0.01).abs()
        moe = moe_cls(w13, s13, None, w2, s2, None, s.top_k, "silu", e)

        def apply(x: Any, weights: Any, ids: Any) -> Any:
            out = t.empty_like(x)
            moe.apply(output=out, hidden_states=x, topk_weights=weights, topk_ids=ids)
            return out

        compared = equal = 0
        with t.no_grad():
            for trial in range(ctx.trials):
                logits = t.randn(ctx.rows, e, generator=t.Generator().manual_seed(300 + trial))
                weights, ids = (v.to(ctx.device) for v in t.topk(logits.sigmoid(), s.top_k, dim=-1))
                x = ctx.randn(ctx.rows, h, seed=400 + trial, scale=0.1)
                out = apply(x, weights, ids)
                for r in range(ctx.rows):
                    ref = apply(x[r : r + 1].clone(), weights[r : r + 1].clone(), ids[r : r + 1].clone())
                    equal += bool(t.equal(out[r], ref[0]))
                    compared += 1
        return compared, equal

    return [_guard("fused_moe", shape, "off", run)]


def check_elementwise(ctx: Ctx) -> list[Row]:
    t, f = ctx.torch, ctx.forms
    F = t.nn.functional
    s = ctx.s
    qf, qs = s.q_heads
    cases = [
        ("softplus", F.softplus, f"gate [{ctx.rows},{qf}] fp32", qf, t.float32, True),
        ("softplus", F.softplus, f"gate [{ctx.rows},{qs}] fp32", qs, t.float32, True),
        ("sigmoid", t.sigmoid, f"router [{ctx.rows},{s.experts}] fp32", s.experts, t.float32, True),
        ("silu", F.silu, f"dense [{ctx.rows},{s.dense_inter}] bf16", s.dense_inter, t.bfloat16, False),
        ("silu", F.silu, f"shared [{ctx.rows},{s.shared_inter}] bf16", s.shared_inter, t.bfloat16, False),
    ]
    rows = []
    for name, fn, shape, width, dtype, has_switch in cases:

        def make(trial: int, width: int = width, dtype: Any = dtype) -> Any:
            return ctx.randn(ctx.rows, width, seed=500 + trial, dtype=dtype, scale=4.0)

        switches = {"off": fn}
        if has_switch:  # patch 0009 applies the form to the decode call too
            switches["apply"] = lambda x, fn=fn: f.apply(fn, x)
        for switch, form in switches.items():
            rows.append(_guard(name, shape, switch, lambda form=form, make=make: ctx.count(form, form, make)))
    return rows


# --------------------------------------------------------------------------------- all-reduce


def check_all_reduce(ctx: Ctx, ranks: int, timeout: float) -> list[Row]:
    t = ctx.torch
    shape = f"[{ctx.rows},{ctx.s.hidden}] bf16 x {ranks} ranks"
    switches = ("dist.all_reduce", "gather+rank-sum")
    if ranks < 2:
        return [not_run("all_reduce", f"[{ctx.rows},{ctx.s.hidden}] bf16", sw, f"--ranks {ranks}") for sw in switches]
    if ctx.device != "cpu":
        count = getattr(t, ctx.device).device_count()
        if count < ranks:
            reason = f"needs {ranks} {ctx.device} devices, found {count}"
            return [not_run("all_reduce", shape, sw, reason) for sw in switches]
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        args = (ranks, all_reduce_ranks.free_port(), ctx.device, ctx.rows, ctx.s.hidden, ctx.trials, out)
        worker = all_reduce_ranks.all_reduce_worker
        workers = mp.start_processes(worker, args=args, nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not workers.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    return [not_run("all_reduce", shape, sw, f"timed out after {timeout:.0f} s") for sw in switches]
        except Exception as e:  # noqa: BLE001 - a rank's failure
            reason = f"rank failed: {str(e).strip().splitlines()[-1][:120]}"
            return [not_run("all_reduce", shape, sw, reason) for sw in switches]
        finally:  # timed out, failed or interrupted: every rank's group goes (no-op when they ended)
            all_reduce_ranks.stop_ranks(workers.processes)
        result = json.loads(Path(out).read_text(encoding="utf-8"))
    rows = []
    for sw in switches:
        compared, equal, agree, trials = result[sw]
        row = measured("all_reduce", shape, sw, (compared, equal))
        row.verdict += f"; ranks agree {agree}/{trials}"
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ recommendation

# Per op, the series' switch that governs it and its values (None: no switch in the series).
_PLAIN = {"all_reduce": "dist.all_reduce"}
_NO_SWITCH = ("fused_moe", "silu", "all_reduce")


def plain_switch(op: str) -> str:
    """The switch label of the unchanged op."""
    return "plain" if op.startswith("linear:") else _PLAIN.get(op, "off")


def series_form(op: str, defaults: dict[str, str] | None, device: str) -> str | None:
    """The form the series runs for ``op`` on exact verify rows with these defaults; None: unknown."""
    if op in _NO_SWITCH:
        return _PLAIN.get(op, "off")  # no form in the series
    if op in ("softplus", "sigmoid"):
        return "apply"  # patch 0009, unconditional (a no-op off CPU)
    if defaults is None:
        return None
    if op == "qk_norm":
        return defaults["qk_norm"]
    if op == "int4":
        return "rows" if defaults["int4"] in ("1", "true") else "off"
    kind = op.split(":", 1)[1]
    names = {v.strip() for v in defaults["linears"].split(",")}
    if not ({"all", kind} & names):
        return "plain"
    form = defaults["linear_form"]
    if form in ("", "none"):  # unset: batch_invariant on XPU, rows elsewhere (0011)
        return "batch_invariant" if device == "xpu" else "rows"
    return form


def recommend(rows: list[Row], defaults: dict[str, str] | None, device: str) -> None:
    """Fill ``change`` per row, per (op, shape) group."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.op, row.shape), []).append(row)
    for (op, _), group in groups.items():
        ran = {r.switch: r for r in group if r.compared is not None}
        current = series_form(op, defaults, device)
        plain = plain_switch(op)
        for row in group:
            if row.compared is None:
                continue
            ok = row.equal == row.compared
            if current is None:
                row.change = "unknown (series defaults not readable)"
            elif row.switch == current:
                if ok:
                    row.change = "no (this is the series' form; row-invariant)"
                else:
                    good = [s for s, r in ran.items() if r.equal == r.compared and s != current]
                    fix = f"use {good[0]}" if good else "no form here is row-invariant"
                    where = " (no switch in the series)" if op in _NO_SWITCH else ""
                    row.change = f"YES: the series' form differs{where}; {fix}"
            elif row.switch == plain:
                row.change = "optional: plain is row-invariant here" if ok else "no: plain differs"
            elif ok and current in ran and ran[current].equal != ran[current].compared:
                row.change = f"YES: use {row.switch}"


# ------------------------------------------------------------------------------------- output


def print_table(rows: list[Row], header: list[str]) -> None:
    cols = ("op", "shape", "switch", "rows compared", "rows bitwise equal", "verdict", "change default?")
    cells = [
        [
            r.op,
            r.shape,
            r.switch,
            "-" if r.compared is None else str(r.compared),
            "-" if r.equal is None else str(r.equal),
            r.verdict,
            r.change,
        ]
        for r in rows
    ]
    report.print_table(header, cols, cells, pad_last=False)


def _device(choice: str, torch: Any) -> str:
    if choice != "auto":
        return choice
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    p = ToolParser(
        prog="python -m scripts.device.op_invariance_check",
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda", "xpu"), default="auto", help="where the ops run")
    p.add_argument("--shapes", choices=tuple(SHAPES), default="laguna-s-tp4", help="shape set (small: CPU smoke test)")
    p.add_argument("--rows", type=int, default=8, help="rows per call M (the verify width), 2..16")
    p.add_argument("--trials", type=int, default=4, help="fresh random inputs per (op, shape, switch), 1..64")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list of {', '.join(OPS)}")
    p.add_argument("--ranks", type=int, default=4, help="processes of the all-reduce check (TP size; 0: skip it)")
    p.add_argument("--rank-timeout", type=float, default=300.0, help="seconds the all-reduce ranks may take")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON here (default: no file)")
    p.add_argument(
        "--series-options",
        type=options_argument,
        default={},
        metavar="JSON",
        help="the series' options the 'change default?' column compares with, a JSON object of "
        "additional_config['xpu_laguna'] (default: none, the options' defaults)",
    )
    p.add_argument(
        "--onednn-verbose",
        action="store_true",
        help="set ONEDNN_VERBOSE=1 before torch loads: oneDNN prints each primitive's shapes under a '== case' line",
    )
    a = p.parse_args(argv)
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    if not ops or any(o not in OPS for o in ops):
        p.error(f"--ops must be a comma list of {', '.join(OPS)}")
    if not 2 <= a.rows <= 16:
        p.error("--rows must be 2..16")
    if not 1 <= a.trials <= 64:
        p.error("--trials must be 1..64")
    if a.ranks < 0 or a.ranks == 1 or a.ranks > 16:
        p.error("--ranks must be 0 (skip) or 2..16")
    if a.rank_timeout < 10:
        p.error("--rank-timeout must be >= 10")
    if a.onednn_verbose:
        if "torch" in sys.modules:
            print("error: --onednn-verbose: torch is already loaded; set ONEDNN_VERBOSE=1 instead", file=sys.stderr)
            return 2
        os.environ["ONEDNN_VERBOSE"] = "1"
    try:
        import torch
    except ImportError as e:
        print(f"error: needs torch ({e})", file=sys.stderr)
        return 2
    device = _device(a.device, torch)
    if device != "cpu" and not (getattr(torch, device).is_available()):
        print(f"error: --device {device}: no {device} device here", file=sys.stderr)
        return 2
    forms, forms_from = load_forms()
    defaults, defaults_from = series_defaults(a.series_options)
    ctx = Ctx(torch, device, a.trials, a.rows, SHAPES[a.shapes], forms)
    rows: list[Row] = []
    for op in OPS:
        if op not in ops:
            continue
        if op == "all_reduce":
            rows += check_all_reduce(ctx, a.ranks, a.rank_timeout)
        else:
            rows += {
                "qk_norm": check_qk_norm,
                "linear": check_linears,
                "int4": check_int4,
                "fused_moe": check_fused_moe,
                "elementwise": check_elementwise,
            }[op](ctx)
    recommend(rows, defaults, device)
    header = [
        f"device {device} (torch {torch.__version__}); shapes {a.shapes}; M={a.rows} in one call vs {a.rows} one-row "
        f"calls; {a.trials} trial(s) each; bitwise torch.equal per row",
        f"forms: {forms_from}",
        f"series defaults: {defaults if defaults else ''} ({defaults_from})",
    ]
    if a.shapes != "laguna-s-tp4":
        header.append(f"shapes '{a.shapes}': a smoke test of this script, not Laguna-S measurements")
    print_table(rows, header)
    ran = [r for r in rows if r.compared is not None]
    print(f"summary: {len(ran)} of {len(rows)} rows measured, {len(rows) - len(ran)} not run")
    report.write_json(a.json, header, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
