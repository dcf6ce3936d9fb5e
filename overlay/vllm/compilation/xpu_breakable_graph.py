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
* a static-input identity guard before replay: the model inputs and the
  KV-cache slot mapping (read inside graph segments) must be the captured
  tensors (pointer, storage offset, shape, stride, dtype, device); the
  attention metadata must not drift: per metadata layout (the metadata is
  read by the eager attention, and one captured shape sees several layouts:
  verify widths, decode steps) its tensors keep the addresses of the first
  step with that layout;
* a check on replay that every eager break returns the same addresses it
  returned during capture (an out-of-place break would otherwise feed stale
  memory to the next segment).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

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

logger = init_logger(__name__)

LAGUNA_ARCHITECTURES = ("LagunaForCausalLM",)


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
    graph_factory: Callable[[], Any]
    pool: Callable[[], Any] = lambda: None
    capture_context: Callable[[], contextlib.AbstractContextManager[Any]] = (
        contextlib.nullcontext
    )
    pre_capture: Callable[[], None] = lambda: None


@contextlib.contextmanager
def _side_stream_capture(device_module: Any) -> Iterator[None]:
    """Capture on a fresh side stream ordered after the current one (as
    ``torch.cuda.graph`` does): device graphs cannot be captured on a
    default stream, and ``torch.xpu`` cannot tell which stream that is."""
    current = device_module.current_stream()
    side = device_module.Stream()
    side.wait_stream(current)
    try:
        with device_module.stream(side):
            yield
    finally:
        current.wait_stream(side)


def _device_pre_capture() -> None:
    gc.collect()
    torch.accelerator.empty_cache()


def device_graph_backend(platform: Any = None) -> DeviceGraphBackend:
    """The device-graph backend of ``platform`` (default: the current one)."""
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
        )
    if platform.is_cuda_alike():
        return DeviceGraphBackend(
            name="cuda",
            graph_factory=torch.cuda.CUDAGraph,
            pool=platform.get_global_graph_pool,
            capture_context=lambda: _side_stream_capture(torch.cuda),
            pre_capture=_device_pre_capture,
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


def _unwrap_model(runnable: Any) -> Any:
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


# Metadata fields rebuilt by the builder on every step (a fresh tensor each
# time) and read only by the attention kernel, which runs eagerly on replay
# and takes the step's own metadata: FlashAttention 3's ahead-of-time
# schedule (CUDA). Nothing captured in a graph segment reads them.
EAGER_ONLY_METADATA_FIELDS = frozenset({"scheduler_metadata", "prefix_scheduler_metadata"})


def reachable_tensor_identities(
    obj: Any,
    root: str = "",
    max_depth: int = 8,
    skip_fields: frozenset[str] = frozenset(),
) -> list[TensorIdentity]:
    """Identity (pointer, storage offset, shape, stride, dtype, device) of
    every tensor reachable from ``obj`` through containers, dataclasses and
    objects holding a ``tensors`` dict, in a stable order. An object reached
    twice is reported once, at its first path. Dataclass fields named in
    ``skip_fields`` are not followed."""
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
                if f.name not in skip_fields:
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


def attention_metadata_identities() -> list[TensorIdentity]:
    if not is_forward_context_available():
        return []
    return reachable_tensor_identities(
        get_forward_context().attn_metadata,
        "attn_metadata",
        skip_fields=EAGER_ONLY_METADATA_FIELDS,
    )


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
        self, fn: Callable[[], Any], kind: BreakKind = BreakKind.ATTENTION
    ) -> Any:
        self._end_segment()
        result = fn()
        self.segments.append(fn)
        self.records.append(_Segment(kind, fn, _result_pointers(result), result))
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

    def replay(self) -> None:
        num_breaks = 0
        for seg in self.records:
            result = seg.fn()
            if seg.result is None:
                continue
            num_breaks += 1
            if result is seg.keep_alive:
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
            raise TopologyMismatchError(
                f"graphs must be breaks + 1: {self.describe()}"
            )
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


