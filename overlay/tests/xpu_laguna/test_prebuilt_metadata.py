# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Prebuilt exact-verify metadata (the ``prebuilt_metadata`` option).

Real builders, real impl, reference kernels on CPU (device graphs are off
here: metadata on + graphs off is a supported configuration). The options
come with each builder's ``VllmConfig`` (``lib.options``).
"""

import copy
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import laguna_attn_testlib as lib  # noqa: E402

from vllm.xpu_laguna.attention import exact as xpu_laguna_exact  # noqa: E402
from vllm.xpu_laguna.attention.prebuilt import (  # noqa: E402
    PrebuiltExactMetadata,
    PrebuiltMetadataDriftError,
)

pytestmark = pytest.mark.skipif(
    xpu_laguna_exact.kernel_seam_name() != "reference"
    or not xpu_laguna_exact.exact_path_available(),
    reason="these tests run the backend on the pure-torch reference kernels",
)

M = 8
COLS = 16


def assert_prebuilt_equals_fresh(exact, seq_lens, table) -> None:
    """The equality test: prebuilt views == freshly built tensors."""
    cu, lens, expanded = xpu_laguna_exact.build_inline(seq_lens, table, exact.width)
    assert torch.equal(exact.query_start_loc, cu), "query offsets differ"
    assert torch.equal(exact.seq_lens, lens), "KV lengths differ"
    assert torch.equal(exact.block_table, expanded), "expanded block table differs"


def pointers(owner: PrebuiltExactMetadata) -> dict:
    out = {name: t.data_ptr() for name, t in owner._buffers.items()}
    for q, obj in owner.by_width.items():
        out[q] = (
            id(obj),
            obj.query_start_loc.data_ptr(),
            obj.seq_lens.data_ptr(),
            obj.block_table.data_ptr(),
            obj.kv_offsets.data_ptr(),
        )
    return out


def random_table(gen: random.Random, rows: int = 1) -> torch.Tensor:
    return torch.tensor(
        [[gen.randrange(1, 4000) for _ in range(COLS)] for _ in range(rows)],
        dtype=torch.int32,
    )


def step_cm(q: int, seq_len: int, table: torch.Tensor):
    return lib.common_metadata([q], [seq_len], table)


@pytest.fixture
def prebuilt_on() -> lib.Options:
    """The options of a configuration with prebuilt metadata on."""
    return lib.options(exact=True, width=M, prebuilt=True)


@pytest.mark.parametrize("q", range(2, M + 1))
def test_prebuilt_equals_freshly_built(prebuilt_on, q):
    builder = lib.make_builder(lib.WINDOW, options=prebuilt_on)
    assert builder.laguna_prebuilt is not None
    table = random_table(random.Random(q))
    seq_lens = torch.tensor([700 + q], dtype=torch.int32)
    exact = builder.laguna_prebuilt.refresh(q, seq_lens, table)
    assert exact.width == q and exact.owner is builder.laguna_prebuilt
    assert_prebuilt_equals_fresh(exact, seq_lens, table)
    # And through the real builder.build:
    md = builder.build(0, step_cm(q, 300 + q, table))
    assert md.laguna_exact is builder.laguna_prebuilt.by_width[q]
    assert_prebuilt_equals_fresh(md.laguna_exact, md.seq_lens, md.block_table)


def test_addresses_stable_while_contents_change(prebuilt_on):
    builder = lib.make_builder(lib.WINDOW, options=prebuilt_on)
    gen = random.Random(0)
    first = None
    seen_objects = {}
    for step in range(300):
        q = gen.randrange(2, M + 1)
        table = random_table(gen)
        seq_len = gen.randrange(q, 64 * COLS)
        md = builder.build(0, step_cm(q, seq_len, table))
        assert_prebuilt_equals_fresh(md.laguna_exact, md.seq_lens, table)
        seen_objects.setdefault(q, md.laguna_exact)
        assert md.laguna_exact is seen_objects[q]
        now = pointers(builder.laguna_prebuilt)
        first = first or now
        assert now == first, f"addresses moved at step {step}"


def test_width_changes_neither_corrupt_nor_reallocate(prebuilt_on):
    builder = lib.make_builder(None, options=prebuilt_on)
    owner = None
    gen = random.Random(1)
    tables = {}
    for i, q in enumerate([8, 2, 8, 2, 5, 8]):
        tables[i] = random_table(gen)
        md = builder.build(0, step_cm(q, 100 + 10 * i, tables[i]))
        owner = owner or builder.laguna_prebuilt
        before = pointers(owner)
        assert_prebuilt_equals_fresh(md.laguna_exact, md.seq_lens, tables[i])
        assert pointers(owner) == before
    # The q=8 view after q=2 refreshes: rows 2..7 must be this step's too.
    md8 = builder.build(0, step_cm(8, 333, tables[0]))
    assert torch.equal(md8.laguna_exact.block_table, tables[0][:1].repeat(8, 1))
    assert md8.laguna_exact.seq_lens.tolist() == list(range(326, 334))


def test_random_walk_across_block_boundaries(prebuilt_on):
    """Accept 1..8 tokens per cycle across many 64-token block rollovers;
    at every cycle the prebuilt and inline paths give bitwise equal attention."""
    heads = 12
    builder_pre = lib.make_builder(lib.WINDOW, heads, prebuilt_on)
    inline = lib.options(exact=True, width=M, prebuilt=False)
    builder_inline = lib.make_builder(lib.WINDOW, heads, inline)
    assert builder_inline.laguna_prebuilt is None
    impl = lib.make_impl(heads, lib.WINDOW)
    layer, kv_cache = lib.ScaleLayer(), lib.make_kv_cache()
    total = 11 * lib.BLOCK_SIZE
    blocks = list(range(40, 29, -1))  # 11 blocks, descending ids
    req = lib.random_request(total, heads, blocks, seed=11)
    lib.fill_cache(impl, layer, kv_cache, req, total)
    gen = random.Random(7)
    seq_len, rollovers, cycles = 20, 0, 0
    while seq_len + M <= total:
        q = gen.randrange(2, M + 1)
        end = seq_len + q
        rollovers += (end - 1) // lib.BLOCK_SIZE != (seq_len - 1) // lib.BLOCK_SIZE
        # Only the blocks allocated so far are in the table (the rest 0).
        table = lib.block_table_for([blocks[: (end - 1) // lib.BLOCK_SIZE + 1]])
        cm = step_cm(q, end, table)
        query = req.q[seq_len:end]
        out_pre, md = lib.forward(builder_pre, impl, layer, kv_cache, cm, query)
        assert md.laguna_exact.owner is builder_pre.laguna_prebuilt
        assert_prebuilt_equals_fresh(md.laguna_exact, cm.seq_lens, table)
        out_inl, md_i = lib.forward(builder_inline, impl, layer, kv_cache, cm, query)
        assert md_i.laguna_exact.owner is None
        assert torch.equal(out_pre, out_inl), f"cycle {cycles}: prebuilt != inline"
        seq_len += gen.randrange(max(1, q - 3), q + 1)  # accepted tokens
        cycles += 1
    assert rollovers >= 8 and cycles >= 50


def test_per_group_block_tables_through_update_block_table(prebuilt_on):
    heads = 12
    group_a = lib.make_builder(lib.WINDOW, heads, prebuilt_on)
    group_b = lib.make_builder(lib.WINDOW, heads, prebuilt_on)  # another group
    impl = lib.make_impl(heads, lib.WINDOW)
    layer = lib.ScaleLayer()
    seq_len, q = 3 * lib.BLOCK_SIZE + 2, 8
    rows = {"a": [5, 6, 7, 8], "b": [30, 31, 32, 33]}
    caches = {}
    reqs = {}
    for name, row in rows.items():
        caches[name] = lib.make_kv_cache()
        reqs[name] = lib.random_request(seq_len, heads, row, seed=len(name) + ord(name))
        lib.fill_cache(impl, layer, caches[name], reqs[name], seq_len)
    table_a = lib.block_table_for([rows["a"]])
    table_b = lib.block_table_for([rows["b"]])
    cm_a = step_cm(q, seq_len, table_a)
    md_a = group_a.build(0, cm_a)
    cm_b = step_cm(q, seq_len, table_b)
    md_b = group_b.update_block_table(md_a, table_b, cm_b.slot_mapping)

    assert md_b.laguna_exact is group_b.laguna_prebuilt.by_width[q]
    assert md_b.laguna_exact is not md_a.laguna_exact
    assert_prebuilt_equals_fresh(md_a.laguna_exact, md_a.seq_lens, table_a)
    assert_prebuilt_equals_fresh(md_b.laguna_exact, md_b.seq_lens, table_b)

    # Each group's layers attend over their own blocks: same as building B.
    query = reqs["b"].q[seq_len - q :]
    out_b, _ = lib.forward(group_b, impl, layer, caches["b"], cm_b, query, md_b)
    ref_b, _ = lib.forward(
        lib.make_builder(lib.WINDOW, heads, prebuilt_on),
        impl,
        layer,
        caches["b"],
        cm_b,
        query,
    )
    assert torch.equal(out_b, ref_b)
    # Group A is still intact after B's refresh.
    query_a = reqs["a"].q[seq_len - q :]
    out_a, _ = lib.forward(group_a, impl, layer, caches["a"], cm_a, query_a, md_a)
    assert not torch.isnan(out_a).any()

    # The trap: reusing A's metadata for B without re-expansion is caught.
    trapped = copy.copy(md_a)
    trapped.block_table = table_b
    with pytest.raises(PrebuiltMetadataDriftError, match="another block table"):
        lib.forward(group_b, impl, layer, caches["b"], cm_b, query, trapped)


def _provoke(owner: PrebuiltExactMetadata, kind: str):
    """Make one kind of drift; returns the (seq_lens, table) for the call."""
    seq_lens = torch.tensor([300], dtype=torch.int32)
    table = random_table(random.Random(3))
    obj = owner.by_width[4]
    if kind == "buffer_pointer":
        buf = owner._buffers["seq_lens"]
        buf.set_(torch.zeros_like(buf))
    elif kind == "buffer_storage_offset":
        buf = owner._buffers["block_table"]
        storage = torch.zeros(buf.numel() + COLS, dtype=buf.dtype).untyped_storage()
        buf.set_(storage, COLS, buf.shape, buf.stride())
    elif kind == "buffer_shape":
        owner._buffers["query_start_loc"].resize_(M + 2)
    elif kind == "buffer_stride":
        buf = owner._buffers["kv_offsets"]
        buf.as_strided_(buf.shape, (1, buf.shape[0]))
    elif kind == "buffer_replaced":
        owner._buffers["seq_lens"] = owner._buffers["seq_lens"].to(torch.int64)
    elif kind == "view_pointer":
        obj.seq_lens.set_(torch.zeros_like(obj.seq_lens))
    elif kind == "view_stride":
        v = obj.block_table
        v.as_strided_(v.shape, (1, 1))
    elif kind == "view_replaced":
        obj.kv_offsets = obj.kv_offsets.clone()
    elif kind == "object_replaced":
        owner.by_width[4] = copy.copy(obj)
    elif kind == "object_modified":
        obj.width = 5
    elif kind == "incoming_table_dtype":
        table = table.to(torch.int64)
    elif kind == "incoming_columns":
        table = torch.cat([table, table], dim=1)
    elif kind == "incoming_device":
        table = table.to("meta")
    elif kind == "incoming_seq_lens_dtype":
        seq_lens = seq_lens.to(torch.int64)
    else:
        raise AssertionError(kind)
    return seq_lens, table


DRIFTS = [
    "buffer_pointer",
    "buffer_storage_offset",
    "buffer_shape",
    "buffer_stride",
    "buffer_replaced",
    "view_pointer",
    "view_stride",
    "view_replaced",
    "object_replaced",
    "object_modified",
    "incoming_table_dtype",
    "incoming_columns",
    "incoming_device",
    "incoming_seq_lens_dtype",
]


@pytest.mark.parametrize("kind", DRIFTS)
def test_every_drift_guard_fires(prebuilt_on, kind):
    builder = lib.make_builder(lib.WINDOW, options=prebuilt_on)
    owner = builder.laguna_prebuilt
    table = random_table(random.Random(2))
    builder.build(0, step_cm(4, 300, table))  # first use allocates
    allocated = dict(owner._buffers)
    seq_lens, table = _provoke(owner, kind)
    with pytest.raises(PrebuiltMetadataDriftError):
        owner.refresh(4, seq_lens, table)
    # Never silently reallocated: the builder still holds the first buffers
    # (or the one the test itself swapped in).
    for name, buf in owner._buffers.items():
        if kind != "buffer_replaced" or name != "seq_lens":
            assert buf is allocated[name]


def test_refresh_on_another_width_still_checks_all_views(prebuilt_on):
    builder = lib.make_builder(lib.WINDOW, options=prebuilt_on)
    owner = builder.laguna_prebuilt
    table = random_table(random.Random(2))
    builder.build(0, step_cm(4, 300, table))
    owner.by_width[7].seq_lens.set_(torch.zeros(7, dtype=torch.int32))
    with pytest.raises(PrebuiltMetadataDriftError, match="width-7 seq_lens"):
        builder.build(0, step_cm(2, 300, table))


def test_same_width_refresh_checks_identity_of_all_widths(prebuilt_on):
    builder = lib.make_builder(lib.WINDOW, options=prebuilt_on)
    owner = builder.laguna_prebuilt
    table = random_table(random.Random(2))
    builder.build(0, step_cm(4, 300, table))
    owner.by_width[7].kv_offsets = owner.by_width[7].kv_offsets.clone()
    with pytest.raises(PrebuiltMetadataDriftError, match="width-7 kv_offsets"):
        builder.build(0, step_cm(4, 301, table))  # same width: fast guard


@pytest.mark.parametrize("debug", [False, True], ids=["default", "debug-full"])
def test_guard_policy_and_its_debug_switch(prebuilt_on, debug):
    """Default: a fingerprint drift in a view of *another* width (same object,
    same tensor, storage swapped in place) is caught at the next width change,
    not on same-width calls; the option ``debug_prebuilt_full_guard`` true
    catches it on the very next call (the literal every-call fingerprint)."""
    options = {**prebuilt_on, "debug_prebuilt_full_guard": debug}
    builder = lib.make_builder(lib.WINDOW, options=options)
    owner = builder.laguna_prebuilt
    assert owner.full_guard_every_call is debug
    table = random_table(random.Random(3))
    builder.build(0, step_cm(4, 300, table))
    owner.by_width[7].seq_lens.set_(torch.zeros(7, dtype=torch.int32))
    if debug:
        with pytest.raises(PrebuiltMetadataDriftError, match="width-7 seq_lens"):
            builder.build(0, step_cm(4, 301, table))
        return
    builder.build(0, step_cm(4, 301, table))  # same width: identity only
    with pytest.raises(PrebuiltMetadataDriftError, match="width-7 seq_lens"):
        builder.build(0, step_cm(3, 301, table))  # width change: full check


@pytest.mark.parametrize("q", range(2, M + 1))
def test_option_off_reproduces_the_inline_path(q):
    heads = 18
    impl = lib.make_impl(heads, None)
    layer, kv_cache = lib.ScaleLayer(), lib.make_kv_cache()
    seq_len = 5 * lib.BLOCK_SIZE + 1
    req = lib.random_request(seq_len, heads, [3, 1, 4, 15, 9, 26], seed=q)
    lib.fill_cache(impl, layer, kv_cache, req, seq_len)
    cm = step_cm(q, seq_len, lib.block_table_for([req.blocks]))
    query = req.q[seq_len - q :]
    outs = {}
    for on in (False, True):
        options = lib.options(exact=True, width=M, prebuilt=on)
        builder = lib.make_builder(None, heads, options)
        assert (builder.laguna_prebuilt is not None) == on
        outs[on], md = lib.forward(builder, impl, layer, kv_cache, cm, query)
        assert md.laguna_exact.width == q
        assert (md.laguna_exact.owner is not None) == on
    assert torch.equal(outs[False], outs[True])


def test_prebuilt_needs_exact_verify():
    options = lib.options(exact=False, width=M, prebuilt=True)
    assert lib.make_builder(None, options=options).laguna_prebuilt is None


# options -> the owner's (max width, full guard, split plan), None: inline
OWNER_CASES = {
    "on": (lib.options(prebuilt=True), (8, False, True)),
    "off": (lib.options(prebuilt=False), None),
    "debug": (
        lib.options(prebuilt=True, split_plan=False, debug_prebuilt_full_guard=True),
        (8, True, False),
    ),
    "width5": (lib.options(prebuilt=True, width=5), (5, False, True)),
    "exact_off": (lib.options(exact=False, prebuilt=True), None),
    "no_options": (None, None),
}


def test_each_builder_owns_what_its_configuration_says():
    """Builders of configurations with different options in one process,
    in either order: each owner (or none) as its own configuration says,
    nothing kept from the builder made before."""
    for order in (list(OWNER_CASES), list(reversed(OWNER_CASES))):
        for name in order:
            options, want = OWNER_CASES[name]
            owner = lib.make_builder(None, options=options).laguna_prebuilt
            got = (
                None
                if owner is None
                else (owner.max_width, owner.full_guard_every_call, owner.split_plan)
            )
            assert got == want, name


def test_wrong_offset_vector_is_caught_by_the_equality_test(prebuilt_on):
    """The equality check can fail: corrupt width 5's constant offsets."""
    builder = lib.make_builder(None, options=prebuilt_on)
    table = random_table(random.Random(9))
    md = builder.build(0, step_cm(5, 400, table))
    assert_prebuilt_equals_fresh(md.laguna_exact, md.seq_lens, table)
    builder.laguna_prebuilt.by_width[5].kv_offsets[0] -= 1  # in place: no drift
    md = builder.build(0, step_cm(5, 401, table))
    with pytest.raises(AssertionError, match="KV lengths differ"):
        assert_prebuilt_equals_fresh(md.laguna_exact, md.seq_lens, table)


