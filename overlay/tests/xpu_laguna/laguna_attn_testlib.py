# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Shared helpers for the XPU Laguna attention tests (CPU, reference kernels).

The tests drive the series' FlashAttention metadata builder and impl (the
backend the series' XPU platform picks: upstream's, subclassed in
``vllm.xpu_laguna.attention.backend``) with real tensors: a real ``VllmConfig`` (from a
tiny local HF config, no hub access), a paged KV cache in the backend's own
shape and stride order, the KV written with the impl's own
``do_kv_cache_update``. On a machine without an XPU the backend runs on the
pure-torch reference kernels: the CPU runtime's test-side stand-ins
(``xpu_laguna_standins``), registered here with the overlay's kernel registry
as the runtime's general plugin does in an engine.

The series' options reach the code under test the way they reach it in an
engine: in the ``VllmConfig`` (``additional_config["xpu_laguna"]``) the
metadata builder is built with (:func:`options`, :func:`vllm_config`,
:func:`make_builder`); the builder decides the exact path from it. Nothing
is set in the environment or kept between configurations.
"""

import contextlib
import functools
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import xpu_laguna_standins

from vllm.config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import flash_attn as flash_attn_module
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.xpu_laguna.attention.backend import (
    XpuLagunaFlashAttentionImpl as FlashAttentionImpl,
)
from vllm.xpu_laguna.attention.backend import (
    XpuLagunaFlashAttentionMetadataBuilder as FlashAttentionMetadataBuilder,
)
from vllm.xpu_laguna.options import ADDITIONAL_CONFIG_KEY

xpu_laguna_standins.register()  # on CPU: the reference kernels

HEAD_SIZE = 128
NUM_KV_HEADS = 2
BLOCK_SIZE = 64
NUM_BLOCKS = 48
WINDOW = 512
DEVICE = torch.device("cpu")


Options = Mapping[str, object]
"""The series' options of a test: ``additional_config["xpu_laguna"]``."""


def options(
    exact: bool = True,
    width: int = 8,
    prebuilt: bool = False,
    split_plan: bool = True,
    **more: object,
) -> dict[str, object]:
    """The options of an attention test. ``exact_verify`` is always given
    explicitly: on CPU a configuration asks for the series by setting one of
    its switches true (``series_in_scope``); ``split_plan`` False is the
    debug option ``debug_no_split_plan`` (the negative control)."""
    return {
        "exact_verify": exact,
        "verify_width": width,
        "prebuilt_metadata": prebuilt,
        "debug_no_split_plan": not split_plan,
        **more,
    }


def vllm_config(num_heads: int = 12, options: Options | None = None) -> VllmConfig:
    """A real ``VllmConfig`` of a one-layer Laguna-named target with
    ``options`` (None: no ``xpu_laguna`` entry, the series not in scope on
    CPU); one per (heads, options), built once."""
    return _vllm_config(num_heads, tuple(sorted((options or {}).items())))


@functools.cache
def _vllm_config(num_heads: int, options: tuple[tuple[str, object], ...]) -> VllmConfig:
    from transformers import LlamaConfig

    path = tempfile.mkdtemp(prefix="xpu_laguna_cfg_")
    LlamaConfig(
        hidden_size=num_heads * HEAD_SIZE,
        num_attention_heads=num_heads,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_SIZE,
        num_hidden_layers=1,
        intermediate_size=64,
        vocab_size=256,
        max_position_embeddings=8192,
        # the series acts on a Laguna target only (series_in_scope); the
        # attention tests need no Laguna layer, only its architecture name
        architectures=["LagunaForCausalLM"],
    ).save_pretrained(path)
    model_config = ModelConfig(
        model=path, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=8192
    )
    return VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=BLOCK_SIZE),
        parallel_config=ParallelConfig(tensor_parallel_size=1),
        additional_config={ADDITIONAL_CONFIG_KEY: dict(options)} if options else {},
    )


def kv_spec(window: int | None, dtype: torch.dtype = torch.bfloat16):
    if window is None:
        return FullAttentionSpec(
            block_size=BLOCK_SIZE,
            num_kv_heads=NUM_KV_HEADS,
            head_size=HEAD_SIZE,
            dtype=dtype,
        )
    return SlidingWindowSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        dtype=dtype,
        sliding_window=window,
    )


def make_builder(
    window: int | None, num_heads: int = 12, options: Options | None = None
) -> FlashAttentionMetadataBuilder:
    """A metadata builder of ``vllm_config(num_heads, options)``: the
    builder decides the exact path (and owns prebuilt metadata) from its
    own config."""
    config = vllm_config(num_heads, options)
    with set_current_vllm_config(config):
        return FlashAttentionMetadataBuilder(
            kv_spec(window), ["layer.0"], config, DEVICE
        )


@contextlib.contextmanager
def _xpu_fp8_kv_support():
    """The impl's FP8 KV check answered as on XPU (vLLM 0.32.0 ``fa_utils``:
    every FP8 cache dtype but ``fp8_e5m2``), which the CPU reference kernel
    stands in for; CPU itself has no FlashAttention FP8 answer."""
    original = flash_attn_module.flash_attn_supports_kv_cache_dtype
    flash_attn_module.flash_attn_supports_kv_cache_dtype = (
        lambda kv_cache_dtype="fp8_e4m3", **_: kv_cache_dtype != "fp8_e5m2"
    )
    try:
        yield
    finally:
        flash_attn_module.flash_attn_supports_kv_cache_dtype = original


