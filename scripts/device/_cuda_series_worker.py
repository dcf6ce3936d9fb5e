"""The series' worker on a CUDA GPU, for the device checks only (never in the wheel).

The wheel's XPU platform names ``vllm.xpu_laguna.worker.XpuLagunaWorker``, whose model runner puts
the series' breakable wrapper in V2's graph manager (``preset_breakable_runner``). A CUDA GPU runs
upstream's CUDA platform, which names upstream's worker, so ``graph_check`` passes this worker
(``worker_cls``) to its graph legs on CUDA: the same hook (``_make_model_runner``, "subclasses
override this") and the same preset after ``initialize_kv_cache`` as the XPU worker, over CUDA's
``Worker`` and ``GPUModelRunner`` (the XPU ones subclass these and add only the ``torch.cuda``
aliases). Without it a CUDA leg would capture through upstream's wrapper and prove nothing about
the series'.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu.model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker
from vllm.xpu_laguna.graphs.wrapper import preset_breakable_runner

WORKER = f"{__name__}.CudaSeriesWorker"


class CudaSeriesModelRunner(GPUModelRunner):
    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> None:
        super().initialize_kv_cache(*args, **kwargs)
        preset_breakable_runner(self)


class CudaSeriesWorker(Worker):
    def _make_model_runner(self) -> GPUModelRunner:
        if self.vllm_config.is_mm_encoder_only:
            return super()._make_model_runner()
        return CudaSeriesModelRunner(self.vllm_config, self.device)
