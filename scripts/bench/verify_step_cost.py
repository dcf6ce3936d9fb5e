"""Cost per verify step of the exact-TP work: row-invariant forms and rank-order collectives vs plain.

Runs in an environment with torch (the forms) and the patched vLLM tree (the collectives: e.g. the
CPU runtime's python). One run, interleaved in rounds so that machine noise hits every mode alike;
per mode the fastest and the median round (us per call); ratios are taken on the fastest rounds.
``plain`` is the path without patches 0010/0011 (upstream's): ``F.linear`` of the M verify rows,
one q/k RMSNorm call, the backend's all-reduce.

* Linears (patch 0011, ``vllm.xpu_laguna.row_invariant``): ``plain`` vs ``rows`` (``per_row``: one
  ``F.linear`` per row; the CPU default) vs ``batch_invariant`` (the XPU default: ``PaddedRows``,
  the copy of the M rows into the form's zero-padded width buffer, then one width-row call; here
  the call is ``F.linear`` in place of upstream's Triton kernel, which Triton on CPU only
  interprets, so the figure is the form's host work plus a CPU GEMM, not the kernel's cost), for
  every target linear shape of ``scripts.device.op_invariance_check.linear_shapes``.
* q/k norm: ``plain`` vs ``pad`` (``norm_padded`` into a ``NormPadBuffer``, as each installed
  norm owns one; the default) vs ``tokens`` (``per_row``), on
  ``[M, heads, head_dim]`` views of a QKV output; the RMSNorm is op_invariance_check's (torch,
  fp32 math, on CPU).
* Collectives (patch 0010): ``plain`` (``dist.all_reduce`` of a copy) vs ``before`` (the exact
  form before issue 29: a gather, a clone, the adds and a copy) vs ``rank-order``
  (``rank_order_all_reduce``) of ``[M, hidden]`` bf16 on ``--world`` CPU gloo ranks (loopback),
  timed by ``scripts.bench.tp_collectives``' code in worker processes kept alive across rounds.
* The series before issue 29, for "before and after in one run": the linears' ``lanes`` (the
  removed XPU default, re-created here as it was: one ``bmm`` of M=1 lanes over the weight's
  transpose expanded with batch stride 0; on XPU oneDNN folds it into the plain M=8 GEMM, so
  its CPU figure is the CPU ``bmm``'s, not the device's), the q/k norm's ``pad-alloc`` (a fresh
  padded tensor per call, before each norm owned a buffer) and the collectives' ``before``.

Every figure is time on this machine's CPU. At ``--shapes laguna-s-tp4`` (Laguna-S-2.1 TP 4
per-rank shapes) the forms' times are host dispatch plus CPU arithmetic; the same call pattern at
op_invariance_check's ``small`` shapes (hidden 64), always timed too, is dispatch-bound (the
arithmetic is negligible): that is the host part. No figure here is a device cost; the estimate
for the device is printed separately, from the reference lab's figures.

Calls per target forward (verify step), from the Laguna-S-2.1 structure that
op_invariance_check's docstring and docs/row-invariance.md give: 48 layers, 12 full-attention and
36 sliding-attention layers, layer 0 dense and 47 MoE layers. Per layer one qkv, o_proj and g_proj
call and one q and one k norm; the dense layer gate, up, down; each MoE layer the router and the
shared expert's gate, up, down; one lm_head call (the target's compute_logits). Collectives:
2 per layer + the embedding = 97 (docs/exact-tp.md; the 145-break topology of
scripts.bench.graph_host_overhead). A step's figure is the sum of calls x us per call of one
round.

Usage (from the repository root)::

    python -m scripts.bench.verify_step_cost [--shapes laguna-s-tp4] [--rounds 7] [--steps 1]
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scripts.bench import tp_collectives as tpc
from scripts.bench.graph_host_overhead import LAYERS, TOKENS
from scripts.cli import ToolParser
from scripts.device import op_invariance_check as oc

FULL_LAYERS = 12  # Laguna-S-2.1: full-attention layers (the other 36 slide)
DENSE_LAYERS = 1  # layer 0; the other 47 are MoE layers
COLLECTIVES_PER_STEP = 2 * LAYERS + 1  # attention output + MLP/MoE output per layer, the embedding
HOST_SHAPES = "small"
STEP_ROW = "per verify step, ms"  # the last row of every table: calls x us per call, summed per round
ANSWER_TIMEOUT_S = 900  # one round of the collective ranks
PARTS = ("forms", "collectives")
LINEAR_MODES = ("plain", "lanes", "rows", "batch_invariant")
NORM_MODES = ("plain", "pad-alloc", "pad", "tokens")
COLLECTIVE_MODES = ("plain", "before", "rank-order")
BEFORE_XPU_FORMS = {"linears": "lanes", "q/k norm": "pad-alloc", "collectives": "before"}  # the series before issue 29
XPU_FORMS = {"linears": "batch_invariant", "q/k norm": "pad", "collectives": "rank-order"}
CPU_FORMS = {"linears": "rows", "q/k norm": "pad", "collectives": "rank-order"}
SERIES = (("XPU before", BEFORE_XPU_FORMS), ("XPU", XPU_FORMS), ("CPU", CPU_FORMS))

# The reference lab's figures (research note lab-exactness.md, section 4 "Question 4: costs and
# speeds"; lab note N/2026-07-22-dflash-depth-sweep-and-profile-decomposition.md).
LAB_RANK_SUMS_MS = 0.181520  # "fixed-rank BF16 sums 0.181520 ms (device)", per cycle at M=8
LAB_COLLECTIVE_API_MS, LAB_COLLECTIVE_CALLS = 13.654, 98  # batched exact, per cycle


@dataclass
class Case:
    """One shape of one part: its calls per verify step and a zero-argument call per mode."""

    label: str
    calls: int
    run: dict[str, Callable[[], Any]]
    steps: int = 1  # calls per mode and round
    samples: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Table:
    part: str  # "linears" | "q/k norm" | "collectives"
    shapes: str
    host: bool  # the host part (HOST_SHAPES, timed next to the main shapes)
    modes: tuple[str, ...]
    cases: list[Case]


def linear_calls(kind: str, label: str) -> int:
    sliding, sparse = LAYERS - FULL_LAYERS, LAYERS - DENSE_LAYERS
    per_layer = {"full": FULL_LAYERS, "sliding": sliding}
    counts = {
        "dense_mlp": {"gate/up": 2 * DENSE_LAYERS, "down": DENSE_LAYERS},
        "shared_expert": {"gate/up": 2 * sparse, "down": sparse},
        "router": {"gate": sparse},
        "lm_head": {"vocab shard": 1},
    }
    return counts.get(kind, per_layer)[label]


def linear_lanes(x: Any, weight: Any) -> Any:
    """The removed "lanes" form as it was: ``F.linear(x, weight)`` as M stride-zero batched M=1 lanes."""
    w_t = weight.t()
    return x.unsqueeze(1).bmm(w_t.unsqueeze(0).expand(x.shape[0], *w_t.shape)).squeeze(1)


def form_tables(shapes_name: str, host: bool, rows: int, steps: int, forms: Any) -> list[Table]:
    import torch

    s = oc.SHAPES[shapes_name]
    ctx = oc.Ctx(torch, "cpu", 1, rows, s, forms)
    linears = []
    pad = forms.PaddedRows(rows)  # one per width, shared by every layer (as the dispatch keeps it)
    for kind, label, k, n in oc.linear_shapes(s):
        w, x = ctx.randn(n, k, seed=k + n, scale=k**-0.5), ctx.randn(rows, k, seed=1)
        modes: dict[str, Callable[[], Any]] = {
            "plain": lambda x=x, w=w: torch.nn.functional.linear(x, w),
            "lanes": lambda x=x, w=w: linear_lanes(x, w),
            "rows": lambda x=x, w=w: forms.per_row(lambda r: torch.nn.functional.linear(r, w), x),
            "batch_invariant": lambda x=x, w=w: pad(lambda r: torch.nn.functional.linear(r, w), x),
        }
        linears.append(Case(f"{kind} {label} [{rows},{k}]x[{k},{n}]", linear_calls(kind, label), modes, steps))
    norm, impl = oc.rms_norm_impl(ctx)
    d, kv = s.head_dim, s.kv_heads
    weight = ctx.randn(d, seed=2)
    norms = []
    for label, q_heads, heads, start, calls in (
        ("q full", s.q_heads[0], s.q_heads[0], 0, FULL_LAYERS),
        ("q sliding", s.q_heads[1], s.q_heads[1], 0, LAYERS - FULL_LAYERS),
        ("k", s.q_heads[0], kv, s.q_heads[0] * d, LAYERS),  # the same [rows, kv, d] in every layer
    ):
        qkv = ctx.randn(rows, (q_heads + 2 * kv) * d, seed=3)
        view = qkv[:, start : start + heads * d].view(rows, heads, d)
        pad_buffer = forms.NormPadBuffer(rows + 1)  # each installed q/k norm owns one
        modes = {
            "plain": lambda v=view: norm(v, weight),
            "pad-alloc": lambda v=view: forms.norm_padded(lambda t: norm(t, weight), v),
            "pad": lambda v=view, b=pad_buffer: forms.norm_padded(lambda t: norm(t, weight), v, b),
            "tokens": lambda v=view: forms.per_row(lambda t: norm(t, weight), v),
        }
        norms.append(Case(f"{label} [{rows},{heads},{d}] {impl}", calls, modes, steps))
    return [
        Table("linears", shapes_name, host, LINEAR_MODES, linears),
        Table("q/k norm", shapes_name, host, NORM_MODES, norms),
    ]


def _collective_worker(
    rank: int, world: int, port: int, shapes: list[tuple[int, int]], steps: int, commands: Any, results: Any
) -> None:
    import torch.distributed as dist

    try:
        group = tpc.join_group(rank, world, port)
        methods = tpc.all_reduce_methods()
        messages = [tpc.message(shape, rank, "bf16") for shape in shapes]
        for x in messages:  # warm-up
            tpc.time_round(methods, COLLECTIVE_MODES, x, group, 1)
        results.put((rank, "ready"))
        while commands.get() == "round":
            results.put((rank, [tpc.time_round(methods, COLLECTIVE_MODES, x, group, steps) for x in messages]))
        dist.destroy_process_group()
    except BaseException as exc:  # reported by the parent, one line
        results.put((rank, f"{type(exc).__name__}: {exc}"))


class Collectives:
    """``world`` gloo ranks forked once (before the parent computes anything), one round per call."""

    def __init__(self, world: int, shapes: list[tuple[int, int]], steps: int) -> None:
        ctx = multiprocessing.get_context("fork")
        port = tpc.free_port()
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(world)]
        self.procs = [
            ctx.Process(
                target=_collective_worker, args=(rank, world, port, shapes, steps, self.commands[rank], self.results)
            )
            for rank in range(world)
        ]
        for proc in self.procs:
            proc.start()
        self._collect()

    def _collect(self) -> Any:
        try:
            got = dict(self.results.get(timeout=ANSWER_TIMEOUT_S) for _ in self.procs)
        except queue.Empty:
            self.close()
            raise RuntimeError(f"the collective ranks did not answer within {ANSWER_TIMEOUT_S} s") from None
        for rank, value in sorted(got.items()):
            if isinstance(value, str) and value != "ready":
                self.close()
                raise RuntimeError(f"collective rank {rank}: {value}")
        return got[0]

    def round(self) -> list[dict[str, float]]:
        for commands in self.commands:
            commands.put("round")
        return self._collect()

    def close(self) -> None:
        for commands in self.commands:
            commands.put("stop")
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():  # a rank stuck in a collective its peer left
                proc.terminate()
                proc.join(timeout=10)


def measure(args: argparse.Namespace, forms: Any) -> list[Table]:
    """Every table, its cases' samples filled (us per call, one per round)."""
    import torch

    hidden = {name: oc.SHAPES[name].hidden for name in (args.shapes, HOST_SHAPES)}
    collective_tables = []
    pool = None
    if "collectives" in args.parts:
        shapes = [(args.rows, hidden[args.shapes]), (args.rows, hidden[HOST_SHAPES])]
        pool = Collectives(args.world, shapes, args.collective_steps)
        for (shapes_name, host), shape in zip(((args.shapes, False), (HOST_SHAPES, True)), shapes, strict=True):
            label = f"all-reduce [{shape[0]},{shape[1]}] bf16, {args.world} gloo ranks"
            case = Case(label, COLLECTIVES_PER_STEP, {})
            collective_tables.append(Table("collectives", shapes_name, host, COLLECTIVE_MODES, [case]))
    torch.set_num_threads(args.threads)
    tables: list[Table] = []
    try:
        with torch.inference_mode():
            if "forms" in args.parts:
                for shapes_name, host, steps in (
                    (args.shapes, False, args.steps),
                    (HOST_SHAPES, True, args.host_steps),
                ):
                    tables += form_tables(shapes_name, host, args.rows, steps, forms)
            for case in (c for t in tables for c in t.cases):  # warm-up
                for fn in case.run.values():
                    fn()
            for _ in range(args.rounds):
                for case in (c for t in tables for c in t.cases):
                    for mode, fn in case.run.items():
                        start = time.perf_counter_ns()
                        for _ in range(case.steps):
                            fn()
                        elapsed = time.perf_counter_ns() - start
                        case.samples.setdefault(mode, []).append(elapsed / case.steps / 1000)
                if pool is not None:
                    for table, per_mode in zip(collective_tables, pool.round(), strict=True):
                        for mode, value in per_mode.items():
                            table.cases[0].samples.setdefault(mode, []).append(value)
    finally:
        if pool is not None:
            pool.close()
    return tables + collective_tables


