"""The device checks' CUDA worker (``scripts/device/_cuda_series_worker.py``): on a CUDA GPU the
graph check's legs get the series' breakable wrapper through the same hook and preset as the
wheel's XPU worker (``vllm/xpu_laguna/worker.py``).

What is real: upstream's CUDA ``Worker`` and V2 ``GPUModelRunner`` classes of the runtime's vLLM,
the series' wrapper and its preset. No GPU here: upstream's ``initialize_kv_cache`` is stood in for
by what the preset needs of it (the graph manager it builds), and the wrapper records through the
test-side recording graph (emulated)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def _config(breakable: bool) -> SimpleNamespace:
    from vllm.config import CompilationConfig

    return SimpleNamespace(
        additional_config={"xpu_laguna": {"breakable_graph": breakable}},
        model_config=SimpleNamespace(architectures=["LagunaForCausalLM"], enforce_eager=False),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, all2all_backend=None),
        compilation_config=CompilationConfig(cudagraph_capture_sizes=[8]),
    )


def test_the_worker_is_upstreams_cuda_worker_with_its_runner_hook() -> None:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    from scripts.device import _cuda_series_worker as cuda

    module, name = cuda.WORKER.rsplit(".", 1)
    assert module == cuda.__name__ and getattr(cuda, name) is cuda.CudaSeriesWorker
    assert issubclass(cuda.CudaSeriesWorker, Worker)
    assert issubclass(cuda.CudaSeriesModelRunner, GPUModelRunner)
    assert "_make_model_runner" in vars(Worker)  # the hook upstream documents for subclasses


@pytest.mark.parametrize("breakable", [True, False])
def test_the_runner_presets_the_series_wrapper(monkeypatch: pytest.MonkeyPatch, breakable: bool) -> None:
    """The option on: the series' wrapper in the manager right after ``initialize_kv_cache``; off
    (negative control): none, for V2 to build upstream's."""
    import torch
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper
    from xpu_laguna_standins.emulated_graphs import recording_backend

    from scripts.device import _cuda_series_worker as cuda

    def upstream(self: object, *args: object, **kwargs: object) -> None:
        self.cudagraph_manager = SimpleNamespace(use_breakable_cg=True, breakable_cg_runner=None)  # type: ignore[attr-defined]

    monkeypatch.setattr(GPUModelRunner, "initialize_kv_cache", upstream)
    monkeypatch.setattr("vllm.xpu_laguna.graphs.wrapper.device_graph_backend", lambda vllm_config: recording_backend())
    runner = object.__new__(cuda.CudaSeriesModelRunner)
    runner.vllm_config = _config(breakable)  # type: ignore[assignment]
    runner.model = torch.nn.Identity()
    runner.initialize_kv_cache(None)
    built = runner.cudagraph_manager.breakable_cg_runner  # type: ignore[attr-defined]
    assert isinstance(built, XpuBreakableGraphWrapper) is breakable
    assert (built is None) is not breakable
