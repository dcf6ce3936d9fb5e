"""Triton's interpreter without its fixed costs per launch; every program computes what it did.

PyPI Triton 3.9.0's interpreter (``triton/runtime/interpreter.py``) pays on every launch, besides
running the kernel's programs:

* ``_patch_lang``: wraps every builtin of ``triton.language`` (``tl``, ``tl.core``, ``tl.math``,
  the tensor class) so that it runs on the interpreter's semantic, and restores them afterwards.
  ``InterpretedFunction.__call__`` patches again, without restoring, on every call of a
  ``@triton.jit`` helper inside a program (``tl.max``, ``tl.sum``, ``tl.argmax``, ``tl.cdiv`` are
  such helpers): a program that reduces three times pays three more patches.
* ``GridExecutor``: reads the kernel's annotations and argument spec, builds a host view of every
  tensor argument over ``storage.cpu()`` and, after the programs ran, copies every storage back
  from its host view.

The fast path cuts these; none can change what a program reads, computes or writes:

1. **The language is patched once and stays patched.** The wrappers are the stock ones, made by
   the stock ``_patch_lang`` for a function that sees both ``tl`` and ``tl.core``: each wrapper
   calls the builtin it wraps with the interpreter's semantic, whichever launch it serves. Stock
   already leaves ``tl.core`` patched after any kernel that calls a helper. Valid only because in
   this runtime every kernel runs interpreted (a compiled kernel's code generator would meet the
   wrappers): the fast path is installed only when ``TRITON_INTERPRET`` is on, every launch and
   every helper call checks Triton's knob again, and when it is off the language is restored and
   the stock code runs. The backend refuses to compile besides (:mod:`.compiler`). A kernel that
   cannot see ``triton.language`` still fails stock's assertion.
2. **No host views, no copy-back, for CPU tensors.** ``UntypedStorage.cpu()`` returns the storage
   itself when it is on the CPU (checked when the fast path is installed), so stock's host view of a
   CPU tensor has the tensor's own storage, offset, sizes, strides and dtype: the programs write
   the tensor's memory and the copy-back copies each storage onto itself. The interpreter turns a
   tensor argument into its ``data_ptr()`` and dtype and nothing else, so a launch whose tensor
   arguments are all plain CPU ``torch.Tensor`` objects hands the programs the tensors themselves
   and copies nothing back. Any other launch (a tensor on another device or of a subclass, a
   ``TensorWrapper``, a tuple, a ``TensorDescriptor``, a kernel with pre-run hooks) takes the stock
   ``GridExecutor.__call__``.
3. **Per kernel, once**: the keyword names its function takes (stock: ``getfullargspec`` per
   launch) and its constexpr names (stock: annotations per launch).
4. **The dtype table, once**: ``_get_np_dtype`` (the numpy dtype of a Triton type, asked for by
   nearly every operation) builds its table of 18 entries on every call; the fast path builds
   the same table once and looks it up the same way.

5. **No dead overflow checks.** With ``sanitize_overflow`` on, every 32-bit integer ``+``, ``-``
   and ``*`` also computes the result in 64 bits, two bounds, two comparisons and their ``and``,
   and hands that to ``device_assert``, which returns at once unless the builder's ``debug``
   option is on (``TritonSemantic.device_assert``): the check's values are never read. A compiled
   kernel's IR carries the same dead check, removed by the compiler. The fast path sets the
   interpreter builder's ``sanitize_overflow`` off while ``debug`` is off (stock's default), and
   puts stock's options back when it is disabled.

Installed by the runtime's ``.pth`` (:func:`xpu_laguna_triton_cpu.install`) unless
``VXL_TRITON_STOCK_INTERPRETER=1``, under Triton 3.9.0 only (whose code it repeats);
:func:`stock` runs the stock interpreter for a while in the same process (the replay test
compares the two). No Triton file is edited.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

STOCK_ENV = "VXL_TRITON_STOCK_INTERPRETER"
TRITON_RELEASE = "3.9.0"
"""The Triton whose interpreter code the fast path repeats (``GridExecutor.__call__``,
``_get_np_dtype``); under another release the stock interpreter runs."""


class _Keep:
    """The scope a launch restores when the language stays patched: nothing."""

    def restore(self) -> None:
        pass


_KEEP = _Keep()


class FastPath:
    """The fast path over one interpreter module: :meth:`enable`, :meth:`disable`."""

    def __init__(self, module: Any) -> None:
        import torch

        self.module = module
        self.stock_patch_lang = module._patch_lang
        self.stock_executor = module.GridExecutor
        self.stock_get_np_dtype = module._get_np_dtype
        self.stock_options = module.interpreter_builder.options
        self.tensor_type = torch.Tensor
        self.scope: Any = None  # the stock scope of the one patch, while the language is patched
        self.specs: dict[tuple[Any, tuple[str, ...]], tuple[frozenset[str], list[str]]] = {}
        self.enabled = False
        self.seconds = 0.0  # in launches through this path (fast or its stock fallback), this process
        self.launches = 0
        self.executor = _executor_class(self)
        self.get_np_dtype = _np_dtype_lookup(module)
        probe = torch.empty(1).untyped_storage()
        self.aliases_cpu = probe.cpu() is probe  # cut 2's premise, else every launch goes stock

    def enable(self) -> None:
        self.module._patch_lang = self.patch_lang
        self.module.GridExecutor = self.executor
        self.module._get_np_dtype = self.get_np_dtype
        if not self.stock_options.debug:  # cut 5: the overflow check feeds only a debug assert
            self.module.interpreter_builder.options = dataclasses.replace(self.stock_options, sanitize_overflow=False)
        self.enabled = True

    def disable(self) -> None:
        self.module._patch_lang = self.stock_patch_lang
        self.module.GridExecutor = self.stock_executor
        self.module._get_np_dtype = self.stock_get_np_dtype
        self.module.interpreter_builder.options = self.stock_options
        self.unpatch()
        self.enabled = False

    def unpatch(self) -> None:
        scope, self.scope = self.scope, None
        if scope is not None:
            scope.restore()

    def patch_lang(self, fn: Any) -> Any:
        """Stands for the interpreter's ``_patch_lang``: patch once, restore nothing."""
        m = self.module
        if not m.triton.knobs.runtime.interpret:
            self.unpatch()
            return self.stock_patch_lang(fn)
        assert any(v is m.tl or v is m.tl.core for v in fn.__globals__.values()), (
            "triton.language must be visible from within jit'd function"
        )
        if self.scope is None:
            self.patch()
        return _KEEP

    def patch(self) -> None:
        """The one patch: stock's, for a function that sees both ``tl`` and ``tl.core``."""
        m = self.module
        if self.scope is None:
            sees_both = types.FunctionType(_nothing.__code__, {"tl": m.tl, "core": m.tl.core})
            self.scope = self.stock_patch_lang(sees_both)

    def spec(self, fn: Any, arg_names: list[str]) -> tuple[frozenset[str], list[str]]:
        """The keyword names ``fn`` takes and its constexpr names, as stock computes them."""
        key = (fn, tuple(arg_names))
        found = self.specs.get(key)
        if found is None:
            from triton.runtime.jit import _normalize_ty

            argspec = inspect.getfullargspec(fn)
            annotations = {name: _normalize_ty(ty) for name, ty in inspect.get_annotations(fn).items()}
            constexprs = [name for name in arg_names if annotations.get(name) == "constexpr"]
            found = self.specs[key] = (frozenset(argspec.args) | frozenset(argspec.kwonlyargs), constexprs)
        return found

    def plain(self, values: Iterable[Any]) -> bool:
        """Whether stock's host copy of every value is the value itself or a view of its storage."""
        if not self.aliases_cpu:
            return False
        descriptor = self.module.TensorDescriptor
        for value in values:
            if type(value) is self.tensor_type:
                if not value.is_cpu:
                    return False
            elif isinstance(value, (tuple, descriptor)) or hasattr(value, "data_ptr"):
                return False
        return True

    def host_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """What the programs get for a plain launch: the arguments themselves (cut 2)."""
        return args, kwargs


