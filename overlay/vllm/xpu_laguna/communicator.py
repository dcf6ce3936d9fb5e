# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' XPU communicator: upstream's ``XpuCommunicator``
whose tensor-parallel all-reduce is the fixed rank-order sum on the exact
path (``vllm.xpu_laguna.collectives``: XCCL's ring sums each
1/N of a message in an order set by the message size, so a verify row and
the decode of the same token would round differently), and an eager break
inside the series' breakable capture (XCCL collectives are not captured).
Every tensor-parallel all-reduce of vLLM reaches it (``GroupCoordinator.
all_reduce``, directly or through the ``vllm.all_reduce`` custom op).

The series' XPU platform (``vllm.xpu_laguna.platform``) names this class in
``get_device_communicator_cls``, so vLLM builds it for every group of an XPU
worker; the mode is decided once, when it is built, from the worker's
config (``PLAIN`` for every group and model the series is not for: then it
is upstream's communicator).
"""

import torch

from vllm.distributed.device_communicators.xpu_communicator import XpuCommunicator
from vllm.xpu_laguna import collectives
from vllm.xpu_laguna.collectives import SeriesAllReduce, TpReduceMode
from vllm.xpu_laguna.graphs.collectives import breakable_all_reduce


class XpuLagunaCommunicator(SeriesAllReduce, XpuCommunicator):
    """``XpuCommunicator`` with the series' all-reduce mode."""

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        # inside the series' breakable capture: an eager break
        return breakable_all_reduce(input_, self, self._eager_all_reduce)

    def _eager_all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.xpu_laguna_mode is TpReduceMode.RANK_ORDER:
            # out of place, like upstream's XPU all-reduce
            return collectives.rank_order_all_reduce(input_, self.device_group)
        return super().all_reduce(input_)
