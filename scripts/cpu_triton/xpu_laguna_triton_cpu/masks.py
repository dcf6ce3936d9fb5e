"""Triton's interpreter takes any nonzero mask as true, as compiled Triton does.

PyPI Triton 3.9.0's interpreter can hand ``tl.load``/``tl.store`` a mask that is not boolean: a
mask built as ``(i < n) & ok & (i < K)`` from an int64 iota comes out as an int32 array typed
``int64``, and the interpreter's C++ load and store then raise ``mask has unsupported dtype``.
vLLM 0.34.0's V2 runner builds such masks (the n-gram speculator's draft gather, the grammar
bitmask kernel of the JIT warm-up). Compiled Triton treats a nonzero integer mask as true, so the
stand-in converts a non-boolean mask to ``mask != 0`` before the interpreter's load or store.

Installed by the runtime's ``.pth`` file (:func:`xpu_laguna_triton_cpu.install`): the class is patched
right after Triton executes ``triton.runtime.interpreter`` (:mod:`.interpreter_hook`), so nothing is
imported at start-up and no Triton file is edited.
"""

from __future__ import annotations

from typing import Any


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


def install() -> None:
    from .interpreter_hook import after_import

    after_import(_fix)
