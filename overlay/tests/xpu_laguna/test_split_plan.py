# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The KV split plan: a port of vllm_xpu_kernels v0.1.11.1 ``get_num_splits``
and of the paged-decode kernel's chunking, and the split-K reference kernel.

Every expected value below was worked out by hand from the C++ source
(csrc/flash_attn/flash_api.cpp get_num_splits, csrc/xpu/attn/xe_2/kernel/
paged_decode_kernel.hpp); the arithmetic is in the comments.
"""

import pytest
import torch
from xpu_laguna_standins import reference_attention as ref

from vllm.xpu_laguna.attention import split_plan as plan

# (batch, heads_q, heads_kv, seqlen_k, block, xe_cores) -> splits
HEURISTIC_TABLE = {
    # tiles = ceil(960/64) = 15 < 16 -> 1
    (1, 12, 2, 960, 64, 32): 1,
    # tiles 16; slots 32*4/4 = 32; wgs 2; par ceil(128/2) = 64; bw 1;
    # red_cap max(2, 4096/12 = 341); tiles/4 = 4 -> min(64, 4, 32, 64) = 4
    (1, 12, 2, 1023, 64, 32): 4,
    (1, 12, 2, 1024, 64, 32): 4,
    # tiles 35 -> tiles/4 = 8
    (1, 12, 2, 2240, 64, 32): 8,
    # tiles 36 -> tiles/4 = 9 (the q=1 side of the 2241 divergence)
    (1, 12, 2, 2241, 64, 32): 9,
    # batch 8: wgs 16, par ceil(128/16) = 8, bw 3, red_cap 4096/96 = 42 -> 8
    (8, 12, 2, 2241, 64, 32): 8,
    # tiles 128: par 64, bw 10, tiles/4 32 -> 32 (hard cap 32)
    (1, 12, 2, 8192, 64, 32): 32,
    # batch 8: par 8, bw 128/12 = 10 -> 10
    (8, 12, 2, 8192, 64, 32): 10,
    # batch 16: wgs 32 >= 32 slots and tiles 32 < 64 -> saturated -> 1
    (16, 12, 2, 2048, 64, 32): 1,
    # batch 16, tiles 256: wgs 32, par ceil(128/32) = 4, bw 21;
    # heads_q 48: red 768, red_cap max(2, 4096/768 = 5) = 5 -> 5
    (16, 48, 2, 16384, 64, 32): 5,
    # block 16: tile 16, sg 1, cap 16, slots 128; tiles 64; par ceil(512/2) =
    # 256; bw 5; red_cap 341; tiles/4 16 -> min(256, 16, 32, 16) = 16
    (1, 12, 2, 1024, 16, 32): 16,
    # block 32: tile 32, sg 2, cap 32, slots 64; tiles 32; par 128; tiles/4 8
    (1, 12, 2, 1024, 32, 32): 8,
    # 20 Xe cores: slots 20, par 40, bw 10, red_cap 2560/12 = 213, tiles/4 32
    (1, 12, 2, 8192, 64, 20): 32,
    # 20 Xe cores, batch 8: par ceil(80/16) = 5, bw 10 -> 10
    (8, 12, 2, 8192, 64, 20): 10,
    # red_cap floor: batch 64 heads_q 96 -> 4096/6144 = 0 -> max(2, 0) = 2;
    # wgs 128 >= 32 but tiles 256 >= 64; par 1; bw 21 -> min(21, 2) = 2
    (64, 96, 2, 16384, 64, 32): 2,
}


@pytest.mark.parametrize("case", list(HEURISTIC_TABLE), ids=str)
def test_heuristic_matches_the_cpp_source(case):
    assert plan.heuristic_num_splits(*case) == HEURISTIC_TABLE[case]


def test_effective_seqlen_for_sliding_window():
    # mha_varlen_fwd: is_local -> min(max_seqlen_k, window_left + 1)
    assert plan.effective_seqlen_k(8192, 511) == 512
    assert plan.effective_seqlen_k(300, 511) == 300
    assert plan.effective_seqlen_k(8192, -1) == 8192
    # a 512 window never splits: 8 tiles < 16
    assert plan.decode_num_splits(16384, 12, 2, 64, 511, 32) == 1


def test_issue_divergence_figures():
    """The figures of the issue (TP4: 12 Q heads, 2 KV heads, block 64)."""
    one = [plan.heuristic_num_splits(1, 12, 2, n, 64, 32) for n in range(1, 9000)]
    eight = [plan.heuristic_num_splits(8, 12, 2, n, 64, 32) for n in range(1, 9000)]
    first = next(n for n in range(1, 9000) if one[n - 1] != eight[n - 1])
    assert first == 2241
    assert (one[8191], eight[8191]) == (32, 10)


@pytest.mark.parametrize("kv_len", [1, 100, 2047, 2241, 4096, 8192, 16384])
def test_plan_is_the_batch1_heuristic(kv_len):
    """Decode occupancy is unchanged: for batch 1 the plan is what the
    kernel would pick (global and sliding)."""
    for window in (-1, 511):
        eff = plan.effective_seqlen_k(kv_len, window)
        assert plan.decode_num_splits(
            kv_len, 12, 2, 64, window, 32
        ) == plan.heuristic_num_splits(1, 12, 2, eff, 64, 32)


SPLIT_RANGES = {
    # 1984 tokens = 31 tiles < kMinBlocksForSplit (32): one split
    (1984, 8, 64, -1): [(0, 1984)],
    # 2048 = 32 tiles, 8 splits of 4 tiles
    (2048, 8, 64, -1): [(i * 256, (i + 1) * 256) for i in range(8)],
    # 2241 = 36 tiles, 9 splits of 4 tiles, the last one partial
    (2241, 9, 64, -1): [(i * 256, min((i + 1) * 256, 2241)) for i in range(9)],
    # 2000 = 32 tiles, 9 splits: ceil(32/9) = 4 tiles each -> only 8 ranges
    (2000, 9, 64, -1): [(i * 256, min((i + 1) * 256, 2000)) for i in range(8)],
    # 8192 with 10 splits: 128 tiles, ceil(12.8) = 13 tiles (832 tokens)
    (8192, 10, 64, -1): [(i * 832, min((i + 1) * 832, 8192)) for i in range(10)],
    # sliding 511: k_block0 = (3000 - 1 - 511) // 64 = 38 -> starts at 2432
    (3000, 1, 64, 511): [(2432, 3000)],
}


@pytest.mark.parametrize("case", list(SPLIT_RANGES), ids=str)
def test_split_ranges_follow_the_kernel(case):
    assert plan.split_ranges(*case) == SPLIT_RANGES[case]


def test_row_groups_split_at_a_count_change():
    lens = tuple(range(2237, 2245))  # 2240 -> 8 splits, 2241 -> 9
    assert plan.row_groups(lens, 12, 2, 64, -1, 32) == (
        (0, 4, 8, 2240),
        (4, 8, 9, 2244),
    )
    assert plan.row_groups(lens, 12, 2, 64, 511, 32) == ((0, 8, 1, 2244),)


# ------------------------------------------------------- split-K reference
def _paged(kv_len: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    blocks = (kv_len + 63) // 64
    k = torch.randn(blocks, 64, 2, 128, generator=gen).to(torch.bfloat16)
    v = torch.randn(blocks, 64, 2, 128, generator=gen).to(torch.bfloat16)
    q = torch.randn(1, 12, 128, generator=gen).to(torch.bfloat16)
    table = torch.arange(blocks, dtype=torch.int32).unsqueeze(0)
    return q, k, v, table


def _decode(q, k, v, table, kv_len, num_splits_kv, batch_max=None):
    return ref.flash_attn_varlen_func(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32),
        max_seqlen_q=1,
        max_seqlen_k=batch_max or kv_len,
        seqused_k=torch.tensor([kv_len], dtype=torch.int32),
        block_table=table,
        softmax_scale=128**-0.5,
        causal=False,
        num_splits_kv=num_splits_kv,
    )


def test_reference_split_count_changes_the_bits_not_the_value():
    q, k, v, table = _paged(8192, 1)
    outs = {n: _decode(q, k, v, table, 8192, n) for n in (1, 10, 32)}
    dense = _decode(q, k, v, table, 8192, 1)
    for out in outs.values():
        torch.testing.assert_close(out.float(), dense.float(), atol=2e-2, rtol=2e-2)
    assert not torch.equal(outs[10], outs[32])
    assert not torch.equal(outs[1], outs[32])
    # the same count gives the same bits
    assert torch.equal(outs[32], _decode(q, k, v, table, 8192, 32))


def test_reference_without_count_uses_the_heuristic_of_the_call():
    q, k, v, table = _paged(8192, 2)
    # batch 1: the heuristic picks 32
    assert torch.equal(
        _decode(q, k, v, table, 8192, None), _decode(q, k, v, table, 8192, 32)
    )
    # below kMinBlocksForSplit tiles any count is one split
    assert torch.equal(
        _decode(q, k, v, table, 1984, 8), _decode(q, k, v, table, 1984, 1)
    )


def test_reference_matches_dense_attention():
    q, k, v, table = _paged(4096, 3)
    out = _decode(q, k, v, table, 4096, 16).float()
    kk = k.reshape(-1, 2, 128)[:4096].float().repeat_interleave(6, dim=1)
    vv = v.reshape(-1, 2, 128)[:4096].float().repeat_interleave(6, dim=1)
    s = torch.einsum("hd,khd->hk", q[0].float(), kk) * 128**-0.5
    want = torch.einsum("hk,khd->hd", torch.softmax(s, -1), vv)
    torch.testing.assert_close(out[0], want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("block_size", "tile"),
    # v0.1.15.4 (_vllm_fa2_C disassembly): multiples of 64 -> 64, 32 -> 32,
    # anything else -> 16 (v0.1.11.1 would have said 64 for 48 and 96)
    [(16, 16), (32, 32), (64, 64), (128, 64), (48, 16), (96, 16)],
)
def test_kv_tile_per_block_size(block_size, tile):
    assert plan.kv_tile(block_size) == tile


@pytest.mark.parametrize("window_left", [-1, 700], ids=["full", "window"])
def test_reference_row_in_a_verify_call_equals_the_row_alone(window_left):
    # Eight verify rows of one request (one block-table row, one read of the
    # cache) beside a second request: each row gives the bits it gives alone
    # in a call of its own, the same split count given.
    gen = torch.Generator().manual_seed(4)
    k = torch.randn(80, 64, 2, 128, generator=gen).to(torch.bfloat16)
    v = torch.randn(80, 64, 2, 128, generator=gen).to(torch.bfloat16)
    q = torch.randn(9, 12, 128, generator=gen).to(torch.bfloat16)
    own = torch.randperm(80, generator=gen)[:70].to(torch.int32)
    other = torch.randperm(80, generator=gen)[:70].to(torch.int32)
    kv_lens = [4090 + i for i in range(8)] + [777]
    table = torch.stack([own] * 8 + [other])

    def call(rows, splits):
        return ref.flash_attn_varlen_func(
            q=q[rows],
            k=k,
            v=v,
            cu_seqlens_q=torch.arange(len(rows) + 1, dtype=torch.int32),
            max_seqlen_q=1,
            max_seqlen_k=max(kv_lens[r] for r in rows),
            seqused_k=torch.tensor([kv_lens[r] for r in rows], dtype=torch.int32),
            block_table=table[rows],
            softmax_scale=128**-0.5,
            causal=True,
            window_size=[window_left, 0],
            num_splits_kv=splits,
        )

    together = call(list(range(9)), 12)
    for r in range(9):
        assert torch.equal(together[r : r + 1], call([r], 12)), r
    # control: the comparison sees a split count change in a single row
    if window_left < 0:
        assert not torch.equal(together[3:4], call([3], 5))
