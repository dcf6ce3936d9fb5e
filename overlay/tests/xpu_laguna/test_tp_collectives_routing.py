# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Routing of the communicators' all-reduce (0010, ``xpu_laguna_collectives``):
which path the CPU and XPU communicators take for each toggle combination,
at the monkeypatch level (recorders instead of collectives; the real gloo
runs are in test_tp_collectives.py), and the XCCL ring stand-in's split
rule."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from xpu_laguna_standins import xccl_ring as standin

from vllm.distributed import xpu_laguna_collectives as xc
from vllm.distributed.device_communicators import cpu_communicator
from vllm.distributed.device_communicators.xpu_communicator import XpuCommunicator

TOGGLES = (
    "VLLM_XPU_LAGUNA_EXACT_VERIFY",
    "VLLM_XPU_LAGUNA_EXACT_TP_REDUCE",
    "VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN",
    "VLLM_BATCH_INVARIANT",
)


# -- routing of the communicators' all_reduce (monkeypatch level) ----------


@pytest.fixture
def toggles(monkeypatch):
    for key in TOGGLES:
        monkeypatch.delenv(key, raising=False)
    xc.reset_tp_reduce_mode_cache()

    def set_env(**env: str) -> None:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        xc.reset_tp_reduce_mode_cache()

    yield set_env
    xc.reset_tp_reduce_mode_cache()


def _recorders(monkeypatch, calls):
    def record(name):
        def call(input_, group, out=None, gathered=None):
            calls.append((name, group))
            return input_ if out is None else out

        return call

    monkeypatch.setattr(xc, "rank_order_all_reduce", record("rank_order"))
    monkeypatch.setattr(xc, "cpu_stand_ins", xc.CpuStandIns())
    xc.cpu_stand_ins.register_xccl_ring(record("standin"))


def _cpu_comm(calls, name="tp:0", world=2):
    comm = object.__new__(cpu_communicator.CpuCommunicator)
    comm.unique_name, comm.world_size, comm.device_group = name, world, "GROUP"
    comm.dist_module = SimpleNamespace(
        all_reduce=lambda t, group=None: calls.append(("plain", group))
    )
    return comm


CPU_CASES = [
    ({}, "rank_order"),
    ({"VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN": "1"}, "rank_order"),
    ({"VLLM_XPU_LAGUNA_EXACT_TP_REDUCE": "0"}, "plain"),
    ({"VLLM_XPU_LAGUNA_EXACT_VERIFY": "0"}, "plain"),
    (
        {
            "VLLM_XPU_LAGUNA_EXACT_TP_REDUCE": "0",
            "VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN": "1",
        },
        "standin",
    ),
    (
        {
            "VLLM_XPU_LAGUNA_EXACT_VERIFY": "0",
            "VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN": "1",
        },
        "standin",
    ),
]


@pytest.mark.parametrize(("env", "path"), CPU_CASES, ids=str)
def test_cpu_communicator_routing(env, path, toggles, monkeypatch):
    calls: list = []
    _recorders(monkeypatch, calls)
    toggles(**env)
    x = torch.ones(2, 4)
    assert _cpu_comm(calls).all_reduce(x) is x
    assert calls == [(path, "GROUP")]


@pytest.mark.parametrize(("name", "world"), [("pp:0", 2), ("ep:0", 4), ("tp:0", 1)])
def test_cpu_communicator_other_groups_stay_plain(name, world, toggles, monkeypatch):
    calls: list = []
    _recorders(monkeypatch, calls)
    toggles(VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN="1")
    _cpu_comm(calls, name, world).all_reduce(torch.ones(3))
    assert calls == [("plain", "GROUP")]


XPU_CASES = [
    ({}, "rank_order"),
    ({"VLLM_XPU_LAGUNA_EXACT_TP_REDUCE": "0"}, "plain"),
    ({"VLLM_XPU_LAGUNA_EXACT_VERIFY": "0"}, "plain"),
    # the stand-in is CPU only: XPU keeps XCCL
    (
        {
            "VLLM_XPU_LAGUNA_EXACT_TP_REDUCE": "0",
            "VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN": "1",
        },
        "plain",
    ),
    # upstream's batch-invariant branch keeps its own rank-order sum
    ({"VLLM_BATCH_INVARIANT": "1"}, "upstream"),
]


