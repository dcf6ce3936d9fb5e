"""Replay recorded kernel launches (:mod:`.record`) through the stock interpreter and the fast one.

Every replay starts from fresh clones of the launch's recorded storages; what it leaves is every
storage's bytes after the launch (whole storages: a program can write anywhere its pointers
reach). Two replays agree when every storage is the same bytes (compared as ``uint8``, so a NaN
equals the same NaN and a flipped payload bit is a difference).
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import fast_launch
from .record import COUNTS_GLOB, LAUNCHES


@dataclass
class Launch:
    path: Path
    kernel: str
    args: list[dict[str, Any]]
    kwargs: dict[str, dict[str, Any]]
    grid: tuple[int, ...]
    storages: list[Any]


@dataclass
class Comparison:
    kernels: int
    launches: int
    differ: list[tuple[Launch, list[int]]] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.kernels} kernels, {self.launches} launches compared"


def load(directory: Path) -> list[Launch]:
    import torch

    def order(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in path.stem.split("-"))

    launches = []
    for path in sorted((directory / LAUNCHES).glob("*.pt"), key=order):
        entry = torch.load(path, weights_only=False)
        launches.append(
            Launch(path, entry["kernel"], entry["args"], entry["kwargs"], tuple(entry["grid"]), entry["storages"])
        )
    return launches


def counts(directory: Path) -> dict[str, dict[str, Any]]:
    """Every recorded process's launch counts, per kernel, summed."""
    total: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob(COUNTS_GLOB)):
        for name, count in json.loads(path.read_text(encoding="utf-8")).items():
            into = total.setdefault(name, {"launches": 0, "saved": 0, "not_saved": {}})
            into["launches"] += count["launches"]
            into["saved"] += count["saved"]
            for why, n in count["not_saved"].items():
                into["not_saved"][why] = into["not_saved"].get(why, 0) + n
    return total


def resolve(name: str) -> Any:
    """The interpreted kernel a recorded name stands for (through autotuners and heuristics)."""
    from triton.runtime.interpreter import InterpretedFunction

    module_name, _, qualname = name.partition(":")
    if "<locals>" in qualname:
        raise LookupError(f"{name}: a kernel defined inside a function cannot be found again")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, InterpretedFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    if not isinstance(obj, InterpretedFunction):
        raise LookupError(f"{name}: {type(obj).__name__} is not an interpreted kernel")
    return obj


def materialize(launch: Launch) -> tuple[list[Any], dict[str, Any], list[Any], list[Any]]:
    """Fresh storages, the launch's arguments over them, and what :func:`settle` undoes after
    the launch: every pointer table pointed at the fresh storages."""
    import torch

    storages = [s.clone() for s in launch.storages]
    aimed: list[tuple[Any, int, int, int]] = []

    def one(arg: dict[str, Any]) -> Any:
        if "value" in arg:
            return arg["value"]
        view = torch.empty(0, dtype=arg["dtype"])
        view.set_(storages[arg["storage"]].untyped_storage(), arg["offset"], arg["size"], arg["stride"])
        for i, target, offset in arg.get("pointers", ()):
            if target is not None:
                recorded, address = int(view[i]), storages[target].data_ptr() + offset
                view[i] = address
                aimed.append((view, i, address, recorded))
        return view

    return [one(a) for a in launch.args], {k: one(v) for k, v in launch.kwargs.items()}, storages, aimed


def settle(aimed: list[Any]) -> None:
    """Pointer tables back to the recorded addresses (those a launch left alone), so that two
    replays' storages compare equal byte for byte."""
    for view, i, address, recorded in aimed:
        if int(view[i]) == address:
            view[i] = recorded


def run(launch: Launch, kernel: Any = None, clock: Callable[[], float] = time.perf_counter) -> tuple[float, list[Any]]:
    """Replay with the interpreter installed now: seconds the launch took on ``clock``, the
    storages after it."""
    kernel = resolve(launch.kernel) if kernel is None else kernel
    args, kwargs, storages, aimed = materialize(launch)
    start = clock()
    kernel.run(*args, grid=launch.grid, warmup=False, **kwargs)
    seconds = clock() - start
    settle(aimed)
    return seconds, storages


def run_fast(
    launch: Launch, kernel: Any = None, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, list[Any]]:
    fast = fast_launch.installed()
    if fast is None or not fast.enabled:
        raise RuntimeError("the interpreter's fast path is not installed in this process")
    return run(launch, kernel, clock)


def run_stock(
    launch: Launch, kernel: Any = None, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, list[Any]]:
    with fast_launch.stock():
        return run(launch, kernel, clock)


def differing(left: list[Any], right: list[Any]) -> list[int]:
    """Indexes of the storages whose bytes differ (all of them when the counts differ)."""
    import torch

    if len(left) != len(right):
        return list(range(max(len(left), len(right))))
    return [i for i, (a, b) in enumerate(zip(left, right)) if not torch.equal(a.view(torch.uint8), b.view(torch.uint8))]


Runner = Callable[[Launch, Any], tuple[float, list[Any]]]


def compare(launches: Iterable[Launch], fast: Runner = run_fast, stock: Runner = run_stock) -> Comparison:
    """Replay every launch both ways; the launches whose storages differ, with which."""
    launches = list(launches)
    result = Comparison(len({launch.kernel for launch in launches}), len(launches))
    for launch in launches:
        kernel = resolve(launch.kernel)
        _, expected = stock(launch, kernel)
        _, got = fast(launch, kernel)
        bad = differing(expected, got)
        if bad:
            result.differ.append((launch, bad))
    return result
