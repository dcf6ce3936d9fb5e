"""Routed-expert row invariance: the INT4 fused MoE at M rows in one call vs M one-row calls, plain and rows form.

Exact DFlash verify needs row i of an M-row verify to get the bits the q=1 decode of that token
gets. The XPU routed experts (vllm_xpu_kernels ``XpuFusedMoe``: ``remap_hidden_states`` with
atomic rows-per-expert, a CUTLASS grouped GEMM whose policy follows the average rows per expert,
SiLU-and-mul, a second grouped GEMM, ``moe_gather``) are not row-invariant by construction. For
each row count M this runs ``--trials`` fresh random inputs (hidden states, router top-k) through

* ``plain``: one M-row call, as a verify step makes it without the series' form;
* ``rows``: the series' form (the option ``row_invariant_moe``: ``rows``): one call per row on
  ``x[i:i+1]`` (``vllm.xpu_laguna.row_invariant_moe.experts_per_row`` of the installed vLLM, else this
  script's own loop, said in the header);

and compares each row bitwise (``torch.equal``) with a one-row call on a fresh copy of that row
(the q=1 decode). It prints per (M, form): rows compared, rows equal, the verdict, the expert
weight sets the call reads (distinct experts of the M-row call; M x top-k for the rows form),
how often two plain M-row calls of the same input agree (the atomic remap order is scheduled at
run time), and the median milliseconds per M rows.

Shapes (``--shapes laguna-s-tp4``): Laguna-S-2.1-INT4 at TP 4 per rank, no expert parallelism:
256 experts, top-10, hidden 3072, expert intermediate 256 per rank (1024 / 4); w13 N=512 K=3072
(uint8 ``[256, 512, 1536]``, two INT4 values a byte), w2 N=3072 K=256 (uint8 ``[256, 3072, 128]``),
group 32, BF16 scales and activations. On ``--device cpu`` the experts are unquantized BF16
stand-in weights run by a pure-torch grouped MoE (routes grouped by expert, one GEMM per expert,
gather in slot order): a smoke test of this script, not a measurement of the device kernel.

    python -m scripts.device.moe_invariance_check                                  # XPU, rows 1,8,12
    python -m scripts.device.moe_invariance_check --device cpu --shapes small      # CPU smoke test
"""

from __future__ import annotations

import importlib
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from scripts.device import _report as report

FORMS = ("plain", "rows")
SERIES_FORM = "vllm.xpu_laguna.row_invariant_moe"


@dataclass(frozen=True)
class Shapes:
    experts: int  # local experts (no EP: all of them)
    top_k: int
    hidden: int
    inter: int  # expert intermediate per rank
    group: int = 32


SHAPES = {
    "laguna-s-tp4": Shapes(256, 10, 3072, 256),
    "small": Shapes(16, 4, 64, 32),
}


@dataclass
class Row:
    rows: int
    form: str
    compared: int
    equal: int
    verdict: str
    experts_read: float  # mean expert weight sets read per M rows
    repeat_equal: int | None  # plain: rows equal between two M-row calls of one input
    ms: float  # median wall time per M rows


# ------------------------------------------------------------------------------------ kernels


def series_form() -> tuple[Callable[..., list[Any]], str]:
    """The series' per-row form from the installed vLLM, else this script's loop."""
    try:
        module = importlib.import_module(SERIES_FORM)
        return module.experts_per_row, f"{SERIES_FORM}.experts_per_row"
    except Exception as e:  # noqa: BLE001 - no vLLM here: the loop below is the same form
        reason = f"{type(e).__name__}"

    def experts_per_row(apply_one: Callable[..., Any], x: Any, weights: Any, ids: Any) -> list[Any]:
        rows = range(x.shape[0])
        return [apply_one(x=x[i : i + 1], topk_weights=weights[i : i + 1], topk_ids=ids[i : i + 1]) for i in rows]

    return experts_per_row, f"this script's per-row loop (vLLM not importable: {reason})"