def _nothing() -> None:
    pass


def _np_dtype_lookup(module: Any) -> Any:
    """Stock ``_get_np_dtype`` with its table built once, at the first call (the interpreter
    module runs while ``triton.language`` is still being imported): the same entries, the same
    lookups."""
    tables: list[tuple[Any, Any, Any, dict[Any, Any]]] = []

    def table() -> tuple[Any, Any, Any, dict[Any, Any]]:
        np, tl = module.np, module.tl
        entries = {
            tl.int1: np.dtype(bool),
            tl.float16: np.dtype(np.float16),
            tl.float32: np.dtype(np.float32),
            tl.float64: np.dtype(np.float64),
            tl.int8: np.dtype(np.int8),
            tl.uint8: np.dtype(np.uint8),
            tl.int16: np.dtype(np.int16),
            tl.uint16: np.dtype(np.uint16),
            tl.int32: np.dtype(np.int32),
            tl.uint32: np.dtype(np.uint32),
            tl.int64: np.dtype(np.int64),
            tl.uint64: np.dtype(np.uint64),
            tl.bfloat16: np.dtype(np.uint16),  # stored as uint16
            tl.float8e5: np.dtype(np.uint8),  # the float8 types stored as uint8
            tl.float8e5b16: np.dtype(np.uint8),
            tl.float8e4nv: np.dtype(np.uint8),
            tl.float8e4b8: np.dtype(np.uint8),
            tl.float8e4b15: np.dtype(np.uint8),
        }
        tables.append((tl.pointer_type, tl.block_type, np.dtype(np.uint64), entries))
        return tables[0]

    def _get_np_dtype(tt_dtype: Any) -> Any:
        pointer_type, block_type, pointer, entries = tables[0] if tables else table()
        if isinstance(tt_dtype, pointer_type):
            return pointer
        if isinstance(tt_dtype, block_type):
            if isinstance(tt_dtype.element_ty, pointer_type):
                return pointer
            return entries[tt_dtype.element_ty]
        return entries[tt_dtype]

    return _get_np_dtype


