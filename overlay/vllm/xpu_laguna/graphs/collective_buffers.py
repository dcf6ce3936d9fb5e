# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Buffers of the collective breaks, allocated before any capture.

Every tensor-parallel all-reduce inside a breakable capture is an eager
break that writes its sum into a buffer the capture owns (the next graph
segment reads that address on every replay). On the exact path the break
also needs scratch for the fixed rank-order sum (every rank's input
gathered, or for large messages every rank's copy of its own slice): a
gather buffer of N times the output, which holds either. Allocating either
inside a forward is what the reference lab saw deadlock a four-rank startup
after XCCL's topology discovery, and it would put device allocations between
the segments of a capture; so the wrapper allocates one output and one gather slot per
expected collective when it is built (at model load, before the first
capture), and each capture hands them out in order.

The number of slots is the expected topology's collective count (2L + 1 for
a Laguna decoder at TP > 1: the embedding, and the attention output and the
MLP/MoE output of each layer); each slot holds the largest captured batch
(the largest capture size) of the model's hidden size. A break bigger than
a slot is refused in one line. A capture with more collective breaks than
slots differs from the expected topology, which the capture check refuses
right after that capture (with the counts); its surplus breaks get buffers
allocated at capture so that the forward can finish and be reported, and no
such capture is ever replayed.
"""

from __future__ import annotations

import torch

from vllm.xpu_laguna.graphs.errors import BreakableGraphError


class CollectiveBuffers:
    """``count`` preallocated (output, gather) slots of ``rows x hidden``."""

    def __init__(
        self,
        count: int,
        rows: int,
        hidden: int,
        world_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if count < 1 or rows < 1 or hidden < 1 or world_size < 2:
            raise ValueError(
                f"bad collective buffers: count={count} rows={rows} "
                f"hidden={hidden} world_size={world_size}"
            )
        self.rows = rows
        self.hidden = hidden
        self.world_size = world_size
        self.dtype = dtype
        self.outputs = [
            torch.empty(rows * hidden, dtype=dtype, device=device) for _ in range(count)
        ]
        self.gathers = [
            torch.empty(world_size * rows * hidden, dtype=dtype, device=device)
            for _ in range(count)
        ]
        self._next = 0

    @property
    def count(self) -> int:
        return len(self.outputs)

    @property
    def capacity(self) -> int:
        """Elements one slot's output holds."""
        return self.rows * self.hidden

    def begin(self) -> None:
        """Start handing out slots for a new capture (from slot 0 again:
        captures replay one at a time, so they may share slots)."""
        self._next = 0

    def take(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The next slot's output (shaped like ``input_``) and gather buffer;
        None once every slot is taken (more breaks than expected: the
        topology check refuses this capture)."""
        if input_.dtype != self.dtype or input_.numel() > self.capacity:
            raise BreakableGraphError(
                f"collective break of {tuple(input_.shape)} {input_.dtype} does "
                f"not fit the preallocated slots ({self.rows} x {self.hidden} "
                f"{self.dtype}): the capture size or the hidden size is not the "
                "one the wrapper was built for"
            )
        if self._next >= self.count:
            return None
        slot = self._next
        self._next += 1
        out = self.outputs[slot][: input_.numel()].view(input_.shape)
        return out, self.gathers[slot]


def collective_buffers_for(
    expected_collectives: int,
    rows: int,
    hidden: int,
    world_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> CollectiveBuffers | None:
    """Slots for a wrapper, or None where no collective breaks happen (TP 1,
    or a model whose topology is unknown: its breaks allocate at first
    capture as upstream's do)."""
    if world_size < 2 or expected_collectives < 1:
        return None
    return CollectiveBuffers(
        expected_collectives, rows, hidden, world_size, dtype, device
    )
