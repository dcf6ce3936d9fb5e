# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Scenario of ``breakable_graph_driver.py`` on the configuration:
``configure_breakable_graph`` on configs built for CPU, with the platform
given as XPU / CUDA / CPU stand-ins, and the series' options in each
config's ``additional_config``."""

from __future__ import annotations

import os
from typing import Any

from breakable_graph_driver_harness import BREAKABLE, Harness, expect_error
from laguna_model_testlib import additional_config


def _graph_fields(cfg: Any) -> dict[str, Any]:
    cc = cfg.compilation_config
    return {
        "mode": None if cc.mode is None else int(cc.mode),
        "cudagraph_mode": None if cc.cudagraph_mode is None else cc.cudagraph_mode.name,
        "sizes": cc.cudagraph_capture_sizes,
        "max": cc.max_cudagraph_capture_size,
        "use_breakable_cudagraph": cc.use_breakable_cudagraph,
        "env": os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH"),
    }


def _unconfigured(h: Harness, options: dict[str, Any] | None = None) -> Any:
    """A 1-layer config given ``options`` after it was built, its graph
    fields unset (as a user who asked for none leaves them)."""
    cfg = h.vllm_config(1, (), options=options)
    cfg.model_config.enforce_eager = False
    cc = cfg.compilation_config
    cc.mode = None
    cc.cudagraph_mode = None
    cc.cudagraph_capture_sizes = None
    cc.max_cudagraph_capture_size = None
    cc.use_breakable_cudagraph = False
    return cfg


def run_config() -> dict[str, Any]:
    """configure_breakable_graph on configs built for CPU, with the
    platform given as XPU / CUDA / CPU stand-ins of the platform object."""
    from breakable_graph_standins import PlatformStandIn

    from vllm.config import CUDAGraphMode
    from vllm.platforms import current_platform
    from vllm.utils import torch_utils
    from vllm.xpu_laguna.graphs.config import configure_breakable_graph

    def Xpu():
        return PlatformStandIn("xpu")

    h = Harness()
    res: dict[str, Any] = {}
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    # the option given to the engine's config on CPU: refused at the build
    res["cpu_platform_config"] = expect_error(
        lambda: h.vllm_config(1, (), at_build=True)
    )
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    cfg = _unconfigured(h)
    res["cpu"] = expect_error(lambda: configure_breakable_graph(cfg, current_platform))
    # the series is for XPU (and CPU runs that ask): CUDA keeps upstream's
    res["cuda"] = expect_error(
        lambda: configure_breakable_graph(cfg, PlatformStandIn("cuda"))
    )
    res["cuda_result"] = _graph_fields(cfg)
    res["xpu"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    res["xpu_result"] = _graph_fields(cfg)
    res["xpu_again"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    cc = cfg.compilation_config
    cc.cudagraph_mode = CUDAGraphMode.FULL
    res["full_mode"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    cc.cudagraph_capture_sizes = [1, 2, 4, 8]
    res["sizes"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    cc.cudagraph_capture_sizes = [8]
    cfg.model_config.enforce_eager = True
    res["eager"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    cfg.model_config.enforce_eager = False
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "0"
    res["upstream_off"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
    # vLLM 0.32.0 has XPU graphs on by default (no VLLM_XPU_ENABLE_XPU_GRAPH);
    # what remains to refuse is a torch without XPU graphs
    has_graphs = torch_utils.supports_xpu_graph
    torch_utils.supports_xpu_graph = lambda: False
    res["xpu_graph_off"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    torch_utils.supports_xpu_graph = lambda: True
    res["xpu_graph_on"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    torch_utils.supports_xpu_graph = has_graphs
    # the same config given another width: its captured size no longer fits
    cfg.additional_config = additional_config({**BREAKABLE, "verify_width": 4})
    res["width_changed"] = expect_error(lambda: configure_breakable_graph(cfg, Xpu()))
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    # two more configs in this process: each configured from its own options
    narrow = _unconfigured(h, {**BREAKABLE, "verify_width": 4})
    res["width_4"] = expect_error(lambda: configure_breakable_graph(narrow, Xpu()))
    res["width_4_result"] = _graph_fields(narrow)
    off = _unconfigured(h, {"exact_verify": True, "breakable_graph": False})
    res["off"] = expect_error(lambda: configure_breakable_graph(off, Xpu()))
    res["off_result"] = _graph_fields(off)
    return res
