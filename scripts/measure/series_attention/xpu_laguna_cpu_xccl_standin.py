"""vLLM general plugin: the patch tests' XCCL ring stand-in in the workers of a CPU TP leg.

The stand-in of XCCL's ring all-reduce is test code (``tests/xpu_laguna/xccl_ring_standin.py`` of the
patched tree, from ``overlay/tests/xpu_laguna/``); vLLM only has a registration point for it
(``xpu_laguna_collectives.cpu_stand_ins``) and refuses ``VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN=1`` in one
line while none is registered. The matrix's CPU TP legs put this folder and the tree's
``tests/xpu_laguna`` on ``PYTHONPATH`` (``scripts.matrix.runner.leg_environment``); vLLM calls
:func:`register` in every process it loads general plugins in, the mp executor's workers among them,
and in a CPU process with the debug toggle on it registers the stand-in there. Anywhere else it does
nothing.
"""

from __future__ import annotations

import os
import sys

STANDIN_ENV = "VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN"
MODULE = "xccl_ring_standin"  # tests/xpu_laguna/xccl_ring_standin.py of the patched tree
REGISTERED_LINE = "XPU Laguna CPU XCCL ring stand-in registered"


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM may call it more than once)."""
    if os.environ.get(STANDIN_ENV) != "1":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    try:
        module = __import__(MODULE)
    except ImportError as exc:  # the communicator then refuses the toggle in one line
        print(f"XPU Laguna CPU XCCL ring stand-in not found on sys.path: {exc!r}", file=sys.stderr, flush=True)
        return
    module.register()
    print(f"{REGISTERED_LINE} (pid {os.getpid()})", file=sys.stderr, flush=True)
