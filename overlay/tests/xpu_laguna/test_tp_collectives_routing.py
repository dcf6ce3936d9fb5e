# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Routing of the series' communicators' all-reduce (``vllm.xpu_laguna.collectives.
SeriesAllReduce``): which path the XPU communicator of the series' platform
(``XpuLagunaCommunicator``) and the CPU runtime's stand-in communicator
(``xpu_laguna_standins.standin_communicator``) take for each combination of the
series' options, at the monkeypatch level (recorders instead of
collectives; the real gloo runs are in test_tp_collectives.py), and the
XCCL ring stand-in's split rule.

A communicator decides its mode once, when it is built, under the current
config (``init_series_mode``, which both communicators call at the end of
their constructor) and keeps it in ``xpu_laguna_mode``; the tests build
their communicators the same way, under a stand-in config carrying the
options.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from laguna_model_testlib import (
    assert_reads_no_variable,
    config_stand_in,
    series_options,
)
from xpu_laguna_standins import standin_communicator as standin_communicator
from xpu_laguna_standins import xccl_ring as standin

from vllm.config import set_current_vllm_config
from vllm.distributed.device_communicators.xpu_communicator import XpuCommunicator
from vllm.xpu_laguna import collectives as xc
from vllm.xpu_laguna.communicator import (
    XpuLagunaCommunicator,
)

# -- routing of the communicators' all_reduce (monkeypatch level) ----------


def _config(**options: object) -> Any:
    """A Laguna config whose options ask for the series (a CPU run), with
    ``options`` over them."""
    return config_stand_in(series_options(**options))


@pytest.fixture(autouse=True)
def _no_batch_invariant(monkeypatch):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)


def _recorders(monkeypatch, calls):
    def record(name):
        def call(input_, group, out=None, gathered=None):
            calls.append((name, group))
            return input_ if out is None else out

        return call

    monkeypatch.setattr(xc, "rank_order_all_reduce", record("rank_order"))
    monkeypatch.setattr(standin_communicator, "xccl_ring_all_reduce", record("standin"))


def _built(comm: Any, config: Any) -> Any:
    """``comm`` given its mode as its constructor does (``init_series_mode``),
    under ``config`` as the current config (the worker's, in
    ``init_device``)."""
    with set_current_vllm_config(config):
        comm.init_series_mode()
    return comm


def _cpu_comm(calls, config, name="tp:0", world=2):
    comm = object.__new__(standin_communicator.StandInCpuCommunicator)
    comm.unique_name, comm.world_size, comm.device_group = name, world, "GROUP"
    comm.dist_module = SimpleNamespace(
        all_reduce=lambda t, group=None: calls.append(("plain", group))
    )
    return _built(comm, config)


CPU_CASES = [
    ({}, "rank_order"),
    ({"debug_xccl_standin": True}, "rank_order"),
    ({"exact_tp_reduce": False}, "plain"),
    ({"exact_verify": False, "prebuilt_metadata": True}, "plain"),
    ({"exact_tp_reduce": False, "debug_xccl_standin": True}, "standin"),
    (
        {"exact_verify": False, "prebuilt_metadata": True, "debug_xccl_standin": True},
        "standin",
    ),
]


@pytest.mark.parametrize(("options", "path"), CPU_CASES, ids=str)
def test_cpu_communicator_routing(options, path, monkeypatch):
    calls: list = []
    _recorders(monkeypatch, calls)
    x = torch.ones(2, 4)
    assert _cpu_comm(calls, _config(**options)).all_reduce(x) is x
    assert calls == [(path, "GROUP")]


RING = {"debug_xccl_standin": True}
OUT_OF_SCOPE = {
    # a Laguna on CPU whose options do not ask for the series...
    "laguna_not_asked": config_stand_in(RING),
    # ...or turn every switch off
    "laguna_all_off": config_stand_in({"exact_verify": False, **RING}),
    "llama": config_stand_in(series_options(**RING), "LlamaForCausalLM"),
    "no_model": config_stand_in(series_options(**RING), architecture=None),
    "no_config": None,
}


@pytest.mark.parametrize("case", OUT_OF_SCOPE)
def test_out_of_scope_configs_keep_the_plain_all_reduce(case, monkeypatch):
    """The series acts on a Laguna target only (on CPU, when its options ask
    for it): any other config keeps upstream's all-reduce, the debug
    stand-in included."""
    calls: list = []
    _recorders(monkeypatch, calls)
    _cpu_comm(calls, OUT_OF_SCOPE[case]).all_reduce(torch.ones(2))
    assert calls == [("plain", "GROUP")]


@pytest.mark.parametrize(("name", "world"), [("pp:0", 2), ("ep:0", 4), ("tp:0", 1)])
def test_cpu_communicator_other_groups_stay_plain(name, world, monkeypatch):
    calls: list = []
    _recorders(monkeypatch, calls)
    config = _config(debug_xccl_standin=True)
    _cpu_comm(calls, config, name, world).all_reduce(torch.ones(3))
    assert calls == [("plain", "GROUP")]


XPU_CASES = [
    ({}, "rank_order"),
    ({"exact_tp_reduce": False}, "plain"),
    ({"exact_verify": False, "prebuilt_metadata": True}, "plain"),
    # the stand-in is CPU only: XPU keeps XCCL
    ({"exact_tp_reduce": False, "debug_xccl_standin": True}, "plain"),
]


