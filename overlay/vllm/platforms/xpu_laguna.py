# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' XPU platform: upstream's ``XPUPlatform`` with the
series' device communicator.

vLLM picks it through the series' ``vllm.platform_plugins`` entry point
(``xpu_laguna`` -> :func:`vllm.xpu_laguna_plugin.platform`), which activates
exactly where upstream's XPU plugin detects an XPU; an out-of-tree platform
plugin takes precedence over the built-in one. Everything else is
``XPUPlatform``'s.
"""

from vllm.platforms.xpu import XPUPlatform

COMMUNICATOR = (
    "vllm.distributed.device_communicators.xpu_laguna_communicator."
    "XpuLagunaCommunicator"
)


class XpuLagunaPlatform(XPUPlatform):
    @classmethod
    def get_device_communicator_cls(cls) -> str:
        super().get_device_communicator_cls()  # upstream's xccl warning
        return COMMUNICATOR
