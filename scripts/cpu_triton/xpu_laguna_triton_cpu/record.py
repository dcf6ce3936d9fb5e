"""Record the kernel launches of a run, to replay them (:mod:`.replay`).

Opt-in: with ``VXL_TRITON_RECORD=DIR`` in the environment of a runtime's process (engine cores
and workers inherit it), every launch of an interpreted kernel is counted, and the first
``VXL_TRITON_RECORD_LIMIT`` (default 6) distinct launches of each kernel are saved, before they
run, as ``DIR/launches/<pid>-<n>.pt``: the kernel (module and qualified name of its function),
its arguments (every tensor as a view of a clone of its whole storage: tensors that share a
storage share the clone, so a kernel that writes one view and reads another replays as it ran;
a ``uint64`` tensor is a table of pointers, and the storages its entries point into are saved
too, with where each entry points; scalars and constexprs as they are) and its grid (a
callable grid as the tuple it returned).
Distinct: another kernel, tensor dtypes, sizes or strides, another constexpr, flag or string,
another fixed grid (integer and float values are not told apart: they change every step).
``DIR/counts-<pid>.json`` counts every kernel's launches, those saved, and those not saved
with why (arguments the replay cannot rebuild, storages over 64 MiB).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RECORD_ENV = "VXL_TRITON_RECORD"
LIMIT_ENV = "VXL_TRITON_RECORD_LIMIT"
DEFAULT_LIMIT = 6
MAX_BYTES = 64 << 20
LAUNCHES = "launches"
COUNTS_GLOB = "counts-*.json"


def kernel_name(function: Any) -> str:
    """``module:qualname`` of a kernel's Python function (how :mod:`.replay` finds it again)."""
    return f"{function.__module__}:{function.__qualname__}"


class Unsupported(Exception):
    """An argument the replay could not rebuild."""


class Recorder:
    def __init__(self, directory: Path, limit: int) -> None:
        self.directory, self.limit = directory, limit
        (directory / LAUNCHES).mkdir(parents=True, exist_ok=True)
        self.forked()
        os.register_at_fork(after_in_child=self.forked)

    def forked(self) -> None:
        """A process of its own (a fork starts again): its counts, its files."""
        self.counts: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, set[Any]] = {}
        self.seq = itertools.count()
        self.pid = os.getpid()

    def _count(self, name: str) -> dict[str, Any]:
        return self.counts.setdefault(name, {"launches": 0, "saved": 0, "not_saved": {}})

    def write_counts(self) -> None:
        if not self.counts:
            return
        path = self.directory / f"counts-{self.pid}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.counts, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)

    def launch(self, run: Any, kernel: Any, args: tuple[Any, ...], grid: Any, kwargs: dict[str, Any]) -> Any:
        name = kernel_name(kernel.fn)
        count = self._count(name)
        count["launches"] += 1
        seen = self.keys.setdefault(name, set())
        entry = None
        if len(seen) < self.limit:
            key = _key(args, kwargs, grid)
            if key not in seen:
                try:
                    entry = _capture(name, args, kwargs)
                except Unsupported as e:
                    count["not_saved"][str(e)] = count["not_saved"].get(str(e), 0) + 1
                seen.add(key)
        if entry is None:
            if count["launches"] % 64 == 1:
                self.write_counts()
            return run(kernel, *args, grid=grid, warmup=False, **kwargs)
        resolved: list[tuple[int, ...]] = []
        launch_grid = grid
        if callable(grid):

            def launch_grid(meta: dict[str, Any]) -> Any:
                value = grid(meta)
                resolved.append(tuple(value))
                return value

        result = run(kernel, *args, grid=launch_grid, warmup=False, **kwargs)
        entry["grid"] = resolved[0] if callable(grid) else tuple(grid)
        import torch

        path = self.directory / LAUNCHES / f"{self.pid}-{next(self.seq)}.pt"
        try:
            torch.save(entry, path)
            count["saved"] += 1
        except Exception as e:  # an argument pickle cannot write: the run goes on, the count says so
            path.unlink(missing_ok=True)
            why = f"not saved: {type(e).__name__}"
            count["not_saved"][why] = count["not_saved"].get(why, 0) + 1
        self.write_counts()
        return result


def _key(args: tuple[Any, ...], kwargs: dict[str, Any], grid: Any) -> Any:
    def one(value: Any) -> Any:
        if hasattr(value, "data_ptr") and hasattr(value, "stride"):
            return ("tensor", str(value.dtype), tuple(value.shape), tuple(value.stride()))
        if isinstance(value, (bool, str)) or value is None:
            return value
        if isinstance(value, (int, float)):
            return type(value).__name__
        return repr(value)

    fixed = None if callable(grid) else repr(grid)
    return (tuple(one(a) for a in args), tuple((k, one(v)) for k, v in sorted(kwargs.items())), fixed)


