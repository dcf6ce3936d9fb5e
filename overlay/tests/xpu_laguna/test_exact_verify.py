# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Exact speculative verify on the FlashAttention backend (reference kernels).

Drives the real metadata builder and impl: a q-row verify step of one request
must produce, row for row, bitwise the output of the q single-token decodes
of those tokens; every other step shape must be the upstream path unchanged.
The options come with the builder's ``VllmConfig``
(``additional_config["xpu_laguna"]``, ``lib.options``): each configuration
gets its own decision.
"""

import dataclasses
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from xpu_laguna_standins import reference_attention as ref

sys.path.insert(0, os.path.dirname(__file__))

import laguna_attn_testlib as lib  # noqa: E402

from vllm.xpu_laguna.attention import exact as xpu_laguna_exact  # noqa: E402
from vllm.xpu_laguna.attention.backend import laguna_exact  # noqa: E402

pytestmark = pytest.mark.skipif(
    xpu_laguna_exact.kernel_seam_name() != "reference"
    or not xpu_laguna_exact.exact_path_available(),
    reason="these tests run the backend on the pure-torch reference kernels",
)


def _verify_vs_decodes(q, window, num_heads, seq_len, kv_dtype="auto"):
    builder = lib.make_builder(window, num_heads, lib.options(exact=True, width=8))
    impl = lib.make_impl(num_heads, window, kv_cache_dtype=kv_dtype)
    fp8 = kv_dtype.startswith("fp8")
    layer = lib.ScaleLayer(0.05, 0.04) if fp8 else lib.ScaleLayer()
    kv_cache = lib.make_kv_cache(torch.uint8 if fp8 else torch.bfloat16)
    blocks = [7, 3, 30, 11, 2, 19, 5, 40, 1, 22, 9, 13]  # scattered on purpose
    req = lib.random_request(seq_len, num_heads, blocks, seed=q * 1000 + seq_len)
    lib.fill_cache(impl, layer, kv_cache, req, seq_len)
    table = lib.block_table_for([blocks])

    verify_cm = lib.common_metadata([q], [seq_len], table)
    verify_out, md = lib.forward(
        builder, impl, layer, kv_cache, verify_cm, req.q[seq_len - q : seq_len]
    )
    assert md.laguna_exact is not None and md.laguna_exact.width == q
    assert not torch.isnan(verify_out).any()
    for j in range(q):
        tok = seq_len - q + j  # token position; a decode of it sees tok+1 keys
        decode_cm = lib.common_metadata([1], [tok + 1], table)
        decode_out, dmd = lib.forward(
            builder, impl, layer, kv_cache, decode_cm, req.q[tok : tok + 1]
        )
        # q=1: the plain decode, one row with the planned split count
        assert dmd.laguna_exact is not None and dmd.laguna_exact.width == 1
        assert torch.equal(verify_out[j], decode_out[0]), (
            f"row {j} of the q={q} verify differs from its single-token decode"
        )
    return verify_out


# Sequence lengths whose verify rows straddle a KV block boundary (block 64),
# and, for the windowed cases, exceed the 512 window.
@pytest.mark.parametrize("q", range(2, 9))
@pytest.mark.parametrize("window", [None, lib.WINDOW])
@pytest.mark.parametrize("num_heads", [18, 12], ids=["gqa18:2", "gqa12:2"])
def test_decomposed_verify_equals_single_token_decodes(q, window, num_heads):
    seq_len = 9 * lib.BLOCK_SIZE + q // 2  # 576 + q//2: boundary inside the rows
    _verify_vs_decodes(q, window, num_heads, seq_len)


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e4m3"])
def test_decomposed_verify_fp8_kv(kv_dtype):
    _verify_vs_decodes(8, lib.WINDOW, 12, 3 * lib.BLOCK_SIZE + 3, kv_dtype)


def test_decomposed_verify_matches_causal_reference():
    """The exact path is the right attention, not just self-consistent."""
    q, seq_len, heads = 8, 2 * lib.BLOCK_SIZE + 5, 12
    builder = lib.make_builder(lib.WINDOW, heads, lib.options(exact=True))
    impl = lib.make_impl(heads, lib.WINDOW)
    layer, kv_cache = lib.ScaleLayer(), lib.make_kv_cache()
    req = lib.random_request(seq_len, heads, [4, 8, 15, 16], seed=5)
    lib.fill_cache(impl, layer, kv_cache, req, seq_len)
    table = lib.block_table_for([req.blocks])
    cm = lib.common_metadata([q], [seq_len], table)
    out, _ = lib.forward(builder, impl, layer, kv_cache, cm, req.q[seq_len - q :])
    # Dense causal attention over the token history, float32.
    k = req.k.float().repeat_interleave(heads // lib.NUM_KV_HEADS, dim=1)
    v = req.v.float().repeat_interleave(heads // lib.NUM_KV_HEADS, dim=1)
    for j in range(q):
        tok = seq_len - q + j
        lo = max(0, tok - (lib.WINDOW - 1))
        s = torch.einsum("hd,khd->hk", req.q[tok].float(), k[lo : tok + 1])
        p = torch.softmax(s * lib.HEAD_SIZE**-0.5, dim=-1)
        want = torch.einsum("hk,khd->hd", p, v[lo : tok + 1])
        torch.testing.assert_close(out[j].float(), want, atol=2e-2, rtol=2e-2)


def test_wrong_kv_lengths_are_detected(monkeypatch):
    """The bitwise check can fail: an off-by-one KV length breaks it."""
    real = xpu_laguna_exact.build_inline

    def off_by_one(seq_lens, block_table, q):
        cu, lens, table = real(seq_lens, block_table, q)
        # verify rows only: the q=1 decodes (the expected values) stay right
        return cu, (lens - 1 if q > 1 else lens), table

    monkeypatch.setattr(xpu_laguna_exact, "build_inline", off_by_one)
    with pytest.raises(AssertionError, match="differs from its single-token"):
        _verify_vs_decodes(4, None, 12, 2 * lib.BLOCK_SIZE + 1)


def test_upstream_verify_rows_are_not_bitwise_decodes():
    """Why the path exists, reproduced on the reference kernel: one q-row
    causal call (the upstream verify) computes rows with a different
    reduction shape than q=1 decode, so some rows differ in the last bits.
    The exact path (above) removes every such difference."""
    differing, rows = 0, 0
    for heads, window in ((18, lib.WINDOW), (12, None)):
        builder = lib.make_builder(window, heads, lib.options(exact=False))
        impl = lib.make_impl(heads, window)
        layer, kv_cache = lib.ScaleLayer(), lib.make_kv_cache()
        table_rows = [2, 9, 4, 11, 6, 13, 8, 15, 10, 17, 12, 19]
        for seq_len in (70, 129, 600, 700):
            req = lib.random_request(seq_len, heads, table_rows, seed=seq_len)
            lib.fill_cache(impl, layer, kv_cache, req, seq_len)
            table = lib.block_table_for([table_rows])
            cm = lib.common_metadata([8], [seq_len], table)
            out, md = lib.forward(
                builder, impl, layer, kv_cache, cm, req.q[seq_len - 8 : seq_len]
            )
            assert laguna_exact(md) is None
            for j in range(8):
                tok = seq_len - 8 + j
                dcm = lib.common_metadata([1], [tok + 1], table)
                dec, _ = lib.forward(
                    builder, impl, layer, kv_cache, dcm, req.q[tok : tok + 1]
                )
                torch.testing.assert_close(out[j], dec[0], atol=1e-2, rtol=1e-2)
                differing += not torch.equal(out[j], dec[0])
                rows += 1
    assert differing > 0, f"all {rows} upstream verify rows matched bitwise"


# ---------------------------------------------------------------- eligibility
def _metadata_fields_equal(a, b) -> bool:
    for f in dataclasses.fields(a):
        if f.name == "laguna_exact":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and x.dtype == y.dtype
                and torch.equal(x, y)
            ):
                return False
        elif x != y:
            return False
    return True


ELIGIBILITY_CASES = {
    # name: (query_lens, seq_lens, width, causal, expected exact width)
    "verify_q2": ([2], [300], 8, True, 2),
    "verify_q8": ([8], [300], 8, True, 8),
    "verify_q5_width5": ([5], [300], 5, True, 5),
    "decode_q1": ([1], [300], 8, True, 1),
    "two_decodes": ([1, 1], [300, 200], 8, True, 0),
    "too_wide_q9": ([9], [300], 8, True, 0),
    "too_wide_for_width4": ([5], [300], 4, True, 0),
    "width1_disables": ([2], [300], 1, True, 0),
    "prefill": ([200], [200], 8, True, 0),
    "short_prefill_two_requests": ([4, 4], [4, 300], 8, True, 0),
    "two_verifies": ([8, 8], [300, 200], 8, True, 0),
    "mixed_decode_prefill": ([1, 50], [300, 50], 8, True, 0),
    "non_causal": ([8], [300], 8, False, 0),
}


@pytest.mark.parametrize("case", ELIGIBILITY_CASES)
def test_eligibility(case):
    query_lens, seq_lens, width, causal, want = ELIGIBILITY_CASES[case]
    heads = 12
    rows = [[5, 6, 7, 8, 9], [20, 21, 22, 23, 24]][: len(query_lens)]
    table = lib.block_table_for(rows)
    impl = lib.make_impl(heads, lib.WINDOW)
    layer, kv_cache = lib.ScaleLayer(), lib.make_kv_cache()
    for i, (s, row) in enumerate(zip(seq_lens, rows)):
        req = lib.random_request(s, heads, row, seed=i)
        lib.fill_cache(impl, layer, kv_cache, req, s)
    query = torch.randn(sum(query_lens), heads, lib.HEAD_SIZE).to(torch.bfloat16)

    outs, mds = {}, {}
    for on in (True, False):
        builder = lib.make_builder(
            lib.WINDOW, heads, lib.options(exact=on, width=width)
        )
        cm = lib.common_metadata(query_lens, seq_lens, table, causal=causal)
        mds[on] = builder.build(common_prefix_len=0, common_attn_metadata=cm)
        if causal:  # the reference upstream path runs either way
            outs[on], _ = lib.forward(
                builder, impl, layer, kv_cache, cm, query, mds[on]
            )

    exact = laguna_exact(mds[True])
    assert (exact.width if exact is not None else 0) == want
    assert laguna_exact(mds[False]) is None
    # Apart from the exact-verify field the metadata is the upstream metadata.
    assert _metadata_fields_equal(mds[True], mds[False])
    if causal and want <= 1:
        # byte-for-byte upstream (a batch-1 decode: the plan is the heuristic)
        assert torch.equal(outs[True], outs[False])


def _config(
    async_scheduling: bool = False,
    spec: bool = False,
    options: lib.Options | None = None,
    architecture: str = "LagunaForCausalLM",
) -> SimpleNamespace:
    """The VllmConfig fields a step planner reads: the target's architecture and
    the series' options (the series' scope and the exact path are decided
    from the builder's config) and the two that say whether the host's
    sequence lengths are exact."""
    opts = lib.options(exact=True) if options is None else options
    return SimpleNamespace(
        model_config=SimpleNamespace(architectures=[architecture]),
        additional_config={"xpu_laguna": dict(opts)},
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        speculative_config=SimpleNamespace() if spec else None,
    )


def _plan(cm, config, dcp_world_size):
    """One step planned as a metadata builder of ``config`` plans it."""
    return xpu_laguna_exact.StepPlanner.from_config(config).plan(cm, dcp_world_size)


def test_dcp_is_not_eligible():
    cm = lib.common_metadata([8], [300], lib.block_table_for([[1, 2, 3, 4, 5]]))
    assert _plan(cm, _config(), 1) is not None
    assert _plan(cm, _config(), 2) is None  # DCP


def test_padded_step_is_not_eligible():
    cm = lib.common_metadata([4], [300], lib.block_table_for([[1, 2, 3, 4, 5]]))
    cm.num_actual_tokens = 8  # padded rows beyond the request's 4
    assert _plan(cm, _config(), 1) is None


def test_exact_seq_len_under_async_speculative_decoding():
    """VLLM 0.32.0's host copy of seq_lens is an upper bound under async
    speculative decoding (every draft assumed accepted): the plan must then
    read the device value, which is what the split plan needs."""
    cm = lib.common_metadata([8], [300], lib.block_table_for([[1, 2, 3, 4, 5]]))
    cm.seq_lens_cpu_upper_bound = torch.tensor([305], dtype=torch.int32)
    on_device = _plan(cm, _config(async_scheduling=True, spec=True), 1)
    assert on_device is not None and on_device.seq_len == 300
    # Negative control: where the host copy is declared exact it is used as is
    # (here deliberately wrong, so the source of the value is visible).
    on_host = _plan(cm, _config(async_scheduling=False, spec=True), 1)
    assert on_host is not None and on_host.seq_len == 305


# ------------------------------------------------- one decision per config
def test_each_config_gets_its_own_exact_path_decision():
    """Configurations of one process (two engines; a Laguna target and
    another model) each get the decision of their own options, in any order:
    nothing is remembered from the configuration asked before."""
    configs = {
        "exact_width6": (lib.vllm_config(12, lib.options(exact=True, width=6)), 6),
        "exact_off": (lib.vllm_config(12, lib.options(exact=False)), 0),
        "no_options": (lib.vllm_config(12), 0),  # on CPU: the run does not ask
        "llama": (_config(architecture="LlamaForCausalLM"), 0),
        "default_width": (_config(options={"exact_verify": True}), 8),
        "prebuilt_asks": (_config(options={"prebuilt_metadata": True}), 8),
        "no_config": (None, 0),
    }
    for order in (list(configs), list(reversed(configs))):
        for name in order + order:
            cfg, width = configs[name]
            assert xpu_laguna_exact.exact_verify_width(cfg) == width, name


# step width q -> (exact width, split plan) or None (the upstream path)
BUILDER_CASES = {
    "exact": (lib.options(exact=True), {8: (8, True), 4: (4, True)}),
    "off": (lib.options(exact=False), {8: None, 4: None}),
    "width4": (lib.options(exact=True, width=4), {8: None, 4: (4, True)}),
    "no_plan": (
        lib.options(exact=True, split_plan=False),
        {8: (8, False), 4: (4, False)},
    ),
    "no_options": (None, {8: None, 4: None}),
}


def test_builders_of_two_configs_keep_their_own_exact_path():
    """Metadata builders of several configurations in one process, stepped
    alternately: each step takes its own builder's decision (the exact path,
    its width, the split-plan debug option), never another's."""
    builders = {
        name: lib.make_builder(None, 12, opts)
        for name, (opts, _) in BUILDER_CASES.items()
    }
    table = lib.block_table_for([[1, 2, 3, 4, 5]])
    for _ in range(2):
        for q in (8, 4):
            for name, builder in builders.items():
                md = builder.build(0, lib.common_metadata([q], [300], table))
                exact = laguna_exact(md)
                got = None if exact is None else (exact.width, exact.split_plan)
                assert got == BUILDER_CASES[name][1][q], (name, q)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alibi_slopes": [0.5] * 12},
        {"logits_soft_cap": 30.0},
    ],
    ids=["alibi", "softcap"],
)
def test_layers_the_exact_path_does_not_cover(kwargs):
    impl = lib.make_impl(12, None, **kwargs)
    assert not xpu_laguna_exact.impl_supports_exact(impl)
    assert xpu_laguna_exact.impl_supports_exact(lib.make_impl(12, None))


