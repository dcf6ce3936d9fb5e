# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Pure-torch reference kernels of the XPU FlashAttention entry points (test-side stand-in).

These functions mirror the two kernel entry points that
``vllm/v1/attention/backends/flash_attn.py`` uses on XPU:

* :func:`flash_attn_varlen_func` has the keyword signature of
  ``vllm._xpu_ops.xpu_ops.flash_attn_varlen_func`` (varlen queries, paged KV
  cache with block tables or contiguous KV with ``cu_seqlens_k``, sliding
  window, GQA, causal and non-causal, optional FP8 KV dequantisation);
* :func:`reshape_and_cache_flash` has the signature of
  ``vllm._custom_ops.reshape_and_cache_flash`` and, like the XPU kernel,
  accepts only ``"auto"`` (native cache dtype) or an FP8 dtype string.

They serve two purposes: the FlashAttention backend's code (including the
XPU Laguna exact-verify path) runs and is tested on machines without an XPU
(registered with the overlay's kernel registry by this package's
:func:`xpu_laguna_standins.register`, on CPU only), and they are the oracle
against which the XPU kernels are checked
(``scripts/device/xpu_attention_check.py``). A test-side stand-in: never in
the wheel, never reached on XPU.

Numerics: every sequence is computed on its own, scores and softmax in
float32, the result cast to the output dtype.

