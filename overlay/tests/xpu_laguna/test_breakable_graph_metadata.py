# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The replay guard on real FlashAttention metadata, prebuilt exact metadata
off and on (both must work with breakable graphs on).

Steps are built like the V1 runner builds them: the common metadata is views
of persistent buffers refreshed in place, one metadata builder per KV-cache
group (sliding window and global, as in Laguna), verify widths varying near
the end of a request and plain decode steps in between. The guard must pass
all of them and refuse a step whose buffer was reallocated.
"""

from __future__ import annotations

import tempfile

import pytest
import torch

import vllm.envs as envs
from vllm.compilation.xpu_breakable_graph import (
    StaticInputMismatchError,
    XpuBreakableGraphWrapper,
    _XpuEntry,
)
from vllm.config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

WIDTH = 8
BLOCK = 64
HEAD = 128
KV_HEADS = 2
COLS = 16
# (query rows, sequence length) per step: verify steps of the full width,
# narrower ones near the end, plain decode steps.
STEPS = [(8, 40), (8, 48), (1, 49), (8, 57), (5, 62), (8, 70), (3, 73), (8, 81)]


def _config() -> VllmConfig:
    from transformers import LlamaConfig

    path = tempfile.mkdtemp(prefix="breakable-md-")
    LlamaConfig(
        hidden_size=8 * HEAD,
        num_attention_heads=8,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD,
        num_hidden_layers=2,
        intermediate_size=64,
        vocab_size=256,
        max_position_embeddings=4096,
    ).save_pretrained(path)
    model = ModelConfig(model=path, skip_tokenizer_init=True, dtype="bfloat16")
    return VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BLOCK),
        parallel_config=ParallelConfig(tensor_parallel_size=1),
    )


class _Runner:
    """Persistent step buffers refreshed in place, as the V1 runner does."""

    def __init__(self, config: VllmConfig) -> None:
        self.qsl = torch.zeros(2, dtype=torch.int32)
        self.seq_lens = torch.zeros(1, dtype=torch.int32)
        self.table = torch.arange(COLS, dtype=torch.int32).reshape(1, COLS) + 3
        self.slots = torch.full((WIDTH,), -1, dtype=torch.int64)
        with set_current_vllm_config(config):
            self.builders = {
                "model.layers.0.self_attn.attn": FlashAttentionMetadataBuilder(
                    SlidingWindowSpec(
                        block_size=BLOCK,
                        num_kv_heads=KV_HEADS,
                        head_size=HEAD,
                        dtype=torch.bfloat16,
                        sliding_window=512,
                    ),
                    ["model.layers.0.self_attn.attn"],
                    config,
                    torch.device("cpu"),
                ),
                "model.layers.1.self_attn.attn": FlashAttentionMetadataBuilder(
                    FullAttentionSpec(
                        block_size=BLOCK,
                        num_kv_heads=KV_HEADS,
                        head_size=HEAD,
                        dtype=torch.bfloat16,
                    ),
                    ["model.layers.1.self_attn.attn"],
                    config,
                    torch.device("cpu"),
                ),
            }

    def step(self, q: int, seq_len: int) -> dict[str, object]:
        self.qsl.copy_(torch.tensor([0, q], dtype=torch.int32))
        self.seq_lens.fill_(seq_len)
        self.slots.fill_(-1)
        self.slots[:q] = torch.arange(seq_len - q, seq_len) + 3 * BLOCK
        common = CommonAttentionMetadata(
            query_start_loc=self.qsl,
            query_start_loc_cpu=self.qsl.clone(),
            seq_lens=self.seq_lens,
            num_reqs=1,
            num_actual_tokens=q,
            max_query_len=q,
            max_seq_len=seq_len,
            block_table_tensor=self.table,
            slot_mapping=self.slots,
            causal=True,
            seq_lens_cpu_upper_bound=self.seq_lens.clone(),
        )
        return {name: b.build(0, common) for name, b in self.builders.items()}


def _check(config: VllmConfig, entry: _XpuEntry, metadata) -> None:
    with set_forward_context(metadata, config):
        XpuBreakableGraphWrapper._check_metadata(entry)


@pytest.mark.parametrize("prebuilt", [False, True], ids=["md-off", "md-on"])
def test_guard_accepts_real_steps_and_refuses_reallocation(monkeypatch, prebuilt):
    monkeypatch.setattr(envs, "VLLM_XPU_LAGUNA_EXACT_VERIFY", True, raising=False)
    monkeypatch.setattr(envs, "VLLM_XPU_LAGUNA_VERIFY_WIDTH", WIDTH, raising=False)
    monkeypatch.setattr(
        envs,
        "VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA",
        prebuilt,
        raising=False,
    )
    config = _config()
    runner = _Runner(config)
    entry = _XpuEntry(batch_descriptor=BatchDescriptor(num_tokens=WIDTH))
    exact_tensors = 0
    for _ in range(2):  # the same steps twice: every layout seen again
        for q, seq_len in STEPS:
            metadata = runner.step(q, seq_len)
            md = metadata["model.layers.0.self_attn.attn"]
            exact = getattr(md, "laguna_exact", None)
            # one request: verify widths and plain decodes (width 1, the planned
            # KV split count) all take the exact path
            assert exact is not None and exact.width == q
            if exact is not None and exact.seq_lens is not None:
                exact_tensors += 1
            _check(config, entry, metadata)
    if prebuilt:
        # Prebuilt per-width views: one layout per verify width + decode.
        assert exact_tensors > 0
        assert len(entry.metadata_addresses) == len({q for q, _ in STEPS})
    else:
        # Inline exact metadata carries no tensors: one layout for all steps.
        assert exact_tensors == 0
        assert len(entry.metadata_addresses) == 1
    # The runner reallocates its sequence-length buffer: refused.
    runner.seq_lens = runner.seq_lens.clone()
    with pytest.raises(StaticInputMismatchError, match=r"\.seq_lens"):
        _check(config, entry, runner.step(*STEPS[0]))