def _capture(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The launch's arguments, with a clone of every storage they point into."""
    import torch

    storages: list[Any] = []
    where: dict[tuple[int, int], int] = {}

    def index(storage: Any) -> int:
        key = (storage.data_ptr(), storage.nbytes())
        if key not in where:
            where[key] = len(storages)
            storages.append(storage)
        return where[key]

    def one(value: Any) -> Any:
        if type(value) is torch.Tensor:
            if not value.is_cpu:
                raise Unsupported(f"a tensor on {value.device}")
            arg = {
                "storage": index(value.untyped_storage()),
                "dtype": value.dtype,
                "offset": value.storage_offset(),
                "size": tuple(value.shape),
                "stride": tuple(value.stride()),
            }
            if value.dtype == torch.uint64:
                arg["pointers"] = [(i, *place) for i, place in enumerate(_pointed(_addresses(value), index))]
            return arg
        if isinstance(value, (tuple, list, dict)) or hasattr(value, "data_ptr"):
            raise Unsupported(f"an argument of type {type(value).__name__}")
        return {"value": value}

    entry = {"kernel": name, "args": [one(a) for a in args], "kwargs": {k: one(v) for k, v in kwargs.items()}}
    if sum(s.nbytes() for s in storages) > MAX_BYTES:
        raise Unsupported(f"storages over {MAX_BYTES >> 20} MiB")
    entry["storages"] = [torch.empty(0, dtype=torch.uint8).set_(s).clone() for s in storages]
    return entry


def _addresses(table: Any) -> list[int]:
    """A pointer table's entries (vLLM's V2 runner hands kernels the addresses of its block tables
    as a ``uint64`` tensor: ``BlockTables._make_ptr_tensor``)."""
    if table.dim() != 1:
        raise Unsupported("a uint64 tensor (a pointer table) that is not one-dimensional")
    return [int(v) for v in table.tolist()]


def _pointed(addresses: list[int], index: Any) -> list[tuple[int | None, int]]:
    """Per address, (storage index, byte offset) of the live CPU tensor storage it points into; a
    null pointer stays null."""
    import gc
    import warnings

    import torch

    found: dict[int, tuple[int | None, int]] = {0: (None, 0)}
    wanted = set(addresses) - set(found)
    with warnings.catch_warnings():  # isinstance() on a deprecated torch class warns
        warnings.simplefilter("ignore")
        live = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)] if wanted else []
    for obj in live:
        if not obj.is_cpu:
            continue
        try:
            storage = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without a storage (sparse, nested, ...)
            continue
        base = storage.data_ptr()
        for address in [a for a in wanted if base <= a < base + storage.nbytes()]:
            found[address] = (index(storage), address - base)
            wanted.discard(address)
        if not wanted:
            break
    if wanted:
        raise Unsupported("a pointer table entry that points into no live tensor")
    return [found[a] for a in addresses]


_RECORDER: Recorder | None = None


def _wrap(cls: Any, recorder: Recorder) -> Any:
    """Make ``cls.run`` (``InterpretedFunction.run``) record its launches; the stock ``run``."""
    run = cls.run

    def recorded_run(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        if warmup:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        return recorder.launch(run, self, args, grid, kwargs)

    cls.run = recorded_run
    return run


@contextmanager
def recording(directory: Path, limit: int = DEFAULT_LIMIT) -> Iterator[Recorder]:
    """Record this process's launches into ``directory`` inside the block (what
    ``VXL_TRITON_RECORD`` does for a whole process)."""
    from triton.runtime.interpreter import InterpretedFunction

    recorder = Recorder(directory, limit)
    run = _wrap(InterpretedFunction, recorder)
    try:
        yield recorder
    finally:
        InterpretedFunction.run = run
        recorder.write_counts()


def _fix(module: Any) -> None:
    global _RECORDER
    directory = os.environ.get(RECORD_ENV, "")
    if not directory or _RECORDER is not None:
        return
    recorder = _RECORDER = Recorder(Path(directory), int(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT)))
    atexit.register(recorder.write_counts)
    _wrap(module.InterpretedFunction, recorder)


def install() -> None:
    if os.environ.get(RECORD_ENV, ""):
        from .interpreter_hook import after_import

        after_import(_fix)
