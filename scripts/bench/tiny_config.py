"""The benchmarks' tiny ``VllmConfig``: a one-layer Llama written to a temporary folder, enough
for vLLM's attention and graph code to run without a model (vLLM and transformers are imported
inside). The series' options of a bench are in it (``additional_config``), as in an engine's: the
series reads no environment variable."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

from scripts.series_options import additional_config


def tiny_vllm_config(
    prefix: str,
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    dtype: str = "float32",
    max_len: int | None = None,
    laguna: bool = False,
    options: Mapping[str, object] | None = None,
    **sections: Any,
) -> Any:
    """``heads`` x ``head_dim`` wide (default: 64 wide, transformers' head size), ``max_len``
    positions (default: transformers' and vLLM's); a one-layer Laguna (4 experts) instead of a
    Llama with ``laguna`` (the target the series acts on); ``options``: the series' options
    (``additional_config["xpu_laguna"]``; on CPU one of its switches named true is how a config
    asks for the series); ``sections`` go to ``VllmConfig``."""
    from transformers import LagunaConfig, LlamaConfig
    from vllm.config import ModelConfig, VllmConfig

    path = tempfile.mkdtemp(prefix=prefix)
    shape: dict[str, Any] = {"hidden_size": heads * head_dim if head_dim else 64}
    if head_dim:
        shape["head_dim"] = head_dim
    if max_len:
        shape["max_position_embeddings"] = max_len
    if laguna:
        shape |= {"architectures": ["LagunaForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2}
        shape |= {"moe_intermediate_size": 64, "shared_expert_intermediate_size": 64}
    (LagunaConfig if laguna else LlamaConfig)(
        **shape,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=1,
        intermediate_size=64,
        vocab_size=256,
    ).save_pretrained(path)
    lengths = {"max_model_len": max_len} if max_len else {}
    model = ModelConfig(model=path, skip_tokenizer_init=True, dtype=dtype, **lengths)
    if options is not None:
        sections["additional_config"] = additional_config(options)
    return VllmConfig(model_config=model, **sections)
