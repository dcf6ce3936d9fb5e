"""Host time of exact-verify metadata preparation per 48-layer step: inline vs prebuilt.

Runs in an environment with the patched vLLM tree (e.g. the CPU runtime venv with
the series synced in); on a machine without an XPU the backend's metadata code is
the same, only the device differs. One process measures both modes, interleaved
in rounds so that machine noise hits both alike, and prints per-step figures and
the ratio.

A Laguna-S step at M=8 (one request, 8 verify rows) is modelled with the real
FlashAttention metadata builders and Laguna's KV-cache grouping: 48 layers = 12
global + 36 sliding, i.e. one full-attention group and three sliding-window
groups of 12 layers; the runner calls ``build`` once per (spec, builder type) and
``update_block_table`` for the other sliding groups.

Two figures per mode (median over steps, microseconds):

* ``exact metadata``: only the exact-verify part. Inline = building query offsets,
  KV lengths and the expanded block table in each of the 48 layer forwards.
  Prebuilt = refreshing the owners' buffers (2 builds + 2 group re-expansions,
  drift guards included) plus the per-layer source guard.
* ``step metadata``: the whole metadata preparation of the step (the upstream
  ``build``/``update_block_table`` work, identical in both modes, plus the above).

And, for a configuration the series is not for (its exact verify off), one ``build`` of the
full-attention group by upstream's builder and by the series' builder (the class the series'
platform gives every FlashAttention layer), side by side: what the series costs a model it
does not act on (its builder decides when it is built and then returns upstream's metadata).

Usage (from the repository root)::

    python -m scripts.bench.metadata_microbench [--steps 2000] [--cols 2048]
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from scripts.bench.tiny_config import tiny_vllm_config

LAYERS = 48
GLOBAL_LAYERS = 12
GROUP_LAYERS = 12
HEADS = 12  # Laguna-S global Q heads per rank at TP4
KV_HEADS = 2  # 8 KV heads / TP4
HEAD_SIZE = 128
BLOCK = 64
WINDOW = 512
WIDTH = 8


def series_options(prebuilt: bool, full_guards: bool) -> dict[str, object]:
    """The series' options of one mode's configuration: exact verify at this width named on (on
    CPU a switch named true is how a configuration asks for the series), the prebuilt metadata on
    or off, its debug guard mode."""
    return {
        "exact_verify": True,
        "verify_width": WIDTH,
        "prebuilt_metadata": prebuilt,
        "debug_prebuilt_full_guard": full_guards,
    }


def _vllm_config(max_len: int, options: dict[str, object]) -> Any:
    from vllm.config import CacheConfig, ParallelConfig

    return tiny_vllm_config(
        "metadata_microbench_",
        laguna=True,  # the series acts on a Laguna target only
        options=options,
        heads=HEADS,
        kv_heads=KV_HEADS,
        head_dim=HEAD_SIZE,
        dtype="bfloat16",
        max_len=max_len,
        cache_config=CacheConfig(block_size=BLOCK),
        parallel_config=ParallelConfig(tensor_parallel_size=1),
    )


def _builders(config: Any) -> list[Any]:
    """One builder per KV-cache group, each given ``config`` (and under it as the current one):
    the mode's series options are that configuration's."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    from vllm.xpu_laguna.attention.backend import (
        XpuLagunaFlashAttentionMetadataBuilder as FlashAttentionMetadataBuilder,
    )

    common = {
        "block_size": BLOCK,
        "num_kv_heads": KV_HEADS,
        "head_size": HEAD_SIZE,
        "dtype": torch.bfloat16,
    }
    specs = [FullAttentionSpec(**common)] + [SlidingWindowSpec(**common, sliding_window=WINDOW) for _ in range(3)]
    out = []
    with set_current_vllm_config(config):
        for gid, spec in enumerate(specs):
            names = [f"layer.{gid}.{i}" for i in range(GROUP_LAYERS)]
            out.append(FlashAttentionMetadataBuilder(spec, names, config, torch.device("cpu")))
    return out


class Step:
    """One M=8 verify step's inputs: common metadata per KV-cache group."""

    def __init__(self, cols: int, seq_len: int) -> None:
        import torch
        from vllm.v1.attention.backend import CommonAttentionMetadata

        qsl = torch.tensor([0, WIDTH], dtype=torch.int32)
        seq = torch.tensor([seq_len], dtype=torch.int32)
        self.seq_len = seq_len
        self.cms = []
        for gid in range(4):
            table = torch.arange(cols, dtype=torch.int32).unsqueeze(0) + 1000 * gid
            self.cms.append(
                CommonAttentionMetadata(
                    query_start_loc=qsl,
                    query_start_loc_cpu=qsl,
                    seq_lens=seq,
                    num_reqs=1,
                    num_actual_tokens=WIDTH,
                    max_query_len=WIDTH,
                    max_seq_len=seq_len,
                    block_table_tensor=table,
                    slot_mapping=torch.arange(seq_len - WIDTH, seq_len),
                    causal=True,
                    seq_lens_cpu_upper_bound=seq,
                )
            )