def all_reduce_into(input_: torch.Tensor, out: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum ``input_`` across ``group`` into the caller-owned ``out``."""
    out.copy_(input_)
    torch.distributed.all_reduce(out, group=group.device_group)
    return out


def breakable_all_reduce(input_: torch.Tensor, group: Any) -> torch.Tensor:
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

    return capture.add_eager(reduce_in_place, kind=BreakKind.COLLECTIVE)


# ---------------------------------------------------------------------------
# Wrapper
# ---------------------------------------------------------------------------


MetadataLayout = tuple[tuple[Any, ...], ...]
MetadataAddresses = list[tuple[int, int]]
# Distinct attention-metadata layouts one captured shape may see (verify
# widths, decode vs verify steps, KV groups); more means buffers are rebuilt.
MAX_METADATA_LAYOUTS = 64


def split_metadata_identities(
    ids: list[TensorIdentity],
) -> tuple[MetadataLayout, MetadataAddresses]:
    """(layout: path, shape, stride, dtype, device of each tensor;
    addresses: pointer and storage offset of each tensor)."""
    layout = tuple((i[0], i[3], i[4], i[5], i[6]) for i in ids)
    return layout, [(i[1], i[2]) for i in ids]


@dataclasses.dataclass
class _XpuEntry(_BreakableEntry):
    input_identities: list[TensorIdentity] | None = None
    metadata_addresses: dict[MetadataLayout, MetadataAddresses] = dataclasses.field(
        default_factory=dict
    )


_AUTO: Any = object()


class XpuBreakableGraphWrapper(BreakableCUDAGraphWrapper):
    """:class:`BreakableCUDAGraphWrapper` driving
    :class:`XpuBreakableGraphCapture`: one audited capture per batch
    descriptor, an identity guard before every replay."""

    def __init__(
        self,
        runnable: Callable[..., Any],
        vllm_config: VllmConfig,
        *,
        backend: DeviceGraphBackend | None = None,
        expected: ExpectedTopology | None = _AUTO,
        max_segments: int | None = None,
    ) -> None:
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.compilation_config = vllm_config.compilation_config
        self.backend = backend if backend is not None else device_graph_backend()
        self.graph_pool = self.backend.pool()
        self.is_debugging_mode = envs.VLLM_LOGGING_LEVEL == "DEBUG"
        self.expected = (
            expected_topology_for(runnable, vllm_config)
            if expected is _AUTO
            else expected
        )
        self.max_segments = max_segments
        self.entries: dict[Any, _BreakableEntry] = {}
        self.audit: list[str] = []
        BreakableCUDAGraphWrapper._all_instances.add(self)
        logger.info_once(
            "Breakable %s graphs enabled (eager breaks at attention and "
            "collectives)",
            self.backend.name,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        forward_context = get_forward_context()
        if forward_context.cudagraph_runtime_mode == CUDAGraphMode.NONE:
            return self.runnable(*args, **kwargs)
        descriptor = forward_context.batch_descriptor
        assert descriptor is not None
        entry = self.entries.get(descriptor)
        if entry is None:
            entry = _XpuEntry(batch_descriptor=descriptor)
            self.entries[descriptor] = entry
        if entry.capture is None:
            return self._capture(entry, args, kwargs)
        return self._replay(entry, args, kwargs)

    def _capture(
        self, entry: _BreakableEntry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        assert isinstance(entry, _XpuEntry)
        validate_cudagraph_capturing_enabled()
        if self.graph_pool is not None:
            from vllm.distributed.device_communicators.pynccl_allocator import (
                set_graph_pool_id,
            )

            set_graph_pool_id(self.graph_pool)
        self.backend.pre_capture()
        get_offloader().sync_prev_onload()

        input_ids = static_input_identities(args, kwargs)
        capture = XpuBreakableGraphCapture(
            pool=self.graph_pool,
            backend=self.backend,
            expected=self.expected,
            max_segments=self.max_segments,
        )
        with self.backend.capture_context(), capture:
            output = self.runnable(*args, **kwargs)
            get_offloader().join_after_forward()
        capture.check_topology()
        line = capture.audit_line(str(entry.batch_descriptor))
        self.audit.append(line)
        logger.info(line)

        entry.capture = capture
        entry.output = output
        entry.input_identities = input_ids
        return output

    def _replay(
        self, entry: _BreakableEntry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        assert isinstance(entry, _XpuEntry)
        assert entry.capture is not None and entry.input_identities is not None
        diff = first_difference(
            entry.input_identities, static_input_identities(args, kwargs)
        )
        if diff is not None:
            raise StaticInputMismatchError(
                f"static input moved since capture for {entry.batch_descriptor}: "
                f"{diff}; refusing to replay"
            )
        self._check_metadata(entry)
        get_offloader().sync_prev_onload()
        entry.capture.replay()
        return entry.output


    @staticmethod
    def _check_metadata(entry: _XpuEntry) -> None:
        """Attention metadata must not drift: the first replay step with a
        given layout (which tensors, shapes, strides) fixes their addresses,
        and every later step with that layout must present the same ones.
        A PIECEWISE capture runs without metadata, and one captured shape
        legitimately sees several layouts (decode vs verify steps, verify
        widths), so the reference is per layout, taken at its first step."""
        ids = attention_metadata_identities()
        layout, addresses = split_metadata_identities(ids)
        reference = entry.metadata_addresses.get(layout)
        if reference is None:
            if len(entry.metadata_addresses) >= MAX_METADATA_LAYOUTS:
                raise StaticInputMismatchError(
                    f"more than {MAX_METADATA_LAYOUTS} attention-metadata "
                    f"layouts for {entry.batch_descriptor}: metadata buffers "
                    "are being rebuilt; refusing to replay"
                )
            entry.metadata_addresses[layout] = addresses
            return
        if reference != addresses:
            index = next(
                i for i, (a, b) in enumerate(zip(reference, addresses)) if a != b
            )
            raise StaticInputMismatchError(
                f"attention metadata moved since its reference step for "
                f"{entry.batch_descriptor}: {layout[index][0]}: (pointer, offset) "
                f"{reference[index]} then, {addresses[index]} now; refusing to "
                "replay"
            )


def breakable_graph_wrapper_cls() -> type[BreakableCUDAGraphWrapper]:
    """The wrapper class the model runner should use."""
    if breakable_graph_enabled():
        return XpuBreakableGraphWrapper
    return BreakableCUDAGraphWrapper


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def configure_breakable_graph(vllm_config: VllmConfig, platform: Any = None) -> None:
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

    if platform.is_xpu():
        from vllm.utils.torch_utils import supports_xpu_graph

        if not supports_xpu_graph():
            fail(f"torch {torch.__version__} has no XPU graphs (need >= 2.11)")
        if not envs.VLLM_XPU_ENABLE_XPU_GRAPH:
            fail("needs VLLM_XPU_ENABLE_XPU_GRAPH=1")
    elif not platform.is_cuda_alike():
        fail(f"needs an XPU or CUDA device, not {platform.device_type!r}")
    if os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH") == "0":
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
    if sc is not None and sc.num_speculative_tokens is not None:
        if 1 + sc.num_speculative_tokens > width:
            fail(
                f"verify batch of {1 + sc.num_speculative_tokens} tokens exceeds "
                f"VLLM_XPU_LAGUNA_VERIFY_WIDTH={width}"
            )
    sched = vllm_config.scheduler_config
    if sched is not None and sched.max_num_batched_tokens < width:
        fail(f"max_num_batched_tokens {sched.max_num_batched_tokens} < width {width}")

    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    cc.cudagraph_capture_sizes = [width]
    cc.max_cudagraph_capture_size = width
    # The upstream breakable path and its config checks key on this.
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
    logger.info_once(
        "Breakable %s graphs: mode NONE, cudagraph_mode PIECEWISE, capture "
        "size %d (verify width)",
        "XPU" if platform.is_xpu() else "CUDA",
        width,
    )
