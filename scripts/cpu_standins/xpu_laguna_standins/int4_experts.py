"""The XPU routed INT4 experts on CPU: vLLM's XPU path with only the kernel call standing in.

On XPU, vLLM 0.34.0 loads a compressed-tensors W4A16 MoE layer through
``CompressedTensorsWNA16MoEMethod``, the ``XPU`` WNA16 MoE backend (the only one it tries there,
``oracle/int_wna16._get_priority_backends``), ``XPUExpertsWNA16`` and the XPU repack
(``_process_weights_xpu``: the int32 words viewed as bytes), and runs it through
``vllm_xpu_kernels``' ``XpuFusedMoe``. On CPU the oracle tries only the CPU backends, which refuse
this deployment. :func:`install` (CPU only, asked for with ``VXL_XPU_INT4_EXPERTS=1``, from the
runtime plugin) makes the CPU take the XPU path:

* the oracle's priority list on CPU is ``[XPU]``, and ``XPUExperts`` accepts the CPU as its device;
* ``torch.ops._xpu_C.is_xe2_arch`` / ``is_xe3_arch`` exist and answer as a B70 (Xe2) does, so the
  experts take unquantized BF16 activations, as on the product's device;
* ``XpuFusedMoe`` in ``experts/xpu_moe.py`` is :class:`ReferenceXpuFusedMoe`: the stand-in.

Everything else is vLLM's: config parsing, the quant method, the weight loader, the XPU repack,
the routing, the modular kernel around the experts. The stand-in reads the repacked weights the
way ``xpu_fused_moe(is_int4=True)`` documents them (w13 ``[E, 2I, H/2]`` and w2 ``[E, H, I/2]``
uint8, two values a byte, the low nibble first, stored plus 8; scales ``[E, N, K/32]``) and
computes each (token, expert) pair in float32: dequantize, ``x @ w13^T``, SiLU-and-mul,
``@ w2^T``, times the routing weight, summed over the token's experts in top-k order.

Reproduced from the device: a row's bits depend on how many rows the call has. ``XpuFusedMoe``
places each route in its expert's block with atomics (``remap_hidden_states``) and its grouped
GEMM picks a policy from the average rows per expert, so a row of an 8-row verify call is not
computed as the same token's 1-row decode (docs/row-invariance.md; the reference lab measured
903/3072 values differing at the layer-1 MoE output). The stand-in models that with one
deterministic rule: a call of more than one row accumulates ``x @ w13^T`` over K in two halves,
each rounded to the activation dtype before they are added (BF16 on the device), a 1-row call in
one float32 pass. So the series' per-row form (the option ``row_invariant_moe``: ``rows``)
gives verify rows the decode's bits and ``off`` does not, as on the device. Not reproduced: the
device kernel's actual arithmetic (dequantization order, tiling, which policies it has), so a
stand-in run proves the loading, the layout and the form's effect, never the device's numerics. A
test-side stand-in: never in the wheel.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

ENV = "VXL_XPU_INT4_EXPERTS"
STAND_IN_LINE = "XPU INT4 experts: the kernel call is a CPU stand-in (reference dequantize-and-matmul)"
"""Printed to stderr once per process that installs the stand-in: the label a run's log carries."""


