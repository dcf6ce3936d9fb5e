# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Scenario of ``breakable_graph_driver.py`` on the configuration:
``configure_breakable_graph`` on a config built for CPU, with the platform
given as CUDA / XPU / CPU stand-ins."""

from __future__ import annotations

import os
from typing import Any

from breakable_graph_driver_harness import Harness, expect_error


def run_config() -> dict[str, Any]:
    """configure_breakable_graph on a config built for CPU, with the
    platform given as CUDA / XPU / CPU stand-ins of the platform object."""
    from breakable_graph_standins import PlatformStandIn

    import vllm.envs as envs
    from vllm.compilation.xpu_breakable_graph.config import configure_breakable_graph
    from vllm.platforms import current_platform

    def CudaLike():
        return PlatformStandIn("cuda")

    def CpuPlatform():
        return current_platform

    h = Harness()
    res: dict[str, Any] = {}
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    res["cpu_platform_config"] = expect_error(
        lambda: h.vllm_config(1, (), flag_on=True)
    )
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    cfg = h.vllm_config(1, ())
    cfg.model_config.enforce_eager = False
    cfg.compilation_config.mode = None
    cfg.compilation_config.cudagraph_mode = None
    cfg.compilation_config.cudagraph_capture_sizes = None
    cfg.compilation_config.max_cudagraph_capture_size = None
    res["cpu"] = expect_error(lambda: configure_breakable_graph(cfg, CpuPlatform()))
    res["cuda"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    cc = cfg.compilation_config
    res["cuda_result"] = {
        "mode": int(cc.mode),
        "cudagraph_mode": cc.cudagraph_mode.name,
        "sizes": cc.cudagraph_capture_sizes,
        "max": cc.max_cudagraph_capture_size,
        "use_breakable_cudagraph": cc.use_breakable_cudagraph,
        "env": os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH"),
    }
    res["cuda_again"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    from vllm.config import CUDAGraphMode

    cc.cudagraph_mode = CUDAGraphMode.FULL
    res["full_mode"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    cc.cudagraph_capture_sizes = [1, 2, 4, 8]
    res["sizes"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    cc.cudagraph_capture_sizes = [8]
    cfg.model_config.enforce_eager = True
    res["eager"] = expect_error(lambda: configure_breakable_graph(cfg, CudaLike()))
    cfg.model_config.enforce_eager = False
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "0"
    res["upstream_off"] = expect_error(
        lambda: configure_breakable_graph(cfg, CudaLike())
    )
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
    # vLLM 0.32.0 has XPU graphs on by default (no VLLM_XPU_ENABLE_XPU_GRAPH);
    # what remains to refuse is a torch without XPU graphs
    from vllm.utils import torch_utils

    has_graphs = torch_utils.supports_xpu_graph
    torch_utils.supports_xpu_graph = lambda: False
    res["xpu_graph_off"] = expect_error(
        lambda: configure_breakable_graph(cfg, PlatformStandIn("xpu"))
    )
    torch_utils.supports_xpu_graph = has_graphs
    res["xpu"] = expect_error(
        lambda: configure_breakable_graph(cfg, PlatformStandIn("xpu"))
    )
    envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH = 4
    res["width_changed"] = expect_error(
        lambda: configure_breakable_graph(cfg, PlatformStandIn("xpu"))
    )
    return res
