# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' Laguna target: upstream's ``LagunaForCausalLM``
with the routing-bias load fix and, when its configuration asks for the
exact verify, the row-invariant forms composed in when it is built.

Registered for the ``LagunaForCausalLM`` architecture by the series'
general plugin (:mod:`vllm.xpu_laguna.plugin`), so vLLM builds this class
for every Laguna target; the DFlash drafter builds upstream's decoder
layers and gets neither. The same plugin registers
:class:`XpuLagunaDFlashForCausalLM` for ``DFlashLagunaForCausalLM``: the
drafter with one CPU load fix (below).

* **Routing bias** (every platform): Laguna checkpoints store the
  auxiliary-loss-free routing bias at ``mlp.experts.e_score_correction_bias``;
  upstream's ``LagunaMoE`` owns it at ``mlp.experts.routed_experts.`` and its
  loader ignores the ``_bias`` suffix, so the router adds a zero bias and
  selects other experts than the checkpoint was trained with. This class
  loads the bias into the tensor the router reads, and raises at load time
  when a checkpoint bias has no router to consume it. Written up for
  upstream in ``docs/upstream/0002-...patch``; drop it when upstream's
  Laguna loads the bias (``tests/e2e/test_laguna_load.py``).
* **Row-invariant forms** (the exact verify, ``exact_verify_width > 0``):
  the q/k norms of the target's attention are built as
  ``RowInvariantQKNorm`` and the target's linears, routed experts and
  ``lm_head`` take the forms of ``row_dispatch`` (see there);
  the ``lm_head``, shared with the drafter, takes a form only inside this
  class's ``compute_logits``. With the path off nothing is installed and
  the model runs as upstream's.
* **DFlash drafter on CPU**: ``DFlashLagunaModel`` builds its fused
  context-KV buffers in ``process_weights_after_loading`` from each layer's
  ``qkv_proj.weight``, which the CPU linear method has by then replaced by an
  empty tensor (``dispatch_cpu_unquantized_gemm``, ``remove_weight=True``):
  the first DFlash step dies with ``IndexError`` (pristine 0.34.0). The
  drafter's ``qkv_proj`` layers take upstream's own opt-out,
  ``_cpu_skip_gemm_dispatch``, when they are built on CPU. Written up for
  upstream in ``docs/upstream/0013-...patch``; drop it when upstream's
  drafter keeps the weight (``tests/e2e/test_laguna_spec_decode.py``).
"""

from collections.abc import Iterable, Iterator

import torch

from vllm.config import VllmConfig
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.laguna import LagunaForCausalLM
from vllm.model_executor.models.laguna_dflash import DFlashLagunaForCausalLM
from vllm.model_executor.models.utils import PPMissingLayer, is_pp_missing_parameter
from vllm.platforms import current_platform
from vllm.xpu_laguna import row_dispatch
from vllm.xpu_laguna.attention.exact import exact_verify_width

BIAS_SUFFIX = ".e_score_correction_bias"


class XpuLagunaForCausalLM(LagunaForCausalLM):
    """Upstream's Laguna target with the series' load fix and forms."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.row_invariant = exact_verify_width(vllm_config) > 0
        if not self.row_invariant:
            return
        row_dispatch.install_target_layers(self.model.layers, vllm_config)
        if not isinstance(self.lm_head, PPMissingLayer):
            row_dispatch.install_lm_head(self.lm_head, vllm_config)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        if not self.row_invariant:
            return super().compute_logits(hidden_states)
        with row_dispatch.target_logits():
            return super().compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        bias_loaded: set[str] = set()
        loaded = super().load_weights(self._load_routing_bias(weights, bias_loaded))
        return loaded | bias_loaded

    def _load_routing_bias(
        self, weights: Iterable[tuple[str, torch.Tensor]], loaded: set[str]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass every weight through but the routing biases, which are loaded
        into the router's tensor (their names go to ``loaded``)."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        for name, tensor in weights:
            if not name.endswith(BIAS_SUFFIX):
                yield name, tensor
                continue
            if is_pp_missing_parameter(name, self):
                continue
            experts = name.split(".mlp.", 1)[0] + ".mlp.experts"
            target = f"{experts}.routed_experts{BIAS_SUFFIX}"
            param = params.get(target)
            router = getattr(modules.get(experts), "router", None)
            if param is None or param is not getattr(
                router, "e_score_correction_bias", None
            ):
                raise ValueError(f"Laguna: {name} is not consumed by the MoE router")
            default_weight_loader(param, tensor)
            loaded.add(target)


class XpuLagunaDFlashForCausalLM(DFlashLagunaForCausalLM):
    """Upstream's DFlash Laguna drafter whose ``qkv_proj`` keeps its weight
    on CPU (see module doc)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if current_platform.is_cpu():
            for layer in self.model.layers:
                # read after loading by _build_context_kv_buffers
                layer.self_attn.qkv_proj._cpu_skip_gemm_dispatch = True
