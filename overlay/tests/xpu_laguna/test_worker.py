# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The series' XPU worker (vllm/xpu_laguna/worker.py), chosen by the series'
XPU platform's ``check_and_update_config``: its model runner puts the
series' breakable wrapper in V2's graph manager once the manager is built.

What is real: upstream's ``XPUPlatform`` and ``XPUWorker`` classes (their
source, and the series' subclasses of them), imported with empty stand-ins
of ``vllm_xpu_kernels``' compiled modules (imported by upstream's XPU
platform only to register ops) and dropped from ``sys.modules`` afterwards;
no XPU here, so upstream's ``check_and_update_config`` and the runner's
``initialize_kv_cache`` are stood in for by what they do to the config and
the runner (set the worker class; build the graph manager). The CPU
stand-in runs take the same ``preset_breakable_runner`` before their
emulated capture (the matrix's graph legs)."""

from __future__ import annotations

import inspect
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch
from breakable_graph_standins import RecordingGraph
from laguna_model_testlib import config_stand_in

from vllm.config import CompilationConfig
from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend
from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

KERNEL_MODULES = ("_C", "_moe_C", "_xpu_C")
# what the fixture imports that needs (or is) the XPU platform: dropped after
XPU_MODULES = (
    "vllm.platforms.xpu",
    "vllm.v1.worker.xpu_",
    "vllm.xpu_laguna.platform",
    "vllm.xpu_laguna.worker",
)


@pytest.fixture
def xpu(monkeypatch):
    """The series' platform and worker modules, with the modules they import
    dropped again afterwards (no other test sees an XPU platform imported)."""
    before = set(sys.modules)
    for name in (
        "vllm_xpu_kernels",
        *(f"vllm_xpu_kernels.{m}" for m in KERNEL_MODULES),
    ):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    from vllm.platforms.xpu import XPUPlatform
    from vllm.v1.worker.xpu_model_runner import XPUModelRunner
    from vllm.v1.worker.xpu_worker import XPUWorker
    from vllm.xpu_laguna import platform, worker

    yield SimpleNamespace(
        XPUPlatform=XPUPlatform,
        XPUModelRunner=XPUModelRunner,
        XPUWorker=XPUWorker,
        platform=platform,
        worker=worker,
    )
    for name in set(sys.modules) - before:
        if name.startswith(XPU_MODULES):
            module = sys.modules.pop(name)
            parent, _, child = name.rpartition(".")
            if getattr(sys.modules.get(parent), child, None) is module:
                delattr(sys.modules[parent], child)


def _parallel(worker_cls: str) -> SimpleNamespace:
    return SimpleNamespace(parallel_config=SimpleNamespace(worker_cls=worker_cls))


def test_upstream_names_the_worker_the_platform_replaces(xpu) -> None:
    """The string the series' platform looks for is the one upstream's XPU
    platform sets: a rename upstream fails here, not silently on a device."""
    source = inspect.getsource(xpu.XPUPlatform.check_and_update_config)
    assert f'"{xpu.platform.XPU_WORKER}"' in source
    module, name = xpu.platform.SERIES_WORKER.rsplit(".", 1)
    assert getattr(xpu.worker, name) is xpu.worker.XpuLagunaWorker
    assert module == xpu.worker.__name__
    assert issubclass(xpu.worker.XpuLagunaWorker, xpu.XPUWorker)
    assert issubclass(xpu.worker.XpuLagunaModelRunner, xpu.XPUModelRunner)


@pytest.mark.parametrize(
    "chosen,series",
    [
        ("auto", True),  # upstream resolves "auto" to its worker
        ("my.own.Worker", False),  # negative control: the user's stays
    ],
)
def test_the_platform_names_the_series_worker(xpu, monkeypatch, chosen, series) -> None:
    def upstream(cls, vllm_config) -> None:
        if vllm_config.parallel_config.worker_cls == "auto":
            vllm_config.parallel_config.worker_cls = xpu.platform.XPU_WORKER

    monkeypatch.setattr(
        xpu.XPUPlatform, "check_and_update_config", classmethod(upstream)
    )
    config = _parallel(chosen)
    xpu.platform.XpuLagunaPlatform.check_and_update_config(config)
    expected = xpu.platform.SERIES_WORKER if series else chosen
    assert config.parallel_config.worker_cls == expected


@pytest.mark.parametrize("breakable", [True, False])
def test_the_runner_presets_the_wrapper_after_building_its_manager(
    xpu, monkeypatch, breakable
) -> None:
    """After upstream's ``initialize_kv_cache`` built the manager, the
    series' runner gives it the series' wrapper where the config asks;
    with the option off (negative control) the manager keeps none, for V2
    to build upstream's."""
    vllm_config = config_stand_in(
        {"breakable_graph": breakable},
        compilation_config=CompilationConfig(cudagraph_capture_sizes=[8]),
    )

    def upstream(self, *args, **kwargs) -> None:
        self.cudagraph_manager = SimpleNamespace(
            use_breakable_cg=True, breakable_cg_runner=None
        )

    monkeypatch.setattr(xpu.XPUModelRunner, "initialize_kv_cache", upstream)
    runner = object.__new__(xpu.worker.XpuLagunaModelRunner)
    runner.vllm_config = vllm_config
    runner.model = torch.nn.Identity()
    monkeypatch.setattr(
        "vllm.xpu_laguna.graphs.wrapper.device_graph_backend",
        lambda vllm_config: DeviceGraphBackend(
            name="recording", graph_factory=RecordingGraph
        ),
    )
    runner.initialize_kv_cache(None, is_profiling=True)
    built = runner.cudagraph_manager.breakable_cg_runner
    assert isinstance(built, XpuBreakableGraphWrapper) is breakable
    assert (built is None) is not breakable
