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
        count,
        rows=8,
        hidden=16,
        world_size=2,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )


def test_slots_in_order_and_again_per_capture() -> None:
    slots = _slots()
    x = torch.zeros(8, 16)
    taken = [slots.take(x) for _ in range(3)]
    assert all(t is not None for t in taken)
    assert [out.data_ptr() for out, _ in taken] == [b.data_ptr() for b in slots.outputs]
    assert all(out.shape == x.shape for out, _ in taken)
    assert [g.numel() for _, g in taken] == [2 * 8 * 16] * 3
    slots.begin()
    out, _ = slots.take(torch.zeros(1, 16)) or (None, None)  # smaller: a view of slot 0
    assert out is not None
    assert out.data_ptr() == slots.outputs[0].data_ptr() and out.shape == (1, 16)


def test_more_breaks_than_expected_get_no_slot() -> None:
    """The surplus break gets no slot (the capture's topology check then
    refuses the capture: test_breakable_graph_laguna's 2L control)."""
    slots = _slots(count=1)
    assert slots.take(torch.zeros(8, 16)) is not None
    assert slots.take(torch.zeros(8, 16)) is None


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
