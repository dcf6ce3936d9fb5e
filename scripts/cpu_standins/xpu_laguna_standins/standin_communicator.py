# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The CPU runtime's device communicator: upstream's ``CpuCommunicator`` with the series'
all-reduce modes (``vllm.xpu_laguna.collectives.SeriesAllReduce``, the same mixin the
series' ``XpuLagunaCommunicator`` uses) and the debug stand-in of XCCL's ring
(:mod:`.xccl_ring`, mode ``XCCL_STANDIN``: the option ``debug_xccl_standin``). Built by
:class:`~xpu_laguna_standins.standin_platform.StandInCpuPlatform` for every group of a CPU worker; the mode
is decided when it is built, under the worker's config (``PLAIN``: upstream's communicator).

The all-reduce runs in place (upstream's CPU all-reduce is in place too), before the SHM / gloo
dispatch, so both transports take it; inside the series' breakable capture (the emulated graphs of
the CPU graph legs) it is an eager break, as the XPU communicator's is on the device.
"""

from __future__ import annotations

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
from vllm.xpu_laguna.collectives import SeriesAllReduce, TpReduceMode
from vllm.xpu_laguna.graphs.collectives import breakable_all_reduce

from .xccl_ring import xccl_ring_all_reduce


class StandInCpuCommunicator(SeriesAllReduce, CpuCommunicator):
    reduce_modes = frozenset({TpReduceMode.RANK_ORDER, TpReduceMode.XCCL_STANDIN})

    def xpu_laguna_reduce_into(
        self, input_: torch.Tensor, out: torch.Tensor, gathered: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        if self.xpu_laguna_mode is TpReduceMode.XCCL_STANDIN and input_.device.type == "cpu":
            return xccl_ring_all_reduce(input_, self.device_group, out, gathered)
        return super().xpu_laguna_reduce_into(input_, out, gathered)

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        # inside the series' breakable capture (emulated graphs): an eager break
        return breakable_all_reduce(input_, self, self._eager_all_reduce)

    def _eager_all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.xpu_laguna_reduce_into(input_, input_) is not None:
            return input_
        return super().all_reduce(input_)
