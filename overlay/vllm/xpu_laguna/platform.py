# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' XPU platform: upstream's ``XPUPlatform`` with the
series' device communicator and FlashAttention backend.

vLLM picks it through the series' ``vllm.platform_plugins`` entry point
(``xpu_laguna`` -> :func:`vllm.xpu_laguna.plugin.platform`), which activates
exactly where upstream's XPU plugin detects an XPU; an out-of-tree platform
plugin takes precedence over the built-in one. Everything else is
``XPUPlatform``'s: where it picks ``FLASH_ATTN`` this platform gives the
series' subclass of it (``vllm.xpu_laguna.attention.backend``:
the exact speculative verify and its prebuilt metadata; upstream's path for
every step and model the series is not for), and where it picks its XPU
worker this platform gives the series' subclass of it
(``vllm.xpu_laguna.worker``: the series' breakable graph wrapper).
"""

from typing import TYPE_CHECKING

from vllm.platforms.xpu import XPUPlatform

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
SERIES_FLASH_ATTN = "vllm.xpu_laguna.attention.backend.XpuLagunaFlashAttentionBackend"
COMMUNICATOR = "vllm.xpu_laguna.communicator.XpuLagunaCommunicator"
XPU_WORKER = "vllm.v1.worker.xpu_worker.XPUWorker"
SERIES_WORKER = "vllm.xpu_laguna.worker.XpuLagunaWorker"


class XpuLagunaPlatform(XPUPlatform):
    @classmethod
    def get_device_communicator_cls(cls) -> str:
        super().get_device_communicator_cls()  # upstream's xccl warning
        return COMMUNICATOR

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: "AttentionBackendEnum",
        attn_selector_config: "AttentionSelectorConfig",
        num_heads: int | None = None,
    ) -> str:
        path = super().get_attn_backend_cls(
            selected_backend, attn_selector_config, num_heads
        )
        return SERIES_FLASH_ATTN if path == FLASH_ATTN else path

    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        super().check_and_update_config(vllm_config)
        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == XPU_WORKER:  # upstream's choice
            parallel_config.worker_cls = SERIES_WORKER
