"""Run fixes on ``triton.runtime.interpreter`` right after Triton executes it.

One finder for every fix of the package (:mod:`.masks`, :mod:`.fast_launch`, :mod:`.record`): a
second finder for the same module would never be asked, the first one answers. Nothing is
imported at start-up and no Triton file is edited.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

MODULE = "triton.runtime.interpreter"

_FIXES: list[Callable[[Any], None]] = []


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_fix(module: Any) -> None:
            exec_module(module)
            for fix in list(_FIXES):
                fix(module)

        spec.loader.exec_module = exec_and_fix  # type: ignore[method-assign]
        return spec


def after_import(fix: Callable[[Any], None]) -> None:
    """``fix(module)`` once the interpreter module is executed (at once when it already is)."""
    if MODULE in sys.modules:
        fix(sys.modules[MODULE])
        return
    if fix not in _FIXES:
        _FIXES.append(fix)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