def _executor_class(fast: FastPath) -> Any:
    stock = fast.stock_executor
    m = fast.module

    class FastGridExecutor(stock):  # type: ignore[misc,valid-type]
        """``GridExecutor`` with cuts 2 and 3; its ``__call__`` is stock's, less what they cut."""

        def __init__(self, fn: Any, arg_names: list[str], grid: Any, pre_run_hooks: Any = ()) -> None:
            self.fn, self.arg_names, self.grid, self.pre_run_hooks = fn, arg_names, grid, pre_run_hooks
            self.kwarg_names, self.constexprs = fast.spec(fn, arg_names)

        def __call__(self, *args_dev: Any, **kwargs: Any) -> None:
            began = time.perf_counter()
            try:
                self.launch(*args_dev, **kwargs)
            finally:
                fast.seconds += time.perf_counter() - began
                fast.launches += 1

        def launch(self, *args_dev: Any, **kwargs: Any) -> None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.kwarg_names}
            if self.pre_run_hooks or not (fast.plain(args_dev) and fast.plain(kwargs.values())):
                stock.__call__(self, *args_dev, **kwargs)
                return
            args_hst, kwargs_hst = fast.host_args(args_dev, kwargs)
            patch_scope = m._patch_lang(self.fn)
            try:
                args = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
                args = {name: arg if name in self.constexprs else m._implicit_cvt(arg) for name, arg in args.items()}
                grid = self.grid(args) if callable(self.grid) else self.grid
                assert len(grid) <= 3, "grid must have at most 3 dimensions"
                grid = grid + (1,) * (3 - len(grid))
                m.interpreter_builder.set_grid_dim(*grid)
                try:
                    for x in range(grid[0]):
                        for y in range(grid[1]):
                            for z in range(grid[2]):
                                m.interpreter_builder.set_grid_idx(x, y, z)
                                self.fn(**args)
                except Exception as e:
                    if m.triton.knobs.compilation.front_end_debugging:
                        raise
                    raise m.InterpreterError(repr(e)) from e
            finally:
                patch_scope.restore()

    return FastGridExecutor


_FAST: FastPath | None = None


def _fix(module: Any) -> None:
    global _FAST
    if not module.triton.knobs.runtime.interpret or module.triton.__version__ != TRITON_RELEASE:
        return
    try:
        import torch  # noqa: F401
    except ImportError:  # nothing to launch on
        return
    _FAST = FastPath(module)
    _FAST.enable()


def installed() -> FastPath | None:
    """The fast path of this process, None where the stock interpreter runs."""
    return _FAST


def launch_time() -> dict[str, float | int]:
    """Seconds spent in interpreted kernel launches in this process and their count (the matrix
    reports them per leg); empty where the fast path is not installed."""
    if _FAST is None:
        return {}
    return {"seconds": _FAST.seconds, "launches": _FAST.launches}


@contextmanager
def stock() -> Iterator[None]:
    """The stock interpreter inside the block, the fast path again after it (when installed)."""
    fast = _FAST
    if fast is None or not fast.enabled:
        yield
        return
    fast.disable()
    try:
        yield
    finally:
        fast.enable()
        if fast.module.triton.knobs.runtime.interpret:
            fast.patch()  # now, not in the next launch (a timed one, in the bench)


def install() -> None:
    if os.environ.get(STOCK_ENV, "") == "1":
        return
    from .interpreter_hook import after_import

    after_import(_fix)
