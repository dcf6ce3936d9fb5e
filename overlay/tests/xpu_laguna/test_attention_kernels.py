# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The kernels of the series' FlashAttention code: the kernel registry.

No fallback to the test-side reference kernels: off XPU only registered
kernels run (the CPU runtime's plugin registers them), none registered is one
error saying what is needed; on XPU only ``vllm_xpu_kernels`` runs, a missing
or too old one is one error naming it with the wheel's pinned version, and
nothing can be registered in its place.
"""

import sys
from types import ModuleType

import pytest
import xpu_laguna_standins

from vllm.xpu_laguna.attention import exact as xpu_laguna_exact
from vllm.xpu_laguna.attention import kernels

INDEX = "https://example.invalid/kernels/whl/"
RECORD = {
    "pins": {
        "xpu_runtime": {"vllm_xpu_kernels": "0.1.17", "vllm_xpu_kernels_url": INDEX}
    }
}


def _fresh(monkeypatch) -> kernels.AttentionKernelRegistry:
    registry = kernels.AttentionKernelRegistry()
    monkeypatch.setattr(kernels, "registry", registry)
    monkeypatch.setattr(xpu_laguna_exact, "kernel_registry", registry)
    return registry


def _on_xpu(monkeypatch) -> None:
    monkeypatch.setattr(kernels.current_platform, "is_xpu", lambda: True)
    monkeypatch.setattr("vllm.xpu_laguna.provenance.load", lambda: RECORD, raising=True)


def test_off_xpu_nothing_registered_is_one_clear_error(monkeypatch):
    registry = _fresh(monkeypatch)
    assert xpu_laguna_exact.kernel_seam_name() == "none"
    with pytest.raises(kernels.MissingAttentionKernelsError) as err:
        kernels.flash_attn_varlen_func(q=None)
    assert "FlashAttention on cpu has no kernels" in str(err.value)
    assert "CPU runtime's reference kernels" in str(err.value)
    assert "\n" not in str(err.value)
    # the impl asks at construction, before any forward
    with pytest.raises(kernels.MissingAttentionKernelsError):
        xpu_laguna_exact.checked_fa_version(None)
    assert registry.registered_name() is None


def test_the_runtime_plugin_registers_the_reference_kernels(monkeypatch):
    registry = _fresh(monkeypatch)
    assert xpu_laguna_standins.register() is True
    assert xpu_laguna_exact.kernel_seam_name() == "reference"
    assert xpu_laguna_exact.checked_fa_version(None) == 2
    from xpu_laguna_standins import reference_attention

    got = registry.get()
    assert got.flash_attn_varlen_func is reference_attention.flash_attn_varlen_func
    assert got.reshape_and_cache_flash is reference_attention.reshape_and_cache_flash


def test_on_xpu_a_missing_kernel_package_names_its_pin(monkeypatch):
    _fresh(monkeypatch)
    _on_xpu(monkeypatch)
    monkeypatch.setitem(sys.modules, "vllm_xpu_kernels", None)  # not installed
    with pytest.raises(kernels.MissingAttentionKernelsError) as err:
        kernels.registry.get()
    message = str(err.value)
    assert message.startswith(
        "XPU attention kernels missing: vllm_xpu_kernels==0.1.17 "
        f"(index {INDEX}) is not installed"
    )
    assert "\n" not in message and "reference" not in message


def test_on_xpu_a_kernel_without_the_split_count_is_refused(monkeypatch):
    _fresh(monkeypatch)
    _on_xpu(monkeypatch)
    package = ModuleType("vllm_xpu_kernels")
    interface = ModuleType("vllm_xpu_kernels.flash_attn_interface")
    interface.flash_attn_varlen_func = lambda q, k, v, num_splits=0: None
    package.flash_attn_interface = interface
    monkeypatch.setitem(sys.modules, "vllm_xpu_kernels", package)
    monkeypatch.setitem(sys.modules, interface.__name__, interface)
    with pytest.raises(kernels.MissingAttentionKernelsError, match="num_splits_kv"):
        kernels.registry.get()


def test_on_xpu_nothing_can_be_registered(monkeypatch):
    """Negative control of the fallback: the reference kernels never reach
    an XPU, not even through the plugin."""
    registry = _fresh(monkeypatch)
    _on_xpu(monkeypatch)
    monkeypatch.setattr(
        "vllm.platforms.current_platform.is_cpu", lambda: False, raising=True
    )
    assert xpu_laguna_standins.register() is False
    reference = kernels.AttentionKernels("reference", print, print)
    with pytest.raises(ValueError, match="cannot be registered on XPU"):
        registry.register(reference)
