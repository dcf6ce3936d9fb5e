"""Time per kernel launch in Triton's interpreter: stock vs the CPU runtime's fast path.

The stand-in CPU runtime runs vLLM's ``@triton.jit`` kernels in Triton's interpreter, with a fast
path that cuts the interpreter's fixed costs per launch (``xpu_laguna_triton_cpu/fast_launch.py``
in ``scripts/cpu_triton/``; docs/cpu-runs.md). This replays a recording of a real run's launches
(made with ``VXL_TRITON_RECORD=DIR`` in the environment of any run of the runtime) through the
stock interpreter and through the fast path, interleaved launch by launch in every round, in this
process (the CPU runtime's python, from the repository root). A first, untimed round rewrites
every kernel's source once (the interpreter does it at a kernel's first launch) and compares the
two replays of every launch byte for byte, as the replay test does; a difference is an error.

Timed on this thread's CPU time by default (``--clock cpu``; ``wall`` for elapsed time): the
interpreter is one Python thread, and on a shared machine CPU time leaves out the time other
processes take the core. Printed per kernel: the launches replayed, the launches of the recorded
run, ms per launch stock and fast (the mean over every replay, and the fastest replay: the least
disturbed by other load), and their ratio; then the totals (mean over the replayed launches, and
the recorded run's launches times each kernel's means). Figures only, nothing is asserted.

Usage (from the repository root)::

    python -m scripts.bench.triton_interpreter DIR [--rounds 3] [--kernel NAME] [--clock cpu|wall]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from scripts.cli import ToolParser
from scripts.errors import ToolError, exit_status

CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def measure(directory: Path, rounds: int, kernel_filter: str, clock: str) -> list[str]:
    try:
        import triton.runtime.interpreter  # noqa: F401  (the runtime's .pth fixes it as it is imported)
        from xpu_laguna_triton_cpu import fast_launch, replay
    except ImportError as exc:
        raise ToolError(f"needs the CPU runtime's python (its Triton backend xpu_laguna_triton_cpu): {exc}") from None
    if fast_launch.installed() is None:
        raise ToolError(
            "the interpreter's fast path is not installed here (TRITON_INTERPRET=1 and no "
            f"{fast_launch.STOCK_ENV}=1 needed)"
        )
    try:
        recorded = replay.load(directory)
    except Exception as exc:  # a torch.load of a file that is not a recorded launch: any error
        raise ToolError(f"{directory}: not a recording of kernel launches: {exc}") from None
    launches = [launch for launch in recorded if kernel_filter in launch.kernel]
    if not launches:
        raise ToolError(
            f"{directory}: no recorded launch" + (f" of a kernel named *{kernel_filter}*" if kernel_filter else "")
        )
    counts = replay.counts(directory)
    kernels = {launch.kernel: replay.resolve(launch.kernel) for launch in launches}
    for launch in launches:  # the untimed round: each kernel's source rewritten once, results compared
        _, stock = replay.run_stock(launch, kernels[launch.kernel])
        _, fast = replay.run_fast(launch, kernels[launch.kernel])
        if replay.differing(stock, fast):
            raise ToolError(f"{launch.path.name} ({launch.kernel}): stock and fast replays differ")
    times: dict[str, dict[str, list[float]]] = {name: {"stock": [], "fast": []} for name in kernels}
    for r in range(rounds):
        for i, launch in enumerate(launches):
            order = [("stock", replay.run_stock), ("fast", replay.run_fast)]
            for mode, runner in reversed(order) if (r + i) % 2 else order:
                seconds, _ = runner(launch, kernels[launch.kernel], CLOCKS[clock])
                times[launch.kernel][mode].append(seconds * 1e3)
    return [f"clock: {clock}", *render(launches, counts, times)]


def _short(name: str) -> str:
    module, _, qualname = name.partition(":")
    return f"{module.rsplit('.', 1)[-1]}:{qualname}"


def render(
    launches: list[Any], counts: dict[str, dict[str, Any]], times: dict[str, dict[str, list[float]]]
) -> list[str]:
    replayed: dict[str, int] = {}
    for launch in launches:
        replayed[launch.kernel] = replayed.get(launch.kernel, 0) + 1
    lines = [
        "ms per launch: mean over every replay (fastest replay); stock/fast: ratio of the means (of the fastest)",
        "",
        "| kernel | replayed | run launches | stock ms | fast ms | stock/fast |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    run_stock = run_fast = 0.0
    run_launches = 0
    for name in sorted(times):
        stock, fast = times[name]["stock"], times[name]["fast"]
        mean_stock, mean_fast = statistics.fmean(stock), statistics.fmean(fast)
        n = int(counts.get(name, {}).get("launches", 0))
        run_launches += n
        run_stock += n * mean_stock
        run_fast += n * mean_fast
        lines.append(
            f"| {_short(name)} | {replayed[name]} | {n} | {mean_stock:.2f} ({min(stock):.2f}) | "
            f"{mean_fast:.2f} ({min(fast):.2f}) | {mean_stock / mean_fast:.1f}x ({min(stock) / min(fast):.1f}x) |"
        )
    every_stock = statistics.fmean(t for v in times.values() for t in v["stock"])
    every_fast = statistics.fmean(t for v in times.values() for t in v["fast"])
    lines += [
        "",
        f"{len(times)} kernels, {len(launches)} launches replayed; mean per launch: stock {every_stock:.2f} ms, "
        f"fast {every_fast:.2f} ms ({every_stock / every_fast:.1f}x)",
    ]
    if run_launches:
        lines.append(
            f"the recorded run's {run_launches} launches at these means: stock {run_stock / 1e3:.2f} s, "
            f"fast {run_fast / 1e3:.2f} s, {(run_stock - run_fast) / 1e3:.2f} s saved"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(prog="python -m scripts.bench.triton_interpreter", description=__doc__)
    parser.add_argument("directory", type=Path, help="a recording (VXL_TRITON_RECORD=DIR of a CPU runtime run)")
    parser.add_argument("--rounds", type=int, default=3, help="replays of every launch, each way")
    parser.add_argument("--kernel", default="", help="only the kernels whose module:name contains this")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: this thread's CPU time (the interpreter is one Python thread; time another process "
        "takes the core from it is left out), wall: elapsed time",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")

    def run() -> None:
        if not args.directory.is_dir():
            raise ToolError(f"{args.directory}: no such folder (a recording: VXL_TRITON_RECORD=DIR)")
        print("\n".join(measure(args.directory, args.rounds, args.kernel, args.clock)))

    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
