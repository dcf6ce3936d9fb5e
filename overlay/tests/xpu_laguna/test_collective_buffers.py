# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The collective breaks' preallocated slots: handed out in order per
capture, refused (never grown) when a capture needs more or bigger ones; and
the collective break inside upstream's own breakable capture (the wrapper
class, the series' or upstream's, is chosen from the config: a capture that
is not the series' gets upstream's all-reduce, whatever config is current)."""

from __future__ import annotations

import pytest
import torch
from breakable_graph_standins import RecordingGraph
from laguna_model_testlib import config_stand_in, series_options

from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
from vllm.config import set_current_vllm_config
from vllm.xpu_laguna import collectives as xc
from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend
from vllm.xpu_laguna.graphs.capture import XpuBreakableGraphCapture
from vllm.xpu_laguna.graphs.collective_buffers import (
    CollectiveBuffers,
    collective_buffers_for,
)
from vllm.xpu_laguna.graphs.collectives import breakable_all_reduce
from vllm.xpu_laguna.graphs.errors import BreakableGraphError


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


class _TwoRankGroup(xc.SeriesAllReduce):
    """A tensor-parallel group of 2 whose all-reduce doubles (and counts);
    a series communicator built in the exact path's mode."""

    unique_name = "tp:0"
    world_size = 2
    device_group = "GROUP"
    xpu_laguna_mode = xc.TpReduceMode.RANK_ORDER

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


CURRENT_CONFIGS = {
    "laguna_series": config_stand_in(series_options(breakable_graph=True)),
    "laguna_without": config_stand_in(None),
    "llama": config_stand_in(series_options(breakable_graph=True), "LlamaForCausalLM"),
    "none": None,
}


@pytest.mark.parametrize("current", CURRENT_CONFIGS)
def test_upstream_capture_gets_upstreams_all_reduce(upstream_capture, current) -> None:
    """Upstream's capture (the wrapper V2 builds for a config the series'
    breakable graphs are not on for) holds no series break: the all-reduce
    upstream would run, whatever config is current, a Laguna with the series
    included (the choice of capture was made from its config)."""
    group, x = _TwoRankGroup(), torch.ones(2, 4)
    with set_current_vllm_config(CURRENT_CONFIGS[current]):
        assert torch.equal(breakable_all_reduce(x, group, group.all_reduce), x * 2)
    assert group.calls == 1


def test_the_series_capture_breaks_into_its_own_buffer(monkeypatch) -> None:
    """Control: inside the series' capture the same call is an eager break
    that reduces (the group's mode: the rank-order sum) into a buffer the
    capture owns, not the group's all-reduce."""
    calls: list[tuple[int, ...]] = []

    def rank_order(input_, group, out=None, gathered=None):
        calls.append(tuple(input_.shape))
        return out.copy_(input_ * 2)

    monkeypatch.setattr(xc, "rank_order_all_reduce", rank_order)
    group, x = _TwoRankGroup(), torch.ones(2, 4)
    cap = XpuBreakableGraphCapture(
        backend=DeviceGraphBackend(name="recording", graph_factory=RecordingGraph)
    )
    with cap:
        out = breakable_all_reduce(x, group, group.all_reduce)
    assert group.calls == 0 and calls == [(2, 4)]
    assert out is not x and torch.equal(out, x * 2)
    assert cap.break_counts()["collective"] == 1


def test_no_break_outside_a_capture(upstream_capture) -> None:
    """Not capturing, or one rank: the communicator's own all-reduce (vLLM's
    group bypasses a one-rank all-reduce before it reaches a communicator)."""
    upstream_capture._capturing = False
    group, x = _TwoRankGroup(), torch.ones(2, 4)
    assert torch.equal(breakable_all_reduce(x, group, group.all_reduce), x * 2)
    upstream_capture._capturing = True
    group.world_size = 1
    assert torch.equal(breakable_all_reduce(x, group, group.all_reduce), x * 2)
    assert group.calls == 2
