# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant dispatch (0011) through a real tiny Laguna target and its
DFlash drafter on CPU: which modules are installed, which calls take which
form (GEMM and norm calls counted at 1, 2..8 and 12 rows), and that with
M-dependent stand-in kernels (``row_invariant_standins.py``) every verify
row of the target equals the 1-row call bitwise while the plain path (and
the drafter, never installed) does not.

The observations come from ``row_dispatch_driver.py``, run once in its own
process (it initialises a one-rank distributed group and builds one target
and drafter per set of the series' options, given in each config's
``additional_config["xpu_laguna"]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from laguna_model_testlib import run_driver

from vllm.xpu_laguna.row_dispatch import KINDS

DRIVER = Path(__file__).with_name("row_dispatch_driver.py")
TARGET_BLOCKS = ("target_attention_0", "target_attention_1", "target_dense_mlp_0")
DRAFT_UNITS = (
    "draft_qkv_proj",
    "draft_lm_head",
    "draft_attention_0",
    "draft_dense_mlp_0",
)


# The variants whose options the configuration contract refuses on the
# exact path (a form off): built without them, given them afterwards.
REFUSED = {
    "linears_none": "row_invariant_linears leaves",
    "linears_router": "row_invariant_linears leaves",
    "norms/off": "row_invariant_qk_norm off",
    "standin/off": "row_invariant_qk_norm off",
    "standin/norm_off": "row_invariant_qk_norm off",
    "standin/linears_none": "row_invariant_linears leaves",
}


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_driver(DRIVER, tmp_path_factory.mktemp("row-dispatch"))


def test_the_contract_refuses_exactly_the_negative_controls(observed) -> None:
    """Every other variant's options build a config as given; the negative
    controls' (a form off on the exact path) are refused in one line naming
    the option, so the driver gives them to the config after it is built."""
    refused = observed["refused"]
    assert {k for k, v in refused.items() if v is not None} == set(REFUSED)
    for variant, text in REFUSED.items():
        line = refused[variant]
        assert line.startswith("XPU Laguna series: xpu_laguna.") and text in line


def test_installed_on_target_layers_only(observed) -> None:
    target = observed["installed"]["target"]
    assert sorted(set(target["kinds"].values())) == sorted(KINDS)
    assert target["kinds"]["model.layers.0.mlp.down_proj"] == "dense_mlp"
    assert target["kinds"]["model.layers.1.mlp.gate"] == "router"
    assert (
        target["kinds"]["model.layers.1.mlp.shared_expert.down_proj"] == "shared_expert"
    )
    assert len(target["norms"]) == 4  # q/k norms of both layers
    draft = observed["installed"]["draft"]
    # the drafter's own layers are never installed; its lm_head is the
    # target's (shared by the proposer) and is scoped to the target's logits
    assert draft == {"kinds": {"lm_head": "lm_head"}, "norms": []}


@pytest.mark.parametrize("kind", KINDS)
def test_default_dispatch_counts(observed, kind: str) -> None:
    calls = observed["calls/default"]
    assert calls[f"{kind}/1"] == [1]  # q=1 decode: one plain call
    assert calls[f"{kind}/4"] == [1] * 4  # verify rows: one M=1 call per row (CPU)
    assert calls[f"{kind}/8"] == [1] * 8
    assert calls[f"{kind}/12"] == [12]  # more rows than the width: plain
    assert calls["counters"][f"linear/{kind}/rows"] == 2  # the 4- and 8-row calls


def test_each_model_keeps_the_forms_of_its_config(observed) -> None:
    """Two configs in one process get their own forms: every model keeps
    what its config asked for when it was built (read from the config, kept
    on the installed layers), and the first model takes the default forms
    again after models of every other variant were built and called."""
    default = observed["settings/default"]["qkv_proj"]
    assert default == {
        "width": 8,
        "qk_norm": "pad",
        "linears": sorted(KINDS),
        "linear_form": "rows",
        "int4": True,
    }
    assert observed["settings/default"]["q_norm"] == default
    assert observed["settings/exact_off"] is None  # no exact path: none built
    assert observed["settings/width_4"]["qkv_proj"]["width"] == 4
    assert observed["settings/form_plain"]["qkv_proj"]["linear_form"] == "plain"
    assert observed["settings/linears_router"]["q_norm"]["linears"] == [
        "lm_head",
        "router",
    ]
    again = observed["calls/default_again"]
    assert again == observed["calls/default"]
    assert again["qkv_proj/8"] == [1] * 8  # not the plain form of the last build


def test_drafter_takes_the_plain_path(observed) -> None:
    calls = observed["calls/default"]
    assert calls["draft_qkv_proj/8"] == [8]
    assert calls["draft_lm_head/8"] == [8]  # the shared head, outside target logits


@pytest.mark.parametrize(
    ("variant", "on"),
    [
        ("linears_none", ()),
        ("linears_router", ("router", "lm_head")),
        ("form_rows", KINDS),
        ("form_plain", ()),
        ("exact_off", ()),
    ],
)
def test_options_select_the_kinds(observed, variant: str, on: tuple[str, ...]) -> None:
    calls = observed[f"calls/{variant}"]
    for kind in KINDS:
        want = [1] * 8 if kind in on else [8]
        assert calls[f"{kind}/8"] == want, (variant, kind)
        assert calls[f"{kind}/1"] == [1]


def test_verify_width_bounds_the_rows(observed) -> None:
    calls = observed["calls/width_4"]
    for kind in KINDS:
        assert calls[f"{kind}/4"] == [1] * 4
        assert calls[f"{kind}/8"] == [8]


def test_batch_invariant_form_replaces_the_gemm(observed) -> None:
    """batch_invariant runs upstream's batch-invariant matmul (interpreted
    here) for 1..8 rows, the q=1 decode included: the layer's own GEMM is not
    called; 12 rows (more than the width) run it. Every target row equals
    the 1-row call bitwise; the drafter (plain fp32 F.linear) does not."""
    calls = observed["calls/batch_invariant"]
    for kind in KINDS:
        assert calls[f"{kind}/1"] == [] and calls[f"{kind}/8"] == [], kind
        assert calls[f"{kind}/12"] == [12], kind
        assert calls["counters"][f"linear/{kind}/batch_invariant"] == 2
    assert calls["draft_qkv_proj/8"] == [8]
    bitwise = observed["bitwise/batch_invariant"]
    for unit in (*KINDS, *TARGET_BLOCKS):
        assert all(bitwise[unit]), unit
    # negative control: plain fp32 F.linear on this CPU is not row-invariant
    assert not all(bitwise["draft_qkv_proj"]) and not all(bitwise["draft_lm_head"])


@pytest.mark.parametrize(
    ("form", "rows", "want_q", "want_k"),
    [
        # 8 q heads, 4 k heads: rows x heads multiple of 16 -> one zero token
        ("pad", 1, [1], [1]),
        ("pad", 2, [3], [2]),
        ("pad", 3, [3], [3]),
        ("pad", 8, [9], [9]),
        ("pad", 12, [12], [12]),
        ("tokens", 1, [1], [1]),
        ("tokens", 3, [1] * 3, [1] * 3),
        ("tokens", 8, [1] * 8, [1] * 8),
        ("tokens", 12, [12], [12]),
        ("off", 8, [8], [8]),
    ],
)
def test_qk_norm_dispatch(observed, form, rows, want_q, want_k) -> None:
    calls = observed[f"norms/{form}"]
    assert calls[f"target/q_norm/{rows}"] == want_q
    assert calls[f"target/k_norm/{rows}"] == want_k
    assert calls[f"draft/q_norm/{rows}"] == [rows]
    assert calls[f"draft/k_norm/{rows}"] == [rows]


@pytest.mark.parametrize("variant", ["default", "tokens"])
def test_target_rows_equal_decode_with_m_dependent_kernels(observed, variant) -> None:
    bitwise = observed[f"bitwise/standin/{variant}"]
    for unit in (*KINDS, *TARGET_BLOCKS):
        assert all(bitwise[unit]), (variant, unit)
    for unit in DRAFT_UNITS:  # never installed: the stand-ins' M-dependence shows
        assert not any(bitwise[unit]), (variant, unit)


@pytest.mark.parametrize("variant", ["off", "exact_off"])
def test_negative_control_plain_path_differs(observed, variant) -> None:
    """With the forms off (their options off, or the exact path off) the
    same M-dependent kernels make verify rows differ from decode."""
    bitwise = observed[f"bitwise/standin/{variant}"]
    for unit in (*KINDS, *TARGET_BLOCKS):
        assert not all(bitwise[unit]), (variant, unit)


def test_plain_linear_form_fails_on_the_m_dependent_gemm(observed) -> None:
    """Negative control of the linear form: ``plain`` leaves the layer's
    GEMM (K-split chosen from (m, n, k)) at M=8; every linear unit and block
    with a linear differs from decode, the q/k norm form still on."""
    bitwise = observed["bitwise/standin/plain"]
    for unit in (*KINDS, *TARGET_BLOCKS):
        assert not all(bitwise[unit]), unit


def test_each_option_is_needed(observed) -> None:
    """Negative controls per option: q/k norm off alone breaks the attention
    rows (the norm stand-in) but not the dense MLP; linears off alone breaks
    both."""
    norm_off = observed["bitwise/standin/norm_off"]
    assert not all(norm_off["target_attention_0"])
    assert all(norm_off["target_dense_mlp_0"]) and all(norm_off["qkv_proj"])
    linears_none = observed["bitwise/standin/linears_none"]
    assert not all(linears_none["target_attention_0"])
    assert not all(linears_none["target_dense_mlp_0"])
