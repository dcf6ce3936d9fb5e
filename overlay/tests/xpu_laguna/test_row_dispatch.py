# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant forms (xpu_laguna_row_invariant) and their dispatch
(xpu_laguna_row_dispatch), in process: the forms against stand-ins of the
M-dependent XPU kernels (``row_invariant_standins.py``), the switches, and
the linear dispatch on vLLM's real quantization methods (unquantized and
compressed-tensors WNA16) with recording stand-in GEMMs. The real tiny
Laguna model is driven in ``test_row_dispatch_laguna.py``.
"""

from __future__ import annotations

import pytest
import torch
from laguna_model_testlib import ROW_DISPATCH_TOGGLES
from row_invariant_standins import m_dependent_linear, xpu_rms_norm
from torch import nn
from torch.nn import functional as F

import vllm.envs as envs
from vllm.model_executor.layers import xpu_laguna_row_dispatch as rd
from vllm.model_executor.layers import xpu_laguna_row_invariant as forms
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (  # noqa: E501
    CompressedTensorsLinearMethod,
)
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
    CompressedTensorsWNA16,
)

# Laguna-S TP4 per-rank heads: full/sliding q heads, k heads
LAGUNA_S_HEADS = (12, 18, 2)


@pytest.fixture
def toggles(monkeypatch):
    for name in ROW_DISPATCH_TOGGLES:
        monkeypatch.delenv(name, raising=False)

    def set_(**values: str) -> rd.Settings:
        for key, value in values.items():
            monkeypatch.setenv(f"VLLM_XPU_LAGUNA_{key}", value)
        rd.counters.reset()
        return rd.refresh()

    set_()
    yield set_
    monkeypatch.undo()
    rd.refresh()
    rd.counters.reset()


def _rows_equal_decode(fn, x: torch.Tensor) -> list[bool]:
    batch = fn(x)
    return [bool(torch.equal(batch[i], fn(x[i : i + 1])[0])) for i in range(x.shape[0])]


# -- forms -----------------------------------------------------------------


def _qkv_views(tokens: int, heads: int, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 4) * 128, generator=gen).to(dtype)
    return qkv[:, : heads * 128].view(tokens, heads, 128)


def _standin_norm(weight: torch.Tensor):
    return lambda x: xpu_rms_norm(x, weight, 1e-6)


@pytest.mark.parametrize("heads", LAGUNA_S_HEADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_forms_equal_decode_on_the_xpu_kernel_model(heads, dtype) -> None:
    weight = torch.randn(128).to(dtype)
    norm = _standin_norm(weight)
    for tokens in range(2, 17):
        x = _qkv_views(tokens, heads, dtype, seed=tokens)
        for form in (forms.per_row, forms.norm_padded):
            assert all(_rows_equal_decode(lambda t, f=form: f(norm, t), x)), (
                form.__name__,
                tokens,
            )


def test_plain_norm_differs_on_the_xpu_kernel_model() -> None:
    """Negative control: 8 tokens x 12/18/2 heads take the multi-row kernel
    (96/144/16 rows), a decode the single-row one; some rows differ (fp32
    shows every rounding difference of the variance)."""
    weight = torch.randn(128)
    norm = _standin_norm(weight)
    for heads in LAGUNA_S_HEADS:
        differing = sum(
            not ok
            for seed in range(4)
            for ok in _rows_equal_decode(norm, _qkv_views(8, heads, seed=seed))
        )
        assert differing > 0, heads


@pytest.mark.parametrize("heads", (*LAGUNA_S_HEADS, 4, 8, 16, 24))
def test_norm_pad_keeps_the_one_token_kernel(heads) -> None:
    """The padded row count takes the kernel a one-token call takes: not a
    multiple of 16 unless the one-token count is one (expectation from the
    kernel's predicate, not from the code under test)."""
    one_token_multi = heads % 16 == 0
    for tokens in range(1, 17):
        pad = forms.norm_pad_tokens(tokens, heads)
        assert pad in (0, 1)
        assert (((tokens + pad) * heads) % 16 == 0) == one_token_multi


def test_norm_padded_shape_and_values() -> None:
    x = _qkv_views(8, 12)
    out = forms.norm_padded(lambda t: t * 2, x)
    assert out.shape == x.shape and out.is_contiguous()
    assert torch.equal(out, x * 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kn", [(64, 160), (128, 64), (256, 96), (96, 256)])
def test_lanes_equal_f_linear_at_m1(dtype, kn) -> None:
    k, n = kn
    gen = torch.Generator().manual_seed(k + n)
    x = torch.randn(8, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    lanes = forms.linear_lanes(x, w)
    assert lanes.shape == (8, n) and lanes.is_contiguous()
    for i in range(8):
        assert torch.equal(lanes[i], F.linear(x[i : i + 1].clone(), w)[0])


def test_rows_form_equals_decode_on_the_m_dependent_gemm() -> None:
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(8, 96, generator=gen), torch.randn(40, 96, generator=gen)
    gemm = lambda t: m_dependent_linear(t, w)  # noqa: E731
    assert all(_rows_equal_decode(lambda t: forms.per_row(gemm, t), x))
    assert not all(_rows_equal_decode(gemm, x))  # negative control


# -- switches --------------------------------------------------------------


def test_defaults(toggles) -> None:
    s = toggles()
    assert (s.qk_norm, s.linear_form, s.int4) == ("pad", "lanes", True)
    assert s.linears == frozenset(rd.KINDS)
    assert s.width == 8  # the exact path is on here (reference kernels)
    assert envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS == "all"


def test_exact_path_off_means_no_rows(toggles) -> None:
    assert toggles(EXACT_VERIFY="0").width == 0


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("all", set(rd.KINDS)),
        ("none", set()),
        ("", set()),
        ("router, lm_head", {"router", "lm_head"}),
        ("QKV_PROJ", {"qkv_proj"}),
    ],
)
def test_parse_linears(value, want) -> None:
    assert rd.parse_linears(value) == want


@pytest.mark.parametrize("value", ["qkv", "all,router", "router,bogus"])
def test_bad_linears_value_is_one_clear_error(toggles, value) -> None:
    with pytest.raises(ValueError, match="ROW_INVARIANT_LINEARS"):
        toggles(ROW_INVARIANT_LINEARS=value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("ROW_INVARIANT_QK_NORM", "on"), ("ROW_INVARIANT_LINEAR_FORM", "bmm")],
)
def test_bad_choice_is_refused(toggles, key, value) -> None:
    with pytest.raises(ValueError, match=f"VLLM_XPU_LAGUNA_{key}"):
        toggles(**{key: value})


