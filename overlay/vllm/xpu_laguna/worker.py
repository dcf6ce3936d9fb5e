# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' XPU worker: upstream's ``XPUWorker``, whose model
runner gives V2's graph manager the series' breakable wrapper.

V2's ``CudaGraphManager.init_breakable_cg_runner`` builds upstream's
``BreakableCUDAGraphWrapper`` only when the manager has no runner yet, so
the series' wrapper is put in place right after the runner has built its
manager (``initialize_kv_cache``, the profiling pass included), from the
runner's own config (:func:`vllm.xpu_laguna.graphs.preset_breakable_runner`).
vLLM builds this worker where the series' platform
(:class:`vllm.xpu_laguna.platform.XpuLagunaPlatform`) names it in
``parallel_config.worker_cls``.
"""

from typing import Any

from vllm.v1.worker.xpu_model_runner import XPUModelRunner
from vllm.v1.worker.xpu_worker import XPUWorker
from vllm.xpu_laguna.graphs.wrapper import preset_breakable_runner


class XpuLagunaModelRunner(XPUModelRunner):
    """``XPUModelRunner`` whose graph manager gets the series' breakable
    wrapper where the config asks for it."""

    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> None:
        super().initialize_kv_cache(*args, **kwargs)
        preset_breakable_runner(self)


class XpuLagunaWorker(XPUWorker):
    """``XPUWorker`` building :class:`XpuLagunaModelRunner` (an encoder-only
    model keeps upstream's runner: it has no breakable graphs)."""

    def _make_model_runner(self):
        if self.vllm_config.is_mm_encoder_only:
            return super()._make_model_runner()
        return XpuLagunaModelRunner(self.vllm_config, self.device)
