"""vLLM general plugin: the series' attention path in every process of a CPU ``vllm serve``.

A CPU ``vllm serve`` resolves attention to ``CPU_ATTN`` (upstream's CPU kernels), so without
this a served CPU leg runs none of the series' FlashAttention code (exact verify, prebuilt
metadata). The in-process matrix and e2e tests override the registry entry in their own process;
a server spawns its engine core (and, past TP 1, workers), so the override has to happen in each.

How it gets there: the tooling puts this folder on the server's ``PYTHONPATH`` with
``MARK_ENV=1`` (``scripts.measure.emulation.series_attention_env``). The folder holds a
``.dist-info`` whose ``entry_points.txt`` names :func:`register` in the ``vllm.general_plugins``
group; ``importlib.metadata`` finds it on ``sys.path``, so nothing is installed into the
runtime, and vLLM calls it in every process it loads general plugins in (the API server while
it parses arguments, the engine core, every worker) before any model is built.

In a process on the CPU platform with the marker set, :func:`register` registers
the series' ``XpuLagunaFlashAttentionBackend`` under ``CPU_ATTN`` (on CPU it runs on the pure-torch reference kernels
that the runtime's test-side plugin ``xpu_laguna_standins`` registers, patch 0004) and starts a
reporter thread that logs the overlay's own counts (``xpu_laguna_exact.counters``) whenever they
change, as one stderr line with ``COUNTERS_LINE``, the JSON snapshot and the process id, so the
server's log shows what ran. Without the marker, or on any other platform, it does nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading

MARK_ENV = "XPU_LAGUNA_CPU_SERIES_ATTENTION"
# the series' FlashAttention backend (upstream's, subclassed), which its XPU platform picks
FLASH_ATTN = "vllm.xpu_laguna.attention.backend.XpuLagunaFlashAttentionBackend"
REGISTERED_LINE = "XPU Laguna CPU series attention: FLASH_ATTN (reference kernels) registered under CPU_ATTN"
COUNTERS_LINE = "XPU Laguna CPU series attention: exact-verify counters"
REPORT_PERIOD_S = 0.5
_started = False


def _say(text: str) -> None:
    """One line on the process's stderr, the server's log. Not through vLLM's logger: vLLM
    0.32.0 configures logging per process after the API server has loaded its plugins, and a
    ``VLLM_LOGGING_LEVEL`` above INFO would hide the proof."""
    print(f"{text} (pid {os.getpid()})", file=sys.stderr, flush=True)


def _report(last: list[str]) -> None:
    """Print the counters if they changed since the last line (and are not all zero)."""
    from vllm.xpu_laguna.attention import exact as xpu_laguna_exact

    try:
        snapshot = xpu_laguna_exact.counters.snapshot()
    except RuntimeError:  # a counter changed size while read: next tick
        return
    if not snapshot["exact_calls_by_width"]:
        return
    text = json.dumps(snapshot, sort_keys=True)
    if last and last[0] == text:
        return
    last[:] = [text]
    _say(f"{COUNTERS_LINE} {text}")


def _reporter(stop: threading.Event, last: list[str]) -> None:
    while not stop.wait(REPORT_PERIOD_S):
        _report(last)


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM may call it more than once)."""
    global _started
    if _started or os.environ.get(MARK_ENV) != "1":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    _started = True
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, FLASH_ATTN)
    selector._cached_get_attn_backend.cache_clear()
    _say(REGISTERED_LINE)
    stop = threading.Event()
    last: list[str] = []
    threading.Thread(target=_reporter, args=(stop, last), name="xpu-laguna-counters", daemon=True).start()

    def final() -> None:
        stop.set()
        _report(last)

    atexit.register(final)
