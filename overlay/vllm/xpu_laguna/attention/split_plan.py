# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KV split plan of the XPU paged-decode kernel, owned by the XPU Laguna series.

The paged-decode kernel of ``vllm_xpu_kernels`` cuts each sequence's KV into
``num_kv_splits`` chunks, reduces each chunk on its own and merges the partial
results (ReduceSplitK). A different split count is a different float32
accumulation order, so a verify row is bitwise equal to the q=1 decode of the
same token only if both use the same split count. The kernel picks the count
from the *whole call* (batch size, longest KV length) unless the caller passes
one, so the series passes it explicitly on both sides: the count a
single-request q=1 decode of that KV length would get.

Ported from ``vllm_xpu_kernels`` v0.1.11.1, ``csrc/flash_attn/flash_api.cpp``:
``get_num_splits`` and the ``effective_seqlen_k`` computation in
``mha_varlen_fwd``; the chunking from
``csrc/xpu/attn/xe_2/kernel/paged_decode_kernel.hpp``
(``XeFMHAFwdSplitKVKernel``: ``k_block0``, ``num_blocks_per_split``,
``kMinBlocksForSplit``). Checked against v0.1.15.4, the version vLLM 0.32.0
pins (no source tag exists for it: its wheel's ``_vllm_fa2_C`` was
disassembled): same constants, Xe-core source, window handling and explicit
``num_splits_kv`` override; the one change is the tile of block sizes other
than 32 and multiples of 64 (16 now, :func:`_tile_policy`). Its ReduceSplitK
merge changed (log-sum-exp weights), which moves the last bits of a merged
result but not which rows share a split count. Re-check all of this on every
kernel pin change.

Everything here is a pure function of integers; the Xe-core count comes from
the device (:func:`device_xe_cores`).
"""

import functools

import torch


def _tile_policy(block_size: int) -> tuple[int, int, int]:
    """(KV tile, sub-groups per work-group, split cap) for a paged block size:
    multiples of 64 -> 64, 32 -> 32, anything else -> 16 (v0.1.15.4; v0.1.11.1
    gave 64 to other sizes but rejected them at dispatch)."""
    if block_size % 64 == 0:
        return (64, 4, 64)
    if block_size == 32:
        return (32, 2, 32)
    return (16, 1, 16)


# Arc Pro B70 (Xe2, BMG-G31): 32 Xe cores. The CPU reference models this
# device when no XPU is present.
REFERENCE_XE_CORES = 32


def kv_tile(block_size: int) -> int:
    """KV tile width (tokens) of the decode kernel for a paged block size."""
    return _tile_policy(block_size)[0]


def min_blocks_for_split(tile: int) -> int:
    """Below this many KV tiles a sequence runs as one split
    (``kMinBlocksForSplit`` in the FMHA and ReduceSplitK kernels)."""
    return 32 if tile <= 64 else 128


def heuristic_num_splits(
    batch_size: int,
    num_heads_q: int,
    num_heads_kv: int,
    max_seqlen_k: int,
    block_size: int,
    num_xe_cores: int,
) -> int:
    """``get_num_splits`` of vllm_xpu_kernels (v0.1.11.1 to v0.1.15.4).

    ``max_seqlen_k`` is the kernel's ``effective_seqlen_k`` (see
    :func:`effective_seqlen_k`).
    """
    tile, sg_per_wg, policy_split_cap = _tile_policy(block_size)
    kv_tiles = (max_seqlen_k + tile - 1) // tile
    if kv_tiles < 16:
        return 1
    num_wg_slots = num_xe_cores * 4 // sg_per_wg
    wgs_per_split = batch_size * num_heads_kv
    if wgs_per_split >= num_wg_slots and kv_tiles < 64:
        return 1
    splits_par = max(1, (4 * num_wg_slots + wgs_per_split - 1) // wgs_per_split)
    splits_bw = max(1, kv_tiles // 12)
    splits = max(splits_par, splits_bw)
    red_work = max(1, batch_size * num_heads_q)
    red_cap = max(2, 128 * num_xe_cores // red_work)
    splits = min(splits, red_cap)
    max_splits_tiles = max(1, kv_tiles // 4)
    return max(1, min(splits, max_splits_tiles, 32, policy_split_cap))


def effective_seqlen_k(max_seqlen_k: int, window_left: int) -> int:
    """The KV length the heuristic sees: capped at ``window_left + 1`` for
    local attention (``window_left`` -1 = unbounded)."""
    if window_left < 0:
        return max_seqlen_k
    return min(max_seqlen_k, window_left + 1)


@functools.lru_cache(maxsize=4096)
def decode_num_splits(
    kv_len: int,
    num_heads_q: int,
    num_heads_kv: int,
    block_size: int,
    window_left: int,
    num_xe_cores: int,
) -> int:
    """The plan: the split count a single-request q=1 decode of a sequence
    with ``kv_len`` keys gets from the kernel (batch size 1, its own length).
    Equal to the kernel's own choice for batch 1, so decode occupancy is
    unchanged."""
    return heuristic_num_splits(
        1,
        num_heads_q,
        num_heads_kv,
        effective_seqlen_k(kv_len, window_left),
        block_size,
        num_xe_cores,
    )


def split_ranges(
    kv_len: int, num_splits: int, block_size: int, window_left: int
) -> list[tuple[int, int]]:
    """Token ranges ``[start, end)`` of the splits the decode kernel reduces
    separately for one sequence (``XeFMHAFwdSplitKVKernel`` legacy path), in
    the order ReduceSplitK merges them. Keys before the window start are
    included in the first range exactly when the kernel's first tile holds
    them; masking is the caller's job."""
    tile = kv_tile(block_size)
    k_blocks = (kv_len + tile - 1) // tile
    k_block0 = max(kv_len - 1 - window_left, 0) // tile if window_left >= 0 else 0
    windowed = k_blocks - k_block0
    if num_splits <= 1 or windowed < min_blocks_for_split(tile):
        return [(k_block0 * tile, kv_len)]
    per_split = (windowed + num_splits - 1) // num_splits
    ranges = []
    for i in range(num_splits):
        first = k_block0 + i * per_split
        count = min(windowed - i * per_split, per_split)
        if count <= 0:
            break
        ranges.append((first * tile, min((first + count) * tile, kv_len)))
    return ranges


