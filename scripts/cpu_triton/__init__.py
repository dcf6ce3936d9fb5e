"""A Triton backend named ``cpu`` for a stand-in CPU runtime, whose kernels run in Triton's interpreter.

vLLM 0.34.0 on x86 CPUs needs Triton with a backend named ``cpu`` (triton-cpu): the V2 model runner
prepares inputs, samples and rejection-samples with ``@triton.jit`` kernels, and
``vllm/triton_utils/importing.py`` keeps Triton only when ``triton.backends`` has ``cpu``. triton-cpu
is published as GitHub release wheels, out of reach here; PyPI Triton has no CPU code generator but
has an interpreter (``TRITON_INTERPRET=1``) that runs every ``@triton.jit`` kernel in Python on CPU
tensors, without a driver or a compiler.

So :mod:`scripts.cpu_stand_in` copies into the runtime's site-packages:

* ``xpu_laguna_triton_cpu/``: the backend: a driver that reports itself active (on CPU tensors) and
  a compiler that refuses to compile (the interpreter never calls it, so a call means
  ``TRITON_INTERPRET`` is unset), found by Triton through
* ``xpu_laguna_triton_cpu-0.dist-info/entry_points.txt``: ``[triton.backends] cpu = ...``;
* ``xpu_laguna_triton_interpret.pth``: sets ``TRITON_INTERPRET=1`` (unless set) in every interpreter
  of the runtime at start-up, spawned engine cores and workers included, and runs
  ``xpu_laguna_triton_cpu.install()``, which, when Triton imports its interpreter, installs

  - ``masks.py``: the interpreter takes a non-boolean mask as ``!= 0``, as compiled Triton does
    (PyPI Triton 3.9.0's interpreter refuses one that V2's kernels build);
  - ``fast_launch.py``: the interpreter without its fixed costs per launch (the language patched
    once, no host copies of CPU tensors, per-kernel lookups once), every program computing what
    it did; ``VXL_TRITON_STOCK_INTERPRETER=1`` leaves it out;
  - ``record.py``, only with ``VXL_TRITON_RECORD=DIR``: every kernel launch counted, the first
    distinct ones of each kernel saved with their arguments, for ``replay.py`` (the replay test,
    ``scripts/bench/triton_interpreter.py``).

No Triton or vLLM file is edited (the fixes patch the interpreter's module when Triton imports
it, :mod:`xpu_laguna_triton_cpu.interpreter_hook`).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "xpu_laguna_triton_cpu"
DIST_INFO = f"{PACKAGE}-0.dist-info"
PTH = "xpu_laguna_triton_interpret.pth"
PTH_TEXT = "import os; os.environ.setdefault('TRITON_INTERPRET', '1'); import xpu_laguna_triton_cpu as p; p.install()\n"