def weight_bytes_per_step(shapes_name: str, rows: int) -> dict[str, int]:
    """BF16 weight bytes the target linears read per verify step, per form (each call reads its
    whole [N, K] weight: once for plain, lanes (the plain GEMM on XPU) and batch_invariant, whose
    width-row tile covers every row, once per row for rows)."""
    once = sum(2 * k * n * linear_calls(kind, label) for kind, label, k, n in oc.linear_shapes(oc.SHAPES[shapes_name]))
    return {"plain": once, "lanes": once, "batch_invariant": once, "rows": rows * once}


def step_totals(table: Table) -> dict[str, list[float]]:
    """Per mode, one figure per round: the sum over the table's cases of calls x us per call."""
    rounds = len(table.cases[0].samples[table.modes[0]])
    return {
        mode: [sum(case.calls * case.samples[mode][r] for case in table.cases) for r in range(rounds)]
        for mode in table.modes
    }


def step_sum(tables: list[Table], modes: dict[str, str]) -> list[float]:
    """Per round, the tables' per-step figures summed, each table in the mode ``modes[part]``."""
    per_table = [step_totals(t)[modes[t.part]] for t in tables]
    return [sum(values) for values in zip(*per_table, strict=True)]


def _cell(values: list[float], ms: bool = False) -> str:
    """``fastest (median)``: us per call with 2 decimals, or (``ms``) ms per step with 3."""
    if ms:
        return f"{min(values) / 1000:.3f} ({statistics.median(values) / 1000:.3f})"
    return f"{min(values):.2f} ({statistics.median(values):.2f})"