@pytest.mark.parametrize(("env", "path"), XPU_CASES, ids=str)
def test_xpu_communicator_routing(env, path, toggles, monkeypatch):
    from vllm.distributed.device_communicators import xpu_communicator

    calls: list = []
    _recorders(monkeypatch, calls)
    monkeypatch.setattr(
        xpu_communicator.dist,
        "all_reduce",
        lambda t, group=None: calls.append(("plain", group)),
    )
    monkeypatch.setattr(
        XpuCommunicator,
        "_fixed_rank_sum",
        lambda self, t: calls.append(("upstream", self.device_group)) or t,
    )
    toggles(**env)
    comm = object.__new__(XpuCommunicator)
    comm.unique_name, comm.world_size, comm.device_group = "tp:0", 4, "GROUP"
    comm.all_reduce(torch.ones(2, 4))
    assert calls == [(path, "GROUP")]


def test_mode_is_cached_per_group(toggles):
    assert xc.tp_reduce_mode("tp:7", 4) is xc.TpReduceMode.RANK_ORDER
    os.environ["VLLM_XPU_LAGUNA_EXACT_TP_REDUCE"] = "0"
    try:
        assert xc.tp_reduce_mode("tp:7", 4) is xc.TpReduceMode.RANK_ORDER  # cached
        assert xc.tp_reduce_mode("tp:8", 4) is xc.TpReduceMode.PLAIN  # new group
        xc.reset_tp_reduce_mode_cache()
        assert xc.tp_reduce_mode("tp:7", 4) is xc.TpReduceMode.PLAIN
    finally:
        del os.environ["VLLM_XPU_LAGUNA_EXACT_TP_REDUCE"]


def test_all_reduce_into_only_on_the_exact_path(toggles, monkeypatch):
    calls: list = []
    _recorders(monkeypatch, calls)
    group = SimpleNamespace(unique_name="tp:0", world_size=4, device_group="GROUP")
    x, out = torch.ones(2), torch.empty(2)
    assert xc.all_reduce_into(x, out, group) is out
    toggles(VLLM_XPU_LAGUNA_EXACT_TP_REDUCE="0")
    assert xc.all_reduce_into(x, out, group) is None
    assert calls == [("rank_order", "GROUP")]
    # the CPU stand-in replaces the plain path of a graph break on CPU only
    toggles(VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN="1")
    assert xc.all_reduce_into(x, out, group) is out
    assert calls[-1] == ("standin", "GROUP")
    assert xc.all_reduce_into(x.to("meta"), out.to("meta"), group) is None


def test_unregistered_standin_fails_in_one_line(toggles, monkeypatch):
    calls: list = []
    monkeypatch.setattr(xc, "cpu_stand_ins", xc.CpuStandIns())
    toggles(VLLM_XPU_LAGUNA_EXACT_TP_REDUCE="0", VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN="1")
    with pytest.raises(
        RuntimeError, match="VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN=1"
    ) as err:
        _cpu_comm(calls).all_reduce(torch.ones(2))
    assert "\n" not in str(err.value) and calls == []
    # the plain path (toggle off) needs no stand-in
    toggles(VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN="0")
    _cpu_comm(calls).all_reduce(torch.ones(2))
    assert calls == [("plain", "GROUP")]


# -- ring split (oneCCL WorkSizeData, NoOverlap) ----------------------------


def test_ring_split_matches_onecll_examples():
    # work_size_data.hpp's own example: 35 bytes, 16-byte messages, 4 ranks
    assert standin.ring_chunk_bounds(35, 1, 4) == [(0, 16), (16, 16), (32, 0), (32, 3)]
    # Laguna-S, TP 4: one row of 3072 bf16, and eight rows
    assert standin.ring_chunk_bounds(3072, 2, 4) == [(i * 768, 768) for i in range(4)]
    assert standin.ring_chunk_bounds(8 * 3072, 2, 4) == [
        (i * 6144, 6144) for i in range(4)
    ]
    # 40 bf16 = 80 bytes = 5 messages: one spare message to chunk 0
    assert standin.ring_chunk_bounds(40, 2, 4) == [(0, 16), (16, 8), (24, 8), (32, 8)]
    with pytest.raises(ValueError):
        standin.ring_chunk_bounds(8, 2, 0)
