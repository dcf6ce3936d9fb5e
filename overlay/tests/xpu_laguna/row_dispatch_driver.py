# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Drives the row-invariant dispatch (patch 0011) through a real tiny Laguna
target and its DFlash drafter on CPU; prints one JSON object of observations
on its last stdout line.

Run in its own process (``test_row_dispatch_laguna.py`` does): it sets up a
one-rank gloo group and builds one target and drafter per set of the
series' options (``additional_config["xpu_laguna"]``: the model installs
the forms of the config it is built under and keeps them).

What is real: vLLM's LagunaForCausalLM and DFlashLagunaForCausalLM modules
(built as the DFlash proposer builds the drafter), their linears with vLLM's
CPU quantization methods (``UnquantizedLinearMethod``, the router's
``_GateLinearMethod``, ``UnquantizedEmbeddingMethod``), LagunaAttention's
forward (q/k norm call sites, rotary, 0009's gate softplus), LagunaMLP's
forward, ``compute_logits`` and the lm_head the proposer shares.

Stand-ins (from ``row_invariant_standins.py``): every linear's CPU GEMM
(``layer.cpu_linear``, which vLLM's CPU methods call) records the row count
of each call and runs either ``F.linear`` (vLLM's CPU fallback) or a GEMM
whose accumulation order depends on M (oneDNN's M-dependent kernel choice);
the q/k norms can run a model of the XPU RMSNorm kernel's two reductions;
the attention kernel is a stub returning q (no KV cache on this path).
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
from row_invariant_standins import (
    m_dependent_linear,
    row_wise_interpreter_dot,
    xpu_rms_norm,
)
from torch import nn
from torch.nn import functional as F

RECORD = Recorder(gemm="flinear", norm="real")


_BUILT: dict[str, Built] = {}


def build(**options: Any) -> Built:
    """The target and drafter of a config with the series' ``options``
    (once per set of options: a later call hands out the same models), with
    the recording stand-ins and the drafter's lm_head the target's."""
    key = json.dumps(options, sort_keys=True)
    if key not in _BUILT:
        built = build_target_and_drafter(
            options, draft_mlp="dense", tmp_prefix="row-dispatch-"
        )
        for prefix, model in (("target", built.target), ("draft", built.drafter)):
            _instrument(prefix, model)
        built.drafter.lm_head = built.target.lm_head  # what the DFlash proposer does
        _BUILT[key] = built
    return _BUILT[key]


def _instrument(prefix: str, model: nn.Module) -> None:
    """Recording stand-in GEMMs on every linear, stand-in-capable norms and a
    stub attention kernel (see module doc)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
    )
    from vllm.model_executor.models.laguna import LagunaAttention

    for name, mod in model.named_modules():
        full = f"{prefix}.{name}"
        method = getattr(mod, "quant_method", None)
        if isinstance(method, (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)):
            mod.cpu_linear = _recording_gemm(full)
        if isinstance(mod, LagunaAttention):
            mod.attn = StubAttention()
            for norm_name in ("q_norm", "k_norm"):
                norm = getattr(mod, norm_name)
                norm._forward_method = _recording_norm(f"{full}.{norm_name}", norm)


def _recording_gemm(name: str):
    def gemm(x, weight, bias):
        RECORD.rows(name, x)
        if RECORD.mode["gemm"] == "standin":
            return m_dependent_linear(x, weight, bias)
        return F.linear(x, weight, bias)

    return gemm


def _recording_norm(name: str, norm: nn.Module):
    """The norm's kernel (its CustomOp forward method), recorded: a q/k norm
    of the target calls it in its row-invariant form."""
    real = norm._forward_method

    def forward(x, residual=None):
        RECORD.rows(name, x)
        if RECORD.mode["norm"] == "standin":
            return xpu_rms_norm(x, norm.weight.data, norm.variance_epsilon)
        return real(x, residual)

    return forward


class StubAttention(nn.Module):
    """The attention kernel's place: returns q (this path has no KV)."""

    def forward(self, q, k, v):
        return q.clone()


def installed(target: nn.Module, drafter: nn.Module) -> dict[str, Any]:
    from vllm.xpu_laguna import row_dispatch as rd

    out: dict[str, Any] = {}
    for prefix, model in (("target", target), ("draft", drafter)):
        kinds, norms = {}, []
        for name, mod in model.named_modules():
            kind = rd.installed_kind(mod)
            if kind is not None:
                kinds[name] = kind
            if isinstance(mod, rd.RowInvariantQKNorm):
                norms.append(name)
        out[prefix] = {"kinds": kinds, "norms": sorted(norms)}
    return out


def _x(rows: int, width: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=gen)


def _units(target: nn.Module, drafter: nn.Module):
    """One callable per linear kind (and the drafter's), with its GEMM
    recorder's name and input width."""
    a0, a1 = target.model.layers[0].self_attn, target.model.layers[1].self_attn
    moe, dense = target.model.layers[1].mlp, target.model.layers[0].mlp
    d_attn = drafter.model.layers[0].self_attn
    q_width = a0.num_heads * a0.head_dim
    return {
        "qkv_proj": (a0.qkv_proj, "target.model.layers.0.self_attn.qkv_proj", HIDDEN),
        "o_proj": (a1.o_proj, "target.model.layers.1.self_attn.o_proj", q_width),
        "g_proj": (a0.g_proj, "target.model.layers.0.self_attn.g_proj", HIDDEN),
        "dense_mlp": (dense.up_proj, "target.model.layers.0.mlp.up_proj", HIDDEN),
        "shared_expert": (
            moe.shared_expert.down_proj,
            "target.model.layers.1.mlp.shared_expert.down_proj",
            32,
        ),
        "router": (moe.gate, "target.model.layers.1.mlp.gate", HIDDEN),
        "lm_head": (target.compute_logits, "target.lm_head", HIDDEN),
        "draft_qkv_proj": (
            d_attn.qkv_proj,
            "draft.model.layers.0.self_attn.qkv_proj",
            HIDDEN,
        ),
        "draft_lm_head": (drafter.compute_logits, "target.lm_head", HIDDEN),
    }


def gemm_calls(
    target: nn.Module, drafter: nn.Module, rows: tuple[int, ...]
) -> dict[str, Any]:
    """Per unit and row count: the row counts of the GEMM calls one call of
    the unit made, and the form counters."""
    from vllm.xpu_laguna import row_dispatch as rd

    rd.counters.reset()
    out: dict[str, Any] = {}
    for unit, (fn, recorder, width) in _units(target, drafter).items():
        for m in rows:
            RECORD.calls.clear()
            with torch.no_grad():
                fn(_x(m, width))
            out[f"{unit}/{m}"] = list(RECORD.calls[recorder])
    out["counters"] = {"/".join(k): v for k, v in rd.counters.calls.items()}
    return out


def _rows_equal(batch: torch.Tensor, singles: list[torch.Tensor]) -> list[bool]:
    return [bool(torch.equal(batch[i], s[0])) for i, s in enumerate(singles)]


def bitwise(target: nn.Module, drafter: nn.Module) -> dict[str, Any]:
    """Per unit: whether each row of an 8-row call equals the 1-row call of
    that row (the q=1 decode), bitwise."""
    out: dict[str, Any] = {}
    for unit, (fn, _, width) in _units(target, drafter).items():
        x = _x(WIDTH, width, seed=7)
        with torch.no_grad():
            batch = fn(x)
            batch = batch[0] if isinstance(batch, tuple) else batch
            singles = []
            for i in range(WIDTH):
                one = fn(x[i : i + 1])
                singles.append(one[0] if isinstance(one, tuple) else one)
        out[unit] = _rows_equal(batch, singles)
    for prefix, model in (("target", target), ("draft", drafter)):
        for idx, layer in enumerate(model.model.layers):
            x = _x(WIDTH, HIDDEN, seed=11)
            pos = torch.arange(WIDTH) + 40
            with torch.no_grad():
                batch = layer.self_attn(pos, x)
                singles = [
                    layer.self_attn(pos[i : i + 1], x[i : i + 1]) for i in range(WIDTH)
                ]
            out[f"{prefix}_attention_{idx}"] = _rows_equal(batch, singles)
            if hasattr(layer.mlp, "gate_proj"):
                with torch.no_grad():
                    batch = layer.mlp(x)
                    singles = [layer.mlp(x[i : i + 1]) for i in range(WIDTH)]
                out[f"{prefix}_dense_mlp_{idx}"] = _rows_equal(batch, singles)
    return out


def norm_calls(target: nn.Module, drafter: nn.Module) -> dict[str, Any]:
    """Row counts of the q/k norm calls of one attention forward."""
    out: dict[str, Any] = {}
    for prefix, attn in (
        ("target", target.model.layers[0].self_attn),
        ("draft", drafter.model.layers[0].self_attn),
    ):
        for m in (1, 2, 3, 8, 12):
            RECORD.calls.clear()
            with torch.no_grad():
                attn(torch.arange(m), _x(m, HIDDEN))
            for norm in ("q_norm", "k_norm"):
                key = f"{prefix}.model.layers.0.self_attn.{norm}"
                out[f"{prefix}/{norm}/{m}"] = list(RECORD.calls[key])
    return out


def installed_settings(target: nn.Module) -> dict[str, Any] | None:
    """The forms the target's installed qkv_proj and q norm keep (None:
    nothing installed, the model was built without the exact path)."""
    from vllm.xpu_laguna import row_dispatch as rd

    attn = target.model.layers[0].self_attn
    if not isinstance(attn.q_norm, rd.RowInvariantQKNorm):
        return None
    out: dict[str, Any] = {}
    for name, s in (
        ("qkv_proj", attn.qkv_proj.quant_method.apply.settings),
        ("q_norm", attn.q_norm.settings),
    ):
        out[name] = {
            "width": s.width,
            "qk_norm": s.qk_norm,
            "linears": sorted(s.linears),
            "linear_form": s.linear_form,
            "int4": s.int4,
        }
    return out


def run() -> dict[str, Any]:
    default = build()
    res: dict[str, Any] = {"installed": installed(default.target, default.drafter)}
    rows = (1, 4, WIDTH, 12)
    variants = {
        **SERIES_VARIANTS,
        "linears_none": {"row_invariant_linears": "none"},
        "linears_router": {"row_invariant_linears": "router,lm_head"},
        "form_rows": {"row_invariant_linear_form": "rows"},
        "form_plain": {"row_invariant_linear_form": "plain"},
    }
    refused: dict[str, str | None] = {}
    for name, options in variants.items():
        built = build(**options)
        refused[name] = built.refused
        res[f"calls/{name}"] = gemm_calls(built.target, built.drafter, rows)
        res[f"settings/{name}"] = installed_settings(built.target)
    # the first model keeps the forms of its own config, whatever models of
    # other configs were built (and called) after it in this process
    res["calls/default_again"] = gemm_calls(default.target, default.drafter, rows)
    for form in ("pad", "tokens", "off"):
        built = build(row_invariant_qk_norm=form)
        refused[f"norms/{form}"] = built.refused
        res[f"norms/{form}"] = norm_calls(built.target, built.drafter)
    # batch_invariant: upstream's batch-invariant matmul (Triton interpreted,
    # each row of a tl.dot on its own: see row_invariant_standins) replaces
    # the GEMM for 1..WIDTH rows; the recorded CPU GEMM is then not called.
    built = build(row_invariant_linear_form="batch_invariant")
    refused["batch_invariant"] = built.refused
    with row_wise_interpreter_dot():
        res["calls/batch_invariant"] = gemm_calls(
            built.target, built.drafter, (1, WIDTH, 12)
        )
        res["bitwise/batch_invariant"] = bitwise(built.target, built.drafter)
    RECORD.mode.update(gemm="standin", norm="standin")
    for name, options in {
        "default": {},
        "tokens": {
            "row_invariant_qk_norm": "tokens",
            "row_invariant_linear_form": "rows",
        },
        "off": {"row_invariant_qk_norm": "off", "row_invariant_linears": "none"},
        "plain": {"row_invariant_linear_form": "plain"},
        "norm_off": {"row_invariant_qk_norm": "off"},
        "linears_none": {"row_invariant_linears": "none"},
        "exact_off": {"exact_verify": False},
    }.items():
        built = build(**options)
        refused[f"standin/{name}"] = built.refused
        res[f"bitwise/standin/{name}"] = bitwise(built.target, built.drafter)
    RECORD.mode.update(gemm="flinear", norm="real")
    res["refused"] = refused
    return res


def main() -> int:
    return driver_main(run)


if __name__ == "__main__":
    sys.exit(main())
