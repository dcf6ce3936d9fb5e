# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tensor-parallel all-reduce as an eager break that reduces in place into
a buffer owned by the capture.

On the exact path (``vllm.xpu_laguna.collectives``: exact
verify and the ``exact_tp_reduce`` option on, TP > 1) the break runs the
fixed rank-order sum, the same arithmetic the series' communicator's
all-reduce runs outside a capture (``SeriesAllReduce``), so a replayed verify step and
an eager teacher decode sum every element in the same order. The break count
is unchanged (one break per all-reduce: 2L + 1 at TP > 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed

from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.xpu_laguna import collectives as exact_collectives
from vllm.xpu_laguna.graphs.capture import XpuBreakableGraphCapture
from vllm.xpu_laguna.graphs.topology import BreakKind

if TYPE_CHECKING:
    from collections.abc import Callable

    from vllm.xpu_laguna.collectives import SeriesAllReduce


def all_reduce_into(
    input_: torch.Tensor,
    out: torch.Tensor,
    group: SeriesAllReduce,
    gathered: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum ``input_`` across ``group`` into the caller-owned ``out``: the
    way the group's series communicator reduces (the exact rank-order sum;
    on CPU, the test-side XCCL ring stand-in) when its mode says so, with
    the caller-owned ``gathered`` as its scratch; else the plain in-place
    all-reduce."""
    if exact_collectives.all_reduce_into(input_, out, group, gathered) is not None:
        return out
    out.copy_(input_)
    torch.distributed.all_reduce(out, group=group.device_group)
    return out


def breakable_all_reduce(
    input_: torch.Tensor,
    group: SeriesAllReduce,
    eager: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Tensor-parallel all-reduce for breakable graphs: the series'
    communicators' ``all_reduce`` (``XpuLagunaCommunicator``; the CPU
    runtime's stand-in communicator).

    Outside the series' capture it is ``eager(input_)``, the communicator's
    own all-reduce. During a capture it closes the graph segment, reduces
    eagerly into a buffer owned by the capture (allocated outside the graph
    pool, reused on every replay) and opens the next segment, which then
    reads that buffer's address.
    """
    if torch.compiler.is_compiling() or group.world_size == 1:
        return eager(input_)  # traced by torch.compile; or nothing to break
    capture = BreakableCUDAGraphCapture.current()
    if capture is None or not capture._capturing:
        return eager(input_)
    if (
        is_forward_context_available()
        and get_forward_context().cudagraph_runtime_mode == CUDAGraphMode.FULL
    ):
        return eager(input_)
    if not isinstance(capture, XpuBreakableGraphCapture):
        # upstream's breakable capture (a model the series is not for, or
        # its options off: preset_breakable_runner left upstream's wrapper
        # to V2's manager): upstream's all-reduce, as without it
        return eager(input_)
    buffers = capture.collective_buffers
    owned: list[torch.Tensor] = []
    gathered: torch.Tensor | None = None
    slot = buffers.take(input_) if buffers is not None else None
    if slot is not None:
        owned.append(slot[0])
        gathered = slot[1]

    def reduce_in_place() -> torch.Tensor:
        # no preallocated slot: unknown topology, or more breaks than the
        # expected topology (that capture is refused by its topology check)
        if not owned:
            owned.append(
                torch.empty(input_.shape, dtype=input_.dtype, device=input_.device)
            )
        return all_reduce_into(input_, owned[0], group, gathered)

    return capture.add_eager(reduce_in_place, kind=BreakKind.COLLECTIVE, in_place=True)
