# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant routed experts (xpu_laguna_row_invariant_moe).

In process: the wrapper over a stand-in of the XPU routed-experts kernel
whose result for a row depends on the rows sharing its experts
(``moe_row_standins.py``: the atomic remap groups routes by expert and the
grouped GEMM's policy follows rows per expert), bitwise against 1-row calls:
the plain call fails (negative control), the ``rows`` form passes; the
option (read from a config's ``additional_config["xpu_laguna"]`` and kept
by each wrapper), the width bound, the cases that keep the plain call.

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
from laguna_model_testlib import (
    assert_reads_no_variable,
    config_stand_in,
    run_driver,
    series_options,
)
from moe_row_standins import grouped_experts

from vllm.xpu_laguna import row_invariant_moe as rim

DRIVER = Path(__file__).with_name("moe_row_driver.py")
HIDDEN, INTER, EXPERTS, TOP_K = 64, 32, 16, 4


def _config(**options: object) -> Any:
    """A Laguna config whose options ask for the series (a CPU run), with
    ``options`` over them."""
    return config_stand_in(series_options(**options))


@pytest.fixture
def form():
    """``form(**options)``: the routed experts' settings of a Laguna config
    with the series' ``options`` (``read_form``, what the model installs),
    the form counters reset."""

    def read(**options: object) -> rim.MoESettings:
        rim.counters.reset()
        return rim.read_form(_config(**options))

    yield read
    rim.counters.reset()


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


def test_rows_form_equals_one_row_calls(form) -> None:
    settings = form()
    assert settings == rim.MoESettings(width=8, form="rows")  # the defaults
    method = StandInMethod()
    wrapped = rim.RowInvariantExperts(method.apply, settings)
    assert all(_rows_equal_decode(wrapped))
    assert rim.counters.calls == {"calls": 1, "rows": 8}


@pytest.mark.parametrize(
    "variant",
    [{"row_invariant_moe": "off"}, {"exact_verify": False}, {"verify_width": 4}],
)
def test_negative_control_plain_call_differs(form, variant) -> None:
    """Option off, exact path off, or more rows than the width: the plain
    call, whose M-dependence shows."""
    method = StandInMethod()
    wrapped = rim.RowInvariantExperts(method.apply, form(**variant))
    assert not any(_rows_equal_decode(wrapped))
    assert rim.counters.calls == {}


@pytest.mark.parametrize(
    ("rows", "want"), [(1, [1]), (2, [1, 1]), (8, [1] * 8), (9, [9]), (12, [12])]
)
def test_row_bounds(form, rows: int, want: list[int]) -> None:
    method = StandInMethod()
    out = _call(rim.RowInvariantExperts(method.apply, form()), *_inputs(rows))
    assert method.calls == want
    assert out.shape == (rows, HIDDEN)


def test_option_value_is_checked(form) -> None:
    with pytest.raises(ValueError, match="row_invariant_moe") as err:
        form(row_invariant_moe="lanes")
    assert "\n" not in str(err.value) and "rows, off" in str(err.value)
    assert form(row_invariant_moe="OFF").form == "off"


def test_the_series_scope_and_the_config_decide_the_form() -> None:
    """The config given decides; no config, or a config the series is not
    for: width 0."""
    assert rim.read_form(None).width == 0
    assert rim.read_form(config_stand_in(None)).width == 0  # CPU, not asked
    llama = config_stand_in(series_options(), architecture="LlamaForCausalLM")
    assert rim.read_form(llama).width == 0
    asked = _config(verify_width=4, row_invariant_moe="off")
    assert rim.read_form(asked) == rim.MoESettings(width=4, form="off")


def test_two_configs_in_one_process_get_their_own_form() -> None:
    """Nothing is remembered between reads; wrappers built from two configs
    keep their own form."""
    off, rows = _config(row_invariant_moe="off"), _config()
    for _ in range(2):
        assert rim.read_form(off).form == "off"
        assert rim.read_form(rows).form == "rows"
    method = StandInMethod()
    plain = rim.RowInvariantExperts(method.apply, rim.read_form(off))
    per_row = rim.RowInvariantExperts(method.apply, rim.read_form(rows))
    _call(plain, *_inputs(8))
    _call(per_row, *_inputs(8))
    _call(plain, *_inputs(8))
    assert method.calls == [8] + [1] * 8 + [8]


def test_nothing_is_read_from_the_environment(monkeypatch) -> None:
    configs = (_config(), _config(row_invariant_moe="off"), None)
    contrary = {
        "exact_verify": "0",
        "verify_width": "4",
        "row_invariant_moe": "off",
    }
    assert_reads_no_variable(monkeypatch, rim.read_form, configs, contrary)


def test_plain_while_compiling(form, monkeypatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    method = StandInMethod()
    _call(rim.RowInvariantExperts(method.apply, form()), *_inputs(8))
    assert method.calls == [8]


def test_shared_experts_inside_the_kernel_keep_the_plain_call(form) -> None:
    """All-to-all kernels run the shared experts inside; one call per row
    would run them per row, so the plain call is kept."""
    method = StandInMethod()
    method.mk_can_overlap_shared_experts = True
    wrapped = rim.RowInvariantExperts(method.apply, form())
    _call(wrapped, *_inputs(8), shared=object())
    assert method.calls == [8]
    method.mk_can_overlap_shared_experts = False
    method.calls.clear()
    _call(wrapped, *_inputs(8), shared=object())  # the runner runs them
    assert method.calls == [1] * 8


def test_deferred_finalize_keeps_the_plain_call(form) -> None:
    deferred = object()
    calls: list[int] = []

    def apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        calls.append(int(x.shape[0]))
        return deferred

    assert _call(rim.RowInvariantExperts(apply, form()), *_inputs(4)) is deferred
    assert calls == [1, 1, 1, 1, 4]
    assert rim.counters.calls == {}


def test_install_wraps_once() -> None:
    class Runner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.routed_experts = torch.nn.Module()
            self.routed_experts.quant_method = StandInMethod()

    runner = Runner()
    first = rim.read_form(_config())
    assert not rim.is_installed(runner)
    rim.install(runner, first)
    rim.install(runner, rim.read_form(_config(row_invariant_moe="off")))
    apply = runner.routed_experts.quant_method.apply
    assert rim.is_installed(runner) and not isinstance(apply.inner, type(apply))
    assert apply.settings == first  # the first install's form is kept
    rim.install(torch.nn.Linear(2, 2), first)  # no routed experts: nothing to wrap


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


def test_each_target_keeps_the_form_of_its_config(observed) -> None:
    """Every variant's options build a config as given (none is refused);
    each target keeps the form its config asked for, and the first one takes
    its form again after the others were built and called."""
    forms = {
        "default": {"width": 8, "form": "rows"},
        "exact_off": None,  # no exact path: the model wraps nothing
        "width_4": {"width": 4, "form": "rows"},
        "off": {"width": 8, "form": "off"},
    }
    for variant, want in forms.items():
        assert observed[f"refused/{variant}"] is None, variant
        assert observed[f"form/{variant}"] == want, variant
    assert observed["calls/default_again"] == observed["calls/default"]


@pytest.mark.parametrize(
    ("variant", "experts"),
    [("off", [8]), ("exact_off", [8]), ("width_4", [8])],
)
def test_options_on_the_model(observed, variant: str, experts) -> None:
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
