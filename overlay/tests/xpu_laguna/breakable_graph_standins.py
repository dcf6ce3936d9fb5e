# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A CPU stand-in for a device graph with the semantics that matter.

Between ``capture_begin`` and ``capture_end`` a device graph records kernels
without running them: their outputs hold garbage and in-place writes do not
happen. ``RecordingGraph`` reproduces that with a dispatch mode: every ATen
or custom op is recorded, its outputs are poisoned with NaN and the writes
of mutating ops are undone (it is run once to learn its outputs); ``replay``
runs the recorded ops on the same tensors, writing their results into the
recorded outputs. View ops only alias
storage and are not recorded.

Breaks reached through the dispatcher (vLLM's opaque attention op) run for
real inside the mode: with :func:`recording_capture` entered around the whole
capture one mode stays installed and the graphs only switch which of them
records, so the eager break can close and open segments from inside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Ops that are eager breaks when a breakable capture is active.
BREAK_OPS = frozenset(
    {"vllm::unified_attention_with_output", "vllm::unified_mla_attention_with_output"}
)


def _written_tensors(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    """The tensors a mutating op writes (``Tensor(a!)`` arguments)."""
    out: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return out


def _poison(out: Any, keep: list[torch.Tensor]) -> None:
    for t in tree_flatten(out)[0]:
        if (
            isinstance(t, torch.Tensor)
            and t.dtype.is_floating_point
            and not any(t is k for k in keep)
        ):
            t.fill_(float("nan"))  # recorded, not computed yet


class Recorder(TorchDispatchMode):
    def __init__(self, graph: RecordingGraph | None = None) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        graph = self.graph
        if graph is None or func.name() in BREAK_OPS or func.is_view:
            return func(*args, **kwargs)
        if func._schema.is_mutable:
            # Run it to learn its outputs, then undo its writes: a recorded
            # kernel leaves the memory it would write untouched.
            written = _written_tensors(func, args, kwargs)
            saved = [t.clone() for t in written]
            out = func(*args, **kwargs)
            for t, s in zip(written, saved):
                t.copy_(s)
            _poison(out, written)
        else:
            out = func(*args, **kwargs)
            _poison(out, [])
        graph.ops.append((func, args, kwargs, out))
        return out


class RecordingGraph:
    """``capture_begin / capture_end / replay`` with record-not-run capture."""

    shared: Recorder | None = None  # set by recording_capture()
    created: list[RecordingGraph] = []

    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = []
        self.replays = 0
        self._own: Recorder | None = None
        RecordingGraph.created.append(self)

    def capture_begin(self, pool: Any = None) -> None:
        if RecordingGraph.shared is not None:
            assert RecordingGraph.shared.graph is None
            RecordingGraph.shared.graph = self
        else:
            self._own = Recorder(self)
            self._own.__enter__()

    def capture_end(self) -> None:
        if RecordingGraph.shared is not None:
            assert RecordingGraph.shared.graph is self
            RecordingGraph.shared.graph = None
        else:
            assert self._own is not None
            self._own.__exit__(None, None, None)
            self._own = None

    def replay(self) -> None:
        self.replays += 1
        for func, args, kwargs, out in self.ops:
            res = func(*args, **kwargs)
            for dst, src in zip(tree_flatten(out)[0], tree_flatten(res)[0]):
                if isinstance(dst, torch.Tensor) and dst is not src:
                    dst.copy_(src)


@contextlib.contextmanager
def recording_capture() -> Iterator[None]:
    """One recorder installed for a whole breakable capture."""
    rec = Recorder()
    RecordingGraph.shared = rec
    try:
        with rec:
            yield
    finally:
        RecordingGraph.shared = None
