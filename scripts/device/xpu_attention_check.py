"""Check the XPU attention kernels of the exact-verify path against decode and the reference.

Runs on an Intel XPU machine where the series' wheel is installed together with
the XPU torch and the pinned ``vllm_xpu_kernels`` (see the README's XPU install
section). ``--device cpu`` runs the same plumbing on the pure-torch reference
kernels: a self-test of this script, never a device result (it says so and never
prints PASS for it).

For each Laguna-S attention shape per rank at TP4 (sliding layers: 18 Q heads,
global layers: 12 Q heads; 2 KV heads; head_dim 128; sliding window 512; KV block
64), each KV dtype (bf16 written as ``--kv-cache-dtype bfloat16``, and fp8), each
verify width q = 2..8, 12, 16 and KV lengths up to 16384 (inside/over the window,
rows straddling a block boundary, past the ~2.2K split-count divergence), on random
inputs it runs:

* ``plan``: the exact verify as the backend runs it (q one-token pseudo-sequences,
  rows grouped by their planned KV split count, one paged-decode call per group,
  explicit ``num_splits_kv``);
* ``noplan``: the same rows in one call without a split count (the kernel picks
  one for the whole call: the series' debug option ``debug_no_split_plan``);
* ``decode``: q separate q=1 decodes with the planned count (as the backend runs a
  single-request decode), and the same decodes with the kernel's own choice;
* ``chunk``: the upstream q-row verify call (causal, cu_seqlens_q=[0, q]);
* ``reference``: the pure-torch reference kernel on the same cache.

Per case it prints the split counts each side used (decode: the plan per row;
plan: per call; noplan: what the ported heuristic predicts the kernel picks), the
rows of plan / noplan / chunk bitwise equal to decode, whether the planned decode
equals the kernel's own batch-1 choice bitwise (it must: otherwise the port or the
Xe-core count disagrees with the kernel), and max |plan - reference|. It also
checks the cache write (kernel vs reference) and the prebuilt metadata (0005).

Pass criteria (exit status 0, device only): every ``plan`` row bitwise equal to its
decode, planned decode == kernel's decode, |plan - reference| <= --tol, the bf16
cache write bitwise equal to the reference, prebuilt == inline. ``noplan`` and
``chunk`` rows that differ are the defects the series fixes: reported, not failed.

Usage on the XPU machine, from the repository root::

    python -m scripts.device.xpu_attention_check            # all shapes and lengths
    python -m scripts.device.xpu_attention_check --quick    # q in {2, 8, 16}, 3 lengths, bf16
    python -m scripts.device.xpu_attention_check --device cpu --quick   # self-test
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

HEAD_SIZE = 128
KV_HEADS = 2  # 8 KV heads / TP4
BLOCK = 64
WINDOW = 512
SHAPES = {"sliding (18:2, window 512)": (18, WINDOW), "global (12:2)": (12, None)}
# short, block straddle, over the window, one split, past the divergence (~2.2K), long
KV_LENGTHS = (70, 129, 600, 1025, 2300, 4096, 8192, 16384)
QUICK_LENGTHS = (600, 2300, 8192)
WIDTHS = (*range(2, 9), 12, 16)
QUICK_WIDTHS = (2, 8, 16)


@dataclass
class Result:
    shape: str
    kv_dtype: str
    q: int
    kv_len: int
    splits_decode: str  # planned count per decode row (distinct values)
    splits_plan: str  # count per verify call with the plan
    splits_noplan: int  # the ported heuristic's prediction for the one no-plan call
    plan_rows_equal: int
    noplan_rows_equal: int
    chunk_rows_equal: int
    decode_plan_equals_kernel: bool
    plan_vs_ref: float
    aux_ok: bool


def _run_case(
    torch: Any,
    dev: Any,
    shape: str,
    num_heads: int,
    window: int | None,
    kv_dtype: str,
    q: int,
    kv_len: int,
    seed: int,
) -> Result:
    from vllm.xpu_laguna.attention import exact as exact_mod
    from vllm.xpu_laguna.attention import split_plan as plan

    from scripts.cpu_standins import standin_module

    ref = standin_module("reference_attention")

    gen = torch.Generator().manual_seed(seed)
    used_blocks = (kv_len + BLOCK - 1) // BLOCK
    num_blocks = used_blocks + 4
    perm = torch.randperm(num_blocks, generator=gen)[:used_blocks]
    table = torch.zeros(1, used_blocks + 1, dtype=torch.int32)
    table[0, :used_blocks] = perm.to(torch.int32)
    table = table.to(dev)

    def rnd(*size: int) -> Any:
        return torch.randn(*size, generator=gen).to(torch.bfloat16).to(dev)

    k, v = rnd(kv_len, KV_HEADS, HEAD_SIZE), rnd(kv_len, KV_HEADS, HEAD_SIZE)
    query = rnd(q, num_heads, HEAD_SIZE)
    fp8 = kv_dtype == "fp8"
    cache_dtype = torch.uint8 if fp8 else torch.bfloat16
    # Backend layout: logical (B, H, N, 2D) in HND memory, split into NHD views.
    kv_cache = torch.zeros(num_blocks, KV_HEADS, BLOCK, 2 * HEAD_SIZE, dtype=cache_dtype, device=dev)
    key_cache, value_cache = kv_cache.transpose(1, 2).split(HEAD_SIZE, dim=-1)
    k_scale = torch.tensor(0.05 if fp8 else 1.0, device=dev)
    v_scale = torch.tensor(0.04 if fp8 else 1.0, device=dev)
    pos = torch.arange(kv_len, device=dev)
    slots = table[0, pos // BLOCK].to(torch.int64) * BLOCK + pos % BLOCK
    write_dtype = exact_mod.cache_write_dtype("fp8" if fp8 else "bfloat16", torch.bfloat16, cache_dtype)
    if dev.type == "xpu":
        from vllm import _custom_ops as ops

        ops.reshape_and_cache_flash(k, v, key_cache, value_cache, slots, write_dtype, k_scale, v_scale)
        ref_cache = torch.zeros_like(kv_cache)
        rk, rv = ref_cache.transpose(1, 2).split(HEAD_SIZE, dim=-1)
        ref.reshape_and_cache_flash(k, v, rk, rv, slots, write_dtype, k_scale, v_scale)
        cache_ok = fp8 or torch.equal(ref_cache, kv_cache)
    else:
        ref.reshape_and_cache_flash(k, v, key_cache, value_cache, slots, write_dtype, k_scale, v_scale)
        cache_ok = True
    if fp8:
        key_cache = key_cache.view(torch.float8_e4m3fn)
        value_cache = value_cache.view(torch.float8_e4m3fn)
    win = [window - 1, 0] if window is not None else [-1, -1]
    window_left = win[0]
    scale = HEAD_SIZE**-0.5
    seq_lens = torch.tensor([kv_len], dtype=torch.int32, device=dev)
    xe_cores = plan.device_xe_cores(dev.index or 0) if dev.type == "xpu" else plan.device_xe_cores()

    def call(
        fn: Any,
        qq: Any,
        cu: Any,
        lens: Any,
        tab: Any,
        max_q: int,
        max_k: int,
        causal: bool,
        splits: int | None,
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
            max_seqlen_k=max_k,
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
            num_splits_kv=splits,
            s_aux=None,
        )
        return out

    kernel = exact_mod.varlen_attention
    cu, lens, tab = exact_mod.build_inline(seq_lens, table, q)
    row_lens = tuple(range(kv_len - q + 1, kv_len + 1))
    groups = plan.row_groups(row_lens, num_heads, KV_HEADS, BLOCK, window_left, xe_cores)
    plan_out = torch.cat(
        [
            call(kernel, query[a:b], cu[: b - a + 1], lens[a:b], tab[a:b], 1, longest, False, n)
            for a, b, n, longest in groups
        ]
    )
    noplan_out = call(kernel, query, cu, lens, tab, 1, kv_len, False, None)
    ref_out = torch.cat(
        [
            call(ref.flash_attn_varlen_func, query[a:b], cu[: b - a + 1], lens[a:b], tab[a:b], 1, longest, False, n)
            for a, b, n, longest in groups
        ]
    )
    one = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    decode_splits = [plan.decode_num_splits(n, num_heads, KV_HEADS, BLOCK, window_left, xe_cores) for n in row_lens]
    decodes = torch.cat(
        [
            call(kernel, query[j : j + 1], one, lens[j : j + 1], table, 1, row_lens[j], True, decode_splits[j])
            for j in range(q)
        ]
    )
    kernel_decodes = torch.cat(
        [call(kernel, query[j : j + 1], one, lens[j : j + 1], table, 1, row_lens[j], True, None) for j in range(q)]
    )
    chunk = call(
        kernel, query, torch.tensor([0, q], dtype=torch.int32, device=dev), seq_lens, table, q, kv_len, True, None
    )

    # Prebuilt metadata (patch 0005) refreshed on this device == inline.
    from vllm.xpu_laguna.attention.prebuilt import PrebuiltExactMetadata

    owner = PrebuiltExactMetadata(max(WIDTHS), dev)
    md = owner.refresh(q, seq_lens, table, kv_len)
    prebuilt_ok = (
        torch.equal(md.query_start_loc, cu) and torch.equal(md.seq_lens, lens) and torch.equal(md.block_table, tab)
    )

    def rows_equal(a: Any, b: Any) -> int:
        return int(sum(torch.equal(a[i], b[i]) for i in range(q)))

    noplan_predicted = plan.heuristic_num_splits(
        q, num_heads, KV_HEADS, plan.effective_seqlen_k(kv_len, window_left), BLOCK, xe_cores
    )
    return Result(
        shape,
        kv_dtype,
        q,
        kv_len,
        splits_decode="/".join(str(n) for n in sorted(set(decode_splits))),
        splits_plan="/".join(str(n) for _, _, n, _ in groups),
        splits_noplan=noplan_predicted,
        plan_rows_equal=rows_equal(plan_out, decodes),
        noplan_rows_equal=rows_equal(noplan_out, decodes),
        chunk_rows_equal=rows_equal(chunk, decodes),
        decode_plan_equals_kernel=torch.equal(decodes, kernel_decodes),
        plan_vs_ref=float((plan_out.float() - ref_out.float()).abs().max()),
        aux_ok=cache_ok and prebuilt_ok,
    )


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser, positive_ints

    parser = ToolParser(
        prog="python -m scripts.device.xpu_attention_check",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--device",
        default="xpu",
        choices=("xpu", "cpu"),
        help="xpu, or cpu for a self-test on the reference kernels (default: %(default)s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"q in {QUICK_WIDTHS}, KV lengths {QUICK_LENGTHS}, bf16 only"
    )
    parser.add_argument(
        "--widths",
        type=positive_ints,
        default=None,
        help=f"verify widths, comma-separated (default: {','.join(map(str, WIDTHS))})",
    )
    parser.add_argument(
        "--lengths",
        type=positive_ints,
        default=None,
        help=f"KV lengths, comma-separated (default: {','.join(map(str, KV_LENGTHS))})",
    )
    parser.add_argument("--tol", type=float, default=2e-2, help="max |plan - reference| (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.widths and max(args.widths) > max(WIDTHS):
        parser.error(f"--widths: at most {max(WIDTHS)}")
    try:
        import torch
        from vllm.platforms import current_platform
    except ImportError as e:
        print(f"error: needs torch and the patched vLLM installed ({e})", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    if dev.type == "xpu" and not current_platform.is_xpu():
        print("error: no XPU platform here; use --device cpu for the self-test", file=sys.stderr)
        return 2
    from vllm.xpu_laguna.attention import exact as xpu_laguna_exact
    from vllm.xpu_laguna.attention import split_plan as plan

    self_test = dev.type != "xpu"
    if self_test:  # the exact path's kernels off XPU: the test-side reference kernels
        from scripts.cpu_standins import standin_module

        standin_module().register()
    xe = plan.device_xe_cores(dev.index or 0) if not self_test else plan.device_xe_cores()
    print(
        f"device {dev}, kernel seam: {xpu_laguna_exact.kernel_seam_name()}, Xe cores "
        f"{xe}{' (modelled device: no XPU here)' if self_test else ' (read from the device)'}"
    )
    if self_test:
        print("SELF-TEST on the reference kernels: checks this script, not an XPU")
    widths = args.widths or (QUICK_WIDTHS if args.quick else WIDTHS)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else KV_LENGTHS)
    kv_dtypes = ("bf16",) if args.quick else ("bf16", "fp8")
    results: list[Result] = []
    failures: list[str] = []
    seed = 0
    print(
        f"{'shape':28}{'kv':>5}{'q':>3}{'kv_len':>7}{'split dec':>10}{'plan':>8}{'noplan*':>8}"
        f"{'plan==dec':>10}{'noplan==dec':>12}{'chunk==dec':>11}{'dec==kern':>10}{'|plan-ref|':>12}"
    )
    for shape, (heads, window) in SHAPES.items():
        for kv_dtype in kv_dtypes:
            for q in widths:
                for kv_len in lengths:
                    if kv_len < q:
                        continue
                    seed += 1
                    r = _run_case(torch, dev, shape, heads, window, kv_dtype, q, kv_len, seed)
                    results.append(r)
                    print(
                        f"{shape:28}{kv_dtype:>5}{q:>3}{kv_len:>7}{r.splits_decode:>10}{r.splits_plan:>8}"
                        f"{r.splits_noplan:>8}{r.plan_rows_equal:>7}/{q:<2}{r.noplan_rows_equal:>9}/{q:<2}"
                        f"{r.chunk_rows_equal:>8}/{q:<2}{'yes' if r.decode_plan_equals_kernel else 'NO':>10}"
                        f"{r.plan_vs_ref:12.3e}"
                    )
                    where = f"{shape} {kv_dtype} q={q} L={kv_len}"
                    if r.plan_rows_equal != q:
                        failures.append(f"{where}: verify rows with the plan equal to decode {r.plan_rows_equal}/{q}")
                    if not r.decode_plan_equals_kernel:
                        failures.append(
                            f"{where}: decode with the planned split count != the kernel's own choice "
                            "(port or Xe-core count disagrees with the kernel)"
                        )
                    if r.plan_vs_ref > args.tol:
                        failures.append(f"{where}: |plan-ref| {r.plan_vs_ref:.3e} > {args.tol}")
                    if not r.aux_ok:
                        failures.append(f"{where}: cache write or prebuilt metadata mismatch")
    rows = sum(r.q for r in results)
    print("* noplan: the count the ported heuristic predicts the kernel picks for the one call")
    print(
        f"summary: {len(results)} cases, {rows} verify rows; plan==decode "
        f"{sum(r.plan_rows_equal for r in results)}/{rows}; noplan==decode "
        f"{sum(r.noplan_rows_equal for r in results)}/{rows}; chunk==decode "
        f"{sum(r.chunk_rows_equal for r in results)}/{rows}; planned decode == kernel decode "
        f"{sum(r.decode_plan_equals_kernel for r in results)}/{len(results)} cases; max |plan-ref| "
        f"{max((r.plan_vs_ref for r in results), default=0.0):.3e}"
    )
    for f in failures:
        print(f"FAIL {f}")
    if failures:
        print(f"FAILED ({len(failures)})")
        return 1
    if self_test:
        print("self-test OK (reference kernels; no device result)")
        return 0
    print(f"PASS ({len(results)} cases run on {dev})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
