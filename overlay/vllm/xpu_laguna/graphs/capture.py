# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The breakable capture: graph segments between eager breaks, accounting
by break kind, the segment ceiling, first-capture materialisation and the
address checks of eager-break results on replay."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend
from vllm.xpu_laguna.graphs.collective_buffers import CollectiveBuffers
from vllm.xpu_laguna.graphs.errors import (
    CaptureCeilingError,
    OutOfPlaceBreakError,
    TopologyMismatchError,
)
from vllm.xpu_laguna.graphs.guards import (
    TensorIdentity,
    _result_pointers,
    first_difference,
)
from vllm.xpu_laguna.graphs.topology import BreakKind, ExpectedTopology


@dataclasses.dataclass
class _Segment:
    kind: BreakKind
    fn: Callable[[], Any]
    result: list[TensorIdentity] | None = None
    # The next segment reads this break's result: check it on every replay
    # (False for breaks that return None or write in place by construction).
    checked: bool = False
    # The capture-time result of an eager break, kept alive so that a
    # fresh tensor returned on replay can never reuse its address and slip
    # past the check (in-place breaks return memory that is alive anyway).
    keep_alive: Any = None


class XpuBreakableGraphCapture(BreakableCUDAGraphCapture):
    """:class:`BreakableCUDAGraphCapture` with an explicit graph backend,
    break accounting by kind, a segment ceiling, materialisation of each
    closed segment and address checks of eager breaks on replay.

    It registers in the upstream capture's thread-local slot, so ops
    decorated with ``eager_break_during_capture`` break here too; those
    are attention ops and are counted as :attr:`BreakKind.ATTENTION`.
    """

    def __init__(
        self,
        pool: Any | None = None,
        *,
        backend: DeviceGraphBackend,
        expected: ExpectedTopology | None = None,
        max_segments: int | None = None,
        materialize: bool = True,
        collective_buffers: CollectiveBuffers | None = None,
    ) -> None:
        super().__init__(pool=pool)
        self.backend = backend
        # Output and gather slots of the collective breaks, allocated by the
        # wrapper before any capture (None: the break allocates at capture).
        self.collective_buffers = collective_buffers
        if collective_buffers is not None:
            collective_buffers.begin()
        self.expected = expected
        if max_segments is None and expected is not None:
            max_segments = expected.ceiling
        self.max_segments = max_segments
        self.materialize = materialize
        self.counts: Counter[BreakKind] = Counter()
        self.records: list[_Segment] = []
        self.replays = 0
        self._all_unchecked = False

    # --- segments ----------------------------------------------------------

    def _begin_segment(self) -> None:
        assert not self._capturing
        graph = self.backend.graph_factory()
        if self.pool is not None:
            graph.capture_begin(pool=self.pool)
        else:
            graph.capture_begin()
        self._current_graph = graph
        self._capturing = True

    def _end_segment(self, materialize: bool | None = None) -> None:
        if not self._capturing:
            return
        graph = self._current_graph
        assert graph is not None
        graph.capture_end()
        self._current_graph = None
        self._capturing = False
        self.segments.append(graph.replay)
        self.records.append(_Segment(BreakKind.GRAPH, graph.replay))
        self._num_graphs += 1
        self.counts[BreakKind.GRAPH] += 1
        if self.materialize if materialize is None else materialize:
            # Captured kernels were recorded, not run: run them once now so
            # the eager break that follows (or the caller) reads real values.
            graph.replay()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._end_segment(materialize=None if exc_type is None else False)
        finally:
            BreakableCUDAGraphCapture._tls.active = None

    def add_eager(
        self,
        fn: Callable[[], Any],
        kind: BreakKind = BreakKind.ATTENTION,
        in_place: bool = False,
    ) -> Any:
        """``in_place``: ``fn`` returns the same tensor object on every call
        (its result needs no check on replay)."""
        self._end_segment()
        result = fn()
        self.segments.append(fn)
        checked = result is not None and not in_place
        self.records.append(
            _Segment(kind, fn, _result_pointers(result), checked, result)
        )
        self._num_eager_breaks += 1
        self.counts[kind] += 1
        num_segments = len(self.records) + 1  # + the segment opened next
        if self.max_segments is not None and num_segments > self.max_segments:
            raise CaptureCeilingError(
                f"capture exceeds its ceiling of {self.max_segments} segments "
                f"({self.describe()}); refusing it"
            )
        self._begin_segment()
        return result

    # --- replay ------------------------------------------------------------

    def finish(self) -> None:
        """Called once the capture is complete: picks the replay loop."""
        self._all_unchecked = not any(seg.checked for seg in self.records)

    def replay(self, debug: bool = False) -> None:
        """Run the segments in order. By default only the results of breaks
        that the next segment reads and that are not in place by
        construction are checked; ``debug`` checks every break's result."""
        self.replays += 1
        if not debug and self._all_unchecked:
            for fn in self.segments:
                fn()
            return
        num_breaks = 0
        for seg in self.records:
            result = seg.fn()
            if seg.result is None:
                continue
            num_breaks += 1
            if not (debug or seg.checked) or result is seg.keep_alive:
                continue  # the same object (or None): in place by construction
            now = _result_pointers(result)
            if now != seg.result:
                diff = first_difference(seg.result, now)
                raise OutOfPlaceBreakError(
                    f"eager break {num_breaks} ({seg.kind.value}) returned other "
                    f"memory than during capture: {diff}; the next graph "
                    "segment would read stale memory (break must write in place)"
                )

    # --- accounting --------------------------------------------------------

    @property
    def kinds(self) -> list[BreakKind]:
        return [seg.kind for seg in self.records]

    def break_counts(self) -> dict[str, int]:
        return {k.value: self.counts.get(k, 0) for k in BreakKind}

    def describe(self) -> str:
        c = self.break_counts()
        return (
            f"graphs={c['graph']} breaks={self._num_eager_breaks} "
            f"(attention={c['attention']} collective={c['collective']})"
        )

    def check_topology(self) -> None:
        """Raise unless the counts match the expected topology (if known)."""
        if self._num_graphs != self._num_eager_breaks + 1:
            raise TopologyMismatchError(f"graphs must be breaks + 1: {self.describe()}")
        exp = self.expected
        if exp is None:
            return
        c = self.break_counts()
        if (c["attention"], c["collective"], c["graph"]) != (
            exp.attention,
            exp.collective,
            exp.graphs,
        ):
            raise TopologyMismatchError(
                f"capture {self.describe()} differs from the expected "
                f"graphs={exp.graphs} breaks={exp.breaks} (attention="
                f"{exp.attention} collective={exp.collective})"
            )

    def audit_line(self, label: str) -> str:
        exp = self.expected
        expected = (
            f"expected graphs={exp.graphs} breaks={exp.breaks} (attention="
            f"{exp.attention} collective={exp.collective}) ceiling="
            f"{exp.ceiling} segments"
            if exp is not None
            else "expected topology unknown (unchecked)"
        )
        return (
            f"breakable {self.backend.name} graph captured {label}: "
            f"{self.describe()}; {expected}; "
            f"materialised={'yes' if self.materialize else 'no'}"
        )