def _ratio(values: list[float], base: list[float]) -> str:
    return f"{min(values) / min(base):.2f}x"


def _what(table: Table, main: str) -> str:
    if table.host and table.part == "collectives":
        return (
            f"{HOST_SHAPES} shapes (hidden 64): latency-bound, the data is negligible: the host part + gloo round trips"
        )
    if table.host:
        return f"{HOST_SHAPES} shapes (hidden 64): dispatch-bound, the arithmetic is negligible: the host part"
    if table.part == "collectives":
        return f"{main} shapes: loopback gloo transport + host on CPU ranks (not XCCL, not a device cost)"
    return f"{main} shapes: host dispatch + CPU arithmetic (not a device cost)"


def render(tables: list[Table], args: argparse.Namespace) -> list[str]:
    import torch

    lines = [
        f"# cost per verify step, M={args.rows} rows, on this machine's CPU (torch {torch.__version__}, "
        f"{args.threads} intra-op thread(s)); {args.rounds} interleaved rounds; calls per mode and round: "
        f"forms {args.steps} ({args.shapes}) and {args.host_steps} ({HOST_SHAPES}), collectives "
        f"{args.collective_steps}; us per call and ms per step: fastest round (median round); ratios on the "
        "fastest rounds; plain = without patches 0010/0011; XPU before = the series' XPU forms before issue 29"
    ]
    for table in tables:
        head = [f"{mode} us" for mode in table.modes] + [f"{mode}/plain" for mode in table.modes[1:]]
        lines += ["", f"## {table.part}, {_what(table, args.shapes)}", ""]
        lines += ["| shape | calls/step | " + " | ".join(head) + " |", "|" + " --- |" * (2 + len(head))]
        totals = step_totals(table)
        rows = [(c.label, c.calls, c.samples) for c in table.cases]
        rows.append((STEP_ROW, sum(c.calls for c in table.cases), totals))
        for label, calls, samples in rows:
            cells = [_cell(samples[m], ms=label == STEP_ROW) for m in table.modes]
            cells += [_ratio(samples[m], samples["plain"]) for m in table.modes[1:]]
            lines.append(f"| {label} | {calls} | " + " | ".join(cells) + " |")
    lines += ["", "## per verify step, the parts measured summed per round", ""]
    head = ["plain ms"] + [f"series {n} ({', '.join(f.values())}) ms" for n, f in SERIES]
    head += [f"series {n}/plain" for n, _ in SERIES] + [f"series {n} - plain ms" for n, _ in SERIES]
    lines += ["| shapes | parts | " + " | ".join(head) + " |", "|" + " --- |" * (2 + len(head))]
    for host in (False, True):
        mine = [t for t in tables if t.host == host]
        plain = step_sum(mine, {part: "plain" for part in XPU_FORMS})
        forms = [step_sum(mine, f) for _, f in SERIES]
        cells = [_cell(plain, ms=True)] + [_cell(v, ms=True) for v in forms] + [_ratio(v, plain) for v in forms]
        cells += [f"{(min(v) - min(plain)) / 1000:.3f}" for v in forms]
        shapes_name = f"{HOST_SHAPES} (host part)" if host else args.shapes
        lines.append(f"| {shapes_name} | {', '.join(t.part for t in mine)} | " + " | ".join(cells) + " |")
    per_sum = LAB_RANK_SUMS_MS * 1000 / COLLECTIVES_PER_STEP
    weights = weight_bytes_per_step("laguna-s-tp4", args.rows)
    per_call = LAB_COLLECTIVE_API_MS * 1000 / LAB_COLLECTIVE_CALLS
    lines += [
        "",
        "## expected on the device: an ESTIMATE from the reference lab's figures, not measured here",
        "",
        f'- rank-order sums: "fixed-rank BF16 sums {LAB_RANK_SUMS_MS:.6f} ms (device)" per cycle, one of the '
        '"Exact-path components at M=8" (research note lab-exactness.md section 4, from the lab note '
        f"N/2026-07-22-dflash-depth-sweep-and-profile-decomposition.md): about {LAB_RANK_SUMS_MS:.2f} ms per "
        f"verify step, {per_sum:.2f} us per sum over its {COLLECTIVES_PER_STEP} collectives.",
        "- their transport (an all-gather in place of XCCL's ring): no lab A/B (\"No A/B cost is given for ... "
        f'rank-order sum versus a plain all-reduce", same section); its batched exact path spent '
        f"{LAB_COLLECTIVE_API_MS} ms per cycle in the collective API over {LAB_COLLECTIVE_CALLS} calls "
        f"({per_call:.1f} us per call, host included).",
        "- linears, weight traffic (the bound at M=8): per rank and verify step the BF16 target weights "
        f"are {weights['plain'] / 2**30:.2f} GiB read once by plain and by batch_invariant (its "
        f"16-row tile holds all {args.rows} rows) and {weights['rows'] / 2**30:.2f} GiB by rows "
        f"({args.rows}x); divide by the card's memory bandwidth for the time. batch_invariant adds one "
        "Triton launch (Python launcher) per call where plain has a oneDNN one, and one [width, K] copy; "
        "its kernel is upstream's, tuned to be close to oneDNN at decode sizes but not measured on "
        "Laguna shapes: the device check settles the bits, a device bench the time.",
        "- the padded q/k norm: one copy into the norm's buffer, not measured by the lab.",
        "- host on the device: under breakable graphs the linears and q/k norms replay inside captured "
        f"segments (their forms' dispatch is paid at capture); the {COLLECTIVES_PER_STEP} collectives are "
        "eager breaks, so their host work recurs every step; this machine's figures for it are CPU host "
        "times, not the device host's.",
    ]
    return lines


