# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The attention kernels the XPU Laguna series' FlashAttention code calls.

Two entry points: ``flash_attn_varlen_func`` (varlen / paged attention, with
the decode kernel's explicit ``num_splits_kv``) and ``reshape_and_cache_flash``
(the KV cache write). Where they come from, by platform:

* XPU: ``vllm_xpu_kernels`` through ``vllm._xpu_ops`` and
  ``vllm._custom_ops``, the functions upstream's backend calls. A missing or
  too old kernel package is one :class:`MissingAttentionKernelsError` naming
  ``vllm_xpu_kernels`` and the version and index this wheel pins (a missing
  one found before anything imports it:
  :mod:`vllm.xpu_laguna.kernels_check`); nothing else is ever used
  on XPU (:meth:`AttentionKernelRegistry.register` refuses there).
* a platform without FlashAttention kernels (CPU): only kernels registered
  with :data:`registry`. The series' CPU runtime registers pure-torch
  reference kernels through its test-side vLLM general plugin
  (``xpu_laguna_standins``, laid into the runtime by the series' tooling, never
  part of this package); without it, using the backend there is one error
  that says so.
* CUDA / ROCm: never asked (their own FlashAttention kernels run).
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.xpu_laguna.kernels_check import (
    PACKAGE as XPU_KERNELS_PACKAGE,
)
from vllm.xpu_laguna.kernels_check import (
    MissingAttentionKernelsError,
    missing,
    require_xpu_kernels,
)

logger = init_logger(__name__)


@dataclass(frozen=True)
class AttentionKernels:
    """One set of kernels: ``name`` is what the logs and counters call it
    (``"xpu"``, or the registrant's name, e.g. ``"reference"``)."""

    name: str
    flash_attn_varlen_func: Callable[..., Any]
    reshape_and_cache_flash: Callable[..., Any]


def _xpu_kernels() -> AttentionKernels:
    """``vllm_xpu_kernels``' entry points, checked once: installed (found
    without importing it), importable, with the split count the exact path
    passes."""
    require_xpu_kernels()
    try:
        from vllm_xpu_kernels.flash_attn_interface import (
            flash_attn_varlen_func as kernel,
        )
    except ImportError as exc:
        raise missing(f"is not importable ({exc})") from exc
    if "num_splits_kv" not in inspect.signature(kernel).parameters:
        raise missing(
            "is required: the installed flash_attn_varlen_func takes no "
            "num_splits_kv (the exact path's KV split plan)"
        )
    try:
        from vllm import _custom_ops as ops
        from vllm._xpu_ops import xpu_ops
    except ImportError as exc:
        raise missing(f"is not loadable ({exc})") from exc
    return AttentionKernels(
        name="xpu",
        flash_attn_varlen_func=xpu_ops.flash_attn_varlen_func,
        reshape_and_cache_flash=ops.reshape_and_cache_flash,
    )


NO_KERNELS_OFF_XPU = (
    "FlashAttention on {device} has no kernels: the XPU Laguna series runs it "
    "there only on the CPU runtime's reference kernels, which its test-side "
    "plugin (xpu_laguna_standins, laid by `python -m scripts.cpu_runtime "
    "sync`) registers; none are registered in this process"
)


class AttentionKernelRegistry:
    """Which kernels the series' FlashAttention code calls (see module doc)."""

    def __init__(self) -> None:
        self._kernels: AttentionKernels | None = None

    def register(self, kernels: AttentionKernels) -> None:
        """Use ``kernels`` on this platform (one without FlashAttention
        kernels of its own); a later registration replaces an earlier one."""
        if current_platform.is_xpu():
            raise ValueError(
                f"attention kernels {kernels.name!r} cannot be registered on "
                f"XPU: it runs {XPU_KERNELS_PACKAGE}"
            )
        if self._kernels != kernels:
            logger.info_once("Attention kernels registered: %s", kernels.name)
        self._kernels = kernels

    def registered_name(self) -> str | None:
        """The kernels' name when any are there (XPU: ``"xpu"``), else None."""
        if current_platform.is_xpu():
            return "xpu"
        return None if self._kernels is None else self._kernels.name

    def get(self) -> AttentionKernels:
        """The kernels; :class:`MissingAttentionKernelsError` when there are
        none (loaded and checked once on XPU)."""
        if self._kernels is None:
            if not current_platform.is_xpu():
                raise MissingAttentionKernelsError(
                    NO_KERNELS_OFF_XPU.format(device=current_platform.device_type)
                )
            self._kernels = _xpu_kernels()
        return self._kernels


registry = AttentionKernelRegistry()


def flash_attn_varlen_func(*args: Any, **kwargs: Any) -> Any:
    """The registered ``flash_attn_varlen_func`` (looked up at call time)."""
    return registry.get().flash_attn_varlen_func(*args, **kwargs)


def reshape_and_cache_flash(*args: Any, **kwargs: Any) -> Any:
    """The registered ``reshape_and_cache_flash`` (looked up at call time)."""
    return registry.get().reshape_and_cache_flash(*args, **kwargs)