def _dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[E, N, K/2] uint8 + [E, N, K/32] scales -> [E, N, K] float32."""
    low, high = packed & 0xF, packed >> 4
    values = torch.stack([low, high], dim=-1).flatten(-2).to(torch.int8) - 8
    group = values.shape[-1] // scales.shape[-1]
    return (values.to(scales.dtype) * scales.repeat_interleave(group, dim=-1)).float()


class ReferenceXpuFusedMoe:
    """Stands for ``vllm_xpu_kernels.fused_moe_interface.XpuFusedMoe`` (INT4, SiLU, no EP)."""

    def __init__(
        self,
        w13: torch.Tensor,
        w13_scales: torch.Tensor,
        w13_bias: torch.Tensor | None,
        w2: torch.Tensor,
        w2_scales: torch.Tensor,
        w2_bias: torch.Tensor | None,
        n_experts_per_token: int,
        activation: str,
        num_experts: int,
        ep_rank: int = 0,
        ep_size: int = 1,
        expert_map: torch.Tensor | None = None,
        gemm1_clamp_limit: float | None = None,
    ) -> None:
        unsupported = {
            "a bias": w13_bias is not None or w2_bias is not None,
            f"activation {activation!r}": activation != "silu",
            "expert parallelism": ep_size != 1 or expert_map is not None,
            "a GEMM1 clamp": gemm1_clamp_limit is not None,
            "weights not INT4-packed uint8": w13.dtype != torch.uint8 or w2.dtype != torch.uint8,
        }
        bad = [name for name, used in unsupported.items() if used]
        if bad:
            raise NotImplementedError(f"reference XPU INT4 experts: {', '.join(bad)} not supported")
        self.w13 = _dequantize(w13, w13_scales)  # [E, 2I, H]
        self.w2 = _dequantize(w2, w2_scales)  # [E, H, I]
        self.num_experts = num_experts
        self.top_k = n_experts_per_token

    def apply(
        self,
        output: torch.Tensor,
        hidden_states: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        a1q_scale: torch.Tensor | None = None,
    ) -> None:
        if a1q_scale is not None:
            raise NotImplementedError("reference XPU INT4 experts: quantized activations not supported")
        x = hidden_states.float()
        acc = torch.zeros(x.shape[0], self.w2.shape[1], dtype=torch.float32, device=x.device)
        # the call's policy: K in one pass for one row, in two halves for more (module docstring)
        splits = (x.shape[1],) if x.shape[0] == 1 else (x.shape[1] // 2, x.shape[1] - x.shape[1] // 2)
        for k in range(topk_ids.shape[1]):
            ids = topk_ids[:, k].long()
            w13 = self.w13[ids].transpose(1, 2)  # one (token, expert) pair per batch entry: [B, H, 2I]
            parts = [
                torch.bmm(xs.unsqueeze(1), ws).squeeze(1)
                for xs, ws in zip(x.split(splits, dim=1), w13.split(splits, dim=1), strict=True)
            ]
            h = parts[0] if len(parts) == 1 else sum(part.to(hidden_states.dtype).float() for part in parts)
            gate, up = h.chunk(2, dim=-1)
            y = torch.bmm((torch.nn.functional.silu(gate) * up).unsqueeze(1), self.w2[ids].transpose(1, 2))
            acc = acc + y.squeeze(1) * topk_weights[:, k : k + 1].float()
        output.copy_(acc.to(output.dtype))


def _define_arch_ops() -> None:
    if hasattr(torch.ops, "_xpu_C") and hasattr(torch.ops._xpu_C, "is_xe2_arch"):
        return
    lib = torch.library.Library("_xpu_C", "FRAGMENT")  # kept alive in _LIBRARIES
    lib.define("is_xe2_arch() -> bool")
    lib.define("is_xe3_arch() -> bool")
    lib.impl("is_xe2_arch", lambda: True, "CompositeExplicitAutograd")
    lib.impl("is_xe3_arch", lambda: False, "CompositeExplicitAutograd")
    _LIBRARIES.append(lib)


_LIBRARIES: list[Any] = []


def install() -> bool:
    """Route CPU WNA16 MoE layers through the XPU path (see the module docstring); True when done.
    Only with ``VXL_XPU_INT4_EXPERTS=1`` and on the CPU platform."""
    if os.environ.get(ENV, "") != "1":
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers.fused_moe.experts import xpu_moe
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16

    if getattr(xpu_moe, "XpuFusedMoe", None) is ReferenceXpuFusedMoe:
        return True  # the plugin ran before in this process
    _define_arch_ops()
    print(STAND_IN_LINE, file=sys.stderr, flush=True)
    xpu_moe.XpuFusedMoe = ReferenceXpuFusedMoe
    xpu_moe.XPUExperts._supports_current_device = staticmethod(lambda: True)
    int_wna16._get_priority_backends = lambda: [int_wna16.WNA16MoEBackend.XPU]
    return True
