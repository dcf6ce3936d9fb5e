"""The ``cpu`` backend's driver: active, CPU tensors; kernels run in Triton's interpreter."""

from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase


class CpuInterpreterDriver(DriverBase):
    @staticmethod
    def is_active():
        return True

    def map_python_to_cpp_type(self, ty):
        raise NotImplementedError("xpu_laguna_triton_cpu: kernels run in Triton's interpreter (TRITON_INTERPRET=1)")

    def get_current_target(self):
        return GPUTarget("cpu", 0, 0)

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        import torch

        return torch.cpu

    def get_benchmarker(self):
        from triton.testing import do_bench

        return do_bench

    def get_empty_cache_for_benchmark(self):
        import torch

        return torch.empty(1, dtype=torch.int8)

    def clear_cache(self, cache):
        cache.zero_()