# -- linear dispatch on real quantization methods --------------------------


class _Layer(nn.Module):
    """A linear as vLLM's CPU methods see it: ``weight`` and the
    ``cpu_linear`` GEMM (here a recording stand-in)."""

    def __init__(self, method, n: int = 40, k: int = 96, gemm=m_dependent_linear):
        super().__init__()
        gen = torch.Generator().manual_seed(n * k)
        self.weight = nn.Parameter(
            torch.randn(n, k, generator=gen), requires_grad=False
        )
        self.quant_method = method
        self.calls: list[int] = []
        self.gemm = gemm

        def cpu_linear(x, weight, bias):
            self.calls.append(x.shape[0])
            return self.gemm(x, self.weight, bias)

        self.cpu_linear = cpu_linear

    def forward(self, x):
        return self.quant_method.apply(self, x)


class _StandInWNA16(CompressedTensorsWNA16):
    """The WNA16 scheme with its XPU ``int4_gemm_w4a16`` replaced by the
    M-dependent stand-in (the oneDNN int4 primitive is built per m)."""

    def apply_weights(self, layer, x, bias=None):
        layer.calls.append(x.shape[0])
        return m_dependent_linear(x, layer.weight, bias)


def _int4_layer(kind: str = "g_proj") -> _Layer:
    layer = _Layer(CompressedTensorsLinearMethod(None))
    layer.scheme = _StandInWNA16("group", 4, 32)
    rd._install_linear(layer, kind)
    return layer


def _bf16_layer(kind: str = "qkv_proj", **kw) -> _Layer:
    layer = _Layer(UnquantizedLinearMethod(), **kw)
    rd._install_linear(layer, kind)
    return layer


def _x(rows: int, k: int = 96) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))


