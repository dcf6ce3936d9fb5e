# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Exact verify at long contexts, with the split-K reference kernel.

The real metadata builder and impl run verify steps of width q at contexts
1024 .. 16384 on a global and a sliding (512) layer, TP4 shapes (12 Q heads,
2 KV heads); each verify row must be bitwise equal to the q=1 decode of its
token. With the split plan disabled (the debug option
``debug_no_split_plan`` in the builder's config) every row whose planned
split count differs from the count the kernel picks for the whole call must
differ: the negative control.
"""

import functools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import laguna_attn_testlib as lib  # noqa: E402

from vllm.xpu_laguna.attention import exact as xpu_laguna_exact  # noqa: E402
from vllm.xpu_laguna.attention import split_plan as plan  # noqa: E402

pytestmark = pytest.mark.skipif(
    xpu_laguna_exact.kernel_seam_name() != "reference"
    or not xpu_laguna_exact.exact_path_available(),
    reason="these tests run the backend on the pure-torch reference kernels",
)

HEADS = 12  # Laguna-S-2.1 at TP4: 48 / 4 Q heads, 8 / 4 KV heads
CONTEXTS = (1024, 2300, 4096, 8192, 16384)
WIDTHS = (*range(2, 9), 12, 16)
MAX_WIDTH = 16


@functools.cache
def _history(seq_len: int):
    """KV history of one request in a cache of its own, and the queries of
    its last MAX_WIDTH tokens."""
    gen = torch.Generator().manual_seed(seq_len)
    num_blocks = seq_len // lib.BLOCK_SIZE + 2
    # a scattered block row (reversed) so the table matters
    blocks = list(range(num_blocks - 1, 0, -1))
    kv_cache = lib.make_kv_cache(num_blocks=num_blocks)
    k = torch.randn(seq_len, lib.NUM_KV_HEADS, lib.HEAD_SIZE, generator=gen)
    v = torch.randn(seq_len, lib.NUM_KV_HEADS, lib.HEAD_SIZE, generator=gen)
    q = torch.randn(MAX_WIDTH, HEADS, lib.HEAD_SIZE, generator=gen)
    req = lib.Request(
        blocks, q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)
    )
    table = lib.block_table_for([blocks], num_cols=num_blocks)
    impl = lib.make_impl(HEADS, None)
    cm = lib.common_metadata([seq_len], [seq_len], table)
    impl.do_kv_cache_update(lib.ScaleLayer(), req.k, req.v, kv_cache, cm.slot_mapping)
    return req, kv_cache, table


def _run(seq_len, q, window, split_plan=True):
    """(verify rows, their q=1 decodes, kernel calls of the verify step)."""
    req, kv_cache, table = _history(seq_len)
    options = lib.options(exact=True, width=MAX_WIDTH, split_plan=split_plan)
    builder = lib.make_builder(window, HEADS, options)
    impl = lib.make_impl(HEADS, window)
    layer = lib.ScaleLayer()
    queries = req.q[MAX_WIDTH - q :]
    xpu_laguna_exact.counters.reset()
    cm = lib.common_metadata([q], [seq_len], table)
    verify, md = lib.forward(builder, impl, layer, kv_cache, cm, queries)
    assert md.laguna_exact is not None and md.laguna_exact.width == q
    calls = xpu_laguna_exact.counters.kernel_calls_by_width[q]
    decodes = []
    for j in range(q):
        dcm = lib.common_metadata([1], [seq_len - q + 1 + j], table)
        out, dmd = lib.forward(builder, impl, layer, kv_cache, dcm, queries[j : j + 1])
        assert dmd.laguna_exact is not None and dmd.laguna_exact.width == 1
        decodes.append(out[0])
    return verify, decodes, calls


def _window_left(window):
    return -1 if window is None else window - 1


@pytest.mark.parametrize("q", WIDTHS)
@pytest.mark.parametrize("window", [None, lib.WINDOW], ids=["global", "sliding"])
@pytest.mark.parametrize("seq_len", CONTEXTS)
def test_verify_rows_equal_decode_with_the_plan(seq_len, window, q):
    verify, decodes, calls = _run(seq_len, q, window)
    differing = [j for j in range(q) if not torch.equal(verify[j], decodes[j])]
    assert not differing, f"rows {differing} of q={q} at {seq_len} differ from decode"
    # one kernel call per run of rows with the same planned count
    lens = tuple(range(seq_len - q + 1, seq_len + 1))
    groups = plan.row_groups(lens, HEADS, 2, lib.BLOCK_SIZE, _window_left(window), 32)
    assert calls == len(groups)


def _rows_needing_other_counts(seq_len, q, window):
    """Rows whose own planned count differs from the whole-call heuristic."""
    wl = _window_left(window)
    call = plan.heuristic_num_splits(
        q, HEADS, 2, plan.effective_seqlen_k(seq_len, wl), lib.BLOCK_SIZE, 32
    )
    out = []
    for j in range(q):
        n = seq_len - q + 1 + j
        own = plan.decode_num_splits(n, HEADS, 2, lib.BLOCK_SIZE, wl, 32)
        # below kMinBlocksForSplit tiles any count is one split
        tiles = (n + 63) // 64
        if own != call and tiles >= 32:
            out.append(j)
    return out


@pytest.mark.parametrize("q", [2, 8, 12, 16])
@pytest.mark.parametrize("window", [None, lib.WINDOW], ids=["global", "sliding"])
@pytest.mark.parametrize("seq_len", CONTEXTS)
def test_without_the_plan_rows_past_the_divergence_differ(seq_len, window, q):
    """Negative control: the debug option drops the explicit count."""
    verify, decodes, calls = _run(seq_len, q, window, split_plan=False)
    assert calls == 1
    expected = _rows_needing_other_counts(seq_len, q, window)
    differing = [j for j in range(q) if not torch.equal(verify[j], decodes[j])]
    assert differing == expected
    if window is None and seq_len >= 4096 and q >= 8:
        assert differing == list(range(q))  # every row, past the divergence
    if window is not None or seq_len <= 2048:
        assert differing == []  # one split on both sides


def test_plan_costs_an_extra_call_only_at_a_count_change():
    # rows 2237..2244: the count changes from 8 to 9 at 2241
    _, _, calls = _run(2244, 8, None)
    assert calls == 2
    _, _, calls = _run(2300, 8, None)
    assert calls == 1


def test_the_debug_option_stays_with_its_configuration():
    """Configurations with and without ``debug_no_split_plan`` in one
    process, alternately: each verify step runs as its own builder's
    configuration says, whatever ran before it (nothing is remembered)."""
    for split_plan in (True, False, True, False):
        verify, decodes, _ = _run(8192, 8, None, split_plan=split_plan)
        equal = [torch.equal(verify[j], decodes[j]) for j in range(8)]
        assert equal == [split_plan] * 8, split_plan