@pytest.mark.parametrize("batch_invariant", [False, True])
@pytest.mark.parametrize(("options", "path"), XPU_CASES, ids=str)
def test_xpu_communicator_routing(options, path, batch_invariant, monkeypatch):
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
    if batch_invariant:
        # upstream's batch-invariant branch keeps its own rank-order sum
        # where the series' mode is plain (the same bits: test_tp_collectives)
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        path = "upstream" if path == "plain" else path
    comm = object.__new__(XpuLagunaCommunicator)
    comm.unique_name, comm.world_size, comm.device_group = "tp:0", 4, "GROUP"
    _built(comm, _config(**options)).all_reduce(torch.ones(2, 4))
    assert calls == [(path, "GROUP")]


def test_a_communicator_keeps_the_mode_it_was_built_with(monkeypatch):
    """Two communicators of the same group built under two configs in one
    process get their own mode, and each keeps it whatever config is
    current when it reduces (nothing is cached per group or per process)."""
    calls: list = []
    _recorders(monkeypatch, calls)
    exact = _cpu_comm(calls, _config())
    plain = _cpu_comm(calls, _config(exact_tp_reduce=False))
    again = _cpu_comm(calls, _config())
    assert exact.xpu_laguna_mode is xc.TpReduceMode.RANK_ORDER
    assert plain.xpu_laguna_mode is xc.TpReduceMode.PLAIN
    assert again.xpu_laguna_mode is xc.TpReduceMode.RANK_ORDER
    with set_current_vllm_config(_config(exact_tp_reduce=False)):
        exact.all_reduce(torch.ones(2))
    with set_current_vllm_config(_config()):
        plain.all_reduce(torch.ones(2))
    assert calls == [("rank_order", "GROUP"), ("plain", "GROUP")]


def test_tp_reduce_mode_is_decided_from_the_config_given():
    """The decision itself: pure in the config, the group name and size."""
    rank_order, plain = xc.TpReduceMode.RANK_ORDER, xc.TpReduceMode.PLAIN
    exact, off = _config(), _config(exact_tp_reduce=False)
    for _ in range(2):
        assert xc.tp_reduce_mode("tp:7", 4, exact) is rank_order
        assert xc.tp_reduce_mode("tp:7", 4, off) is plain
    assert xc.tp_reduce_mode("tp:7", 4, None) is plain
    assert xc.tp_reduce_mode("pp:7", 4, exact) is plain
    assert xc.tp_reduce_mode("tp:7", 1, exact) is plain
    standin_config = _config(exact_tp_reduce=False, debug_xccl_standin=True)
    assert xc.tp_reduce_mode("tp:7", 4, standin_config) is xc.TpReduceMode.XCCL_STANDIN


def test_nothing_is_read_from_the_environment(monkeypatch):
    """The variables the series used to read change no decision."""
    configs = (_config(), _config(exact_tp_reduce=False), config_stand_in(None))
    contrary = {"exact_verify": "0", "exact_tp_reduce": "0"}
    assert_reads_no_variable(
        monkeypatch, lambda c: xc.tp_reduce_mode("tp:0", 4, c), configs, contrary
    )


def test_all_reduce_into_only_on_the_exact_path(monkeypatch):
    """The graph break's entry asks the group's communicator (a
    GroupCoordinator's ``device_communicator``, or the communicator)."""
    calls: list = []
    _recorders(monkeypatch, calls)

    def group(config):
        return SimpleNamespace(
            unique_name="tp:0",
            world_size=2,
            device_group="GROUP",
            device_communicator=_cpu_comm(calls, config),
        )

    x, out = torch.ones(2), torch.empty(2)
    assert xc.all_reduce_into(x, out, group(_config())) is out
    assert xc.all_reduce_into(x, out, group(_config(exact_tp_reduce=False))) is None
    assert calls == [("rank_order", "GROUP")]
    # a communicator the series did not build (upstream's): plain
    bare = SimpleNamespace(
        unique_name="tp:0",
        world_size=4,
        device_group="GROUP",
        xpu_laguna_mode=xc.TpReduceMode.RANK_ORDER,
    )
    assert xc.all_reduce_into(x, out, bare) is None
    # the CPU stand-in replaces the plain path of a graph break on CPU only
    ring = group(_config(exact_tp_reduce=False, debug_xccl_standin=True))
    assert xc.all_reduce_into(x, out, ring) is out
    assert calls[-1] == ("standin", "GROUP")
    assert xc.all_reduce_into(x.to("meta"), out.to("meta"), ring) is None


def test_the_xpu_communicator_runs_no_ring(monkeypatch):
    """The wheel's communicator runs only the rank-order mode: the debug
    ring mode is plain there (only the test-side communicator has it)."""
    calls: list = []
    _recorders(monkeypatch, calls)
    assert XpuLagunaCommunicator.reduce_modes == {xc.TpReduceMode.RANK_ORDER}
    assert xc.TpReduceMode.XCCL_STANDIN in (
        standin_communicator.StandInCpuCommunicator.reduce_modes
    )
    comm = object.__new__(XpuLagunaCommunicator)
    comm.unique_name, comm.world_size, comm.device_group = "tp:0", 4, "GROUP"
    ring = _built(comm, _config(exact_tp_reduce=False, debug_xccl_standin=True))
    assert ring.xpu_laguna_mode is xc.TpReduceMode.XCCL_STANDIN
    x = torch.ones(2)
    assert ring.xpu_laguna_reduce_into(x, torch.empty(2)) is None
    assert calls == []


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
