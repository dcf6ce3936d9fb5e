"""Divergence lengths of the XPU paged-decode KV split count: verify vs q=1 decode.

For each verify width q, the KV lengths (of the step's last row) at which some verify row would
be reduced with another split count than the q=1 decode of its own length, when the q rows run
in one call and the kernel picks the count (no plan), and with the series' plan (rows grouped
by their own planned count: always none); plus the kernel calls per verify step the plan costs.
Pure arithmetic on the port of vllm_xpu_kernels v0.1.11.1 ``get_num_splits``
(vllm/xpu_laguna/attention/split_plan.py); runs anywhere the patched vLLM imports.

    python -m scripts.device.split_divergence                  # Laguna-S TP4, Arc Pro B70
    python -m scripts.device.split_divergence --widths 8 --max-len 32768
"""

from __future__ import annotations

from scripts.cli import ToolParser, positive_ints


def runs(flags: list[tuple[int, bool]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for length, bad in flags:
        if bad and out and out[-1][1] == length - 1:
            out[-1] = (out[-1][0], length)
        elif bad:
            out.append((length, length))
    return out


def main(argv: list[str] | None = None) -> int:
    p = ToolParser(
        prog="python -m scripts.device.split_divergence",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--heads-q", type=int, default=12, help="Q heads per rank (default: %(default)s, Laguna-S TP4)")
    p.add_argument("--heads-kv", type=int, default=2, help="KV heads per rank (default: %(default)s)")
    p.add_argument("--block", type=int, default=64, help="KV block size (default: %(default)s)")
    p.add_argument("--xe-cores", type=int, default=32, help="Xe cores (default: %(default)s, Arc Pro B70)")
    p.add_argument("--window", type=int, default=0, help="sliding window (0: global layer; default: %(default)s)")
    p.add_argument("--widths", type=positive_ints, default=(8, 12, 16), help="verify widths (default: 8,12,16)")
    p.add_argument("--max-len", type=int, default=65536, help="longest KV length scanned (default: %(default)s)")
    a = p.parse_args(argv)
    from vllm.xpu_laguna.attention import split_plan as plan

    wl = a.window - 1 if a.window else -1
    tile = plan.kv_tile(a.block)

    def own(n: int) -> int:
        return plan.decode_num_splits(n, a.heads_q, a.heads_kv, a.block, wl, a.xe_cores)

    def splits_apart(n: int) -> bool:  # below kMinBlocksForSplit tiles every count is one split
        first = max(n - 1 - wl, 0) // tile if wl >= 0 else 0
        return (n + tile - 1) // tile - first >= plan.min_blocks_for_split(tile)

    print(
        f"heads {a.heads_q}:{a.heads_kv}, block {a.block}, Xe cores {a.xe_cores}, "
        f"{'window ' + str(a.window) if a.window else 'global'}, lengths to {a.max_len}"
    )
    for q in a.widths:
        noplan, planned, calls = [], [], []
        for length in range(q, a.max_len + 1):
            rows = range(length - q + 1, length + 1)
            call = plan.heuristic_num_splits(
                q, a.heads_q, a.heads_kv, plan.effective_seqlen_k(length, wl), a.block, a.xe_cores
            )
            noplan.append((length, any(own(n) != call and splits_apart(n) for n in rows)))
            groups = plan.row_groups(tuple(rows), a.heads_q, a.heads_kv, a.block, wl, a.xe_cores)
            planned.append(
                (
                    length,
                    any(own(n) != g[2] for g in groups for n in range(length - q + 1 + g[0], length - q + 1 + g[1])),
                )
            )
            calls.append(len(groups))
        bad = runs(noplan)
        shown = ", ".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in bad[:6]) + (" ..." if len(bad) > 6 else "")
        print(
            f"q={q:>2}: no plan: rows differ at step lengths {shown or 'none'} "
            f"(first {bad[0][0] if bad else '-'}, {sum(b for _, b in noplan)} of {len(noplan)} lengths); "
            f"with plan: {sum(b for _, b in planned)} lengths; kernel calls per verify step: mean "
            f"{sum(calls) / len(calls):.4f}, max {max(calls)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
