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
from vllm.compilation.xpu_breakable_graph.backends import (
    device_graph_backend_override,
)
from vllm.compilation.xpu_breakable_graph.errors import BreakableGraphConfigError
from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.platforms.interface import Platform

logger = init_logger(__name__)


def breakable_graph_enabled() -> bool:
    return bool(envs.VLLM_XPU_LAGUNA_BREAKABLE_GRAPH)


def debug_checks_enabled() -> bool:
    """Full structural checks on every replay (upstream's debug switch: the
    logger at DEBUG, e.g. ``VLLM_LOGGING_LEVEL=DEBUG``)."""
    return logger.isEnabledFor(logging.DEBUG)


LAGUNA_TARGET_ARCHITECTURES = ("LagunaForCausalLM",)
"""The targets the series acts on (its exact path, contract and collectives)."""
# Toggles that switch the series on; on CPU one of them set to 1 in the
# environment is how a run asks for the series (the device is XPU).
SERIES_TOGGLES = (
    "VLLM_XPU_LAGUNA_EXACT_VERIFY",
    "VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA",
    "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH",
)


class _SeriesScope:
    """Whether the series applies in this process: decided from the
    VllmConfig (the target's architecture and the platform) wherever one is
    at hand, remembered for the calls that have none (a worker's forward
    pass, and on CPU its warm-up, run outside ``set_current_vllm_config``).
    Engine processes forked from the one that built the config inherit its
    decision; a spawned worker decides under its config when its device
    communicators are created (``init_device``: each decides its group's
    all-reduce mode, ``tp_reduce_mode``), and again wherever a predicate is
    called under the current config (attention builders, load)."""

    def __init__(self) -> None:
        self.decided: bool | None = None


_scope = _SeriesScope()


def series_in_scope(
    vllm_config: VllmConfig | None = None, platform: Platform | None = None
) -> bool:
    """Whether the series may act here: the target is Laguna
    (``LAGUNA_TARGET_ARCHITECTURES``) and the platform is XPU, or CPU with a
    series toggle set to 1 explicitly in the environment (the stand-in runs).
    Without a config (the argument or the current one): the decision last
    made in this process, else True (the series' own ops used outside an
    engine: the toggles alone decide)."""
    if vllm_config is None:
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
    mc = vllm_config.model_config if vllm_config is not None else None
    if mc is None:
        return True if _scope.decided is None else _scope.decided
    if platform is None:
        from vllm.platforms import current_platform

        platform = current_platform
    laguna = bool(set(mc.architectures) & set(LAGUNA_TARGET_ARCHITECTURES))
    if not laguna:
        decided = False
    elif platform.is_xpu():
        decided = True
    else:
        decided = platform.is_cpu() and any(
            envs.is_set(name) and bool(getattr(envs, name)) for name in SERIES_TOGGLES
        )
    _scope.decided = decided
    return decided


def reset_series_scope() -> None:
    """Forget this process's decision (tests that build several configs)."""
    _scope.decided = None


def xpu_laguna_series_active(vllm_config: VllmConfig | None = None) -> bool:
    """Whether a toggle of the XPU Laguna series is in effect for this
    configuration: the series is in scope (:func:`series_in_scope`) and
    breakable graphs, prebuilt exact metadata or the exact verify is on (the
    configuration contract acts only then)."""
    if not series_in_scope(vllm_config):
        return False
    return any(bool(getattr(envs, name)) for name in SERIES_TOGGLES)


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
    if not series_in_scope(vllm_config):
        # Another model (or Laguna on CPU without an explicit toggle): the
        # configuration stays upstream's (series_in_scope logs nothing here;
        # the contract's one line says the series is inactive).
        return False
    if platform is None:
        from vllm.platforms import current_platform

        platform = current_platform
    width = int(envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH)
    cc = vllm_config.compilation_config
    prefix = "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1"

    def fail(msg: str) -> None:
        raise BreakableGraphConfigError(f"{prefix}: {msg}")

    override = device_graph_backend_override()
    if override is not None:
        logger.warning_once(
            "Breakable graphs are EMULATED by %s on %s: results are emulated, "
            "not device graphs",
            override.graph_class_name,
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
            f"VLLM_XPU_LAGUNA_VERIFY_WIDTH={width}"
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
    width = int(envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH)
    cc = vllm_config.compilation_config
    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
    cc.cudagraph_capture_sizes = [width]
    cc.max_cudagraph_capture_size = width
    cc.prefill_cudagraph_capture_token_sizes = [width]
    cc.max_prefill_cudagraph_capture_tokens = width
    cc.decode_cudagraph_capture_request_sizes = []
