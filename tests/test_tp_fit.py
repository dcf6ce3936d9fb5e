"""vLLM 0.32.0's tensor-parallel split rules for Laguna configs, and the tiny variants per TP
(pure: no torch, no vLLM)."""

from __future__ import annotations

import pytest

from scripts.tiny_laguna import (
    DENSE_INTERMEDIATE,
    DRAFT_HEADS,
    HEADS_PER_LAYER,
    MOE_INTERMEDIATE,
    NUM_EXPERTS,
    NUM_KV_HEADS,
    SHARED_INTERMEDIATE,
    VARIANTS,
    TinyLagunaError,
    variant_for_tp,
)
from scripts.tp_fit import config_problems


def _target(heads: tuple[int, ...], **extra: object) -> dict[str, object]:
    return {
        "num_hidden_layers": len(heads),
        "num_attention_heads": max(heads),
        "num_attention_heads_per_layer": list(heads),
        "num_key_value_heads": NUM_KV_HEADS,
        "num_experts": NUM_EXPERTS,
        "mlp_layer_types": ["dense"] + ["sparse"] * (len(heads) - 1),
        "intermediate_size": DENSE_INTERMEDIATE,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "shared_expert_intermediate_size": SHARED_INTERMEDIATE,
        **extra,
    }


DRAFT = {
    "num_hidden_layers": 1,
    "num_attention_heads": DRAFT_HEADS,
    "num_key_value_heads": NUM_KV_HEADS,
    "num_experts": 0,
    "intermediate_size": DENSE_INTERMEDIATE,
}


def test_every_tiny_variant_splits_at_its_tp_sizes() -> None:
    for variant in VARIANTS:
        for tp in variant.tps:
            assert config_problems(_target(variant.heads_per_layer), tp) == [], (variant, tp)
            assert config_problems(DRAFT, tp) == []


def test_the_default_pair_cannot_split_at_tp4() -> None:
    assert config_problems(_target(HEADS_PER_LAYER), 4) == ["query heads [2] do not divide by TP 4"]


@pytest.mark.parametrize(
    ("config", "tp", "problem"),
    [
        (_target((8, 8, 8, 4), num_key_value_heads=3), 4, "3 KV heads neither divide by TP 4 nor divide it"),
        (_target((6, 6), num_key_value_heads=4), 2, "query heads [6] over TP 2 do not group over 2 KV head(s)"),
        (_target((8, 8), num_experts=2), 4, "TP 4 is more than the 2 routed experts"),
        (_target((8, 8), moe_intermediate_size=18), 4, "moe_intermediate_size 18 does not divide by TP 4"),
        (_target((8, 8), shared_expert_intermediate_size=6), 4, "shared_expert_intermediate_size 6"),
        (_target((8, 8), intermediate_size=30), 4, "intermediate_size 30 does not divide by TP 4"),
        ({**DRAFT, "intermediate_size": 30}, 4, "intermediate_size 30"),
        ({"text_config": _target((4, 2))}, 4, "query heads [2]"),
    ],
)
def test_each_rule_refuses_a_split_vllm_refuses(config: dict[str, object], tp: int, problem: str) -> None:
    problems = config_problems(config, tp)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_dense_width_of_a_model_without_dense_layers_is_not_split() -> None:
    assert config_problems(_target((8, 8), mlp_layer_types=["sparse", "sparse"], intermediate_size=30), 4) == []


def test_each_tp_size_gets_the_first_variant_built_for_it() -> None:
    assert [variant_for_tp(tp).name for tp in (1, 2, 4)] == ["default", "default", "tp4"]
    with pytest.raises(TinyLagunaError, match="no tiny Laguna variant runs at TP 3"):
        variant_for_tp(3)


def test_a_config_without_heads_is_refused_past_tp1_only() -> None:
    assert config_problems({"hidden_size": 64}, 1) == []
    assert config_problems({"hidden_size": 64}, 2) == ["config.json names no attention heads (num_attention_heads)"]
