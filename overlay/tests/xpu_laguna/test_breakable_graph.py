# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Unit tests of vllm/compilation/xpu_breakable_graph.py on CPU.

``RecordingGraph`` (breakable_graph_standins.py) stands in for a device
graph with the property that matters: between ``capture_begin`` and
``capture_end`` kernels are recorded, not executed (their outputs hold
garbage, here NaN), and ``replay`` runs them on the same tensors. The
capture module is the real one.
"""

from __future__ import annotations

import pytest
import torch
from breakable_graph_standins import RecordingGraph

from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
from vllm.compilation.xpu_breakable_graph import (
    BreakableGraphConfigError,
    BreakKind,
    CaptureCeilingError,
    DeviceGraphBackend,
    ExpectedTopology,
    OutOfPlaceBreakError,
    TopologyMismatchError,
    XpuBreakableGraphCapture,
    device_graph_backend,
    first_difference,
    reachable_tensor_identities,
)


BACKEND = DeviceGraphBackend(name="recording", graph_factory=RecordingGraph)


def _forward(capture, x, buf, *, in_place=True):
    """graph: y = 2x | eager: buf = y + 1 | graph: w = 3 * buf."""
    y = x * 2

    def eager():
        if in_place:
            return torch.add(y, 1, out=buf)
        return y + 1  # out-of-place: a new tensor each call

    z = capture.add_eager(eager, kind=BreakKind.COLLECTIVE)
    return z * 3


def test_expected_topology_laguna_s() -> None:
    tp4 = ExpectedTopology.decoder(48, 4)
    assert (tp4.attention, tp4.collective) == (48, 97)
    assert (tp4.graphs, tp4.breaks) == (146, 145)
    assert tp4.segments == 291 and tp4.ceiling == 582
    tp1 = ExpectedTopology.decoder(48, 1)
    assert (tp1.attention, tp1.collective, tp1.graphs) == (48, 0, 49)
    with pytest.raises(ValueError):
        ExpectedTopology.decoder(4, 0)


def test_materialisation_makes_first_capture_correct() -> None:
    x = torch.arange(4, dtype=torch.float32)
    buf = torch.empty(4)
    cap = XpuBreakableGraphCapture(backend=BACKEND)
    with cap:
        w = _forward(cap, x, buf)
    assert torch.equal(w, (x * 2 + 1) * 3)
    assert cap.break_counts() == {"graph": 2, "attention": 0, "collective": 1}
    assert cap.kinds == [BreakKind.GRAPH, BreakKind.COLLECTIVE, BreakKind.GRAPH]
    # Each graph ran exactly once, at capture.
    graphs = RecordingGraph.created[-2:]
    assert [g.replays for g in graphs] == [1, 1]
    # Replay after an in-place input update recomputes through the break.
    x.copy_(torch.tensor([5.0, 6.0, 7.0, 8.0]))
    cap.replay()
    assert torch.equal(w, (x * 2 + 1) * 3)


def test_without_materialisation_first_capture_is_garbage() -> None:
    """The failure the materialisation prevents: the eager break consumes
    a segment output that was never computed."""
    x = torch.arange(4, dtype=torch.float32)
    buf = torch.empty(4)
    cap = XpuBreakableGraphCapture(backend=BACKEND, materialize=False)
    with cap:
        w = _forward(cap, x, buf)
    assert torch.isnan(w).all()
    cap.replay()  # a later replay is right again
    assert torch.equal(w, (x * 2 + 1) * 3)


def test_out_of_place_break_is_refused_on_replay() -> None:
    x = torch.arange(4, dtype=torch.float32)
    cap = XpuBreakableGraphCapture(backend=BACKEND)
    with cap:
        w = _forward(cap, x, torch.empty(4), in_place=False)
    assert torch.equal(w, (x * 2 + 1) * 3)  # the capture itself looks fine
    x.add_(1)
    with pytest.raises(OutOfPlaceBreakError, match="write in place"):
        cap.replay()


def test_ceiling_refuses_and_releases_capture_slot() -> None:
    cap = XpuBreakableGraphCapture(
        backend=BACKEND, expected=ExpectedTopology(attention=1, collective=0)
    )
    assert cap.max_segments == 6
    x = torch.ones(2)
    with pytest.raises(CaptureCeilingError, match="ceiling of 6 segments"):
        with cap:
            for _ in range(4):
                cap.add_eager(lambda: torch.mul(x, 2, out=x))
    assert BreakableCUDAGraphCapture.current() is None
    assert cap.num_eager_breaks == 3  # refused at the 3rd break (7 > 6)


def test_topology_mismatch_raises() -> None:
    cap = XpuBreakableGraphCapture(
        backend=BACKEND, expected=ExpectedTopology(attention=2, collective=5)
    )
    x = torch.ones(2)
    with cap:
        for kind in (BreakKind.COLLECTIVE, BreakKind.ATTENTION):
            cap.add_eager(lambda: torch.mul(x, 2, out=x), kind=kind)
    with pytest.raises(TopologyMismatchError, match="attention=1 collective=1"):
        cap.check_topology()
    ok = XpuBreakableGraphCapture(
        backend=BACKEND, expected=ExpectedTopology(attention=1, collective=1)
    )
    with ok:
        for kind in (BreakKind.COLLECTIVE, BreakKind.ATTENTION):
            ok.add_eager(lambda: torch.mul(x, 2, out=x), kind=kind)
    ok.check_topology()
    assert "graphs=3 breaks=2 (attention=1 collective=1)" in ok.audit_line("s8")


def test_identities_cover_nested_metadata() -> None:
    base = torch.zeros(10)
    obj = {"a": [base[2:4], (base,)], "b": {"c": base[::2]}}
    ids = reachable_tensor_identities(obj, "m")
    assert [i[0] for i in ids] == ["m['a'][0]", "m['a'][1][0]", "m['b']['c']"]
    assert ids[0][2] == 2 and ids[2][4] == (2,)
    moved = {"a": [base[3:5], (base,)], "b": {"c": base[::2]}}
    diff = first_difference(ids, reachable_tensor_identities(moved, "m"))
    assert diff is not None and diff.startswith("m['a'][0]")
    assert first_difference(ids, reachable_tensor_identities(obj, "m")) is None


def test_eager_only_metadata_fields_are_not_guarded() -> None:
    """FlashAttention 3's AOT schedule is a fresh tensor every step and is
    read only by the eager attention kernel: it must not trip the guard;
    every other metadata tensor must."""
    import dataclasses

    from vllm.compilation.xpu_breakable_graph import EAGER_ONLY_METADATA_FIELDS

    @dataclasses.dataclass
    class Meta:
        seq_lens: torch.Tensor
        scheduler_metadata: torch.Tensor

    seq = torch.zeros(4, dtype=torch.int32)

    def ids(m):
        return reachable_tensor_identities(
            m, "md", skip_fields=EAGER_ONLY_METADATA_FIELDS
        )

    a = ids(Meta(seq[:1], torch.zeros(3)))
    assert [i[0] for i in a] == ["md.seq_lens"]
    assert first_difference(a, ids(Meta(seq[:1], torch.zeros(3)))) is None
    assert first_difference(a, ids(Meta(seq[1:2], torch.zeros(3)))) is not None


class _PlatformStandIn:
    def __init__(self, device_type: str) -> None:
        self.device_type = device_type

    def is_xpu(self) -> bool:
        return self.device_type == "xpu"

    def is_cuda_alike(self) -> bool:
        return self.device_type == "cuda"

    def get_global_graph_pool(self):
        return ("pool", self.device_type)


def test_device_graph_choice() -> None:
    xpu = device_graph_backend(_PlatformStandIn("xpu"))
    assert xpu.name == "xpu" and xpu.graph_factory is torch.xpu.XPUGraph
    assert xpu.pool() == ("pool", "xpu")
    cuda = device_graph_backend(_PlatformStandIn("cuda"))
    assert cuda.name == "cuda" and cuda.graph_factory is torch.cuda.CUDAGraph
    with pytest.raises(BreakableGraphConfigError, match="XPU or CUDA"):
        device_graph_backend(_PlatformStandIn("cpu"))


def test_runner_wrapper_choice_follows_the_toggle(monkeypatch) -> None:
    import vllm.envs as envs
    from vllm.compilation.breakable_cudagraph import (
        BreakableCUDAGraphWrapper,
        is_breakable_cudagraph_enabled,
    )
    from vllm.compilation.xpu_breakable_graph import (
        XpuBreakableGraphWrapper,
        breakable_graph_wrapper_cls,
    )

    monkeypatch.setattr(envs, "VLLM_USE_BREAKABLE_CUDAGRAPH", False, raising=False)
    monkeypatch.setattr(envs, "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH", False, raising=False)
    assert breakable_graph_wrapper_cls() is BreakableCUDAGraphWrapper
    assert not is_breakable_cudagraph_enabled()
    monkeypatch.setattr(envs, "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH", True, raising=False)
    assert breakable_graph_wrapper_cls() is XpuBreakableGraphWrapper
    assert is_breakable_cudagraph_enabled()  # arms the upstream decorator too
