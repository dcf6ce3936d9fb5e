# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Drives the row-invariant routed experts (``xpu_laguna_row_invariant_moe``)
through the real MoE layers of a tiny Laguna target and of a DFlash drafter
given a sparse layer, on CPU; prints one JSON object of observations on its
last stdout line.

Run in its own process (``test_row_invariant_moe.py`` does): it sets up a
one-rank gloo group and builds one target and drafter per set of the
series' options (``additional_config["xpu_laguna"]``: the target installs
the form of the config it is built under and keeps it).

What is real: vLLM's LagunaMoE (router gate, shared expert, MoERunner,
RoutedExperts with ``UnquantizedFusedMoEMethod`` and vLLM's CPU experts
kernel ``CPUUnquantizedExperts``), the drafter's LagunaDecoderLayer MoE.
Stand-ins: every linear's CPU GEMM is ``F.linear`` (``layer.cpu_linear``);
the experts kernel (``moe_kernel.fused_experts.apply``) records the row
count of each call and runs either the real CPU kernel or
``moe_row_standins.grouped_experts`` (a result that depends on the rows
sharing an expert, as the XPU remap and grouped GEMM make it).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from laguna_model_testlib import (
    HIDDEN,
    SERIES_VARIANTS,
    WIDTH,
    Built,
    Recorder,
    build_target_and_drafter,
    driver_main,
)
from moe_row_standins import grouped_experts
from torch import nn
from torch.nn import functional as F

RECORD = Recorder(experts="real")


_BUILT: dict[str, Built] = {}


def build(**options: Any) -> Built:
    """The target and drafter (given a sparse layer, to show it is not
    wrapped) of a config with the series' ``options``, instrumented (once
    per set of options: a later call hands out the same models)."""
    from vllm.config import set_current_vllm_config

    key = json.dumps(options, sort_keys=True)
    if key not in _BUILT:
        built = build_target_and_drafter(
            options, draft_mlp="sparse", tmp_prefix="moe-rows-"
        )
        with set_current_vllm_config(built.config):
            for prefix, model in (("target", built.target), ("draft", built.drafter)):
                _instrument(prefix, _moe(model))
        _BUILT[key] = built
    return _BUILT[key]


def _moe(model: nn.Module) -> nn.Module:
    return next(layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "gate"))


def _instrument(prefix: str, moe: nn.Module) -> None:
    """F.linear GEMMs, processed expert weights and recorders on the experts
    kernel, the router's expert selection, the shared expert and the final
    reduction of the MoE runner."""
    for mod in moe.modules():
        if hasattr(mod, "quant_method") and not hasattr(mod, "routed_experts"):
            mod.cpu_linear = lambda x, w, b: F.linear(x, w, b)
    runner = moe.experts
    experts = runner.routed_experts
    w13, w2 = experts.w13_weight.detach().clone(), experts.w2_weight.detach().clone()
    experts.quant_method.process_weights_after_loading(experts)  # packs w13/w2
    kernel = experts.quant_method.moe_kernel.fused_experts
    real = kernel.apply

    def apply(**kw: Any) -> Any:  # the modular kernel passes keywords
        x = kw["hidden_states"]
        RECORD.rows(f"{prefix}.experts", x)
        if RECORD.mode["experts"] == "standin":
            out = grouped_experts(x, w13, w2, kw["topk_weights"], kw["topk_ids"])
            kw["output"].copy_(out)
            return None
        return real(**kw)

    kernel.apply = apply
    _record(f"{prefix}.select_experts", runner.router, "select_experts")
    _record(f"{prefix}.final_reduce", runner, "_maybe_reduce_final_output")
    _record(f"{prefix}.shared_expert", moe.shared_expert, "forward")


def _record(name: str, obj: Any, attr: str) -> None:
    real = getattr(obj, attr)

    def call(*args, **kwargs):
        RECORD.rows(name, kwargs.get("hidden_states", args[0] if args else None))
        return real(*args, **kwargs)

    setattr(obj, attr, call)


def _x(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(seed))


def calls(config: Any, target: nn.Module, drafter: nn.Module) -> dict[str, Any]:
    """Per model and row count: the row counts of each recorded call one MoE
    forward made, and the form counters."""
    from vllm.forward_context import set_forward_context
    from vllm.xpu_laguna import row_invariant_moe as rim

    rim.counters.reset()
    out: dict[str, Any] = {}
    for model in (target, drafter):
        for m in (1, 4, WIDTH, 12):
            RECORD.calls.clear()
            with set_forward_context(None, config), torch.no_grad():
                _moe(model)(_x(m, seed=m))
            for key, value in RECORD.calls.items():
                out[f"{key}/{m}"] = list(value)
    out["counters"] = dict(rim.counters.calls)
    return out


def bitwise(config: Any, target: nn.Module, drafter: nn.Module) -> dict[str, Any]:
    """Per model: whether each row of an 8-row MoE forward equals the 1-row
    forward of that row (the q=1 decode), bitwise."""
    from vllm.forward_context import set_forward_context

    out: dict[str, Any] = {}
    for prefix, model in (("target", target), ("draft", drafter)):
        moe = _moe(model)
        x = _x(WIDTH, seed=7)
        with set_forward_context(None, config), torch.no_grad():
            batch = moe(x)
            singles = [moe(x[i : i + 1]) for i in range(WIDTH)]
        out[prefix] = [bool(torch.equal(batch[i], s[0])) for i, s in enumerate(singles)]
    return out


def installed(target: nn.Module, drafter: nn.Module) -> dict[str, Any]:
    from vllm.xpu_laguna import row_invariant_moe as rim

    return {
        prefix: {
            name: rim.is_installed(mod)
            for name, mod in model.named_modules()
            if hasattr(mod, "routed_experts")
        }
        for prefix, model in (("target", target), ("draft", drafter))
    }


def installed_form(target: nn.Module) -> dict[str, Any] | None:
    """The form the target's wrapped routed experts keep (None: not
    wrapped, the model was built without the exact path)."""
    from vllm.xpu_laguna import row_invariant_moe as rim

    apply = _moe(target).experts.routed_experts.quant_method.apply
    if not isinstance(apply, rim.RowInvariantExperts):
        return None
    return {"width": apply.settings.width, "form": apply.settings.form}


def run() -> dict[str, Any]:
    default = build()
    res: dict[str, Any] = {"installed": installed(default.target, default.drafter)}
    variants = {**SERIES_VARIANTS, "off": {"row_invariant_moe": "off"}}
    for name, options in variants.items():
        built = build(**options)
        res[f"refused/{name}"] = built.refused
        res[f"form/{name}"] = installed_form(built.target)
        res[f"calls/{name}"] = calls(built.config, built.target, built.drafter)
        res[f"bitwise/real/{name}"] = bitwise(built.config, built.target, built.drafter)
    # the first target keeps its config's form after the others were built
    res["calls/default_again"] = calls(default.config, default.target, default.drafter)
    RECORD.mode["experts"] = "standin"
    for name, options in variants.items():
        built = build(**options)
        res[f"bitwise/standin/{name}"] = bitwise(
            built.config, built.target, built.drafter
        )
    RECORD.mode["experts"] = "real"
    return res


def main() -> int:
    return driver_main(run)


if __name__ == "__main__":
    sys.exit(main())
