"""Triton's interpreter takes any nonzero mask as true, as compiled Triton does.

PyPI Triton 3.9.0's interpreter can hand ``tl.load``/``tl.store`` a mask that is not boolean: a
mask built as ``(i < n) & ok & (i < K)`` from an int64 iota comes out as an int32 array typed
``int64``, and the interpreter's C++ load and store then raise ``mask has unsupported dtype``.
vLLM 0.34.0's V2 runner builds such masks (the n-gram speculator's draft gather, the grammar
bitmask kernel of the JIT warm-up). Compiled Triton treats a nonzero integer mask as true, so the
stand-in converts a non-boolean mask to ``mask != 0`` before the interpreter's load or store.

Installed by the runtime's ``.pth`` file: a finder patches ``triton.runtime.interpreter`` right
after Triton executes it, so nothing is imported at start-up and no Triton file is edited.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

MODULE = "triton.runtime.interpreter"


def _fix(module: Any) -> None:
    builder = module.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def boolean(mask: Any) -> Any:
        if mask.data.dtype == bool:
            return mask
        return module.TensorHandle(mask.data != 0, module.tl.int1)

    # Keyword arguments pass through: the interpreter's tensor-descriptor load calls
    # ``create_masked_load(..., cache_policy=..., is_volatile=...)``.
    def create_masked_load(self, ptrs, mask, other, *args, **kwargs):  # type: ignore[no-untyped-def]
        return load(self, ptrs, boolean(mask), other, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):  # type: ignore[no-untyped-def]
        return store(self, ptrs, value, boolean(mask), *args, **kwargs)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store


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
            _fix(module)

        spec.loader.exec_module = exec_and_fix  # type: ignore[method-assign]
        return spec


def install() -> None:
    if MODULE in sys.modules:
        _fix(sys.modules[MODULE])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
