# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant routed experts of the Laguna target on the exact verify path.

A verify step runs 2..M rows (M = the ``verify_width`` option) through
the target; each row must get the bits the q=1 decode of its token gets.
The XPU routed experts (``XPUExpertsWNA16`` and the unquantized
``XPUExperts``, both ``vllm_xpu_kernels`` ``XpuFusedMoe``) are not
row-invariant by construction: ``remap_hidden_states`` places each
``[row, slot]`` route inside its expert's block with work-group and device
atomics, so a row's position in the grouped GEMM depends on the other rows
(and on scheduling); the CUTLASS grouped GEMM picks its policy from the
average rows per expert (``M * top_k / local experts``); only the final
``moe_gather`` (fp32 sum in top-k slot order per row) is row-invariant by
reading. The reference lab measured 903/3072 values differing at the
layer-1 MoE output between a q=1 decode and a q=8 verify (GEMM and
all-reduce not separated) before it wrote a fixed-route kernel.

The option ``row_invariant_moe`` (``VllmConfig.additional_config
["xpu_laguna"]``, read from the model's config when it is installed):

* ``rows`` (default): :func:`experts_per_row`, one call of the layer's own
  experts kernel per row on ``x[i:i+1]`` with that row's top-k weights and
  ids: the kernel, shapes and routing of a 1-row decode, so correct by
  construction. Routing, the shared expert and the tensor-parallel
  all-reduce of the MoE block run once for all rows (only the routed
  experts' computation is wrapped). Weight traffic stays about the same:
  for top-10 of 256 experts a verify step of 8 rows reads 80 expert weight
  sets per layer in this form against about 70 distinct ones in one
  8-row call (256 * (1 - (246/256)^8)); 120 against about 97 at 12 rows.
* ``off``: the plain call.

Taken only on modules :func:`install` wrapped (the target's MoE layers:
``row_dispatch.install_target_layers``, never the DFlash
drafter), on the exact path, for ``1 < rows <= M`` and not while a graph is
being compiled. It applies to whatever routed experts the target has
(INT4 WNA16 on Laguna-S-2.1-INT4, unquantized ones on an unquantized
checkpoint or the CPU test model): the form is a per-row call of the
layer's own kernel, right for any kernel, and an unquantized checkpoint on
XPU runs the same remap path. Modular kernels only (``quant_method.apply``;
a monolithic kernel routes inside and is not wrapped); shared experts run
inside the kernel (all-to-all overlap, expert parallelism) keep the plain
call, as does a deferred-finalize output.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.fused_moe.runner.shared_experts import (
        SharedExperts,
    )

logger = init_logger(__name__)

MOE_FORMS = ("rows", "off")


@dataclass(frozen=True)
class MoESettings:
    """The form and the verify width of one model (:func:`read_form`)."""

    width: int  # largest verify width on the exact path (0: path off)
    form: str


def read_form(vllm_config: "VllmConfig | None") -> MoESettings:
    """The routed experts' form ``vllm_config`` asks for."""
    from vllm.xpu_laguna.attention.exact import exact_verify_width
    from vllm.xpu_laguna.options import XpuLagunaOptions

    s = MoESettings(
        width=exact_verify_width(vllm_config),
        form=XpuLagunaOptions.from_config(vllm_config).row_invariant_moe,
    )
    if s.width > 1:
        logger.info_once(
            "XPU Laguna routed experts on verify rows 2..%d: %s",
            s.width,
            "one experts call per row" if s.form == "rows" else "plain (off)",
        )
    return s


@dataclass
class MoECounters:
    """Verify calls that took the form and the rows they had (tests, debug)."""

    calls: Counter = field(default_factory=Counter)

    def reset(self) -> None:
        self.calls.clear()


counters = MoECounters()


def experts_per_row(
    apply_one: Callable[..., Any],
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> list[Any]:
    """``apply_one`` on each row: ``x=x[i:i+1]``, ``topk_weights=...[i:i+1]``,
    ``topk_ids=...[i:i+1]`` (the keywords of ``quant_method.apply``), the
    shapes and strides of a 1-row decode call."""
    return [
        apply_one(
            x=x[i : i + 1],
            topk_weights=topk_weights[i : i + 1],
            topk_ids=topk_ids[i : i + 1],
        )
        for i in range(x.shape[0])
    ]


class RowInvariantExperts:
    """Replaces a target MoE layer's ``quant_method.apply`` (the routed
    experts of a modular kernel): :func:`experts_per_row` on exact verify
    rows, else the original."""

    def __init__(self, inner: Callable[..., Any], settings: MoESettings) -> None:
        self.inner = inner
        self.settings = settings
        self.method = getattr(inner, "__self__", None)

    def _form(self, x: torch.Tensor, shared_experts: Any) -> bool:
        if x.dim() != 2 or torch.compiler.is_compiling():
            return False
        s = self.settings
        if s.form != "rows" or not 1 < x.shape[0] <= s.width:
            return False
        if shared_experts is not None and getattr(
            self.method, "mk_can_overlap_shared_experts", False
        ):
            logger.info_once(
                "XPU Laguna routed experts: the shared experts run inside the "
                "MoE kernel here; verify rows keep the plain experts call"
            )
            return False
        return True

    def __call__(
        self,
        layer: nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts: "SharedExperts | None" = None,
        shared_experts_input: torch.Tensor | None = None,
    ) -> Any:
        def plain() -> Any:
            return self.inner(
                layer=layer,
                x=x,
                topk_weights=topk_weights,
                topk_ids=topk_ids,
                shared_experts=shared_experts,
                shared_experts_input=shared_experts_input,
            )

        if not self._form(x, shared_experts):
            return plain()
        # Shared experts are not run by the kernel here (checked above); the
        # runner runs them once for all rows.
        one = partial(
            self.inner, layer=layer, shared_experts=None, shared_experts_input=None
        )
        outs = experts_per_row(one, x, topk_weights, topk_ids)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            logger.warning_once(
                "XPU Laguna routed experts: the kernel deferred its finalize; "
                "verify rows take the plain experts call"
            )
            return plain()
        counters.calls["calls"] += 1
        counters.calls["rows"] += x.shape[0]
        return torch.cat(outs)


def install(moe: nn.Module, settings: MoESettings) -> None:
    """Wrap the routed experts of a target MoE block's runner
    (``LagunaMoE.experts``) with the model's form (:func:`read_form`)."""
    experts = getattr(moe, "routed_experts", None)
    method = getattr(experts, "quant_method", None)
    if method is None or isinstance(method.apply, RowInvariantExperts):
        return
    method.apply = RowInvariantExperts(method.apply, settings)


def is_installed(moe: nn.Module) -> bool:
    """Whether :func:`install` wrapped this MoE block's routed experts."""
    experts = getattr(moe, "routed_experts", None)
    method = getattr(experts, "quant_method", None)
    return isinstance(getattr(method, "apply", None), RowInvariantExperts)
