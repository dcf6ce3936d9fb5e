"""Check the XPU attention kernels of the exact-verify path against the reference.

Runs on an Intel XPU machine where the series' wheel is installed together with
the XPU torch and the pinned ``vllm_xpu_kernels`` (see the README's XPU install
section). It cannot run on a machine without an XPU; ``--device cpu`` runs the
same plumbing on the pure-torch reference kernels (a self-test of this script:
there the "kernel" is the reference, so every comparison is trivially exact).

For each Laguna-S attention shape per rank at TP4 (sliding layers: 18 Q heads,
global layers: 12 Q heads; 2 KV heads; head_dim 128; sliding window 512; KV block
64), each KV dtype (bf16 written as ``--kv-cache-dtype bfloat16``, and fp8), each
verify width q = 2..8 and several KV lengths (inside/over the window, verify rows
straddling a block boundary), on random inputs it runs:

* ``exact``: the exact-verify call of patch 0004 (q one-token pseudo-sequences in
  one paged-decode call, through the same seam the backend uses);
* ``decode``: q separate q=1 decodes, exactly as the upstream backend calls the
  kernel for plain decoding;
* ``chunk``: the upstream q-row verify call (causal, cu_seqlens_q=[0, q]), i.e.
  what runs without the patch;
* ``reference``: the pure-torch reference kernel on the same cache.

and prints, per case, max |exact - reference|, max |chunk - decode|, and the
number of verify rows of ``exact`` and of ``chunk`` that are bitwise equal to
``decode``. It also checks the cache write (kernel vs reference) and that the
prebuilt metadata (patch 0005) refreshed on the device equals the inline tensors.

Pass criteria (exit status 0): every ``exact`` row bitwise equal to its decode,
max |exact - reference| <= --tol (default 2e-2 for bf16 and fp8 inputs), the bf16
cache write bitwise equal to the reference, prebuilt == inline. ``chunk`` rows that
differ from ``decode`` are the defect the patch fixes and are reported, not failed.

Usage on the XPU machine, from the repository root::

    python -m scripts.device.xpu_attention_check            # all shapes
    python -m scripts.device.xpu_attention_check --quick    # q in {2, 8}, bf16
    python -m scripts.device.xpu_attention_check --device cpu   # self-test
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

HEAD_SIZE = 128
KV_HEADS = 2  # 8 KV heads / TP4
BLOCK = 64
WINDOW = 512
SHAPES = {"sliding (18:2, window 512)": (18, WINDOW), "global (12:2)": (12, None)}
KV_LENGTHS = (70, 129, 600, 1025)  # short, block straddle, over the window, long


@dataclass
class Result:
    shape: str
    kv_dtype: str
    q: int
    kv_len: int
    exact_vs_ref: float
    chunk_vs_decode: float
    exact_rows_equal: int
    chunk_rows_equal: int


def _run_case(
    torch: Any,
    dev: Any,
    num_heads: int,
    window: int | None,
    kv_dtype: str,
    q: int,
    kv_len: int,
    seed: int,
) -> tuple[float, float, int, int, bool]:
    from vllm.v1.attention.backends import xpu_laguna_exact as exact_mod
    from vllm.v1.attention.ops import xpu_laguna_reference as ref

    gen = torch.Generator().manual_seed(seed)
    num_blocks = (kv_len + BLOCK - 1) // BLOCK + 4
    perm = torch.randperm(num_blocks, generator=gen)[: (kv_len + BLOCK - 1) // BLOCK]
    table = torch.zeros(1, 32, dtype=torch.int32)
    table[0, : perm.numel()] = perm.to(torch.int32)
    table = table.to(dev)
    k = (
        torch.randn(kv_len, KV_HEADS, HEAD_SIZE, generator=gen)
        .to(torch.bfloat16)
        .to(dev)
    )
    v = (
        torch.randn(kv_len, KV_HEADS, HEAD_SIZE, generator=gen)
        .to(torch.bfloat16)
        .to(dev)
    )
    query = (
        torch.randn(q, num_heads, HEAD_SIZE, generator=gen).to(torch.bfloat16).to(dev)
    )
    fp8 = kv_dtype == "fp8"
    cache_dtype = torch.uint8 if fp8 else torch.bfloat16
    # Backend layout: logical (B, H, N, 2D) in HND memory, split into NHD views.
    kv_cache = torch.zeros(
        num_blocks, KV_HEADS, BLOCK, 2 * HEAD_SIZE, dtype=cache_dtype, device=dev
    )
    key_cache, value_cache = kv_cache.transpose(1, 2).split(HEAD_SIZE, dim=-1)
    k_scale = torch.tensor(0.05 if fp8 else 1.0, device=dev)
    v_scale = torch.tensor(0.04 if fp8 else 1.0, device=dev)
    pos = torch.arange(kv_len, device=dev)
    slots = table[0, pos // BLOCK].to(torch.int64) * BLOCK + pos % BLOCK
    write_dtype = exact_mod.cache_write_dtype("fp8" if fp8 else "bfloat16")
    if dev.type == "xpu":
        from vllm import _custom_ops as ops

        ops.reshape_and_cache_flash(
            k, v, key_cache, value_cache, slots, write_dtype, k_scale, v_scale
        )
        ref_cache = torch.zeros_like(kv_cache)
        rk, rv = ref_cache.transpose(1, 2).split(HEAD_SIZE, dim=-1)
        ref.reshape_and_cache_flash(k, v, rk, rv, slots, write_dtype, k_scale, v_scale)
        cache_ok = fp8 or torch.equal(ref_cache, kv_cache)
    else:
        ref.reshape_and_cache_flash(
            k, v, key_cache, value_cache, slots, write_dtype, k_scale, v_scale
        )
        cache_ok = True
    if fp8:
        key_cache = key_cache.view(torch.float8_e4m3fn)
        value_cache = value_cache.view(torch.float8_e4m3fn)
    win = [window - 1, 0] if window is not None else [-1, -1]
    scale = HEAD_SIZE**-0.5
    seq_lens = torch.tensor([kv_len], dtype=torch.int32, device=dev)

    def call(
        fn: Any, qq: Any, cu: Any, lens: Any, tab: Any, max_q: int, causal: bool
    ) -> Any:
        n = cu.numel() - 1
        out = torch.empty_like(qq)
        fn(
            q=qq,
            k=key_cache,
            v=value_cache,
            out=out,
            cu_seqlens_q=cu,
            max_seqlen_q=max_q,
            seqused_k=lens,
            max_seqlen_k=kv_len,
            softmax_scale=scale,
            causal=causal,
            window_size=win,
            block_table=tab,
            softcap=0.0,
            scheduler_metadata=None,
            fa_version=2,
            q_descale=None,
            k_descale=k_scale.expand(n, KV_HEADS),
            v_descale=v_scale.expand(n, KV_HEADS),
            num_splits=0,
            s_aux=None,
        )
        return out

    kernel = exact_mod.varlen_attention
    cu, lens, tab = exact_mod.build_inline(seq_lens, table, q)
    out_exact = call(lambda **kw: kernel(**kw), query, cu, lens, tab, 1, False)
    out_ref = call(ref.flash_attn_varlen_func, query, cu, lens, tab, 1, False)
    one = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    decodes = torch.cat(
        [
            call(
                lambda **kw: kernel(**kw),
                query[j : j + 1],
                one,
                seq_lens - (q - 1 - j),
                table,
                1,
                True,
            )
            for j in range(q)
        ]
    )
    chunk = call(
        lambda **kw: kernel(**kw),
        query,
        torch.tensor([0, q], dtype=torch.int32, device=dev),
        seq_lens,
        table,
        q,
        True,
    )

    # Prebuilt metadata (patch 0005) refreshed on this device == inline.
    from vllm.v1.attention.backends.xpu_laguna_prebuilt import PrebuiltExactMetadata

    owner = PrebuiltExactMetadata(8, dev)
    md = owner.refresh(q, seq_lens, table)
    prebuilt_ok = (
        torch.equal(md.query_start_loc, cu)
        and torch.equal(md.seq_lens, lens)
        and torch.equal(md.block_table, tab)
    )

    def rows_equal(a: Any, b: Any) -> int:
        return int(sum(torch.equal(a[i], b[i]) for i in range(q)))

    return (
        float((out_exact.float() - out_ref.float()).abs().max()),
        float((chunk.float() - decodes.float()).abs().max()),
        rows_equal(out_exact, decodes),
        rows_equal(chunk, decodes),
        cache_ok and prebuilt_ok,
    )


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="python -m scripts.device.xpu_attention_check",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--device", default="xpu", help="xpu, or cpu for the self-test"
    )
    parser.add_argument("--quick", action="store_true", help="q in {2, 8}, bf16 only")
    parser.add_argument(
        "--tol", type=float, default=2e-2, help="max |exact - reference|"
    )
    args = parser.parse_args(argv)
    try:
        import torch
        from vllm.platforms import current_platform
    except ImportError as e:
        print(
            f"error: needs torch and the patched vLLM installed ({e})", file=sys.stderr
        )
        return 2
    dev = torch.device(args.device)
    if dev.type == "xpu" and not current_platform.is_xpu():
        print(
            "error: no XPU platform here; use --device cpu for the self-test",
            file=sys.stderr,
        )
        return 2
    from vllm.v1.attention.backends import xpu_laguna_exact

    print(f"device {dev}, kernel seam: {xpu_laguna_exact.kernel_seam_name()}")
    widths = (2, 8) if args.quick else tuple(range(2, 9))
    kv_dtypes = ("bf16",) if args.quick else ("bf16", "fp8")
    results: list[Result] = []
    failures: list[str] = []
    seed = 0
    header = (
        f"{'shape':28}{'kv':>5}{'q':>3}{'kv_len':>7}{'|exact-ref|':>13}"
        f"{'|chunk-dec|':>13}{'exact==dec':>11}{'chunk==dec':>11}"
    )
    print(header)
    for shape, (heads, window) in SHAPES.items():
        for kv_dtype in kv_dtypes:
            for q in widths:
                for kv_len in KV_LENGTHS:
                    seed += 1
                    e_ref, c_dec, e_eq, c_eq, aux_ok = _run_case(
                        torch, dev, heads, window, kv_dtype, q, kv_len, seed
                    )
                    r = Result(shape, kv_dtype, q, kv_len, e_ref, c_dec, e_eq, c_eq)
                    results.append(r)
                    print(
                        f"{shape:28}{kv_dtype:>5}{q:>3}{kv_len:>7}{e_ref:13.3e}"
                        f"{c_dec:13.3e}{e_eq:>8}/{q:<2}{c_eq:>8}/{q:<2}"
                    )
                    if e_eq != q:
                        failures.append(
                            f"{shape} {kv_dtype} q={q} L={kv_len}: exact rows "
                            f"equal to decode {e_eq}/{q}"
                        )
                    if e_ref > args.tol:
                        failures.append(
                            f"{shape} {kv_dtype} q={q} L={kv_len}: "
                            f"|exact-ref| {e_ref:.3e} > {args.tol}"
                        )
                    if not aux_ok:
                        failures.append(
                            f"{shape} {kv_dtype} q={q} L={kv_len}: cache write "
                            "or prebuilt metadata mismatch"
                        )
    rows = sum(r.q for r in results)
    print(
        f"summary: {len(results)} cases, {rows} verify rows; exact==decode "
        f"{sum(r.exact_rows_equal for r in results)}/{rows}; chunk==decode "
        f"{sum(r.chunk_rows_equal for r in results)}/{rows}; max |exact-ref| "
        f"{max(r.exact_vs_ref for r in results):.3e}; max |chunk-decode| "
        f"{max(r.chunk_vs_decode for r in results):.3e}"
    )
    for f in failures:
        print(f"FAIL {f}")
    print("PASS" if not failures else f"FAILED ({len(failures)})")
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
