# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Is ``vllm_xpu_kernels`` installed? Checked without importing it.

On XPU upstream imports the package from several places: the platform module
(``vllm/platforms/xpu.py``: ``import vllm_xpu_kernels._C``, which the XPU
platform detection runs and whose ImportError it swallows, so that vLLM then
finds no device) and ``vllm/_xpu_ops.py`` (through
``vllm/v1/attention/backends/fa_utils.py``). Without the package, each fails
somewhere inside upstream. :func:`require_xpu_kernels` says it in one line
instead, naming the version and the index this wheel pins: its provenance
record, written from ``pins.toml [xpu_runtime]`` when the wheel is built (the
pin is never written here). It looks with ``importlib.util.find_spec``, so
nothing of the package is imported to check it.

Only the standard library and :mod:`vllm.xpu_laguna.provenance` are imported
here: safe to call before the platform is known.
"""

import importlib.util
import sys
from collections.abc import Callable

PACKAGE = "vllm_xpu_kernels"


class MissingAttentionKernelsError(RuntimeError):
    """The kernels the FlashAttention backend needs are not there."""


def pinned() -> str:
    """The kernels this wheel pins, as the error names them:
    ``vllm_xpu_kernels==VERSION (index URL)``."""
    from vllm.xpu_laguna import provenance

    record = provenance.load() or {}
    pins = record.get("pins", {}).get("xpu_runtime", {})
    version, index = pins.get(PACKAGE), pins.get(f"{PACKAGE}_url")
    if not version:
        return f"{PACKAGE} (the version requirements/xpu.txt names)"
    return f"{PACKAGE}=={version}" + (f" (index {index})" if index else "")


def missing(why: str) -> MissingAttentionKernelsError:
    """The one-line error: the pinned kernels, then ``why``."""
    return MissingAttentionKernelsError(
        f"XPU attention kernels missing: {pinned()} {why}; "
        "install the pinned version (docs/install-xpu.md)"
    )


def installed() -> bool:
    """Whether ``vllm_xpu_kernels`` can be imported (a module already
    imported counts; nothing is imported to find out)."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE] is not None
    return importlib.util.find_spec(PACKAGE) is not None


def require_xpu_kernels() -> None:
    """:class:`MissingAttentionKernelsError` (one line) when the package is
    not installed."""
    if not installed():
        raise missing("is not installed")


def _xpu_present() -> bool:
    import torch

    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def check_xpu_kernels(xpu_present: Callable[[], bool] = _xpu_present) -> None:
    """:func:`require_xpu_kernels` for the series' XPU wheel (it carries a
    provenance record) on a machine with an XPU; nothing anywhere else (the
    CPU runtime, upstream builds). It does not ask vLLM's platform, which
    cannot be XPU without the package: a caller may run it before the
    platform is resolved."""
    from vllm.xpu_laguna import provenance

    if provenance.load() is None or not xpu_present():
        return
    require_xpu_kernels()
