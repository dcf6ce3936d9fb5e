"""Host time of one tensor-parallel all-reduce on CPU ranks: plain gloo vs the rank-order sum before and after.

Runs in an environment with the patched vLLM tree (e.g. the CPU runtime venv with the series synced
in). ``--world`` CPU processes (forked from this one, one intra-op thread each) join a gloo group over
loopback and all-reduce the same message with three methods, interleaved in rounds so that machine
noise hits all alike:

* ``plain``: ``dist.all_reduce`` of a copy (what ``XpuCommunicator.all_reduce`` does without the
  series; gloo here, XCCL on the device);
* ``before``: the rank-order sum as 0010 first shipped it, kept here as the reference (all-gather,
  clone rank 0's copy, N - 1 in-place adds: :func:`before_rank_order`);
* ``rank-order``: ``vllm.xpu_laguna.collectives.rank_order_all_reduce`` now (adds into the output; from
  ``RANK_ORDER_SCATTER_MIN_BYTES`` on, each rank sums its own slice, then all-gather).

Per method and message shape: the fastest and the median round (microseconds per call, rank 0's
clock, a barrier before every round), the fastest round x ``REDUCTIONS_PER_STEP`` (a verify step),
then the bytes each rank receives and allocates per reduction by construction (not measured) for
1, 8 and 8192 tokens at TP 2 and 4. Nothing is asserted: the times are CPU host costs of loopback
gloo, not the device's XCCL costs.

Usage (from the repository root)::

    python -m scripts.bench.tp_collectives [--hidden 3072] [--rows 1,8,8192] [--world 2]
"""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

METHODS = ("plain", "before", "rank-order")
DTYPES = ("bf16", "fp32")
REDUCTIONS_PER_STEP = 97  # Laguna-S target forward at TP > 1: 2 per layer (48 layers) + the embedding
BYTES_TOKENS = (1, 8, 8192)
BYTES_WORLDS = (2, 4)
STEP_ELEMENTS = 8 * 3072  # a shape this large or smaller gets --steps calls per round, larger fewer


def before_rank_order(x: Any, group: Any) -> Any:
    """The reference: 0010's first form (all-gather, clone, in-place adds in rank order)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    flat = x.contiguous().view(-1)
    gathered = torch.empty((world, flat.numel()), dtype=x.dtype)
    dist.all_gather_single(gathered.view(-1), flat, group=group)
    acc = gathered[0].clone()
    for rank in range(1, world):
        acc.add_(gathered[rank])
    return acc.view(x.shape)


def all_reduce_methods() -> dict[str, Callable[[Any, Any], Any]]:
    import torch.distributed as dist
    from vllm.xpu_laguna import collectives as xc

    def plain(x: Any, group: Any) -> Any:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    return {"plain": plain, "before": before_rank_order, "rank-order": xc.rank_order_all_reduce}


def bytes_per_rank(numel: int, elem: int, world: int, scatter_min_bytes: int) -> dict[str, tuple[int, int]]:
    """(received, allocated) bytes per rank of one reduction with a new output, by construction:
    ``before`` gathers N copies and clones one; ``rank-order`` does the same below
    ``scatter_min_bytes`` (the sum written into the output instead of a clone), from there receives
    every rank's copy of its slice and the summed slices (2 (N - 1) / N of the message) into one
    message of scratch plus the output; ``ring`` is a ring all-reduce's traffic, for comparison."""
    size = numel * elem
    part = -(-numel // world) * elem
    gather = ((world - 1) * size, (world + 1) * size)
    if size >= scatter_min_bytes:
        scratch = world * part + (0 if numel % world == 0 else part)
        after = (2 * (world - 1) * part, scratch + size)
    else:
        after = gather
    return {"before": gather, "rank-order": after, "ring": (2 * (world - 1) * part, 0)}


def message(shape: tuple[int, int], rank: int, dtype: str) -> Any:
    """Rank ``rank``'s message: seeded normal values of ``shape`` in ``dtype`` (``DTYPES``)."""
    import torch

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    return torch.randn(*shape, generator=torch.Generator().manual_seed(rank)).to(torch_dtype)


def time_round(
    methods: dict[str, Callable[[Any, Any], Any]], names: tuple[str, ...], x: Any, group: Any, steps: int
) -> dict[str, float]:
    """One round: us per call of each named method (``steps`` calls, a barrier before each method)."""
    import torch.distributed as dist

    out = {}
    for name in names:
        fn = methods[name]
        dist.barrier(group)
        start = time.perf_counter_ns()
        for _ in range(steps):
            fn(x, group)
        out[name] = (time.perf_counter_ns() - start) / steps / 1000
    return out


def join_group(rank: int, world: int, port: int) -> Any:
    """One intra-op thread, then the gloo group over loopback; returns the group."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return dist.group.WORLD


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _measure(
    rank: int, world: int, port: int, shapes: list[tuple[int, int]], dtype: str, steps: int, rounds: int
) -> dict[tuple[int, int], dict[str, list[float]]]:
    import torch.distributed as dist

    group = join_group(rank, world, port)
    methods = all_reduce_methods()
    samples: dict[tuple[int, int], dict[str, list[float]]] = {}
    try:
        for shape in shapes:
            x = message(shape, rank, dtype)
            per_shape = samples.setdefault(shape, {name: [] for name in METHODS})
            shape_steps = max(2, min(steps, steps * STEP_ELEMENTS // (shape[0] * shape[1])))
            for fn in methods.values():  # warm-up
                fn(x, group)
            for _ in range(rounds):
                for name, value in time_round(methods, METHODS, x, group, shape_steps).items():
                    per_shape[name].append(value)
    finally:
        dist.destroy_process_group()
    return samples


def _worker(rank: int, world: int, port: int, args: tuple[Any, ...], results: Any) -> None:
    try:
        results.put((rank, _measure(rank, world, port, *args)))
    except BaseException as exc:  # reported by the parent, one line
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def run(
    world: int, shapes: list[tuple[int, int]], dtype: str, steps: int, rounds: int
) -> dict[tuple[int, int], dict[str, list[float]]]:
    """Rank 0's samples (us per call, one per round) per shape and method."""
    port = free_port()
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(rank, world, port, (shapes, dtype, steps, rounds), results))
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    got = dict(results.get(timeout=1800) for _ in range(world))
    for proc in procs:
        proc.join(timeout=60)
    for rank, value in sorted(got.items()):
        if not isinstance(value, dict):
            raise RuntimeError(f"rank {rank}: {value}")
    return got[0]


