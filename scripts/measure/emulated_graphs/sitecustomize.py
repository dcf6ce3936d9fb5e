"""Emulated breakable graphs in every process of a CPU ``vllm serve`` (``--emulate-graphs``).

Put on ``PYTHONPATH`` by ``python -m scripts.measure crossover --emulate-graphs`` (see
``scripts/measure/emulation.py``); Python imports it at start-up in the API server, the engine
core and the worker alike (the CPU platform spawns them). In a process with the marker variable
set (:data:`MARK_ENV`; the crossover sets it in the legs whose servers have the option
``xpu_laguna.breakable_graph`` on, and in no other: the option travels in each server's config,
which a process cannot read at start-up), it installs the recording stand-in (the CPU runtime's
test-side ``xpu_laguna_standins.emulated_graphs``, ``install_cpu_emulation``: graphs captured and
replayed by ``RecordingGraph``, results EMULATED, the graph class in the accounting says so) as
soon as the process imports one of ``HOOKED_MODULES``, before its config is checked or its model
loaded. Nothing is imported at start-up: helper processes (resource trackers, compile workers)
never load vLLM for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

MARK_ENV = "XPU_LAGUNA_EMULATED_GRAPHS"
# The first of these to be imported installs the emulation: the config's checks import the
# breakable-graph package (any of its modules imports the package first) in the processes that
# build or check a config (API server, engine core), the CPU worker process imports its worker module before it
# loads the model (it gets its config pickled).
HOOKED_MODULES = frozenset({"vllm.xpu_laguna.graphs", "vllm.v1.worker.cpu_worker"})
_installed = False


def _install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from xpu_laguna_standins.emulated_graphs import install_cpu_emulation

    install_cpu_emulation()


class _Finder(importlib.abc.MetaPathFinder):
    """Runs ``_install`` once a hooked module has been executed."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in HOOKED_MODULES or _installed:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_install(module: ModuleType) -> None:
            exec_module(module)
            _install()

        loader.exec_module = exec_and_install  # type: ignore[method-assign]
        return spec


if os.environ.get(MARK_ENV) == "1":
    sys.meta_path.insert(0, _Finder())
