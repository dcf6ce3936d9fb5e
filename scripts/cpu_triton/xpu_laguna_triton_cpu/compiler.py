"""The ``cpu`` backend's compiler: refuses; with TRITON_INTERPRET=1 Triton never compiles."""

from triton.backends.compiler import BaseBackend


class CpuInterpreterBackend(BaseBackend):
    @staticmethod
    def supports_target(target):
        return target.backend == "cpu"

    def hash(self):
        return "xpu-laguna-triton-cpu-interpreter"

    def parse_options(self, options):
        raise RuntimeError(
            "xpu_laguna_triton_cpu cannot compile a Triton kernel: set TRITON_INTERPRET=1 "
            "(the runtime's xpu_laguna_triton_interpret.pth does) so kernels run in Triton's interpreter"
        )

    def add_stages(self, stages, options, language):
        self.parse_options(options)

    def load_dialects(self, context):
        pass

    def get_module_map(self):
        return {}
