# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The toggles of the series and the breakable-graph configuration: mode
NONE, ``cudagraph_mode`` PIECEWISE, one capture size equal to the verify
width, and one-line refusals of the combinations that cannot work."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

import vllm.envs as envs
from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
from vllm.logger import init_logger
from vllm.xpu_laguna.graphs.backends import platform_graph_backend
from vllm.xpu_laguna.graphs.errors import BreakableGraphConfigError
from vllm.xpu_laguna.options import XpuLagunaOptions

if TYPE_CHECKING:
    from vllm.platforms.interface import Platform

logger = init_logger(__name__)


def breakable_graph_enabled(
    vllm_config: VllmConfig | None, platform: Platform | None = None
) -> bool:
    """Whether ``vllm_config`` turns the series' breakable graphs on (the
    ``breakable_graph`` option) for a target the series is for."""
    return XpuLagunaOptions.from_config(
        vllm_config
    ).breakable_graph and series_in_scope(vllm_config, platform)


def debug_checks_enabled() -> bool:
    """Full structural checks on every replay (upstream's debug switch: the
    logger at DEBUG, e.g. ``VLLM_LOGGING_LEVEL=DEBUG``)."""
    return logger.isEnabledFor(logging.DEBUG)


LAGUNA_TARGET_ARCHITECTURES = ("LagunaForCausalLM",)
"""The targets the series acts on (its exact path, contract and collectives)."""


def series_in_scope(
    vllm_config: VllmConfig | None, platform: Platform | None = None
) -> bool:
    """Whether the series may act for ``vllm_config``: the target is Laguna
    (``LAGUNA_TARGET_ARCHITECTURES``) and the platform is XPU, or CPU with
    the configuration asking for the series (one of its switches set true
    explicitly in ``additional_config["xpu_laguna"]``: the stand-in runs).
    Decided from the configuration alone, never remembered: without one
    (or without a model) the series is not in scope."""
    mc = vllm_config.model_config if vllm_config is not None else None
    if mc is None:
        return False
    if platform is None:
        from vllm.platforms import current_platform

        platform = current_platform
    if not set(mc.architectures) & set(LAGUNA_TARGET_ARCHITECTURES):
        return False
    if platform.is_xpu():
        return True
    return (
        platform.is_cpu() and XpuLagunaOptions.from_config(vllm_config).asks_for_series
    )


def xpu_laguna_series_active(vllm_config: VllmConfig | None) -> bool:
    """Whether a switch of the XPU Laguna series is in effect for this
    configuration: the series is in scope (:func:`series_in_scope`) and
    breakable graphs, prebuilt exact metadata or the exact verify is on (the
    configuration contract acts only then)."""
    return (
        series_in_scope(vllm_config)
        and XpuLagunaOptions.from_config(vllm_config).any_switch_on
    )


