# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The CPU runtime's test-side platform: upstream's ``CpuPlatform`` whose device communicator is
:class:`~xpu_laguna_standins.standin_communicator.StandInCpuCommunicator` (the series' all-reduce modes on
CPU, the XCCL ring stand-in among them). Never in the wheel.

vLLM picks it through this package's ``vllm.platform_plugins`` entry point
(:func:`xpu_laguna_standins.platform_plugin`),
which activates exactly where upstream's CPU plugin detects a CPU platform; an out-of-tree platform
plugin takes precedence over the built-in one. It models the series' XPU platform
(``vllm.xpu_laguna.platform``), which does the same for the XPU communicator: the platform hook
(``get_device_communicator_cls``) is the one the device uses; only the communicator's base and
transport (gloo / SHM instead of XCCL) differ.
"""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform

COMMUNICATOR = "xpu_laguna_standins.standin_communicator.StandInCpuCommunicator"


class StandInCpuPlatform(CpuPlatform):
    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return COMMUNICATOR
