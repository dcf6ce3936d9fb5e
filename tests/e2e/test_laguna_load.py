"""Loading the tiny Laguna checkpoint into vLLM's LagunaForCausalLM in-process.

Checks patch 0002 directly: the checkpoint's routing correction bias ends up in
the tensor the MoE router reads, and a bias no router consumes is a load error
(instead of being dropped silently, as upstream 0.26.0 does).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from scripts.tiny_laguna import TinyModels


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def load_model(tiny_models: TinyModels) -> Iterator[Any]:
    """Return ``load(weights) -> (model, loaded names)``: a fresh vLLM Laguna each call."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.laguna import LagunaForCausalLM

    def make_config() -> Any:
        return EngineArgs(
            model=str(tiny_models.target),
            dtype="float32",
            enforce_eager=True,
            max_model_len=512,
            kv_cache_memory_bytes=64 << 20,
        ).create_engine_config()

    with set_current_vllm_config(make_config()):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1, 1)

    def load(weights: dict[str, Any]) -> tuple[Any, set[str]]:
        config = make_config()
        with set_current_vllm_config(config):
            model = LagunaForCausalLM(vllm_config=config)
            return model, model.load_weights(weights.items())

    try:
        yield load
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()


def _checkpoint(tiny_models: TinyModels) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(tiny_models.target / "model.safetensors"))


def test_routing_bias_reaches_the_router(tiny_models: TinyModels, load_model: Any) -> None:
    import torch

    weights = _checkpoint(tiny_models)
    model, loaded = load_model(weights)
    biases = {k: v for k, v in weights.items() if k.endswith("e_score_correction_bias")}
    assert biases
    for name, value in biases.items():
        layer = int(name.split(".")[2])
        experts = model.model.layers[layer].mlp.experts
        param = experts.routed_experts.e_score_correction_bias
        assert param is experts.router.e_score_correction_bias
        assert torch.equal(param.detach().cpu(), value), f"{name} not loaded"
        assert f"model.layers.{layer}.mlp.experts.routed_experts.e_score_correction_bias" in loaded


def test_unconsumed_routing_bias_is_a_load_error(tiny_models: TinyModels, load_model: Any) -> None:
    weights = _checkpoint(tiny_models)
    some_bias = next(v for k, v in weights.items() if k.endswith("e_score_correction_bias"))
    # Layer 0 is dense: no router could consume a bias stored for it.
    weights["model.layers.0.mlp.experts.e_score_correction_bias"] = some_bias.clone()
    with pytest.raises(ValueError, match="not consumed by the MoE router"):
        load_model(weights)
