# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant routed experts (xpu_laguna_row_invariant_moe).

In process: the wrapper over a stand-in of the XPU routed-experts kernel
whose result for a row depends on the rows sharing its experts
(``moe_row_standins.py``: the atomic remap groups routes by expert and the
grouped GEMM's policy follows rows per expert), bitwise against 1-row calls:
the plain call fails (negative control), the ``rows`` form passes; the
switch, the width bound, the cases that keep the plain call.

Through a real tiny Laguna target and a DFlash drafter with a sparse layer
(``moe_row_driver.py``, its own process): the wrapper sits on the target's
MoE only, the experts kernel is called once per verify row while routing,
the shared expert and the final reduction run once for all rows, and the
target's verify rows equal its 1-row forwards with the stand-in kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from laguna_model_testlib import MOE_TOGGLES, run_driver, toggles_fixture
from moe_row_standins import grouped_experts

from vllm.model_executor.layers import xpu_laguna_row_invariant_moe as rim

DRIVER = Path(__file__).with_name("moe_row_driver.py")
HIDDEN, INTER, EXPERTS, TOP_K = 64, 32, 16, 4


@pytest.fixture
def toggles(monkeypatch):
    def reload() -> rim.MoESettings:
        rim.moe_settings.cache_clear()
        rim.counters.reset()
        return rim.moe_settings()

    yield from toggles_fixture(monkeypatch, MOE_TOGGLES, reload)


class StandInMethod:
    """A quantization method's ``apply`` over the stand-in kernel; records
    the row count of each call."""

    mk_can_overlap_shared_experts = False

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) * 0.2
        self.w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) * 0.2
        self.calls: list[int] = []

    def apply(
        self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input
    ) -> Any:
        self.calls.append(int(x.shape[0]))
        return grouped_experts(x, self.w13, self.w2, topk_weights, topk_ids)


def _inputs(rows: int, seed: int = 3) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, HIDDEN, generator=gen)
    logits = torch.randn(rows, EXPERTS, generator=gen)
    weights, ids = torch.topk(logits.sigmoid(), TOP_K, dim=-1)
    return x, weights, ids


def _call(fn, x, weights, ids, shared=None) -> Any:
    return fn(
        layer=None,
        x=x,
        topk_weights=weights,
        topk_ids=ids,
        shared_experts=shared,
        shared_experts_input=None,
    )


def _rows_equal_decode(fn, rows: int = 8) -> list[bool]:
    x, w, ids = _inputs(rows)
    batch = _call(fn, x, w, ids)
    return [
        bool(torch.equal(batch[i], _call(fn, *(t[i : i + 1] for t in (x, w, ids)))[0]))
        for i in range(rows)
    ]


def test_standin_depends_on_the_rows_of_the_call() -> None:
    """The stand-in is M-dependent (else the tests below prove nothing)."""
    method = StandInMethod()
    assert not any(_rows_equal_decode(method.apply))


def test_rows_form_equals_one_row_calls(toggles) -> None:
    assert toggles() == rim.MoESettings(width=8, form="rows")  # the defaults
    method = StandInMethod()
    wrapped = rim.RowInvariantExperts(method.apply)
    assert all(_rows_equal_decode(wrapped))
    assert rim.counters.calls == {"calls": 1, "rows": 8}


@pytest.mark.parametrize(
    "variant",
    [{"ROW_INVARIANT_MOE": "off"}, {"EXACT_VERIFY": "0"}, {"VERIFY_WIDTH": "4"}],
)
def test_negative_control_plain_call_differs(toggles, variant) -> None:
    """Switch off, exact path off, or more rows than the width: the plain
    call, whose M-dependence shows."""
    toggles(**variant)
    method = StandInMethod()
    assert not any(_rows_equal_decode(rim.RowInvariantExperts(method.apply)))
    assert rim.counters.calls == {}


@pytest.mark.parametrize(
    ("rows", "want"), [(1, [1]), (2, [1, 1]), (8, [1] * 8), (9, [9]), (12, [12])]
)
def test_row_bounds(toggles, rows: int, want: list[int]) -> None:
    method = StandInMethod()
    out = _call(rim.RowInvariantExperts(method.apply), *_inputs(rows))
    assert method.calls == want
    assert out.shape == (rows, HIDDEN)


