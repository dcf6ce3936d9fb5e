# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' XPU communicator: upstream's ``XpuCommunicator``
whose tensor-parallel all-reduce is the fixed rank-order sum on the exact
path (``vllm.distributed.xpu_laguna_collectives``: XCCL's ring sums each
1/N of a message in an order set by the message size, so a verify row and
the decode of the same token would round differently), and an eager break
inside the series' breakable capture (XCCL collectives are not captured).
Every tensor-parallel all-reduce of vLLM reaches it (``GroupCoordinator.
all_reduce``, directly or through the ``vllm.all_reduce`` custom op).

The series' XPU platform (``vllm.platforms.xpu_laguna``) names this class in
``get_device_communicator_cls``, so vLLM builds it for every group of an XPU
worker; the mode is decided once, when it is built, from the worker's
config (``PLAIN`` for every group and model the series is not for: then it
is upstream's communicator).
"""

import torch

from vllm.compilation.xpu_breakable_graph.collectives import breakable_all_reduce
from vllm.distributed import xpu_laguna_collectives
from vllm.distributed.xpu_laguna_collectives import SeriesAllReduce, TpReduceMode

from .xpu_communicator import XpuCommunicator


class XpuLagunaCommunicator(SeriesAllReduce, XpuCommunicator):
    """``XpuCommunicator`` with the series' all-reduce mode."""

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        # inside the series' breakable capture: an eager break
        return breakable_all_reduce(input_, self, self._eager_all_reduce)

    def _eager_all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.xpu_laguna_mode is TpReduceMode.RANK_ORDER:
            # out of place, like upstream's XPU all-reduce
            return xpu_laguna_collectives.rank_order_all_reduce(
                input_, self.device_group
            )
        return super().all_reduce(input_)
