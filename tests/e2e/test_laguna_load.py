"""Loading the tiny Laguna checkpoint in-process into the class vLLM resolves for
``LagunaForCausalLM``: the series' ``XpuLagunaForCausalLM``, which its general plugin (an
entry point of the wheel's metadata; the CPU runtime's sync writes the tree's) registers.

Checks the series' routing-bias load fix directly: the checkpoint's routing correction bias ends
up in the tensor the MoE router reads, and a bias no router consumes is a load error. The negative
control loads the same checkpoint into upstream's own class, which drops the bias silently (the bug
in 0.26.0 through 0.34.0).
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
    from vllm.model_executor.model_loader.utils import get_model_cls
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

    def load(weights: dict[str, Any], upstream: bool = False) -> tuple[Any, set[str]]:
        config = make_config()  # EngineArgs loads vLLM's general plugins
        cls = LagunaForCausalLM if upstream else get_model_cls(config.model_config)
        with set_current_vllm_config(config):
            model = cls(vllm_config=config)
            return model, model.load_weights(weights.items())

    try:
        yield load
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()


def _checkpoint(tiny_models: TinyModels) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(tiny_models.target / "model.safetensors"))


def test_vllm_builds_the_series_laguna_class(tiny_models: TinyModels, load_model: Any) -> None:
    model, _ = load_model(_checkpoint(tiny_models))
    assert type(model).__qualname__ == "XpuLagunaForCausalLM"
    assert type(model).__module__ == "vllm.xpu_laguna.model"


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


def test_negative_control_upstream_class_drops_the_routing_bias(tiny_models: TinyModels, load_model: Any) -> None:
    """Without the series' class the gate above fails: upstream's Laguna leaves every router's
    bias at zero and reports no bias loaded."""
    weights = _checkpoint(tiny_models)
    model, loaded = load_model(weights, upstream=True)
    biases = [k for k, v in weights.items() if k.endswith("e_score_correction_bias") and v.any()]
    assert biases
    for name in biases:
        experts = model.model.layers[int(name.split(".")[2])].mlp.experts
        assert not experts.router.e_score_correction_bias.any(), f"{name} loaded by upstream"
    assert not any(k.endswith("e_score_correction_bias") for k in loaded)
