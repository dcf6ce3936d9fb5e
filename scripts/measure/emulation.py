"""What the tooling puts into the processes of a CPU ``vllm serve`` it starts.

Two independent hooks, each a folder on the server's ``PYTHONPATH`` plus a marker variable:

* the series' attention (``series_attention/``, on by default in the crossover): a vLLM general
  plugin that registers FlashAttention (reference kernels) under ``CPU_ATTN`` in every vLLM
  process of the server, so a served CPU leg runs the series' exact-verify and prebuilt-metadata
  code instead of upstream's CPU attention; it logs the overlay's counters
  (``series_attention/xpu_laguna_cpu_attention.py``). On any other platform it does nothing.
* ``--emulate-graphs``: breakable graphs through the recording stand-in. The matrix installs the
  overlay's emulation in-process (``install_cpu_emulation``); a server spawns its engine core
  and worker, so the installation has to happen in each of them. ``emulated_graphs/`` (a
  ``sitecustomize``) installs it in every vLLM process of a server whose environment has the
  marker, and in no other. The marker alone decides (the series' options travel in the server's
  config, not its environment): the tooling sets it only for a server with breakable graphs (the
  option ``xpu_laguna.breakable_graph`` on), the crossover per leg (``leg_inputs``). Results are
  EMULATED: the graph class in the wrappers' accounting, and so in the record's graph section, is
  the recording stand-in.

Why a general plugin for the attention: vLLM loads its general plugins in the API server (while
it parses arguments), the engine core and every worker before it builds a model; that is the
documented place for a registry override, and it needs no knowledge of which vLLM module a
process imports first (the ``sitecustomize`` hook keys on module names: the CPU runner, the
graph wrapper). The graph emulation keeps its hook: it works, is tested, and this change is not
about it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from scripts.measure.emulated_graphs.sitecustomize import MARK_ENV
from scripts.measure.series_attention.xpu_laguna_cpu_attention import COUNTERS_LINE
from scripts.measure.series_attention.xpu_laguna_cpu_attention import MARK_ENV as SERIES_ATTENTION_ENV

SITE_DIR = Path(__file__).resolve().parent / "emulated_graphs"
PLUGIN_DIR = Path(__file__).resolve().parent / "series_attention"


def emulated_graphs_env() -> dict[str, str]:
    """Variables that make a CPU server emulate its breakable graphs: only for a server whose
    options turn them on (the marker alone decides)."""
    return {"PYTHONPATH": str(SITE_DIR), MARK_ENV: "1"}


def series_attention_env() -> dict[str, str]:
    """Variables that make every CPU server of a run use the series' FlashAttention."""
    return {"PYTHONPATH": str(PLUGIN_DIR), SERIES_ATTENTION_ENV: "1"}


def server_hooks_env(*, series_attention: bool, emulate_graphs: bool) -> dict[str, str]:
    """The variables of the chosen hooks, their ``PYTHONPATH`` folders joined."""
    parts = ([series_attention_env()] if series_attention else []) + ([emulated_graphs_env()] if emulate_graphs else [])
    out: dict[str, str] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = f"{out[key]}{os.pathsep}{value}" if key == "PYTHONPATH" and key in out else value
    return out


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
