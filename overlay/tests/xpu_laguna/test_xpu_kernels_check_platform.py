# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Patch 0014: vLLM's platform probe runs the series' kernels check once,
before any platform plugin is probed, so its one line reaches the user (the
probe's loop swallows what a built-in plugin raises, and the XPU plugin
swallows the failed import of the XPU platform module). An explicit CPU
target returns before it."""

import pytest

import vllm.platforms as platforms
from vllm.xpu_laguna import kernels_check as check


@pytest.fixture
def probe(monkeypatch):
    """The probe with one stand-in built-in plugin that records its call and
    finds no platform; (plugins probed, check calls)."""
    probed, checked = [], []
    monkeypatch.setattr(
        platforms, "builtin_platform_plugins", {"xpu": lambda: probed.append("xpu")}
    )
    monkeypatch.setattr(platforms, "load_plugins_by_group", lambda group: {})
    monkeypatch.setattr(check, "check_xpu_kernels", lambda: checked.append(True))
    return probed, checked


def test_the_check_runs_before_the_plugins_and_its_line_is_not_swallowed(
    probe, monkeypatch
):
    probed, checked = probe
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "xpu")

    def missing():
        raise check.missing("is not installed")

    monkeypatch.setattr(check, "check_xpu_kernels", missing)
    with pytest.raises(check.MissingAttentionKernelsError, match="is not installed"):
        platforms.resolve_current_platform_cls_qualname()
    assert probed == []  # raised before any plugin was probed


def test_a_passing_check_goes_on_to_the_plugins(probe, monkeypatch):
    probed, checked = probe
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "xpu")
    qualname = platforms.resolve_current_platform_cls_qualname()
    assert checked == [True] and probed == ["xpu"]
    assert qualname.endswith("UnspecifiedPlatform")


def test_an_explicit_cpu_target_never_runs_the_check(probe, monkeypatch):
    probed, checked = probe
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert platforms.resolve_current_platform_cls_qualname().endswith("CpuPlatform")
    assert checked == [] and probed == []