def configure_breakable_graph(
    vllm_config: VllmConfig, platform: Platform | None = None
) -> bool:
    """Turn ``vllm_config`` into the breakable-graph configuration: mode
    NONE, ``cudagraph_mode`` PIECEWISE, one capture size equal to the
    verifier width, and upstream's breakable path on in this config
    (``compilation_config.use_breakable_cudagraph``, the field V2 reads);
    True when it did. A target the series is not for
    (:func:`series_in_scope`) keeps upstream's configuration (False).
    Raises :class:`BreakableGraphConfigError` (one line) for combinations
    that cannot work."""
    if not breakable_graph_enabled(vllm_config, platform):
        # Off, or another model (or Laguna on CPU without an explicit
        # switch): the configuration stays upstream's (the contract's one
        # line says the series is inactive).
        return False
    if platform is None:
        from vllm.platforms import current_platform

        platform = current_platform
    width = XpuLagunaOptions.from_config(vllm_config).verify_width
    cc = vllm_config.compilation_config
    prefix = "xpu_laguna.breakable_graph"

    def fail(msg: str) -> None:
        raise BreakableGraphConfigError(f"{prefix}: {msg}")

    own = platform_graph_backend(platform, vllm_config)
    if own is not None:
        logger.warning_once(
            "Breakable graphs are EMULATED by %s on %s: results are emulated, "
            "not device graphs",
            own.graph_class_name,
            platform.device_type,
        )
    elif platform.is_xpu():
        from vllm.utils.torch_utils import supports_xpu_graph

        if not supports_xpu_graph():
            fail(f"torch {torch.__version__} has no XPU graphs (need >= 2.11)")
    elif not platform.is_cuda_alike():
        fail(f"needs an XPU or CUDA device, not {platform.device_type!r}")
    if envs.is_set("VLLM_USE_BREAKABLE_CUDAGRAPH") and not (
        envs.VLLM_USE_BREAKABLE_CUDAGRAPH
    ):
        fail("contradicts VLLM_USE_BREAKABLE_CUDAGRAPH=0")
    mc = vllm_config.model_config
    if mc is not None and mc.enforce_eager:
        fail("cannot be combined with enforce_eager")
    if cc.mode not in (None, CompilationMode.NONE):
        fail(f"needs compilation mode NONE, not {CompilationMode(cc.mode).name}")
    if cc.cudagraph_mode not in (None, CUDAGraphMode.PIECEWISE):
        fail(f"needs cudagraph_mode PIECEWISE, not {cc.cudagraph_mode.name}")
    if cc.cudagraph_capture_sizes not in (None, [width]):
        fail(
            f"captures exactly the verify width [{width}], not "
            f"{cc.cudagraph_capture_sizes}"
        )
    if cc.max_cudagraph_capture_size not in (None, width):
        fail(
            f"max_cudagraph_capture_size must be the verify width {width}, not "
            f"{cc.max_cudagraph_capture_size}"
        )
    if cc.prefill_cudagraph_capture_token_sizes not in (None, [width]):
        fail(
            f"captures exactly the verify width [{width}], not "
            f"prefill_cudagraph_capture_token_sizes "
            f"{cc.prefill_cudagraph_capture_token_sizes}"
        )
    if cc.decode_cudagraph_capture_request_sizes not in (None, []):
        fail(
            "captures PIECEWISE graphs only, not FULL decode graphs of "
            f"decode_cudagraph_capture_request_sizes "
            f"{cc.decode_cudagraph_capture_request_sizes}"
        )
    pc = vllm_config.parallel_config
    if pc.pipeline_parallel_size > 1:
        fail("does not support pipeline parallelism")
    if getattr(pc, "use_ubatching", False):
        fail("does not support micro-batching (DBO)")
    sc = vllm_config.speculative_config
    if (
        sc is not None
        and sc.num_speculative_tokens is not None
        and 1 + sc.num_speculative_tokens > width
    ):
        fail(
            f"verify batch of {1 + sc.num_speculative_tokens} tokens exceeds "
            f"xpu_laguna.verify_width {width}"
        )
    sched = vllm_config.scheduler_config
    if sched is not None and sched.max_num_batched_tokens < width:
        fail(f"max_num_batched_tokens {sched.max_num_batched_tokens} < width {width}")

    apply_breakable_graph_settings(vllm_config)
    # Upstream's breakable path, on in this config only: nothing is written
    # to the environment, so a later config in this process (or a child's)
    # resolves as its own settings say.
    cc.use_breakable_cudagraph = True
    logger.info_once(
        "Breakable %s graphs: mode NONE, cudagraph_mode PIECEWISE, capture "
        "size %d (verify width)",
        platform.device_type,
        width,
    )
    return True


def apply_breakable_graph_settings(vllm_config: VllmConfig) -> None:
    """Compilation mode NONE, PIECEWISE, one capture size: the verify width. Model
    Runner V2 captures PIECEWISE graphs by token count from
    ``prefill_cudagraph_capture_token_sizes`` (``cudagraph_capture_sizes`` is
    deprecated there), and no FULL decode graphs."""
    width = XpuLagunaOptions.from_config(vllm_config).verify_width
    cc = vllm_config.compilation_config
    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    cc.cudagraph_capture_sizes = [width]
    cc.max_cudagraph_capture_size = width
    cc.prefill_cudagraph_capture_token_sizes = [width]
    cc.max_prefill_cudagraph_capture_tokens = width
    cc.decode_cudagraph_capture_request_sizes = []
