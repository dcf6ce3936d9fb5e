"""What the tooling puts into the processes of a CPU ``vllm serve`` it starts, and what it reads
back from their logs.

* The series' attention (``series_attention/``, on by default in the crossover): a vLLM general
  plugin, a folder on the server's ``PYTHONPATH`` plus a marker variable, that registers
  FlashAttention (reference kernels) under ``CPU_ATTN`` in every vLLM process of the server, so a
  served CPU leg runs the series' exact-verify and prebuilt-metadata code instead of upstream's CPU
  attention; it logs the overlay's counters (``series_attention/xpu_laguna_cpu_attention.py``). On
  any other platform it does nothing.
* ``--emulate-graphs`` needs nothing here: breakable graphs through the recording stand-in are asked
  in the server's config (``xpu_laguna_standins.emulation_entry``, an ``additional_config`` entry
  beside the series' options, the crossover's legs with the option ``xpu_laguna.breakable_graph``
  on and no other), which reaches the engine core and every worker with the config. Results are
  EMULATED: the graph class in the wrappers' accounting, and so in the record's graph section, is
  the recording stand-in.

Why a general plugin for the attention: vLLM loads its general plugins in the API server (while
it parses arguments), the engine core and every worker before it builds a model; that is the
documented place for a registry override.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from scripts.measure.series_attention.xpu_laguna_cpu_attention import COUNTERS_LINE
from scripts.measure.series_attention.xpu_laguna_cpu_attention import MARK_ENV as SERIES_ATTENTION_ENV

PLUGIN_DIR = Path(__file__).resolve().parent / "series_attention"


def series_attention_env() -> dict[str, str]:
    """Variables that make every CPU server of a run use the series' FlashAttention."""
    return {"PYTHONPATH": str(PLUGIN_DIR), SERIES_ATTENTION_ENV: "1"}


def logged_counters(log: str) -> dict[str, Any] | None:
    """The last exact-verify counters any process of a server logged (the one with the model's
    attention: the worker, or the engine core at TP 1 without workers); None when none did."""
    lines = [line for line in log.splitlines() if COUNTERS_LINE in line]
    if not lines:
        return None
    found = re.search(r"(\{.*\}) \(pid \d+\)$", lines[-1].rstrip())
    if found is None:
        raise ValueError(f"not a counters line: {lines[-1]!r}")
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def settled_counters(log_path: Path, wait_s: float) -> dict[str, Any] | None:
    """:func:`logged_counters` of the log at ``log_path`` once the plugin's reporter (every
    ``REPORT_PERIOD_S``) has had time to log the last calls: wait up to ``wait_s`` for a first line,
    then one more second."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and logged_counters(log_path.read_text(errors="replace")) is None:
        time.sleep(0.5)
    time.sleep(1.0)
    return logged_counters(log_path.read_text(encoding="utf-8", errors="replace"))