def test_switch_value_is_checked(toggles) -> None:
    with pytest.raises(ValueError, match="VLLM_XPU_LAGUNA_ROW_INVARIANT_MOE"):
        toggles(ROW_INVARIANT_MOE="lanes")
    assert toggles(ROW_INVARIANT_MOE="OFF").form == "off"


def test_plain_while_compiling(toggles, monkeypatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    method = StandInMethod()
    _call(rim.RowInvariantExperts(method.apply), *_inputs(8))
    assert method.calls == [8]


def test_shared_experts_inside_the_kernel_keep_the_plain_call(toggles) -> None:
    """All-to-all kernels run the shared experts inside; one call per row
    would run them per row, so the plain call is kept."""
    method = StandInMethod()
    method.mk_can_overlap_shared_experts = True
    wrapped = rim.RowInvariantExperts(method.apply)
    _call(wrapped, *_inputs(8), shared=object())
    assert method.calls == [8]
    method.mk_can_overlap_shared_experts = False
    method.calls.clear()
    _call(wrapped, *_inputs(8), shared=object())  # the runner runs them
    assert method.calls == [1] * 8


def test_deferred_finalize_keeps_the_plain_call(toggles) -> None:
    deferred = object()
    calls: list[int] = []

    def apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        calls.append(int(x.shape[0]))
        return deferred

    assert _call(rim.RowInvariantExperts(apply), *_inputs(4)) is deferred
    assert calls == [1, 1, 1, 1, 4]
    assert rim.counters.calls == {}


def test_install_wraps_once() -> None:
    class Runner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.routed_experts = torch.nn.Module()
            self.routed_experts.quant_method = StandInMethod()

    runner = Runner()
    assert not rim.is_installed(runner)
    rim.install(runner)
    rim.install(runner)
    apply = runner.routed_experts.quant_method.apply
    assert rim.is_installed(runner) and not isinstance(apply.inner, type(apply))
    rim.install(torch.nn.Linear(2, 2))  # no routed experts: nothing to wrap


# -- the real tiny Laguna target (driver process) ------------------------------


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_driver(DRIVER, tmp_path_factory.mktemp("moe-rows"))


def test_installed_on_the_target_moe_only(observed) -> None:
    assert observed["installed"] == {
        "target": {"model.layers.1.mlp.experts": True},
        "draft": {"model.layers.0.mlp.experts": False},
    }


@pytest.mark.parametrize(
    ("rows", "experts"), [(1, [1]), (4, [1] * 4), (8, [1] * 8), (12, [12])]
)
def test_experts_per_row_the_rest_once(observed, rows: int, experts) -> None:
    calls = observed["calls/default"]
    assert calls[f"target.experts/{rows}"] == experts
    for once in ("select_experts", "shared_expert", "final_reduce"):
        assert calls[f"target.{once}/{rows}"] == [rows], once
        assert calls[f"draft.{once}/{rows}"] == [rows], once
    assert calls[f"draft.experts/{rows}"] == [rows]  # never wrapped
    assert calls["counters"] == {"calls": 2, "rows": 12}  # the 4- and 8-row calls


@pytest.mark.parametrize(
    ("variant", "experts"),
    [("off", [8]), ("exact_off", [8]), ("width_4", [8])],
)
def test_switches_on_the_model(observed, variant: str, experts) -> None:
    calls = observed[f"calls/{variant}"]
    assert calls["target.experts/8"] == experts
    assert calls["target.experts/1"] == [1]
    if variant == "width_4":
        assert calls["target.experts/4"] == [1] * 4


def test_target_rows_equal_decode_with_the_standin_kernel(observed) -> None:
    assert all(observed["bitwise/standin/default"]["target"])
    # the real CPU kernel: the form is per-row calls, so equal as well
    assert all(observed["bitwise/real/default"]["target"])


@pytest.mark.parametrize("variant", ["off", "exact_off", "width_4"])
def test_negative_control_on_the_model(observed, variant: str) -> None:
    """Without the form the stand-in kernel's M-dependence reaches the
    target's MoE output; the drafter's (never wrapped) always shows it."""
    assert not any(observed[f"bitwise/standin/{variant}"]["target"])
    assert not any(observed["bitwise/standin/default"]["draft"])
