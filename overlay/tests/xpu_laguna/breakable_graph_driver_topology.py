# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Scenarios of ``breakable_graph_driver.py`` on the capture topology: break
counts and order of the tiny Laguna target and its DFlash drafter at fake
tensor-parallel sizes, and the refusals of the segment ceiling and of a
mismatching expected topology."""

from __future__ import annotations

from typing import Any

import torch
from breakable_graph_driver_harness import (
    EVENTS,
    Harness,
    attention_layers,
    expect_error,
    forward_ctx,
    observe_real_calls,
    stand_in_backend,
)


def _fields(obj: Any, *names: str) -> dict[str, Any] | None:
    """``names`` of ``obj`` as a dict (None for None)."""
    return None if obj is None else {name: getattr(obj, name) for name in names}


def run_counts(h: Harness, num_layers: int, tp: int, moe: bool) -> dict[str, Any]:
    from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

    moe_layers = tuple(range(num_layers)) if moe else ()
    vllm_config, model = h.build(num_layers, tp, moe_layers)
    observe_real_calls(model)
    wrapper = XpuBreakableGraphWrapper(model, vllm_config, backend=stand_in_backend())
    inputs = h.inputs()
    with torch.no_grad():
        EVENTS.clear()
        with forward_ctx(vllm_config, graphs=False):
            eager = wrapper(**inputs).clone()
        eager_events = list(EVENTS)
        EVENTS.clear()
        with forward_ctx(vllm_config):
            out = wrapper(**inputs)
        capture_events = list(EVENTS)
        EVENTS.clear()
        with forward_ctx(vllm_config):
            out2 = wrapper(**inputs)
        replay_events = list(EVENTS)
    (entry,) = wrapper.entries.values()
    cap = entry.capture
    exp = wrapper.expected
    slots = wrapper.collective_buffers
    return {
        # the collective breaks' output slots, allocated when the wrapper was
        # built (before the capture), in the order the breaks take them
        "collective_slots": []
        if slots is None
        else [buf.data_ptr() for buf in slots.outputs],
        "counts": cap.break_counts(),
        "graphs": cap.num_graphs,
        "breaks": cap.num_eager_breaks,
        "kinds": [k.value for k in cap.kinds],
        "expected": _fields(exp, "attention", "collective", "graphs", "ceiling"),
        "audit": wrapper.audit,
        "eager_events": eager_events,
        "capture_events": capture_events,
        "replay_events": replay_events,
        "output_shape_matches_eager": list(out.shape) == list(eager.shape),
        "replay_returns_captured_output": out2 is out,
        "num_moe_layers": sum(
            1 for layer in model.model.layers if getattr(layer, "is_moe_layer", False)
        ),
        "num_attention_modules": len(attention_layers(model)),
    }


def run_drafter_counts(h: Harness, draft_layers: int, tp: int) -> dict[str, Any]:
    """The DFlash drafter's capture at a fake TP size, called as the DFlash
    proposer calls it (``inputs_embeds=None``: it embeds the query tokens
    itself), with the expected topology the wrapper derives from the model
    and the config. Controls: an expectation without the embedding's
    all-reduce (2L) must be refused, and so must the drafter called with
    precomputed embeddings (the embedding all-reduce then does not happen)
    against the derived expectation."""
    from vllm.xpu_laguna.graphs.topology import ExpectedTopology
    from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

    vllm_config, model = h.build(3, tp, draft_layers=draft_layers)
    inputs = h.inputs()

    def capture(wrapper, **extra) -> None:
        with torch.no_grad(), forward_ctx(vllm_config):
            wrapper(**inputs, **extra)

    wrapper = XpuBreakableGraphWrapper(
        model, vllm_config, backend=stand_in_backend(), label="drafter"
    )
    capture(wrapper, inputs_embeds=None)
    (entry,) = wrapper.entries.values()
    cap = entry.capture
    exp = wrapper.expected
    without_embedding = XpuBreakableGraphWrapper(
        model,
        vllm_config,
        backend=stand_in_backend(),
        expected=ExpectedTopology(
            attention=draft_layers, collective=2 * draft_layers if tp > 1 else 0
        ),
    )
    with torch.no_grad():
        embeds = model.embed_input_ids(inputs["input_ids"])
    precomputed = XpuBreakableGraphWrapper(
        model, vllm_config, backend=stand_in_backend()
    )
    return {
        "model": type(model).__name__,
        "num_attention_modules": len(attention_layers(model)),
        "counts": cap.break_counts(),
        "graphs": cap.num_graphs,
        "kinds": [k.value for k in cap.kinds],
        "expected": _fields(exp, "attention", "collective", "graphs"),
        "accounting": wrapper.accounting(),
        "without_embedding": expect_error(
            lambda: capture(without_embedding, inputs_embeds=None)
        ),
        "precomputed_embeds": expect_error(
            lambda: capture(precomputed, inputs_embeds=embeds)
        ),
    }


def run_ceiling(h: Harness) -> dict[str, Any]:
    from vllm.xpu_laguna.graphs.topology import ExpectedTopology
    from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

    vllm_config, model = h.build(3, 2)
    # Expect TP 1 topology (3 breaks, ceiling 14) from a TP 2 forward (10
    # breaks, 21 segments): the capture must refuse.
    wrapper = XpuBreakableGraphWrapper(
        model,
        vllm_config,
        backend=stand_in_backend(),
        expected=ExpectedTopology.decoder(3, 1),
    )
    inputs = h.inputs()

    def capture():
        with torch.no_grad(), forward_ctx(vllm_config):
            wrapper(**inputs)

    result = expect_error(capture)
    # Under the ceiling but not matching: expected TP 4 topology of 4 layers
    # from a 3-layer TP 2 forward.
    wrapper2 = XpuBreakableGraphWrapper(
        model,
        vllm_config,
        backend=stand_in_backend(),
        expected=ExpectedTopology.decoder(4, 4),
    )

    def capture2():
        with torch.no_grad(), forward_ctx(vllm_config):
            wrapper2(**inputs)

    result["mismatch"] = expect_error(capture2)
    return result
