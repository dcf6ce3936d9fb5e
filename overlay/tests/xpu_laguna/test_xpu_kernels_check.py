# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A missing ``vllm_xpu_kernels`` on XPU is one line naming the version and
the index the wheel pins (its provenance record), found with ``find_spec``
before anything imports the package; present, or not the series' XPU wheel on
an XPU, nothing is said.

The module under test imports only the standard library and
``vllm.xpu_laguna.provenance``: this file also runs outside the CPU runtime,
with the overlay as the ``vllm`` package
(``PYTHONPATH=overlay python -m pytest --noconftest THIS_FILE``).
"""

import importlib.machinery
import sys

import pytest

from vllm.xpu_laguna import kernels_check as check
from vllm.xpu_laguna import provenance as xpu_laguna_provenance

INDEX = "https://example.invalid/kernels/whl/"


def _record(version="0.1.17", index=INDEX):
    pins = {"vllm_xpu_kernels": version, "vllm_xpu_kernels_url": index}
    return {"pins": {"xpu_runtime": {k: v for k, v in pins.items() if v}}}


@pytest.fixture
def looked_up(monkeypatch):
    """``find_spec`` of the module under test, answering for the kernels:
    None (not installed) until the test says otherwise; the names asked."""
    asked = []
    answer = {"spec": None}

    def find_spec(name, package=None):
        asked.append(name)
        assert name == check.PACKAGE
        return answer["spec"]

    monkeypatch.delitem(sys.modules, check.PACKAGE, raising=False)
    monkeypatch.setattr(check.importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(xpu_laguna_provenance, "load", _record)
    return asked, answer


def test_a_missing_package_on_xpu_is_one_line_naming_the_pin(looked_up):
    asked, _ = looked_up
    with pytest.raises(check.MissingAttentionKernelsError) as err:
        check.check_xpu_kernels(xpu_present=lambda: True)
    assert str(err.value) == (
        "XPU attention kernels missing: vllm_xpu_kernels==0.1.17 "
        f"(index {INDEX}) is not installed; install the pinned version "
        "(docs/install-xpu.md)"
    )
    assert asked == ["vllm_xpu_kernels"]
    assert check.PACKAGE not in sys.modules  # looked for, never imported


def test_the_package_present_is_no_error(looked_up):
    """Negative control: the same check with the package found."""
    asked, answer = looked_up
    answer["spec"] = importlib.machinery.ModuleSpec(check.PACKAGE, None)
    check.check_xpu_kernels(xpu_present=lambda: True)
    assert asked == ["vllm_xpu_kernels"]


def test_the_pin_is_the_records(looked_up, monkeypatch):
    """The version and index come from the wheel's provenance, not from a
    constant here."""
    monkeypatch.setattr(
        xpu_laguna_provenance,
        "load",
        lambda: _record("9.8.7", "https://example.invalid/other/"),
    )
    with pytest.raises(check.MissingAttentionKernelsError) as err:
        check.require_xpu_kernels()
    assert "vllm_xpu_kernels==9.8.7 (index https://example.invalid/other/)" in str(
        err.value
    )
    monkeypatch.setattr(xpu_laguna_provenance, "load", lambda: _record(index=""))
    assert check.pinned() == "vllm_xpu_kernels==0.1.17"
    monkeypatch.setattr(xpu_laguna_provenance, "load", lambda: {"pins": {}})
    assert check.pinned() == (
        "vllm_xpu_kernels (the version requirements/xpu.txt names)"
    )


def test_nothing_is_said_off_the_series_xpu_wheel_or_off_an_xpu(looked_up, monkeypatch):
    asked, _ = looked_up
    check.check_xpu_kernels(xpu_present=lambda: False)  # no XPU here
    monkeypatch.setattr(xpu_laguna_provenance, "load", lambda: None)
    check.check_xpu_kernels(xpu_present=lambda: True)  # CPU runtime, upstream
    assert asked == []


def test_an_imported_module_counts_and_a_blocked_one_does_not(looked_up, monkeypatch):
    asked, _ = looked_up
    monkeypatch.setitem(sys.modules, check.PACKAGE, None)  # import blocked
    assert check.installed() is False
    monkeypatch.setitem(sys.modules, check.PACKAGE, sys)  # any module object
    assert check.installed() is True
    assert asked == []
