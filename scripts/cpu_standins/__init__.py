"""The series' test-side stand-ins (``xpu_laguna_standins/``) and how they reach a CPU runtime.

The package holds the pure-torch reference attention kernels, the emulated device graphs and the
XCCL ring all-reduce; it is never part of the wheel (``nox -s build`` packages ``vllm/`` only, and
nothing there imports it). :func:`lay` copies it with its ``.dist-info`` (a ``vllm.general_plugins``
entry point that registers the reference kernels and the XCCL ring on CPU) into a runtime's
site-packages; ``python -m scripts.cpu_runtime sync`` calls it. Code of this repository that runs
outside such a runtime (the device checks on an XPU machine, tooling tests) imports the same
modules from this folder through :func:`standin_module`.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
PACKAGE = "xpu_laguna_standins"
DIST_INFO = f"{PACKAGE}-0.dist-info"


def lay(site: Path) -> None:
    """Copy the package and its ``.dist-info`` into ``site`` (a site-packages folder), replacing
    an earlier copy, so the runtime gets this checkout's stand-ins."""
    for name in (PACKAGE, DIST_INFO):
        dest = site / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(HERE / name, dest, ignore=shutil.ignore_patterns("__pycache__"))


def standin_module(name: str = "") -> ModuleType:
    """``xpu_laguna_standins.<name>`` (the package itself for ``""``): the runtime's copy when
    installed, else this folder's."""
    full = f"{PACKAGE}.{name}" if name else PACKAGE
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name != PACKAGE:
            raise
    sys.path.append(str(HERE))
    return importlib.import_module(full)
