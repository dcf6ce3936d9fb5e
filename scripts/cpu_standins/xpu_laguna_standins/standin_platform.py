# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The CPU runtime's test-side platform: upstream's ``CpuPlatform`` with the series' device
communicator on CPU and, for an engine whose config asks for emulation
(:func:`~xpu_laguna_standins.emulation_entry`) and whose series' options turn ``breakable_graph``
on, breakable graphs emulated by the recording graph. Never in the wheel.

vLLM picks it through this package's ``vllm.platform_plugins`` entry point
(:func:`xpu_laguna_standins.platform_plugin`),
which activates exactly where upstream's CPU plugin detects a CPU platform; an out-of-tree platform
plugin takes precedence over the built-in one. It models the series' XPU platform
(``vllm.xpu_laguna.platform``), through the same hooks:

* ``get_device_communicator_cls``:
  :class:`~xpu_laguna_standins.standin_communicator.StandInCpuCommunicator` (the series' all-reduce
  modes on CPU, the XCCL ring stand-in among them); only the communicator's base and transport
  (gloo / SHM instead of XCCL) differ from the XPU one;
* ``check_and_update_config``: where upstream names its CPU worker,
  :class:`~xpu_laguna_standins.standin_worker.StandInCpuWorker` (the XPU platform names the series'
  XPU worker); and, for a config that asks for emulation and the series' breakable graphs, the
  graph settings the CPU platform clears (mode PIECEWISE, the capture size,
  ``use_breakable_cudagraph``) set again;
* ``xpu_laguna_graph_backend(vllm_config)`` (the series' graphs package asks a platform for its
  own graphs, with the config of the engine they are for): for a config that asks for emulation,
  the recording graph, so the series' wrapper captures and replays through it, labelled emulated;
  else none (a CPU has no device graphs: the series refuses breakable graphs);
* ``_global_graph_pool``: a name where a device has its pool handle (CPU has none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.platforms.cpu import CpuPlatform

from . import emulation_asked

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend

COMMUNICATOR = "xpu_laguna_standins.standin_communicator.StandInCpuCommunicator"
CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"
WORKER = "xpu_laguna_standins.standin_worker.StandInCpuWorker"
# what upstream's graph manager takes for the global graph pool (a device's pool handle)
EMULATED_POOL = "emulated graph pool (CPU)"


class StandInCpuPlatform(CpuPlatform):
    _global_graph_pool: Any = EMULATED_POOL

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return COMMUNICATOR

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.xpu_laguna.graphs.config import apply_breakable_graph_settings, breakable_graph_enabled

        super().check_and_update_config(vllm_config)
        if emulation_asked(vllm_config) and breakable_graph_enabled(vllm_config):
            apply_breakable_graph_settings(vllm_config)
            vllm_config.compilation_config.use_breakable_cudagraph = True
        if vllm_config.parallel_config.worker_cls == CPU_WORKER:
            vllm_config.parallel_config.worker_cls = WORKER

    @classmethod
    def xpu_laguna_graph_backend(cls, vllm_config: VllmConfig) -> DeviceGraphBackend | None:
        # imported late: the platform plugin is probed before vLLM's platform is set up, and the
        # graphs' module needs it
        from .emulated_graphs import recording_backend

        return recording_backend() if emulation_asked(vllm_config) else None