# ------------------------------------------------------------ BF16 cache write
def test_cache_write_dtype_mapping():
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    write = xpu_laguna_exact.cache_write_dtype
    # A native float name is "auto" only when it is the model (and cache) dtype.
    assert write("bfloat16", bf16, bf16) == "auto"
    assert write("float16", fp16, fp16) == "auto"
    assert write("half", fp16, fp16) == "auto"
    assert write("float32", fp32, fp32) == "auto"
    assert write("auto", bf16, bf16) == "auto"
    for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert write(fp8, bf16, torch.uint8) == fp8
    # Any other combination would be stored mistyped: one clear error.
    for name, model, cache in (
        ("bfloat16", fp16, bf16),
        ("float16", bf16, fp16),
        ("bfloat16", fp32, bf16),
        ("float16", fp16, bf16),
    ):
        with pytest.raises(ValueError, match="only in the model dtype"):
            write(name, model, cache)


def test_mismatched_native_kv_cache_dtype_fails_clearly():
    """--kv-cache-dtype bfloat16 on a float16 model: refused, nothing written."""
    heads = 12
    impl = lib.make_impl(heads, None, kv_cache_dtype="bfloat16")
    layer, kv_cache = lib.ScaleLayer(), lib.make_kv_cache(torch.bfloat16)
    req = lib.random_request(10, heads, [9], seed=3, dtype=torch.float16)
    with pytest.raises(ValueError, match="model dtype float16"):
        lib.fill_cache(impl, layer, kv_cache, req, 10)
    assert not kv_cache.any()