def _shapes(rows: str, hidden: int) -> list[tuple[int, int]]:
    try:
        counts = [int(part) for part in rows.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"--rows must be positive integers separated by commas, got {rows!r}")
    return [(count, hidden) for count in counts]


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.bench.tp_collectives",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--hidden", type=int, default=3072, help="elements per row (Laguna-S hidden size)")
    parser.add_argument(
        "--rows", default="1,8,8192", help="message rows to time, comma-separated (decode, verify, prefill chunk)"
    )
    parser.add_argument("--world", type=int, default=2, help="CPU ranks in the gloo group (2..16)")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16", help="message dtype")
    parser.add_argument("--steps", type=int, default=200, help="calls per method and round (fewer for large shapes)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    args = parser.parse_args(argv)
    try:
        shapes = _shapes(args.rows, args.hidden)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.hidden < 1 or args.steps < 1 or args.rounds < 1 or not 2 <= args.world <= 16:
        print("error: --hidden, --steps, --rounds must be at least 1 and --world 2..16", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
        from vllm.xpu_laguna import collectives as xpu_laguna_collectives  # noqa: F401
    except ImportError:
        print("error: needs torch and the patched vLLM tree (the CPU runtime's python)", file=sys.stderr)
        return 2
    try:
        result = run(args.world, shapes, args.dtype, args.steps, args.rounds)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"host time per all-reduce, {args.world} CPU ranks (gloo, loopback), {args.dtype}; "
        f"{args.rounds} interleaved rounds; fastest round, median round in (); "
        f"per step: fastest x {REDUCTIONS_PER_STEP}"
    )
    header = f"{'shape':<12}" + "".join(f"{name + ' us':>22}" for name in METHODS)
    header += "".join(f"{name + ' ms/step':>20}" for name in METHODS) + f"{'rank-order/before':>19}"
    print(header)
    for shape, per_method in result.items():
        fastest = {name: min(values) for name, values in per_method.items()}
        line = f"{'x'.join(map(str, shape)):<12}"
        line += "".join(f"{fastest[name]:>12.1f} ({statistics.median(per_method[name]):>7.1f})" for name in METHODS)
        line += "".join(f"{fastest[name] * REDUCTIONS_PER_STEP / 1000:>20.2f}" for name in METHODS)
        line += f"{fastest['rank-order'] / fastest['before']:>18.2f}x"
        print(line)
    from vllm.xpu_laguna.collectives import RANK_ORDER_SCATTER_MIN_BYTES

    elem = 2 if args.dtype == "bf16" else 4
    print(
        f"\nbytes per rank and reduction (by construction; scatter form from {RANK_ORDER_SCATTER_MIN_BYTES} "
        f"bytes), tokens x {args.hidden} {args.dtype}: received / allocated, MiB"
    )
    print(f"{'tokens':>7}{'TP':>4}{'before':>22}{'rank-order':>22}{'ring (received)':>18}")
    for tokens in BYTES_TOKENS:
        for world in BYTES_WORLDS:
            cost = bytes_per_rank(tokens * args.hidden, elem, world, RANK_ORDER_SCATTER_MIN_BYTES)
            cells = "".join(
                f"{cost[k][0] / 2**20:>10.3f} / {cost[k][1] / 2**20:>9.3f}" for k in ("before", "rank-order")
            )
            print(f"{tokens:>7}{world:>4}{cells}{cost['ring'][0] / 2**20:>18.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