@pytest.mark.parametrize("options", [None, lib.options(exact=False)])
def test_a_config_the_series_is_not_for_gets_upstreams_metadata(options, monkeypatch):
    """The builder decides when it is built: for a config the series is not
    for (no options, or exact verify off) every step returns upstream's
    metadata as upstream built it, and no step reads the options. The
    series' config (the control) gets the series' metadata."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
    from vllm.xpu_laguna.attention.backend import XpuLagunaFlashAttentionMetadata
    from vllm.xpu_laguna.options import XpuLagunaOptions

    off = lib.make_builder(None, options=options)
    on = lib.make_builder(None, options=lib.options(exact=True, width=M))
    assert off.laguna_planner.width == 0 and on.laguna_planner.width == M

    def read(*args, **kwargs):
        raise AssertionError("a step read the series' options")

    monkeypatch.setattr(XpuLagunaOptions, "from_config", read)
    cm = step_cm(M, 5 * lib.BLOCK_SIZE + 1, lib.block_table_for([[3, 1, 4, 15, 9, 26]]))
    md = off.build(0, cm)
    assert type(md) is FlashAttentionMetadata
    md = on.build(0, cm)
    assert type(md) is XpuLagunaFlashAttentionMetadata
    assert md.laguna_exact is not None and md.laguna_exact.width == M