def _calls(layer: _Layer, rows: int) -> list[int]:
    layer.calls.clear()
    layer(_x(rows))
    return list(layer.calls)


def test_bf16_dispatch_and_bits(toggles) -> None:
    toggles()
    layer = _bf16_layer()
    assert [_calls(layer, m) for m in (1, 2, 8, 9)] == [[1], [1, 1], [1] * 8, [9]]
    assert all(_rows_equal_decode(layer, _x(8)))
    toggles(ROW_INVARIANT_LINEARS="none")  # negative control
    assert _calls(layer, 8) == [8]
    assert not all(_rows_equal_decode(layer, _x(8)))


@pytest.mark.parametrize("kind", ["g_proj", "dense_mlp", "qkv_proj"])
def test_int4_dispatch_and_bits(toggles, kind) -> None:
    """INT4 dense linears (g_proj covered whether it is INT4 or BF16): one
    GEMM per row under the INT4 switch, independent of LINEARS."""
    toggles(ROW_INVARIANT_LINEARS="none")
    layer = _int4_layer(kind)
    assert [_calls(layer, m) for m in (1, 8, 12)] == [[1], [1] * 8, [12]]
    assert all(_rows_equal_decode(layer, _x(8)))
    assert rd.counters.calls["linear", kind, "rows"] > 0
    toggles(ROW_INVARIANT_INT4="0")  # negative control
    assert _calls(layer, 8) == [8]
    assert not all(_rows_equal_decode(layer, _x(8)))


def test_other_quantization_is_left_alone(toggles) -> None:
    class OtherMethod(LinearMethodBase):
        def create_weights(self, *a, **k):  # pragma: no cover - unused
            raise NotImplementedError

        def apply(self, layer, x, bias=None):
            return layer.cpu_linear(x, layer.weight, bias)

    toggles()
    layer = _Layer(OtherMethod())
    rd._install_linear(layer, "qkv_proj")
    assert _calls(layer, 8) == [8]


def test_uninstalled_layer_and_other_shapes_are_plain(toggles) -> None:
    toggles()
    plain = _Layer(UnquantizedLinearMethod())
    assert _calls(plain, 8) == [8]  # never installed (e.g. a drafter layer)
    layer = _bf16_layer()
    layer.calls.clear()
    layer(torch.randn(2, 4, 96))  # not a [rows, K] input
    assert layer.calls == [2]


def test_compiled_graphs_take_the_plain_path(toggles, monkeypatch) -> None:
    toggles()
    layer = _bf16_layer()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _calls(layer, 8) == [8]
    norm_calls: list[int] = []

    class Norm(nn.Module):
        def forward(self, x):
            norm_calls.append(x.shape[0])
            return x

    norm = Norm()
    setattr(norm, rd._NORM_ATTR, True)
    rd.qk_norm(norm, _qkv_views(8, 12))
    assert norm_calls == [8]


def test_lm_head_only_inside_target_logits(toggles) -> None:
    toggles()
    head = _bf16_layer("lm_head")
    assert _calls(head, 8) == [8]  # outside: the drafter's compute_logits
    with rd.target_logits():
        assert _calls(head, 8) == [1] * 8
    assert _calls(head, 8) == [8]


@pytest.mark.parametrize(
    ("case", "want"),
    [("plain", []), ("bias", [1] * 8), ("strided", [1] * 8), ("not_xpu", [1] * 8)],
)
def test_lanes_preconditions(toggles, monkeypatch, case, want) -> None:
    """Lanes need a contiguous [N, K] weight, no bias and a platform whose
    plain GEMM is F.linear; otherwise the rows form."""
    toggles()
    monkeypatch.setattr(rd, "_lanes_platform", case != "not_xpu")
    layer = _bf16_layer(gemm=F.linear)
    if case == "strided":
        layer.weight.data = layer.weight.data.t().contiguous().t()
    layer.calls.clear()
    bias = torch.zeros(40) if case == "bias" else None
    with torch.no_grad():
        out = layer.quant_method.apply(layer, _x(8), bias)
    assert layer.calls == want
    for i in range(8):
        assert torch.equal(out[i], F.linear(_x(8)[i : i + 1], layer.weight, bias)[0])