def _exact_only(builders: list[Any], step: Step, metadata: list[Any]) -> None:
    """Exact-verify metadata work only (metadata from a previous full build)."""
    from vllm.xpu_laguna.attention import exact as x

    owner0 = builders[0].laguna_prebuilt
    if owner0 is None:  # inline: every layer builds its tensors
        for gid in range(4):
            md = metadata[gid]
            for _ in range(GROUP_LAYERS):
                x.build_inline(md.seq_lens, md.block_table, WIDTH)
        return
    cms = step.cms
    mds = [
        builders[0].laguna_prebuilt.refresh(WIDTH, cms[0].seq_lens, cms[0].block_table_tensor, step.seq_len),
        builders[1].laguna_prebuilt.refresh(WIDTH, cms[1].seq_lens, cms[1].block_table_tensor, step.seq_len),
    ]
    mds.append(builders[2].laguna_prebuilt.rebind(mds[1], cms[2].seq_lens, cms[2].block_table_tensor))
    mds.append(builders[3].laguna_prebuilt.rebind(mds[1], cms[3].seq_lens, cms[3].block_table_tensor))
    for gid in range(4):
        table = cms[gid].block_table_tensor
        exact = mds[gid]
        for _ in range(GROUP_LAYERS):
            exact.owner.check_source(exact, table)


def _full_step(builders: list[Any], step: Step) -> list[Any]:
    """Whole metadata preparation of a step, as the V1 runner does it."""
    from vllm.xpu_laguna.attention import exact as x

    cms = step.cms
    md_full = builders[0].build(0, cms[0])
    md_slide = builders[1].build(0, cms[1])
    mds = [
        md_full,
        md_slide,
        builders[2].update_block_table(md_slide, cms[2].block_table_tensor, cms[2].slot_mapping),
        builders[3].update_block_table(md_slide, cms[3].block_table_tensor, cms[3].slot_mapping),
    ]
    for gid in range(4):
        md = mds[gid]
        exact = md.laguna_exact
        assert exact is not None and exact.width == WIDTH
        for _ in range(GROUP_LAYERS):
            if exact.owner is None:
                x.build_inline(md.seq_lens, md.block_table, WIDTH)
            else:
                exact.owner.check_source(exact, md.block_table)
    return mds


def _off_builders(cols: int) -> dict[str, Any]:
    """Upstream's builder and the series' builder of the full-attention group of one config the
    series is not for (exact verify off)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.xpu_laguna.attention.backend import XpuLagunaFlashAttentionMetadataBuilder

    config = _vllm_config(cols * BLOCK, {"exact_verify": False})
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, dtype=torch.bfloat16)
    with set_current_vllm_config(config):
        return {
            "upstream": FlashAttentionMetadataBuilder(spec, ["layer.0"], config, torch.device("cpu")),
            "series": XpuLagunaFlashAttentionMetadataBuilder(spec, ["layer.0"], config, torch.device("cpu")),
        }


def _time_us(fn: Any, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
    return samples


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.bench.metadata_microbench",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--steps", type=int, default=2000, help="steps per mode")
    parser.add_argument("--cols", type=int, default=2048, help="block-table columns")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument(
        "--full-guards",
        action="store_true",
        help="fingerprint every view of every width on each refresh",
    )
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: needs torch and the patched vLLM tree", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    modes = {
        name: _builders(_vllm_config(args.cols * BLOCK, series_options(prebuilt, args.full_guards)))
        for name, prebuilt in (("inline", False), ("prebuilt", True))
    }
    if modes["prebuilt"][0].laguna_prebuilt is None or modes["inline"][0].laguna_prebuilt:
        print("error: the prebuilt_metadata option did not take effect", file=sys.stderr)
        return 2
    owners = [b.laguna_prebuilt for b in modes["prebuilt"] if b.laguna_prebuilt is not None]
    if any(owner.full_guard_every_call != args.full_guards for owner in owners):
        print("error: the debug_prebuilt_full_guard option did not take effect", file=sys.stderr)
        return 2
    step = Step(args.cols, seq_len=args.cols * BLOCK // 2)
    prepared = {name: _full_step(b, step) for name, b in modes.items()}  # warm-up
    per = max(1, args.steps // args.rounds)
    exact: dict[str, list[float]] = {m: [] for m in modes}
    full: dict[str, list[float]] = {m: [] for m in modes}
    off = _off_builders(args.cols)
    off_build: dict[str, list[float]] = {m: [] for m in off}
    for _ in range(args.rounds):
        for name, builders in modes.items():
            md = prepared[name]
            exact[name] += _time_us(lambda b=builders, m=md: _exact_only(b, step, m), per)
            full[name] += _time_us(lambda b=builders: _full_step(b, step), per)
        for name, builder in off.items():
            off_build[name] += _time_us(lambda b=builder: b.build(0, step.cms[0]), per)
    print(
        f"metadata preparation per {LAYERS}-layer M={WIDTH} step "
        f"(4 KV-cache groups, {args.cols} block-table columns, "
        f"{per * args.rounds} steps per mode, torch threads 1, device cpu, "
        f"drift guards: {'all views' if args.full_guards else 'tiered'})"
    )
    print(f"{'':24}{'inline':>12}{'prebuilt':>12}{'ratio':>10}")
    for label, data in (("exact metadata [us]", exact), ("step metadata [us]", full)):
        inl = statistics.median(data["inline"])
        pre = statistics.median(data["prebuilt"])
        print(f"{label:24}{inl:12.1f}{pre:12.1f}{inl / pre:9.1f}x")
    print("one build of a config the series is not for (exact verify off)")
    print(f"{'':24}{'upstream':>12}{'series':>12}{'ratio':>10}")
    up, series = (statistics.median(off_build[m]) for m in ("upstream", "series"))
    print(f"{'build [us]':24}{up:12.1f}{series:12.1f}{series / up:9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