class _Parser(ToolParser):
    def error(self, message: str) -> Any:  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _check(args: argparse.Namespace) -> str | None:
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or not set(parts) <= set(PARTS):
        return f"--parts must be a comma list of {', '.join(PARTS)}, got {args.parts!r}"
    args.parts = tuple(p for p in PARTS if p in parts)
    if not 2 <= args.rows <= 16:
        return f"--rows must be 2..16 (the verify width), got {args.rows}"
    for name in ("rounds", "steps", "host_steps", "collective_steps", "threads"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
    if not 2 <= args.world <= 16:
        return f"--world must be 2..16, got {args.world}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m scripts.bench.verify_step_cost", description=__doc__)
    add = parser.add_argument
    add(
        "--shapes",
        choices=sorted(oc.SHAPES),
        default="laguna-s-tp4",
        help="shapes of the main tables: laguna-s-tp4 = Laguna-S-2.1 per-rank shapes at TP 4 (hidden 3072), "
        f"small = op_invariance_check's tiny ones (hidden 64); the host part is always also timed at {HOST_SHAPES}",
    )
    add("--rows", type=int, default=TOKENS, help="verify rows M of every call and message (2..16)")
    add(
        "--parts",
        default=",".join(PARTS),
        help="comma list: forms (the linears and the q/k norm, torch only), collectives (plain vs rank-order "
        "all-reduce on --world gloo ranks; needs the patched vLLM tree)",
    )
    add("--rounds", type=int, default=7, help="interleaved rounds; every mode of every part is timed once per round")
    add("--steps", type=int, default=1, help="calls per form mode, shape and round at --shapes")
    add("--host-steps", type=int, default=200, help=f"calls per form mode, shape and round at {HOST_SHAPES}")
    add("--collective-steps", type=int, default=50, help="all-reduces per mode, message shape and round")
    add(
        "--world",
        type=int,
        default=2,
        help="CPU processes (gloo ranks, one intra-op thread each) of the collectives, 2..16",
    )
    add("--threads", type=int, default=1, help="intra-op threads of this process for the forms (torch.set_num_threads)")
    args = parser.parse_args(argv)
    problem = _check(args)
    if problem:
        parser.error(problem)
    try:
        import torch  # noqa: F401

        if "collectives" in args.parts:
            from vllm.xpu_laguna import collectives as xpu_laguna_collectives  # noqa: F401
    except ImportError as exc:
        parser.error(f"needs torch, and for the collectives the patched vLLM tree (the CPU runtime's python): {exc}")
    forms, _ = oc.load_forms()
    try:
        tables = measure(args, forms)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(render(tables, args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
