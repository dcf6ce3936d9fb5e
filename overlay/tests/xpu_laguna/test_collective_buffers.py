# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The collective breaks' preallocated slots: handed out in order per
capture, refused (never grown) when a capture needs more or bigger ones."""

from __future__ import annotations

import pytest
import torch

from vllm.compilation.xpu_breakable_graph.collective_buffers import (
    CollectiveBuffers,
    collective_buffers_for,
)
from vllm.compilation.xpu_breakable_graph.errors import BreakableGraphError


def _slots(count: int = 3) -> CollectiveBuffers:
    return CollectiveBuffers(
        count, rows=8, hidden=16, world_size=2, dtype=torch.float32,
        device=torch.device("cpu"),
    )


def test_slots_in_order_and_again_per_capture() -> None:
    slots = _slots()
    x = torch.zeros(8, 16)
    taken = [slots.take(x) for _ in range(3)]
    assert [out.data_ptr() for out, _ in taken] == [
        b.data_ptr() for b in slots.outputs
    ]
    assert all(out.shape == x.shape for out, _ in taken)
    assert [g.numel() for _, g in taken] == [2 * 8 * 16] * 3
    slots.begin()
    out, _ = slots.take(torch.zeros(1, 16))  # a smaller batch: a view of slot 0
    assert out.data_ptr() == slots.outputs[0].data_ptr() and out.shape == (1, 16)


def test_more_breaks_than_expected_is_refused() -> None:
    slots = _slots(count=1)
    slots.take(torch.zeros(8, 16))
    with pytest.raises(BreakableGraphError, match="more than the 1 collective"):
        slots.take(torch.zeros(8, 16))


def test_bigger_or_other_dtype_is_refused() -> None:
    slots = _slots()
    with pytest.raises(BreakableGraphError, match="does not fit"):
        slots.take(torch.zeros(9, 16))
    with pytest.raises(BreakableGraphError, match="does not fit"):
        slots.take(torch.zeros(8, 16, dtype=torch.bfloat16))


def test_no_slots_without_collectives() -> None:
    cpu = torch.device("cpu")
    assert collective_buffers_for(0, 8, 16, 2, torch.float32, cpu) is None
    assert collective_buffers_for(5, 8, 16, 1, torch.float32, cpu) is None
    assert collective_buffers_for(5, 8, 16, 4, torch.float32, cpu).count == 5