def test_bf16_kv_cache_write_through_the_impl():
    """``--kv-cache-dtype bfloat16``: the impl's cache write stores the values."""
    heads = 12
    impl = lib.make_impl(heads, None, kv_cache_dtype="bfloat16")
    layer, kv_cache = lib.ScaleLayer(), lib.make_kv_cache(torch.bfloat16)
    req = lib.random_request(70, heads, [9, 2], seed=3)
    lib.fill_cache(impl, layer, kv_cache, req, 70)
    key_cache, value_cache = kv_cache.transpose(1, 2).split(lib.HEAD_SIZE, dim=-1)
    for pos in (0, 63, 64, 69):
        blk, off = req.blocks[pos // lib.BLOCK_SIZE], pos % lib.BLOCK_SIZE
        assert torch.equal(key_cache[blk, off], req.k[pos])
        assert torch.equal(value_cache[blk, off], req.v[pos])
    # The kernel contract the mapping exists for: the dtype name is rejected.
    with pytest.raises(ValueError, match="Unsupported kv_cache_dtype"):
        ref.reshape_and_cache_flash(
            req.k[:1],
            req.v[:1],
            key_cache,
            value_cache,
            torch.tensor([0]),
            "bfloat16",
            layer._k_scale,
            layer._v_scale,
        )


def test_fp8_kv_cache_write_through_the_impl():
    heads = 12
    impl = lib.make_impl(heads, None, kv_cache_dtype="fp8")
    layer, kv_cache = lib.ScaleLayer(0.05, 0.04), lib.make_kv_cache(torch.uint8)
    req = lib.random_request(10, heads, [3], seed=4)
    lib.fill_cache(impl, layer, kv_cache, req, 10)
    key_cache, _ = kv_cache.transpose(1, 2).split(lib.HEAD_SIZE, dim=-1)
    stored = key_cache[3, :10].view(torch.float8_e4m3fn).float() * 0.05
    torch.testing.assert_close(stored, req.k[:10].float(), atol=0.1, rtol=0.1)
    assert not torch.equal(stored, req.k[:10].float())  # really quantised


# ------------------------------------------------------ split plan per step
LAYERS = 4
# Rows of a q=8 step: KV 2237..2244 (2240 -> 8 splits, 2241 -> 9, worked out
# in test_split_plan.py) and KV 2233..2240 (all 8); 12 heads, no window.
PLAN_2244 = ((0, 4, 8, 2240), (4, 8, 9, 2244))
PLAN_2240 = ((0, 8, 8, 2240),)


def _steps_of_layers(prebuilt: bool):
    """Two q=8 steps (KV 2244, then 2240) of one request, each step's
    metadata built once and run by LAYERS layers of the same shape, as the
    model runner does; per step: the counts, the outputs, the exact metadata
    and the plans it held after the step."""
    heads = 12
    builder = lib.make_builder(
        None, heads, lib.options(exact=True, width=8, prebuilt=prebuilt)
    )
    impl = lib.make_impl(heads, None)
    kv_cache = lib.make_kv_cache(torch.bfloat16)
    gen = torch.Generator().manual_seed(29)
    kv_cache.copy_(torch.randn(kv_cache.shape, generator=gen).to(torch.bfloat16))
    blocks = list(torch.randperm(lib.NUM_BLOCKS, generator=gen)[:36].tolist())
    table = lib.block_table_for([blocks], num_cols=40)
    steps = []
    for seq_len in (2244, 2240):
        query = torch.randn(8, heads, lib.HEAD_SIZE, generator=gen).to(torch.bfloat16)
        md = builder.build(
            common_prefix_len=0,
            common_attn_metadata=lib.common_metadata([8], [seq_len], table),
        )
        xpu_laguna_exact.counters.reset()
        outs = [
            lib.forward(
                builder, impl, lib.ScaleLayer(), kv_cache, None, query, metadata=md
            )[0]
            for _ in range(LAYERS)
        ]
        exact = md.laguna_exact
        steps.append(
            (
                xpu_laguna_exact.counters.snapshot(),
                outs,
                exact,
                list(exact.plans.values()),
            )
        )
    return steps


@pytest.mark.parametrize("prebuilt", [False, True], ids=["inline", "prebuilt"])
def test_split_plan_is_computed_once_per_step(prebuilt):
    steps = _steps_of_layers(prebuilt)
    for (counts, outs, _, plans), plan in zip(steps, (PLAN_2244, PLAN_2240)):
        assert counts["exact_calls_by_width"] == {"8": LAYERS}
        assert counts["kernel_calls_by_width"] == {"8": LAYERS * len(plan)}
        assert counts["plans"] == 1, "the split plan was computed more than once"
        assert plans == [plan]  # this step's, never stale
        assert not torch.isnan(outs[0]).any()
        assert all(torch.equal(o, outs[0]) for o in outs[1:])
    if prebuilt:  # the same fixed-address object both steps, re-planned
        assert steps[0][2] is steps[1][2]


def test_split_plan_counter_sees_a_plan_per_layer(monkeypatch):
    """Negative control: with the plan computed in every layer forward (the
    code before the per-step plan) the counter shows one plan per layer."""
    monkeypatch.setattr(
        xpu_laguna_exact.ExactVerifyMetadata,
        "call_groups",
        lambda self, *shape: xpu_laguna_exact.call_groups(self, *shape),
    )
    for counts, *_ in _steps_of_layers(prebuilt=False):
        assert counts["plans"] == LAYERS
