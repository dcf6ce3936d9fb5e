# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The collective breaks' preallocated slots: handed out in order per
capture, refused (never grown) when a capture needs more or bigger ones; and
the collective break inside upstream's own breakable capture."""

from __future__ import annotations

import pytest
import torch

from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
from vllm.compilation.xpu_breakable_graph import config
from vllm.compilation.xpu_breakable_graph.collective_buffers import (
    CollectiveBuffers,
    collective_buffers_for,
)
from vllm.compilation.xpu_breakable_graph.collectives import breakable_all_reduce
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


class _TwoRankGroup:
    """A tensor-parallel group of 2 whose all-reduce doubles (and counts)."""

    world_size = 2

    def __init__(self) -> None:
        self.calls = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2


@pytest.fixture
def upstream_capture():
    """Upstream's breakable capture, active and capturing (its CUDA graph
    segments never begin: the break decides before any segment work)."""
    cap = BreakableCUDAGraphCapture()
    cap._capturing = True
    BreakableCUDAGraphCapture._tls.active = cap
    yield cap
    BreakableCUDAGraphCapture._tls.active = None


def test_upstream_capture_of_another_model_gets_upstreams_all_reduce(
    upstream_capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model the series is not for, with upstream's breakable graphs and
    the series' toggle set: the all-reduce upstream would run."""
    monkeypatch.setattr(config._scope, "decided", False)
    group, x = _TwoRankGroup(), torch.ones(2, 4)
    assert torch.equal(breakable_all_reduce(x, group), x * 2)
    assert group.calls == 1


def test_upstream_capture_of_laguna_is_refused(
    upstream_capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: in scope, upstream's capture cannot hold the series' break."""
    monkeypatch.setattr(config._scope, "decided", True)
    group = _TwoRankGroup()
    with pytest.raises(BreakableGraphError, match="upstream breakable capture"):
        breakable_all_reduce(torch.ones(2, 4), group)
    assert group.calls == 0
