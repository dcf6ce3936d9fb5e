# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The INT4 checkpoint layout checks (vllm/xpu_laguna/checkpoint.py) on a
hand-made safetensors folder: linears stored unquantized must be ignored
(matched the way vLLM's compressed-tensors config matches ``ignore``: names
and ``re:`` patterns), routed experts are packed, and K/V scales must sit
under the names Laguna's loader maps. The contract's refusal at load is run
end to end in tests/e2e/test_int4_checkpoint.py."""

from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm.xpu_laguna import checkpoint as layout

EXPERT = "model.layers.1.mlp.experts.0.down_proj"
G_PROJ = "model.layers.1.self_attn.g_proj"


def _folder(tmp_path: Path, names: list[str]) -> Path:
    tensors = {name: torch.zeros(2, 2, dtype=torch.bfloat16) for name in names}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_plain_linears_must_be_ignored_packed_experts_need_not(tmp_path: Path) -> None:
    names = [
        f"{EXPERT}.weight_packed",
        f"{EXPERT}.weight_scale",
        f"{G_PROJ}.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.input_layernorm.weight",  # not a linear
        "model.embed_tokens.weight",  # not a linear
        "lm_head.weight",
    ]
    tensors = layout.tensor_index(_folder(tmp_path, names))
    assert tensors[G_PROJ + ".weight"] == ("BF16", (2, 2))
    ignore = ["lm_head", "re:.*q_proj$"]
    assert layout.unignored_plain_linears(tensors, ignore) == [G_PROJ]
    assert layout.unignored_plain_linears(tensors, [*ignore, G_PROJ]) == []
    assert layout.ROUTED_EXPERT.match(EXPERT) and not layout.ROUTED_EXPERT.match(G_PROJ)


def test_kv_scales_under_another_name_are_named_not_skipped(tmp_path: Path) -> None:
    good = [f"model.layers.{n}.self_attn.{w}_scale" for n in range(2) for w in "kv"]
    tensors = layout.tensor_index(_folder(tmp_path, good))
    assert layout.kv_scale_problems(tensors, 2) == []
    moved = [*good[1:], "model.layers.0.self_attn.attn.k_scale"]
    other = tmp_path / "moved"
    other.mkdir()
    assert layout.kv_scale_problems(layout.tensor_index(_folder(other, moved)), 2) == [
        "model.layers.0.self_attn.k_scale: missing (kv_cache_scheme is static FP8; "
        "vLLM maps only this name)",
        "model.layers.0.self_attn.attn.k_scale: a KV scale vLLM does not map "
        "(the loader would drop it)",
    ]
