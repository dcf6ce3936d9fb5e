# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Expected topology: the eager breaks (attention, collectives) a decoder
forward must produce, derived from the model and the config."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import torch

from vllm.config import VllmConfig

# Decoders whose forward breaks once per attention layer and, at TP > 1,
# at the embedding and twice per layer (attention output, MLP/MoE output).
LAGUNA_ARCHITECTURES = ("LagunaForCausalLM", "DFlashLagunaForCausalLM")


class BreakKind(str, enum.Enum):
    GRAPH = "graph"
    ATTENTION = "attention"
    COLLECTIVE = "collective"


@dataclasses.dataclass(frozen=True)
class ExpectedTopology:
    """Eager breaks a decoder forward must produce.

    A decoder of ``L`` attention layers at tensor parallel size > 1 breaks
    at each attention (L) and at each all-reduce: embedding, attention
    output projection and MLP/MoE output per layer (2L + 1). At TP 1 there
    are no collectives. Every break closes one graph segment and opens the
    next, so graphs = breaks + 1.
    """

    attention: int
    collective: int

    @classmethod
    def decoder(cls, num_attention_layers: int, tp_size: int) -> ExpectedTopology:
        if num_attention_layers < 0 or tp_size < 1:
            raise ValueError(
                f"bad topology: layers={num_attention_layers} tp={tp_size}"
            )
        collective = 2 * num_attention_layers + 1 if tp_size > 1 else 0
        return cls(attention=num_attention_layers, collective=collective)

    @property
    def breaks(self) -> int:
        return self.attention + self.collective

    @property
    def graphs(self) -> int:
        return self.breaks + 1

    @property
    def segments(self) -> int:
        return self.graphs + self.breaks

    @property
    def ceiling(self) -> int:
        return 2 * self.segments


def _unwrap_model(runnable: object) -> object:
    seen = 0
    while hasattr(runnable, "unwrap") and seen < 8:
        runnable = runnable.unwrap()
        seen += 1
    return runnable


def expected_topology_for(
    runnable: Any, vllm_config: VllmConfig
) -> ExpectedTopology | None:
    """Expected topology of ``runnable`` when it is a Laguna decoder, else
    None (unknown: counts are reported but not checked)."""
    model = _unwrap_model(runnable)
    # the class or a base (the series' own Laguna class subclasses upstream's)
    if not {c.__name__ for c in type(model).__mro__} & set(LAGUNA_ARCHITECTURES):
        return None
    if not isinstance(model, torch.nn.Module):
        return None
    from vllm.model_executor.layers.attention.attention import Attention

    num_layers = sum(1 for m in model.modules() if isinstance(m, Attention))
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    return ExpectedTopology.decoder(num_layers, tp_size)
