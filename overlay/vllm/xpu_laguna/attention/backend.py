# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' FlashAttention backend: upstream's, with the exact
speculative verify and its prebuilt metadata.

The series' XPU platform returns it where upstream's XPU platform picks
``FLASH_ATTN`` (``vllm.xpu_laguna.platform``); CPU runs register it
(the CPU runtime's test-side plugins). What it adds, each by subclassing:

* the metadata builder plans each step's exact verify
  (``exact_verify.StepPlanner``: verify rows as one-token paged-decode
  pseudo-sequences, None for every step and model the series is not for)
  into :class:`XpuLagunaFlashAttentionMetadata`, from fixed-address
  buffers it owns when the ``prebuilt_metadata`` option asks
  (``vllm.xpu_laguna.attention.prebuilt``), re-expanded per KV-cache group;
* the impl runs a planned step through ``exact_verify.run_exact_verify``
  before upstream's forward, checks at construction that the kernels the
  series calls are there, and writes a native float KV cache under
  ``"auto"`` (``exact_verify.cache_write_dtype``).

Everything else, and every step without a plan, is upstream's.
"""

import dataclasses

import torch

from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends import flash_attn
from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadata,
    FlashAttentionMetadataBuilder,
)
from vllm.xpu_laguna.attention import exact as exact_verify
from vllm.xpu_laguna.attention.prebuilt import maybe_create

_ENCODER = (AttentionType.ENCODER, AttentionType.ENCODER_ONLY)


@dataclasses.dataclass
class XpuLagunaFlashAttentionMetadata(FlashAttentionMetadata):
    # XPU Laguna exact speculative verify (None: upstream's path).
    laguna_exact: exact_verify.ExactVerifyMetadata | None = None


def laguna_exact(
    metadata: FlashAttentionMetadata,
) -> exact_verify.ExactVerifyMetadata | None:
    """A step's exact-verify metadata; None: upstream's path (upstream's own
    metadata, which a builder of a config the series is not for returns, has
    none)."""
    return getattr(metadata, "laguna_exact", None)


class XpuLagunaFlashAttentionMetadataBuilder(FlashAttentionMetadataBuilder):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # what each step's plan reads of the config, decided here
        self.laguna_planner = exact_verify.StepPlanner.from_config(self.vllm_config)
        # fixed-address exact-verify metadata (None: planned inline)
        self.laguna_prebuilt = maybe_create(self.vllm_config, self.device)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> FlashAttentionMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        if self.laguna_planner.width == 0:
            return metadata  # a config the series is not for: upstream's, as is
        fields = {
            f.name: getattr(metadata, f.name) for f in dataclasses.fields(metadata)
        }
        fields["laguna_exact"] = self.laguna_planner.plan(
            common_attn_metadata, self.dcp_world_size, self.laguna_prebuilt
        )
        return XpuLagunaFlashAttentionMetadata(**fields)

    def update_block_table(
        self,
        metadata: FlashAttentionMetadata,
        blk_table: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> FlashAttentionMetadata:
        new_metadata = super().update_block_table(metadata, blk_table, slot_mapping)
        if self.laguna_prebuilt is not None:
            assert isinstance(new_metadata, XpuLagunaFlashAttentionMetadata)
            # Re-expand into this group's buffers from this group's table.
            new_metadata.laguna_exact = self.laguna_prebuilt.rebind(
                new_metadata.laguna_exact, metadata.seq_lens, blk_table
            )
        return new_metadata


class XpuLagunaFlashAttentionImpl(FlashAttentionImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.vllm_flash_attn_version = exact_verify.checked_fa_version(
            self.vllm_flash_attn_version
        )

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: FlashAttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        exact = laguna_exact(attn_metadata)
        if (
            exact is not None
            and output_scale is None
            and output_block_scale is None
            and self.attn_type not in _ENCODER
        ):
            # upstream's view of the cache (an unquantized one: the exact
            # path refuses a quantized KV cache)
            key_cache, value_cache = kv_cache.transpose(1, 2).split(
                self.head_size, dim=-1
            )
            if exact_verify.run_exact_verify(
                self, layer, query, key_cache, value_cache, output, attn_metadata
            ):
                return output
        return super().forward(
            layer,
            query,
            key,
            value,
            kv_cache,
            attn_metadata,
            output,
            output_scale,
            output_block_scale,
        )

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        write = exact_verify.cache_write_dtype(
            self.kv_cache_dtype, key.dtype, kv_cache.dtype
        )
        if write == self.kv_cache_dtype or self.attn_type in _ENCODER:
            return super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        # upstream's write with the dtype string the kernel stores natively
        key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        flash_attn.reshape_and_cache_flash(
            key,
            value,
            key_cache,
            value_cache,
            slot_mapping,
            write,
            layer._k_scale,
            layer._v_scale,
        )


class XpuLagunaFlashAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[FlashAttentionImpl]:
        return XpuLagunaFlashAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[FlashAttentionMetadataBuilder]:
        return XpuLagunaFlashAttentionMetadataBuilder
