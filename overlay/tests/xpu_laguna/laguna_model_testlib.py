# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Shared helpers for the XPU Laguna tests that build tiny Laguna models on
CPU: the config-only checkpoints, the engine arguments of the in-process
configs, and the one-rank gloo group.

Imports no vLLM or transformers at module level: the drivers set their
toggles before anything imports vLLM.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

HIDDEN = 64
HEADS = 8  # q rows per token: 8 (8 tokens: 64 rows, a multiple of 16)
KV_HEADS = 4
HEAD_DIM = 32
VOCAB = 256
# The row-invariant toggles the row dispatch tests switch (and clear).
ROW_DISPATCH_TOGGLES = (
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_QK_NORM",
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS",
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEAR_FORM",
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_INT4",
    "VLLM_XPU_LAGUNA_EXACT_VERIFY",
    "VLLM_XPU_LAGUNA_VERIFY_WIDTH",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_laguna_config(
    num_layers: int,
    moe_layers: Sequence[int] = (),
    *,
    layer_types: list[str] | None = None,
    max_position_embeddings: int = 256,
) -> Any:
    """A transformers ``LagunaConfig`` of the tiny target (``HIDDEN`` wide,
    ``HEADS`` query and ``KV_HEADS`` KV heads of ``HEAD_DIM``, ``VOCAB``
    tokens; every fourth layer full attention unless ``layer_types``; the
    ``moe_layers`` sparse, the others dense)."""
    from transformers import LagunaConfig

    cfg = LagunaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=HEADS,
        num_attention_heads_per_layer=[HEADS] * num_layers,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_position_embeddings,
        sliding_window=16,
        layer_types=layer_types
        or [
            "full_attention" if i % 4 == 3 else "sliding_attention"
            for i in range(num_layers)
        ],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        mlp_only_layers=[i for i in range(num_layers) if i not in moe_layers],
        mlp_layer_types=[
            "sparse" if i in moe_layers else "dense" for i in range(num_layers)
        ],
        decoder_sparse_step=1,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["LagunaForCausalLM"]
    return cfg


def tiny_engine_args(model: str, speculative_config: dict | None = None) -> Any:
    """``EngineArgs`` of an eager float32 CPU config of a tiny model (128
    tokens, 8 sequences, a 16 MiB KV cache, no tokenizer)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        max_num_batched_tokens=128,
        max_num_seqs=8,
        kv_cache_memory_bytes=1 << 24,
        speculative_config=speculative_config,
    )


def init_one_rank(vllm_config: Any) -> None:
    """A one-rank gloo group (TP 1, PP 1) under ``vllm_config``."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
