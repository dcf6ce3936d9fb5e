# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Scenarios of ``breakable_graph_driver.py`` on replays: numerics through
the real attention with graphs that record and do not run at capture, the
static-input guard, and the refusal of an out-of-place eager break."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from breakable_graph_driver_harness import (
    Harness,
    attention_layers,
    expect_error,
    forward_ctx,
    stand_in_backend,
)


def real_attention(model, vllm_config, num_tokens: int):
    """Zeroed KV caches bound to the attention layers and real CPU attention
    metadata (one request, ``num_tokens`` prompt tokens), as the runner
    builds them: per-layer metadata from each layer's own builder."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    bs = vllm_config.cache_config.block_size
    qsl = torch.tensor([0, num_tokens], dtype=torch.int32)
    slot_mapping = torch.arange(num_tokens, dtype=torch.int64)
    common = CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
        num_reqs=1,
        num_actual_tokens=num_tokens,
        max_query_len=num_tokens,
        max_seq_len=num_tokens,
        block_table_tensor=torch.zeros(1, 1, dtype=torch.int32),
        slot_mapping=slot_mapping,
        causal=True,
    )
    metadata: dict[str, Any] = {}
    slots: dict[str, torch.Tensor] = {}
    for layer in attention_layers(model):
        backend = layer.get_attn_backend()
        spec = dataclasses.replace(layer.get_kv_cache_spec(vllm_config), block_size=bs)
        builder = backend.get_builder_cls()(
            spec, [layer.layer_name], vllm_config, torch.device("cpu")
        )
        metadata[layer.layer_name] = builder.build(0, common)
        slots[layer.layer_name] = slot_mapping
        # vLLM 0.32.0's layer view (block, head, token, 2 * head size) over
        # the backend's preferred physical layout
        from vllm.v1.kv_cache_layout import KVCacheLayout

        layouts = backend.supported_kv_cache_layouts() or (KVCacheLayout.LBNHC,)
        order = layouts[0].layer_view_order
        logical = (1, layer.num_kv_heads, bs, 2 * layer.head_size)
        physical = torch.zeros([logical[i] for i in order], dtype=torch.float32)
        layer.kv_cache = physical.permute(*[order.index(i) for i in range(4)])
    return metadata, slots


def run_numerics(h: Harness, num_layers: int, tp: int) -> dict[str, Any]:
    """Eager forward vs first capture vs replay with new inputs, through the
    real attention, with graphs that record and do not run at capture."""
    from breakable_graph_standins import RecordingGraph, recording_capture

    from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend
    from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

    vllm_config, model = h.build(num_layers, tp)
    metadata, slots = real_attention(model, vllm_config, 8)
    backend = DeviceGraphBackend(
        name="recording",
        graph_factory=RecordingGraph,
        capture_context=recording_capture,
    )
    wrapper = XpuBreakableGraphWrapper(model, vllm_config, backend=backend)
    inputs = h.inputs()

    def run(graphs: bool):
        with (
            torch.no_grad(),
            forward_ctx(
                vllm_config, attn_metadata=metadata, graphs=graphs, slot_mapping=slots
            ),
        ):
            return wrapper(**inputs)

    first = len(RecordingGraph.created)
    ref = run(False).clone()
    captured = run(True)
    graphs = RecordingGraph.created[first:]
    res: dict[str, Any] = {
        "capture_equals_eager": bool(torch.equal(captured, ref)),
        "capture_max_abs_diff": float((captured - ref).abs().max()),
        "capture_has_nan": bool(torch.isnan(captured).any()),
        "graphs": len(graphs),
        "recorded_ops": sum(len(g.ops) for g in graphs),
        "replays_at_capture": [g.replays for g in graphs],
    }
    captured_copy = captured.clone()
    inputs["input_ids"].copy_(h.inputs(seed=7)["input_ids"])
    ref2 = run(False).clone()
    replayed = run(True)
    res.update(
        inputs_change_output=not bool(torch.equal(ref2, ref)),
        replay_is_captured_output=replayed is captured,
        replay_equals_eager=bool(torch.equal(replayed, ref2)),
        replay_max_abs_diff=float((replayed - ref2).abs().max()),
        replay_changed_output=not bool(torch.equal(replayed, captured_copy)),
    )
    return res


@dataclasses.dataclass
class _Meta:
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_seq_len: int


def run_guard(h: Harness) -> dict[str, Any]:
    from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

    vllm_config, model = h.build(2, 2)
    names = [m.layer_name for m in attention_layers(model)]
    # The metadata below is synthetic (only its tensors' identities matter
    # here): the CPU kernel is handed its warm-up path (None) for it.
    for mod in attention_layers(model):
        real = mod.impl.forward

        def forward(layer, q, k, v, kv, md, *a, __real=real, **kw):
            md = None if isinstance(md, _Meta) else md
            return __real(layer, q, k, v, kv, md, *a, **kw)

        mod.impl.forward = forward
    wrapper = XpuBreakableGraphWrapper(model, vllm_config, backend=stand_in_backend())
    inputs = h.inputs()
    res: dict[str, Any] = {}

    def per_layer(md):
        return {n: md for n in names}

    def call(inp, meta=None, slots=None):
        with (
            torch.no_grad(),
            forward_ctx(vllm_config, attn_metadata=meta, slot_mapping=slots),
        ):
            return wrapper(**inp)

    call(inputs)  # capture (no metadata, as in a PIECEWISE capture)
    # Attention metadata: the first replay fixes the reference (views of
    # persistent buffers, shared by the layers of a group).
    seq = torch.zeros(4, dtype=torch.int32)
    table = torch.zeros(4, 8, dtype=torch.int32)
    shared = _Meta(seq[:1], table[:1], 8)
    meta = per_layer(shared)
    res["metadata_reference"] = expect_error(lambda: call(inputs, meta))
    # Same buffers, new values and new metadata objects over the same
    # addresses: replays.
    inputs["input_ids"].copy_(h.inputs(seed=1)["input_ids"])
    seq.fill_(3)
    meta_same = per_layer(_Meta(seq[:1], table[:1], 9))
    res["same_buffers"] = expect_error(lambda: call(inputs, meta_same))
    # New tensor with the same shape and values: refused.
    moved = dict(inputs, input_ids=inputs["input_ids"].clone())
    res["moved_input"] = expect_error(lambda: call(moved, meta_same))
    # Same storage, other view (offset / stride): refused.
    backing = torch.zeros(16, dtype=inputs["positions"].dtype)
    res["strided_view"] = expect_error(
        lambda: call(dict(inputs, positions=backing[::2]), meta_same)
    )
    fresh = _Meta(seq[:1], table[:1].clone(), 9)
    res["metadata_moved"] = expect_error(lambda: call(inputs, per_layer(fresh)))
    # The KV-cache slot mapping is read inside a graph segment: it must be
    # the captured one (here: none at capture, one now).
    slots = {n: torch.zeros(8, dtype=torch.int64) for n in names}
    res["slot_mapping_moved"] = expect_error(lambda: call(inputs, meta_same, slots))
    # Another layout (e.g. another verify width): its own reference...
    wider = _Meta(seq[:2], table[:2], 9)
    res["metadata_new_layout"] = expect_error(lambda: call(inputs, per_layer(wider)))
    # ...checked from then on, while the first layout still replays.
    res["metadata_first_layout_again"] = expect_error(lambda: call(inputs, meta_same))
    wider_moved = _Meta(seq[:2], table[:2].clone(), 9)
    res["metadata_new_layout_moved"] = expect_error(
        lambda: call(inputs, per_layer(wider_moved))
    )
    # Same pointer, other storage offset: refused.
    shifted = _Meta(seq[1:2], table[:1], 9)
    res["metadata_offset"] = expect_error(lambda: call(inputs, per_layer(shifted)))
    # Same pointer, other stride: the cheap every-replay check compares
    # addresses only; the debug-mode check compares the full structure.
    backing = torch.zeros(16, dtype=inputs["positions"].dtype)
    strided = dict(inputs, positions=backing[:8])
    debug = XpuBreakableGraphWrapper(
        model, vllm_config, backend=stand_in_backend(), debug=False
    )

    def call_debug(inp):
        with torch.no_grad(), forward_ctx(vllm_config):
            return debug(**inp)

    call_debug(strided)  # capture
    same_ptr = dict(strided, positions=backing[::2])
    res["same_pointer_other_stride"] = expect_error(lambda: call_debug(same_ptr))
    debug.is_debugging_mode = True
    res["same_pointer_other_stride_debug"] = expect_error(lambda: call_debug(same_ptr))
    return res


def run_out_of_place(h: Harness) -> dict[str, Any]:
    """Decorate an out-of-place all-reduce (what the XPU communicator does)
    with the upstream break decorator instead of the in-place break: the
    replay must refuse before the next segment reads stale memory."""
    from vllm.compilation.breakable_cudagraph import eager_break_during_capture
    from vllm.xpu_laguna.graphs import collectives
    from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

    def out_of_place(input_, group):
        output = input_.clone()
        torch.distributed.all_reduce(output, group=group.device_group)
        return output

    decorated = eager_break_during_capture(out_of_place)
    res: dict[str, Any] = {"decorator_active": decorated is not out_of_place}
    vllm_config, model = h.build(2, 2)
    wrapper = XpuBreakableGraphWrapper(
        model, vllm_config, backend=stand_in_backend(), expected=None
    )
    inputs = h.inputs()
    real = collectives.breakable_all_reduce
    collectives.breakable_all_reduce = lambda input_, group, eager: (
        input_ if group.world_size == 1 else decorated(input_, group)
    )
    try:
        with torch.no_grad(), forward_ctx(vllm_config):
            wrapper(**inputs)
        (entry,) = wrapper.entries.values()
        res["breaks"] = entry.capture.num_eager_breaks

        def replay():
            with torch.no_grad(), forward_ctx(vllm_config):
                wrapper(**inputs)

        res["replay"] = expect_error(replay)
    finally:
        collectives.breakable_all_reduce = real
    return res