def make_impl(
    num_heads: int,
    window: int | None,
    kv_cache_dtype: str = "auto",
    **kwargs,
) -> FlashAttentionImpl:
    # (on CPU the impl reads no option: the exact path comes with the
    # metadata its builder made)
    with (
        set_current_vllm_config(vllm_config(num_heads)),
        _xpu_fp8_kv_support(),
    ):
        return FlashAttentionImpl(
            num_heads=num_heads,
            head_size=HEAD_SIZE,
            scale=HEAD_SIZE**-0.5,
            num_kv_heads=NUM_KV_HEADS,
            alibi_slopes=kwargs.pop("alibi_slopes", None),
            sliding_window=window,
            kv_cache_dtype=kv_cache_dtype,
            **kwargs,
        )


class ScaleLayer(torch.nn.Module):
    """The attributes FlashAttentionImpl reads from its Attention layer."""

    def __init__(self, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        super().__init__()
        self._q_scale = torch.tensor(1.0)
        self._k_scale = torch.tensor(k_scale)
        self._v_scale = torch.tensor(v_scale)
        # vLLM 0.34.0's FlashAttentionImpl also reads the host copies
        self._q_scale_float = 1.0
        self._k_scale_float = k_scale
        self._v_scale_float = v_scale


def make_kv_cache(
    dtype: torch.dtype = torch.bfloat16, num_blocks: int = NUM_BLOCKS
) -> torch.Tensor:
    """A KV cache as vLLM 0.32.0 hands it to the backend: the logical layer
    view ``(blocks, kv heads, block size, 2 * head size)`` (keys then values
    in the last axis) over the default physical layout LBNHC (NHD: block,
    token, head, content)."""
    return physical_nhd_kv_cache(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, dtype)


def physical_nhd_kv_cache(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    physical = torch.zeros(
        num_blocks, block_size, num_kv_heads, 2 * head_size, dtype=dtype
    )
    return physical.permute(0, 2, 1, 3)


def block_table_for(
    rows: list[list[int]], num_cols: int = 16, dtype=torch.int32
) -> torch.Tensor:
    table = torch.zeros(len(rows), num_cols, dtype=dtype)
    for i, row in enumerate(rows):
        table[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return table


def common_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_table: torch.Tensor,
    causal: bool = True,
) -> CommonAttentionMetadata:
    """CommonAttentionMetadata for a batch, with the slot mapping of its rows."""
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    slots = []
    for i, (q, s) in enumerate(zip(query_lens, seq_lens)):
        for pos in range(s - q, s):
            blk = int(block_table[i, pos // BLOCK_SIZE])
            slots.append(blk * BLOCK_SIZE + pos % BLOCK_SIZE)
    qsl_t = torch.tensor(qsl, dtype=torch.int32)
    seq_t = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl_t,
        query_start_loc_cpu=qsl_t.clone(),
        seq_lens=seq_t,
        num_reqs=len(query_lens),
        num_actual_tokens=qsl[-1],
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        causal=causal,
        seq_lens_cpu_upper_bound=seq_t.clone(),
    )


@dataclass
class Request:
    """One request's block row and full K/V/Q history (one row per token)."""

    blocks: list[int]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def random_request(
    length: int,
    num_heads: int,
    blocks: list[int],
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
) -> Request:
    gen = torch.Generator().manual_seed(seed)

    def rnd(h: int) -> torch.Tensor:
        return torch.randn(length, h, HEAD_SIZE, generator=gen).to(dtype)

    return Request(blocks, rnd(num_heads), rnd(NUM_KV_HEADS), rnd(NUM_KV_HEADS))


def fill_cache(
    impl: FlashAttentionImpl,
    layer: ScaleLayer,
    kv_cache: torch.Tensor,
    req: Request,
    upto: int,
) -> None:
    """Write tokens [0, upto) of ``req`` with the impl's own cache write."""
    table = block_table_for([req.blocks])
    cm = common_metadata([upto], [upto], table)
    impl.do_kv_cache_update(
        layer, req.k[:upto], req.v[:upto], kv_cache, cm.slot_mapping
    )


def forward(
    builder: FlashAttentionMetadataBuilder,
    impl: FlashAttentionImpl,
    layer: ScaleLayer,
    kv_cache: torch.Tensor,
    cm: CommonAttentionMetadata,
    query: torch.Tensor,
    metadata=None,
) -> tuple[torch.Tensor, object]:
    """Build metadata (unless given) and run the impl's forward."""
    if metadata is None:
        metadata = builder.build(common_prefix_len=0, common_attn_metadata=cm)
    out = torch.full(
        (query.shape[0], impl.num_heads, HEAD_SIZE), float("nan"), dtype=query.dtype
    )
    impl.forward(layer, query, None, None, kv_cache, metadata, out)
    return out, metadata