Calls with ``max_seqlen_q == 1`` on a paged cache model the XPU paged-decode
kernel's split-K (vllm_xpu_kernels v0.1.11.1, ``paged_decode_kernel.hpp``):
the split count is ``num_splits_kv`` when given, else the kernel's own
heuristic for the whole call (batch size, longest effective KV length; see
:mod:`vllm.xpu_laguna.attention.split_plan`, with the modelled device's
Xe-core count); each sequence's KV is cut into the kernel's chunks (whole KV
tiles, the window's first tile, one split below ``kMinBlocksForSplit``
tiles); each chunk yields an unnormalised float32 partial output stored in
the output dtype (the kernel's ``tmp_out`` has the query dtype), its base-2
max logit and exp-sum; the partials are merged in split order like
ReduceSplitK (``exp2`` rescale to the global max, sum, one reciprocal).
That is v0.1.11.1's merge; v0.1.15.4 (pinned by vLLM 0.32.0) merges with
log-sum-exp weights, also in split order: a different last-bit rounding, the
same dependence on the split count.
Reproduced: which keys each chunk sees, the merge order and the rounding of
the partials to the output dtype, so a different split count gives a
different result in the last bits, as on the device. Not reproduced: the
kernel's tile-by-tile online softmax inside a chunk, its sub-group reduction
order and its ``exp2`` approximation (this kernel reduces each chunk in one
pass), so reference and device results are not bitwise equal to each other.
Two calls that present the same query row with the same KV length and the
same split count produce bitwise equal results, whatever else is in the
batch.

Cost on CPU (what makes the stand-in runs affordable, not part of the model):
a decode row reads only the cache blocks its splits cover (a windowed
layer's window, not the whole sequence); consecutive rows with the same
block-table row (the verify rows of one request) read them once and each
takes its own slice; a row's splits are reduced side by side, padded to
whole splits with masked keys and zero values.
"""

import math
from typing import NamedTuple

import torch
from vllm.logger import init_logger
from vllm.xpu_laguna.attention import split_plan

logger = init_logger(__name__)

_FP8_CACHE_DTYPES: dict[str, torch.dtype] = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
_FP8_TORCH_DTYPES = (
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
)


def _scalar(x: torch.Tensor | float | None) -> float | torch.Tensor | None:
    """A (possibly expanded) per-tensor scale as a 0-d float32 tensor."""
    if x is None or isinstance(x, float):
        return x
    return x.reshape(-1)[0].to(torch.float32)


class _Mask(NamedTuple):
    """What a query row may see: the softmax scale, causality and the
    sliding window (``-1``: unbounded) to the left and right."""

    scale: float
    causal: bool
    window_left: int
    window_right: int


def _attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: _Mask) -> torch.Tensor:
    """Attention of ``q`` (ql, H, D) over ``k``/``v`` (L, Hk, D) in float32.

    Query row ``i`` sits at absolute position ``L - ql + i`` (bottom-right
    alignment, as in FlashAttention). Returns (ql, H, D) float32.
    """
    scale, causal, window_left, window_right = mask
    ql, num_heads, head_size = q.shape
    kv_len, num_kv_heads, _ = k.shape
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    group = num_heads // num_kv_heads
    # (Hk, group, ql, D) x (Hk, 1, D, L) -> (Hk, group, ql, L)
    qg = q.reshape(ql, num_kv_heads, group, head_size).permute(1, 2, 0, 3)
    kg = k.permute(1, 2, 0).unsqueeze(1)
    scores = torch.matmul(qg, kg) * scale

    pos = torch.arange(kv_len - ql, kv_len, device=q.device).unsqueeze(1)
    key_pos = torch.arange(kv_len, device=q.device).unsqueeze(0)
    allowed = torch.ones(ql, kv_len, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= key_pos <= pos
    if window_left >= 0:
        allowed &= key_pos >= pos - window_left
    if window_right >= 0:
        allowed &= key_pos <= pos + window_right
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # Rows with no visible key (cannot happen for valid inputs) give 0.
    probs = torch.nan_to_num(probs, nan=0.0)
    vg = v.permute(1, 0, 2).unsqueeze(1)  # (Hk, 1, L, D)
    out = torch.matmul(probs, vg)  # (Hk, group, ql, D)
    return out.permute(2, 0, 1, 3).reshape(ql, num_heads, v.shape[-1])


_QUERY_CHUNK = 256
"""Causal query rows per :func:`_attend_one` call in :func:`_attend_rows`."""


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: _Mask) -> torch.Tensor:
    """:func:`_attend_one`, for a long causal query in chunks of rows, each
    over the keys its rows can see (from the first row's window start to the
    last row): no score is computed for a key every row of the chunk masks.
    A row's result depends on the call's query and key lengths and its index,
    not on other sequences."""
    ql, kv_len = q.shape[0], k.shape[0]
    if not mask.causal or ql <= _QUERY_CHUNK:
        return _attend_one(q, k, v, mask)
    parts = []
    for first in range(0, ql, _QUERY_CHUNK):
        last = min(first + _QUERY_CHUNK, ql)
        hi = kv_len - ql + last  # one past the chunk's last row (causal)
        lo = max(0, kv_len - ql + first - mask.window_left) if mask.window_left >= 0 else 0
        parts.append(_attend_one(q[first:last], k[lo:hi], v[lo:hi], mask))
    return torch.cat(parts)


_LOG2E = math.log2(math.e)


def _attend_split_k(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    window_left: int,
    ranges: list[tuple[int, int]],
    out_dtype: torch.dtype,
    offset: int = 0,
) -> torch.Tensor:
    """One decode row ``q`` (1, H, D) over the keys and values ``k``/``v``
    (n, Hk, D) at token positions ``offset .. offset + n`` (the last one is the
    row's own), reduced per KV range and merged like ReduceSplitK. Returns
    (1, H, D) float32.

    ``ranges`` cover ``offset .. offset + n`` in order, all as long as the
    first but the last (:func:`split_plan.split_ranges`), so the splits are
    reduced side by side: the keys are padded to whole splits (masked, their
    values zero) and each split's max, exp-sum and unnormalised output are
    taken over its own keys alone.
    """
    _, num_heads, head_size = q.shape
    n, num_kv_heads, _ = k.shape
    kv_len = offset + n
    group = num_heads // num_kv_heads
    num_splits = len(ranges)
    split_len = ranges[0][1] - ranges[0][0]
    pad = num_splits * split_len - n
    if ranges[0][0] != offset or ranges[-1][1] != kv_len or pad < 0 or pad >= split_len:
        raise ValueError(f"splits {ranges} do not tile the keys {offset}..{kv_len}")
    qg = q.reshape(num_kv_heads, group, head_size)  # (Hk, group, D)
    kt = k.permute(1, 2, 0).contiguous()  # (Hk, D, n)
    s = torch.bmm(qg, kt) * (scale * _LOG2E)  # (Hk, group, n)
    first_visible = kv_len - 1 - window_left if window_left >= 0 else 0
    if pad or first_visible > offset:
        key_pos = torch.arange(offset, offset + n + pad, device=q.device)
        s = torch.nn.functional.pad(s, (0, pad))
        s = s.masked_fill((key_pos < first_visible) | (key_pos >= kv_len), float("-inf"))
    s = s.view(num_kv_heads, group, num_splits, split_len).transpose(1, 2)
    m = s.amax(dim=-1, keepdim=True)  # (Hk, splits, group, 1)
    p = torch.exp2(s - m)
    lsum = p.sum(dim=-1, keepdim=True)
    vt = torch.nn.functional.pad(v.permute(1, 0, 2), (0, 0, 0, pad))
    vt = vt.reshape(num_kv_heads, num_splits, split_len, -1)
    o = torch.matmul(p, vt)  # unnormalised, (Hk, splits, group, D)
    if num_splits == 1:
        res = o[:, 0] / lsum[:, 0]
    else:
        big = m.amax(dim=1, keepdim=True)
        rescale = torch.where(lsum > 0, torch.exp2(m - big), 0.0)
        terms = o.to(out_dtype).to(torch.float32) * rescale
        weights = lsum * rescale
        # Merged in split order, one split after another (ReduceSplitK).
        acc, total = terms[:, 0], weights[:, 0]
        for i in range(1, num_splits):
            acc = acc + terms[:, i]
            total = total + weights[:, i]
        res = acc * (1.0 / total)
    return res.reshape(1, num_heads, v.shape[-1])


def _dequant(x: torch.Tensor, descale: torch.Tensor | float | None) -> torch.Tensor:
    if x.dtype in _FP8_TORCH_DTYPES:
        x = x.to(torch.float32)
        if descale is not None:
            x = x * descale
        return x
    return x.to(torch.float32)


def _window(window_size: tuple[int, int] | list[int] | None) -> tuple[int, int]:
    """A kernel's ``window_size`` as Python ints (left, right); -1: unbounded."""
    if window_size is None:
        return -1, -1
    left, right = window_size
    return int(left), int(right)


def _gather(
    cache: torch.Tensor,
    blocks: torch.Tensor,
    lo: int,
    hi: int,
    descale: torch.Tensor | float | None,
) -> torch.Tensor:
    """Tokens ``lo .. hi`` of one sequence in a paged cache (block ids
    ``blocks``), as (hi - lo, Hk, D) float32: only the blocks that hold them
    are read."""
    block_size = cache.shape[1]
    first, last = lo // block_size, (hi + block_size - 1) // block_size
    ids = blocks[first:last].to(torch.long)
    x = cache.index_select(0, ids).reshape((last - first) * block_size, *cache.shape[2:])
    base = first * block_size
    return _dequant(x[lo - base : hi - base], descale)


def _decode_rows(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    out: torch.Tensor,
    rows: range,
    cu: list[int],
    kv_lens: list[int],
    blocks: torch.Tensor,
    splits: int,
    scale: float,
    window_left: int,
    k_scale: torch.Tensor | float | None,
    v_scale: torch.Tensor | float | None,
) -> None:
    """Split-K decode of one-query ``rows`` that share the block ids ``blocks``.

    The cache is read once, for the keys the rows' splits cover (a windowed
    layer's window, not the whole sequence); each row then reduces over its
    own slice of it, so its result depends on its query, its keys and the
    split count alone, whatever else the call holds.
    """
    block_size = key_cache.shape[1]
    plans = []
    for r in rows:
        kv_len = int(kv_lens[r])
        plans.append((r, kv_len, split_plan.split_ranges(kv_len, splits, block_size, window_left)))
    lo_all = min(ranges[0][0] for _, _, ranges in plans)
    hi_all = max(kv_len for _, kv_len, _ in plans)
    k_all = _gather(key_cache, blocks, lo_all, hi_all, k_scale)
    v_all = _gather(value_cache, blocks, lo_all, hi_all, v_scale)
    for r, kv_len, ranges in plans:
        lo = ranges[0][0]
        res = _attend_split_k(
            q[cu[r] : cu[r] + 1].to(torch.float32),
            k_all[lo - lo_all : kv_len - lo_all],
            v_all[lo - lo_all : kv_len - lo_all],
            scale,
            window_left,
            ranges,
            out.dtype,
            lo,
        )
        out[cu[r] : cu[r] + 1] = res.to(out.dtype)


def paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int] | list[int] | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
    out: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    num_splits_kv: int | None = None,
) -> torch.Tensor:
    """Paged attention over a block-table KV cache.

    ``q`` is (total_q, num_heads, head_size). ``key_cache`` and
    ``value_cache`` are (num_blocks, block_size, num_kv_heads, head_size)
    with any strides (the backend passes views of its cache); FP8 caches are
    dequantised with ``k_descale``/``v_descale``. ``cu_seqlens_q`` holds the
    (num_seqs + 1,) query offsets, ``seqused_k`` the (num_seqs,) KV lengths,
    ``block_table`` the block ids per sequence. ``window_size`` is (left,
    right), -1 = unbounded. ``max_seqlen_q``/``max_seqlen_k`` are as passed
    to the kernel: with ``max_seqlen_q == 1`` the call models the split-K
    decode kernel, with ``num_splits_kv`` as its explicit split count (None:
    the kernel's heuristic). Writes into ``out`` when given.
    """
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    left, right = _window(window_size)
    mask = _Mask(float(softmax_scale), bool(causal), left, right)
    block_size = key_cache.shape[1]
    cu = cu_seqlens_q.tolist()
    kv_lens = seqused_k.tolist()
    decode = max_seqlen_q == 1
    splits = 0
    if decode:
        splits = num_splits_kv
        if splits is None:
            longest = max_seqlen_k if max_seqlen_k is not None else max(kv_lens)
            splits = split_plan.heuristic_num_splits(
                len(cu) - 1,
                q.shape[1],
                key_cache.shape[2],
                split_plan.effective_seqlen_k(int(longest), left),
                block_size,
                split_plan.device_xe_cores(),
            )
    k_scale = _scalar(k_descale)
    v_scale = _scalar(v_descale)
    num_seqs = len(cu) - 1
    i = 0
    while i < num_seqs:
        start, end = cu[i], cu[i + 1]
        if decode and end - start == 1:
            # Consecutive one-query rows with the same block-table row (the
            # verify rows of one request) share one read of the cache.
            j = i + 1
            while j < num_seqs and cu[j + 1] - cu[j] == 1 and torch.equal(block_table[j], block_table[i]):
                j += 1
            _decode_rows(
                q, key_cache, value_cache, out, range(i, j), cu, kv_lens, block_table[i],
                splits, float(softmax_scale), left, k_scale, v_scale,
            )  # fmt: skip
            i = j
            continue
        if end > start:
            kv_len = int(kv_lens[i])
            k_seq = _gather(key_cache, block_table[i], 0, kv_len, k_scale)
            v_seq = _gather(value_cache, block_table[i], 0, kv_len, v_scale)
            q_seq = q[start:end].to(torch.float32)
            res = _attend_rows(q_seq, k_seq, v_seq, mask)
            out[start:end] = res.to(out.dtype)
        i += 1
    return out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    out: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    window_size: list[int] | None = None,
    softcap: float | None = 0.0,
    seqused_k: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    scheduler_metadata=None,
    fa_version: int = 2,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    num_splits: int = 0,
    num_splits_kv: int | None = None,
    return_softmax_lse: bool | None = False,
    s_aux: torch.Tensor | None = None,
    return_attn_probs: bool | None = False,
    dynamic_causal: torch.Tensor | None = None,
    mask_mod=None,
    aux_tensors: list | None = None,
    **kwargs,
) -> torch.Tensor:
    """Reference for ``xpu_ops.flash_attn_varlen_func`` (same keywords).

    ``num_splits`` is accepted and ignored (as on XPU); ``num_splits_kv`` is
    the decode kernel's explicit split count (see :func:`paged_attention`).
    """
    unsupported = {
        "alibi_slopes": alibi_slopes is not None,
        "softcap": bool(softcap),
        "dropout_p": bool(dropout_p),
        "return_softmax_lse": bool(return_softmax_lse),
        "return_attn_probs": bool(return_attn_probs),
        "s_aux": s_aux is not None,
        "dynamic_causal": dynamic_causal is not None,
        "mask_mod": mask_mod is not None,
    }
    bad = [name for name, used in unsupported.items() if used]
    if bad:
        raise NotImplementedError(f"reference flash_attn_varlen_func does not support {', '.join(bad)}")
    if (cu_seqlens_k is None) == (seqused_k is None):
        raise ValueError("exactly one of cu_seqlens_k and seqused_k is required")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if q.dtype in _FP8_TORCH_DTYPES:
        q = _dequant(q, _scalar(q_descale)).to(torch.float32)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if block_table is not None:
        if seqused_k is None:
            raise ValueError("block_table requires seqused_k")
        return paged_attention(
            q,
            k,
            v,
            cu_seqlens_q,
            seqused_k,
            block_table,
            softmax_scale,
            causal,
            window_size,
            k_descale,
            v_descale,
            out,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            num_splits_kv=num_splits_kv,
        )
    # Contiguous (non-paged) KV: k/v are (total_k, num_kv_heads, head_size).
    assert cu_seqlens_k is not None
    mask = _Mask(float(softmax_scale), bool(causal), *_window(window_size))
    cu_q = cu_seqlens_q.tolist()
    cu_k = cu_seqlens_k.tolist()
    for i in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if qe == qs:
            continue
        k_seq = _dequant(k[ks:ke], _scalar(k_descale))
        v_seq = _dequant(v[ks:ke], _scalar(v_descale))
        q_seq = q[qs:qe].to(torch.float32)
        out[qs:qe] = _attend_rows(q_seq, k_seq, v_seq, mask).to(out.dtype)
    return out


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` rows into the paged cache by slot.

    ``key_cache``/``value_cache`` are (num_blocks, block_size, num_kv_heads,
    head_size) views. The number of rows written is ``slot_mapping``'s
    length; negative slots are padding and skipped. Like the XPU kernel,
    only ``"auto"`` (store in the cache's own dtype) and FP8 strings are
    accepted: a native float dtype must be passed as ``"auto"``.
    """
    if kv_cache_dtype != "auto" and kv_cache_dtype not in _FP8_CACHE_DTYPES:
        raise ValueError(
            f"Unsupported kv_cache_dtype {kv_cache_dtype!r} for the cache write "
            "(native float caches must be written with 'auto')"
        )
    num_tokens = slot_mapping.shape[0]
    slots = slot_mapping.to(torch.long)
    k = key[:num_tokens]
    v = value[:num_tokens]
    if kv_cache_dtype == "auto":
        kq, vq = k.to(key_cache.dtype), v.to(value_cache.dtype)
    else:
        fp8 = _FP8_CACHE_DTYPES[kv_cache_dtype]
        kq = (k.to(torch.float32) / _scalar(k_scale)).to(fp8)
        vq = (v.to(torch.float32) / _scalar(v_scale)).to(fp8)
        if key_cache.dtype != fp8:
            kq = kq.view(key_cache.dtype)
            vq = vq.view(value_cache.dtype)
    # Static shapes throughout (a captured device kernel has no data-dependent
    # shape, and Model Runner V2 captures with every slot padding): a padding
    # row rewrites the first valid row's slot with that row's values, or, when
    # no row is valid, the cache's first slot with its own content; duplicate
    # targets then carry identical values.
    valid = slots >= 0
    any_valid = valid.any()
    first = torch.argmax(valid.to(torch.int8))
    target = torch.where(valid, slots, torch.where(any_valid, slots[first], 0))
    block_size = key_cache.shape[1]
    block_idx = target // block_size
    block_off = target % block_size
    rows = valid.view(-1, *([1] * (kq.dim() - 1)))
    for cache, src in ((key_cache, kq), (value_cache, vq)):
        if cache.element_size() == 1:  # FP8 caches: select on the bytes
            cache, src = cache.view(torch.uint8), src.view(torch.uint8)
        pad = torch.where(any_valid, src[first], cache[0, 0])
        cache[block_idx, block_off] = torch.where(rows, src, pad)