def int4_shapes(s: Shapes) -> dict[str, tuple[int, ...]]:
    """Per-rank tensors of the INT4 experts ([E, N, K/2] uint8, two values a byte; [E, N, K/group] scales)."""
    e, h, i = s.experts, s.hidden, s.inter
    return {
        "w13": (e, 2 * i, h // 2),
        "w13_scales": (e, 2 * i, h // s.group),
        "w2": (e, h, i // 2),
        "w2_scales": (e, h, i // s.group),
    }


def xpu_experts(torch: Any, s: Shapes) -> Callable[[Any, Any, Any], Any]:
    """``XpuFusedMoe`` over random INT4 (uint8-packed) weights with BF16 group scales."""
    cls = importlib.import_module("vllm_xpu_kernels.fused_moe_interface").XpuFusedMoe
    gen = torch.Generator().manual_seed(5)
    shape = int4_shapes(s)
    w13 = torch.randint(0, 256, shape["w13"], generator=gen, dtype=torch.uint8).to("xpu")
    w2 = torch.randint(0, 256, shape["w2"], generator=gen, dtype=torch.uint8).to("xpu")
    s13 = (torch.rand(shape["w13_scales"], generator=gen) * 0.01 + 0.001).to(torch.bfloat16).to("xpu")
    s2 = (torch.rand(shape["w2_scales"], generator=gen) * 0.01 + 0.001).to(torch.bfloat16).to("xpu")
    kwargs: dict[str, Any] = {}
    if "is_int4" in inspect.signature(cls.__init__).parameters:
        kwargs["is_int4"] = True  # older wheels take it; newer ones infer it from the dtypes
    moe = cls(
        w13=w13,
        w13_scales=s13,
        w13_bias=None,
        w2=w2,
        w2_scales=s2,
        w2_bias=None,
        n_experts_per_token=s.top_k,
        activation="silu",
        num_experts=s.experts,
        **kwargs,
    )

    def apply(x: Any, topk_weights: Any, topk_ids: Any) -> Any:
        out = torch.empty_like(x)
        moe.apply(output=out, hidden_states=x, topk_weights=topk_weights, topk_ids=topk_ids)
        return out

    return apply


def cpu_experts(torch: Any, s: Shapes) -> Callable[[Any, Any, Any], Any]:
    """Pure-torch grouped MoE over BF16 stand-in weights (the XPU kernel's dataflow, no INT4)."""
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(5)
    w13 = (torch.randn(s.experts, 2 * s.inter, s.hidden, generator=gen) * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(s.experts, s.hidden, s.inter, generator=gen) * 0.05).to(torch.bfloat16)

    # the keywords of ``quant_method.apply``, which the series' per-row form passes
    def apply(x: Any, topk_weights: Any, topk_ids: Any) -> Any:
        weights, ids = topk_weights, topk_ids
        rows, top_k = ids.shape
        routes = torch.empty(rows, top_k, s.hidden, dtype=x.dtype)
        for expert in ids.unique().tolist():
            r, slot = (ids == expert).nonzero(as_tuple=True)
            h = F.linear(x[r], w13[expert])
            routes[r, slot] = F.linear(F.silu(h[:, : s.inter]) * h[:, s.inter :], w2[expert])
        acc = torch.zeros(rows, s.hidden, dtype=torch.float32)
        for k in range(top_k):
            acc += routes[:, k].float() * weights[:, k : k + 1].float()
        return acc.to(x.dtype)

    return apply


# ------------------------------------------------------------------------------------ measure


class Bench:
    def __init__(self, torch: Any, device: str, shapes: Shapes, trials: int, apply: Callable[..., Any]) -> None:
        self.torch, self.device, self.s, self.trials, self.apply = torch, device, shapes, trials, apply

    def sync(self) -> None:
        if self.device != "cpu":
            getattr(self.torch, self.device).synchronize()

    def inputs(self, rows: int, trial: int) -> tuple[Any, Any, Any]:
        t, s = self.torch, self.s
        gen = t.Generator().manual_seed(1000 * rows + trial)
        x = (t.randn(rows, s.hidden, generator=gen) * 0.1).to(t.bfloat16)
        weights, ids = t.topk(t.randn(rows, s.experts, generator=gen).sigmoid(), s.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return x.to(self.device), weights.float().to(self.device), ids.to(t.int32).to(self.device)

    def timed(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return out, (time.perf_counter() - start) * 1e3

    def run(self, rows: int, form: str, per_row: Callable[..., list[Any]]) -> Row:
        t = self.torch
        compared = equal = repeat = 0
        times: list[float] = []
        read = 0
        with t.no_grad():
            for trial in range(self.trials):
                x, w, ids = self.inputs(rows, trial)
                if form == "plain":
                    out, ms = self.timed(lambda x=x, w=w, ids=ids: self.apply(x, w, ids))
                    again = self.apply(x, w, ids)
                    repeat += sum(bool(t.equal(out[i], again[i])) for i in range(rows))
                    read += len(t.unique(ids))
                else:
                    out, ms = self.timed(lambda x=x, w=w, ids=ids: t.cat(per_row(self.apply, x, w, ids)))
                    read += rows * self.s.top_k
                times.append(ms)
                for i in range(rows):
                    ref = self.apply(x[i : i + 1].clone(), w[i : i + 1].clone(), ids[i : i + 1].clone())
                    equal += bool(t.equal(out[i], ref[0]))
                    compared += 1
        verdict = "row-invariant" if equal == compared else "NOT row-invariant"
        return Row(
            rows,
            form,
            compared,
            equal,
            verdict,
            read / self.trials,
            repeat if form == "plain" else None,
            statistics.median(times),
        )


# ------------------------------------------------------------------------------------- output


def print_table(rows: list[Row], header: list[str]) -> None:
    cols = ("M", "form", "rows compared", "rows bitwise equal", "verdict", "experts read", "plain repeat equal", "ms")
    cells = [
        [
            str(r.rows),
            r.form,
            str(r.compared),
            str(r.equal),
            r.verdict,
            f"{r.experts_read:.1f}",
            "-" if r.repeat_equal is None else str(r.repeat_equal),
            f"{r.ms:.3f}",
        ]
        for r in rows
    ]
    report.print_table(header, cols, cells)


def _device(choice: str, torch: Any) -> str:
    if choice != "auto":
        return choice
    return "xpu" if hasattr(torch, "xpu") and torch.xpu.is_available() else "cpu"


def _row_counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        return ()
    return values if all(1 <= v <= 16 for v in values) else ()


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    p = ToolParser(
        prog="python -m scripts.device.moe_invariance_check",
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    p.add_argument("--device", choices=("auto", "cpu", "xpu"), default="auto", help="where the experts run")
    p.add_argument("--shapes", choices=tuple(SHAPES), default="laguna-s-tp4", help="shape set (small: CPU smoke test)")
    p.add_argument("--rows", default="1,8,12", help="comma list of row counts M per call, each 1..16")
    p.add_argument("--trials", type=int, default=4, help="fresh random inputs per (M, form), 1..64")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON here (default: no file)")
    a = p.parse_args(argv)
    counts = _row_counts(a.rows)
    if not counts:
        p.error("--rows must be a comma list of integers 1..16")
    if not 1 <= a.trials <= 64:
        p.error("--trials must be 1..64")
    try:
        import torch
    except ImportError as e:
        print(f"error: needs torch ({e})", file=sys.stderr)
        return 2
    device = _device(a.device, torch)
    shapes = SHAPES[a.shapes]
    if device == "xpu":
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            print("error: --device xpu: no xpu device here", file=sys.stderr)
            return 3
        try:
            apply = xpu_experts(torch, shapes)
        except Exception as e:  # noqa: BLE001 - one line, the reason
            print(f"error: XpuFusedMoe not usable here ({type(e).__name__}: {e})", file=sys.stderr)
            return 3
        kernel = "vllm_xpu_kernels XpuFusedMoe, INT4 group 32"
    else:
        apply = cpu_experts(torch, shapes)
        kernel = "pure-torch grouped MoE over BF16 stand-in weights"
    per_row, form_from = series_form()
    bench = Bench(torch, device, shapes, a.trials, apply)
    rows = [bench.run(m, form, per_row) for m in counts for form in FORMS]
    header = [
        f"device {device} (torch {torch.__version__}); shapes {a.shapes} {asdict(shapes)}; kernel: {kernel}",
        f"each row of an M-row call vs a one-row call of that row; {a.trials} trial(s) each; bitwise torch.equal",
        f"rows form: {form_from}",
    ]
    if device == "cpu":
        header.append("device cpu: a smoke test of this script, not a measurement of the XPU kernel")
    print_table(rows, header)
    report.write_json(a.json, header, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