def row_groups(
    kv_lens: tuple[int, ...],
    num_heads_q: int,
    num_heads_kv: int,
    block_size: int,
    window_left: int,
    num_xe_cores: int,
) -> tuple[tuple[int, int, int, int], ...]:
    """Verify rows grouped into kernel calls: ``(first, end, num_splits,
    max_kv_len)`` per run of consecutive rows with the same planned count."""
    groups: list[tuple[int, int, int, int]] = []
    for i, kv_len in enumerate(kv_lens):
        n = decode_num_splits(
            kv_len, num_heads_q, num_heads_kv, block_size, window_left, num_xe_cores
        )
        if groups and groups[-1][2] == n:
            first, _, _, longest = groups[-1]
            groups[-1] = (first, i + 1, n, max(longest, kv_len))
        else:
            groups.append((i, i + 1, n, kv_len))
    return tuple(groups)


@functools.cache
def device_xe_cores(device_index: int = 0) -> int:
    """Xe cores of an XPU (``gpu_slices * gpu_subslices_per_slice``, what
    ``get_num_splits`` reads from the SYCL device); off XPU the modelled
    device's count (:data:`REFERENCE_XE_CORES`)."""
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return REFERENCE_XE_CORES
    props = torch.xpu.get_device_properties(device_index)
    slices = getattr(props, "gpu_slices", None)
    per_slice = getattr(props, "gpu_subslices_per_slice", None)
    if slices and per_slice:
        return int(slices) * int(per_slice)
    subslices = getattr(props, "gpu_subslice_count", None)
    if subslices:
        return int(subslices)
    raise RuntimeError(
        "cannot read the Xe-core count of the XPU (no gpu_slices/"
        "gpu_subslices_per_slice/gpu_subslice_count in its device properties); "
        "the exact-verify split plan needs it"
    )
