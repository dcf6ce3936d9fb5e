# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The breakable-graph wrapper: one audited capture per batch descriptor,
the static-input guard before every replay, accounting of captures and
replays, and the model runner's hooks (read its accounting, put the
series' wrapper in its graph manager)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from vllm.compilation.breakable_cudagraph import (
    BreakableCUDAGraphWrapper,
    _BreakableEntry,
)
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.logger import init_logger
from vllm.model_executor.offloader.base import get_offloader
from vllm.utils.torch_utils import weak_ref_tensors
from vllm.xpu_laguna.graphs.backends import (
    DeviceGraphBackend,
    device_graph_backend,
)
from vllm.xpu_laguna.graphs.capture import XpuBreakableGraphCapture
from vllm.xpu_laguna.graphs.collective_buffers import (
    CollectiveBuffers,
    collective_buffers_for,
)
from vllm.xpu_laguna.graphs.config import (
    breakable_graph_enabled,
    debug_checks_enabled,
)
from vllm.xpu_laguna.graphs.errors import StaticInputMismatchError
from vllm.xpu_laguna.graphs.guards import (
    StaticInputProbe,
    TensorIdentity,
    first_difference,
    slot_mapping_representatives,
    static_input_identities,
    static_input_probe,
)
from vllm.xpu_laguna.graphs.topology import (
    BreakKind,
    ExpectedTopology,
    _unwrap_model,
    expected_topology_for,
)

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

logger = init_logger(__name__)


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
        label: str = "target",
        runtime_mode: CUDAGraphMode | None = None,
        key_fn: Callable[..., Hashable] | None = None,
    ) -> None:
        # upstream's state (runnable, config, key_fn: Python control flow that
        # changes what runs keys its own captures, entries, the registration
        # that lets clear_all_graphs free these graphs too), then the series'
        super().__init__(
            runnable, vllm_config, runtime_mode=runtime_mode, key_fn=key_fn
        )
        self.backend = (
            backend if backend is not None else device_graph_backend(vllm_config)
        )
        self.graph_pool = self.backend.pool()
        self.is_debugging_mode = debug_checks_enabled() if debug is None else debug
        self.expected = (
            expected_topology_for(runnable, vllm_config)
            if expected is _AUTO
            else expected
        )
        self.max_segments = max_segments
        self.label = label
        self.collective_buffers = _collective_buffers(
            runnable, vllm_config, self.expected
        )
        self.audit: list[str] = []
        self.replays = 0
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
        descriptor = forward_context.batch_descriptor
        key: Hashable = descriptor
        if self.key_fn is not None:
            key = (descriptor, self.key_fn(*args, **kwargs))
        entry = self.entries.get(key)
        if entry is None or entry.capture is None:
            assert descriptor is not None
            if entry is None:
                entry = _XpuEntry(batch_descriptor=descriptor)
                self.entries[key] = entry
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
                collective_buffers=self.collective_buffers,
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


def _collective_buffers(
    runnable: Any, vllm_config: VllmConfig, expected: ExpectedTopology | None
) -> CollectiveBuffers | None:
    """The collective breaks' slots, allocated now (model load, before any
    capture): one per expected collective, each for the largest capture size
    of the model's hidden size, on the model's device and in its dtype."""
    if expected is None or expected.collective == 0:
        return None
    model = _unwrap_model(runnable)
    param = (
        next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    )
    sizes = vllm_config.compilation_config.cudagraph_capture_sizes
    if param is None or not sizes:
        return None
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if hidden is None:
        hidden = vllm_config.model_config.get_hidden_size()
    return collective_buffers_for(
        expected.collective,
        rows=max(sizes),
        hidden=int(hidden),
        world_size=vllm_config.parallel_config.tensor_parallel_size,
        dtype=vllm_config.model_config.dtype,
        device=param.device,
    )


def graph_accounting(runner: GPUModelRunner) -> dict[str, Any]:
    """Accounting of the runner's breakable-graph wrapper (the target's: V2's
    DFlash speculator captures FULL graphs or none); empty when none is
    installed."""
    manager = getattr(runner, "cudagraph_manager", None)
    wrapper = getattr(manager, "breakable_cg_runner", None)
    if isinstance(wrapper, XpuBreakableGraphWrapper):
        return {"target": wrapper.accounting()}
    return {}


def preset_breakable_runner(
    runner: GPUModelRunner, *, backend: DeviceGraphBackend | None = None
) -> bool:
    """Give the runner's graph manager the series' breakable wrapper before
    V2 builds upstream's: ``CudaGraphManager.init_breakable_cg_runner`` builds
    one only when none is set. Call it once the runner has built its manager
    (``initialize_kv_cache``); it does nothing (False) where the manager takes
    no breakable graphs or already has a wrapper, or where the runner's config
    does not ask for the series' (its toggle off, or a target the series is
    not for: upstream's wrapper then)."""
    manager = runner.cudagraph_manager
    if (
        manager is None
        or not manager.use_breakable_cg
        or manager.breakable_cg_runner is not None
        or not breakable_graph_enabled(runner.vllm_config)
    ):
        return False
    manager.breakable_cg_runner = XpuBreakableGraphWrapper(
        runner.model, runner.vllm_config, backend=backend
    )
    return True
