# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant forms (vllm.xpu_laguna.row_invariant) and their dispatch
(vllm.xpu_laguna.row_dispatch), in process: the forms against stand-ins of the
M-dependent XPU kernels (``row_invariant_standins.py``), the switches, and
the linear dispatch on vLLM's real quantization methods (unquantized and
compressed-tensors WNA16) with recording stand-in GEMMs. The options come
from a (stand-in) config's ``additional_config["xpu_laguna"]``; installed
layers keep the settings of the config they were installed under. The real
tiny Laguna model is driven in ``test_row_dispatch_laguna.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from laguna_model_testlib import (
    assert_reads_no_variable,
    config_stand_in,
    series_options,
)
from row_invariant_standins import (
    m_dependent_linear,
    row_wise_interpreter_dot,
    xpu_rms_norm,
)
from torch import nn
from torch.nn import functional as F

from vllm.model_executor.layers.layernorm import RMSNorm
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
from vllm.xpu_laguna import row_dispatch as rd
from vllm.xpu_laguna import row_invariant as forms
from vllm.xpu_laguna.options import XpuLagunaOptions

# Laguna-S TP4 per-rank heads: full/sliding q heads, k heads
LAGUNA_S_HEADS = (12, 18, 2)


def _config(**options: object) -> SimpleNamespace:
    """A Laguna config whose options ask for the series (a CPU run), with
    ``options`` over them."""
    return config_stand_in(series_options(**options))


@pytest.fixture
def settings():
    """``settings(**options)``: the row-invariant settings of a Laguna
    config with the series' ``options`` (``read_settings``, what the model
    installs), the form counters reset."""

    def read(**options: object) -> rd.Settings:
        rd.counters.reset()
        return rd.read_settings(_config(**options))

    yield read
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


def test_norm_pad_buffer_is_reused() -> None:
    """The padded q/k norm writes into the buffer it owns (same storage
    every call, its zero token never written) and gives the values of the
    allocating form."""
    buffer = forms.NormPadBuffer(capacity=9)
    norm = _standin_norm(torch.randn(128))
    ptrs = set()
    for tokens in (8, 4, 8, 3, 4):  # 12 heads: 8 and 4 tokens are padded
        x = _qkv_views(tokens, 12, seed=tokens)
        out = forms.norm_padded(norm, x, buffer)
        assert torch.equal(out, forms.norm_padded(norm, x))
        assert out.shape == x.shape and out.is_contiguous()
        if forms.norm_pad_tokens(tokens, 12):
            ptrs.add(buffer.buffer.data_ptr())
            assert torch.count_nonzero(buffer.buffer[0]) == 0
    assert buffer.buffer.shape == (9, 12, 128)
    assert len(ptrs) == 1


def test_padded_rows_pads_to_the_width_in_one_buffer() -> None:
    pad = forms.PaddedRows(8)
    seen: list[tuple[tuple[int, ...], int]] = []

    def fn(rows: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(rows.shape), rows.data_ptr()))
        return rows * 2

    for m in (8, 1, 3, 8, 2):
        x = _x(m)
        out = pad(fn, x)
        assert torch.equal(out, x * 2) and out.shape == x.shape
        assert torch.count_nonzero(pad.buffer(x)[m:]) == 0  # pad rows zero
    assert {shape for shape, _ in seen} == {(8, 96)}
    assert len({ptr for _, ptr in seen}) == 1
    with pytest.raises(ValueError, match="not"):
        pad(fn, _x(9))


def test_rows_form_equals_decode_on_the_m_dependent_gemm() -> None:
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(8, 96, generator=gen), torch.randn(40, 96, generator=gen)
    gemm = lambda t: m_dependent_linear(t, w)  # noqa: E731
    assert all(_rows_equal_decode(lambda t: forms.per_row(gemm, t), x))
    assert not all(_rows_equal_decode(gemm, x))  # negative control


# -- options ---------------------------------------------------------------


def test_defaults(settings) -> None:
    s = settings()
    # rows on CPU (Triton interpreted); batch_invariant is the XPU default
    assert (s.qk_norm, s.linear_form, s.int4) == ("pad", "rows", True)
    assert XpuLagunaOptions().row_invariant_linear_form is None
    assert s.linears == frozenset(rd.KINDS)
    assert s.width == 8  # the exact path is on here (reference kernels)
    assert XpuLagunaOptions().row_invariant_linears == "all"


def test_exact_path_off_means_no_rows(settings) -> None:
    assert settings(exact_verify=False).width == 0


def test_the_series_scope_decides_the_width() -> None:
    """On CPU a Laguna config gets the forms only when its options ask for
    the series explicitly; another model never does; no config (nothing
    current) means no series."""
    assert rd.read_settings(_config()).width == 8
    assert rd.read_settings(config_stand_in(None)).width == 0  # not asked
    assert rd.read_settings(config_stand_in({"exact_verify": False})).width == 0
    llama = config_stand_in(series_options(), architecture="LlamaForCausalLM")
    assert rd.read_settings(llama).width == 0
    assert rd.read_settings(None).width == 0


def test_two_configs_in_one_process_get_their_own_settings() -> None:
    """Nothing is remembered between reads: each config gets what its
    options say, in any order, as often as it is read."""
    plain = _config(row_invariant_linear_form="PLAIN", verify_width=4)
    series = _config()
    without = config_stand_in(None)
    for _ in range(2):
        assert rd.read_settings(plain).linear_form == "plain"
        assert rd.read_settings(plain).width == 4
        assert rd.read_settings(series).linear_form == "rows"
        assert rd.read_settings(series).width == 8
        assert rd.read_settings(without).width == 0


def test_nothing_is_read_from_the_environment(monkeypatch) -> None:
    """The variables the series used to read change nothing (the config
    build refuses them; the forms never look)."""
    configs = (_config(), _config(row_invariant_linear_form="plain"), None)
    contrary = {
        "exact_verify": "0",
        "verify_width": "4",
        "row_invariant_qk_norm": "off",
        "row_invariant_linears": "none",
        "row_invariant_linear_form": "batch_invariant",
        "row_invariant_int4": "0",
    }
    assert_reads_no_variable(monkeypatch, rd.read_settings, configs, contrary)


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
def test_bad_linears_value_is_one_clear_error(settings, value) -> None:
    with pytest.raises(ValueError, match="xpu_laguna.row_invariant_linears"):
        settings(row_invariant_linears=value)


@pytest.mark.parametrize(
    ("key", "value", "valid"),
    [
        ("row_invariant_qk_norm", "on", "off, tokens, pad"),
        ("row_invariant_linear_form", "lanes", "batch_invariant, rows, plain"),
        ("row_invariant_linear_form", "bmm", "batch_invariant, rows, plain"),
        ("row_invariant_int4", "yes", "true or false"),
        ("row_invariant_int4", 1, "true or false"),
        ("row_invariant_linears", "qkv", "qkv_proj, o_proj"),
    ],
)
def test_bad_value_is_one_line_naming_the_valid_values(key, value, valid) -> None:
    """read_settings (the config contract's entry) and the install of a
    model's layers refuse a bad option in one line: the option, the value,
    the valid values."""
    cfg = _config(**{key: value})
    for read in (
        rd.read_settings,
        lambda c: rd.install_target_layers([], c),
        lambda c: rd.install_lm_head(nn.Linear(2, 2), c),
    ):
        with pytest.raises(ValueError) as err:
            read(cfg)
        line = str(err.value)
        assert "\n" not in line
        assert key in line and str(value) in line
        assert valid in line


def test_n_contig_weight_is_refused_with_batch_invariant(settings, monkeypatch) -> None:
    """VLLM_XPU_FORCE_N_CONTIG_WEIGHT=1 stores weights K-major; the
    batch-invariant form reads [N, K] rows: refused in one line with the fix;
    fine with rows, with no linears, or with the exact path off."""
    monkeypatch.setenv("VLLM_XPU_FORCE_N_CONTIG_WEIGHT", "1")
    with pytest.raises(ValueError, match="unset VLLM_XPU_FORCE_N_CONTIG_WEIGHT"):
        settings(row_invariant_linear_form="batch_invariant")
    assert settings(row_invariant_linear_form="rows").linear_form == "rows"
    batch_invariant = {"row_invariant_linear_form": "batch_invariant"}
    assert settings(**batch_invariant, row_invariant_linears="none").linears == (
        frozenset()
    )
    assert settings(**batch_invariant, exact_verify=False).width == 0


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


def _int4_layer(s: rd.Settings, kind: str = "g_proj") -> _Layer:
    layer = _Layer(CompressedTensorsLinearMethod(None))
    layer.scheme = _StandInWNA16("group", 4, 32)
    rd._install_linear(layer, kind, s)
    return layer


def _bf16_layer(s: rd.Settings, kind: str = "qkv_proj", **kw) -> _Layer:
    layer = _Layer(UnquantizedLinearMethod(), **kw)
    rd._install_linear(layer, kind, s)
    return layer


def _x(rows: int, k: int = 96) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))


def _calls(layer: _Layer, rows: int) -> list[int]:
    layer.calls.clear()
    layer(_x(rows))
    return list(layer.calls)


def test_bf16_rows_form_and_plain_negative_control(settings) -> None:
    """The layer's GEMM is the M-dependent stand-in (K-split chosen from
    (m, n, k), as oneDNN does): ``rows`` gives every row the 1-row bits;
    ``plain`` (the upstream GEMM at M=8) and linears ``none`` do not. Each
    layer keeps the form of the options it was installed under."""
    layer = _bf16_layer(settings(row_invariant_linear_form="rows"))
    assert [_calls(layer, m) for m in (1, 2, 8, 9)] == [[1], [1, 1], [1] * 8, [9]]
    assert all(_rows_equal_decode(layer, _x(8)))
    negatives = (
        {"row_invariant_linear_form": "plain"},
        {"row_invariant_linears": "none"},
    )
    for negative in negatives:
        other = _bf16_layer(settings(**negative))
        assert _calls(other, 8) == [8]
        assert not all(_rows_equal_decode(other, _x(8))), negative
    # the first layer still takes its own form
    assert _calls(layer, 8) == [1] * 8


@pytest.fixture
def row_wise_dot():
    with row_wise_interpreter_dot():
        yield


@pytest.fixture
def kernel_calls(monkeypatch):
    """Row counts of the calls of upstream's ``linear_batch_invariant`` (the
    real kernel runs; Triton interpreted on CPU)."""
    from vllm.model_executor.determinism import batch_invariant

    calls: list[tuple[int, ...]] = []
    real = batch_invariant.linear_batch_invariant

    def recording(x, weight, bias=None):
        calls.append(tuple(x.shape))
        return real(x, weight, bias)

    monkeypatch.setattr(batch_invariant, "linear_batch_invariant", recording)
    return calls


def test_bf16_batch_invariant_form(settings, kernel_calls, row_wise_dot) -> None:
    """batch_invariant replaces the layer's GEMM for 1..W rows (the q=1
    decode too) by upstream's batch-invariant matmul on exactly W rows; more
    rows than W run the layer's own GEMM. Rows of a W-row call equal the
    1-row call bitwise. On CPU the kernel is upstream's pointer-based
    persistent matmul (``mm_batch_invariant`` picks the descriptor kernel on
    XPU only) run by Triton's interpreter in fp32, with each row of a
    ``tl.dot`` computed on its own (``row_wise_interpreter_dot``: OpenBLAS
    rounds by row position, DPAS does not): this proves the wiring and the
    padding, not the device's DPAS arithmetic."""
    layer = _bf16_layer(settings(row_invariant_linear_form="batch_invariant"))
    assert [_calls(layer, m) for m in (1, 3, 8, 9)] == [[], [], [], [9]]
    assert kernel_calls == [(8, 96)] * 3
    assert rd.counters.calls["linear", "qkv_proj", "batch_invariant"] == 3
    with torch.no_grad():
        assert all(_rows_equal_decode(layer, _x(8)))
        bias = torch.randn(40)
        x = _x(5)
        out = layer.quant_method.apply(layer, x, bias)
        ref = torch.cat([layer.quant_method.apply(layer, r, bias) for r in x.split(1)])
    assert torch.equal(out, ref)
    torch.testing.assert_close(out, F.linear(x, layer.weight, bias))


def test_batch_invariant_refuses_a_weight_it_cannot_read(settings) -> None:
    """A K-major weight (VLLM_XPU_FORCE_N_CONTIG_WEIGHT's layout) or one vLLM
    packed away on CPU: one clear error naming the option, no silent form."""
    layer = _bf16_layer(settings(row_invariant_linear_form="batch_invariant"))
    layer.weight.data = layer.weight.data.t().contiguous().t()
    with pytest.raises(
        RuntimeError, match="row_invariant_linear_form batch_invariant needs"
    ):
        layer(_x(2))
    layer.weight.data = torch.empty(0)
    with pytest.raises(RuntimeError, match="set the form to rows"):
        layer(_x(1))


@pytest.mark.parametrize("dtype", [torch.float32])
def test_xpu_descriptor_kernel_rows_equal_one_row_call(dtype) -> None:
    """Upstream's XPU kernel (``matmul_descriptor_persistent``, tensor
    descriptors) under Triton's interpreter on CPU: with the padded-rows form
    every call of 1..8 rows is one [8, K] launch and each row equals the
    1-row call bitwise. fp32 only: Triton 3.9's interpreter multiplies BF16
    ``tl.dot`` operands as raw 16-bit integers. The interpreter is not the
    device's DPAS code generation: this proves the padding and that the
    kernel reads no other row, not the device arithmetic."""
    from vllm.model_executor.determinism import batch_invariant

    pad = forms.PaddedRows(8)
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(72, 160, generator=gen).to(dtype)
    seen: list[tuple[int, ...]] = []

    def kernel(a: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(a.shape))
        return batch_invariant.matmul_descriptor_persistent(a, w.t())

    x = torch.randn(8, 160, generator=gen).to(dtype)

    def differing(m: int) -> list[int]:
        batch = pad(kernel, x[:m])
        torch.testing.assert_close(batch, F.linear(x[:m], w))
        ones = [pad(kernel, x[i : i + 1])[0] for i in range(m)]
        return [i for i in range(m) if not torch.equal(batch[i], ones[i])]

    with row_wise_interpreter_dot():
        assert differing(8) == [] and differing(3) == []
    assert set(seen) == {(8, 160)}
    # Without the shim the interpreter's BLAS rounds rows by their position in
    # the block (a CPU property, reported, not asserted either way).
    print("interpreter rows differing without the row-wise dot:", differing(8))


@pytest.mark.parametrize("kind", ["g_proj", "dense_mlp", "qkv_proj"])
def test_int4_dispatch_and_bits(settings, kind) -> None:
    """INT4 dense linears (g_proj covered whether it is INT4 or BF16): one
    GEMM per row under the INT4 option, independent of the linears option."""
    layer = _int4_layer(settings(row_invariant_linears="none"), kind)
    assert [_calls(layer, m) for m in (1, 8, 12)] == [[1], [1] * 8, [12]]
    assert all(_rows_equal_decode(layer, _x(8)))
    assert rd.counters.calls["linear", kind, "rows"] > 0
    # negative control: the option off, on a layer installed under it
    off = _int4_layer(settings(row_invariant_int4=False), kind)
    assert _calls(off, 8) == [8]
    assert not all(_rows_equal_decode(off, _x(8)))
    assert _calls(layer, 8) == [1] * 8  # the first layer keeps its form


def test_other_quantization_is_left_alone(settings) -> None:
    class OtherMethod(LinearMethodBase):
        def create_weights(self, *a, **k):  # pragma: no cover - unused
            raise NotImplementedError

        def apply(self, layer, x, bias=None):
            return layer.cpu_linear(x, layer.weight, bias)

    layer = _Layer(OtherMethod())
    rd._install_linear(layer, "qkv_proj", settings())
    assert _calls(layer, 8) == [8]


def test_uninstalled_layer_and_other_shapes_are_plain(settings) -> None:
    plain = _Layer(UnquantizedLinearMethod())
    assert _calls(plain, 8) == [8]  # never installed (e.g. a drafter layer)
    layer = _bf16_layer(settings())
    layer.calls.clear()
    layer(torch.randn(2, 4, 96))  # not a [rows, K] input
    assert layer.calls == [2]


def _record(norm: nn.Module) -> list[tuple[int, tuple[int, ...]]]:
    """The pointer and shape of each call an installed q/k norm makes to
    its RMSNorm kernel (recorded from now on)."""
    seen: list[tuple[int, tuple[int, ...]]] = []
    kernel = norm._forward_method

    def forward(x: torch.Tensor) -> torch.Tensor:
        seen.append((x.data_ptr(), tuple(x.shape)))
        return kernel(x)

    norm._forward_method = forward
    return seen


@pytest.fixture(autouse=True)
def _current_config():
    """RMSNorm is a CustomOp: built under a current config (as in a model,
    which is built under its own)."""
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


def _decoder_layer() -> SimpleNamespace:
    """What ``install_target_layers`` reads of a LagunaDecoderLayer: q/k
    norms, a BF16 qkv_proj and a dense MLP's up_proj (the others absent)."""
    return SimpleNamespace(
        self_attn=SimpleNamespace(
            q_norm=RMSNorm(128, eps=1e-6),
            k_norm=RMSNorm(128, eps=1e-6),
            qkv_proj=_Layer(UnquantizedLinearMethod()),
            o_proj=None,
        ),
        mlp=SimpleNamespace(
            gate_proj=None, up_proj=_Layer(UnquantizedLinearMethod()), down_proj=None
        ),
    )


def test_compiled_graphs_take_the_plain_path(settings, monkeypatch) -> None:
    layer = _bf16_layer(settings())
    decoder = _decoder_layer()
    rd.install_target_layers([decoder], _config())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _calls(layer, 8) == [8]
    norm = decoder.self_attn.q_norm
    seen = _record(norm)
    norm(_qkv_views(8, 12))
    assert [shape[0] for _, shape in seen] == [8]
    monkeypatch.undo()  # control: the same call outside a compiled graph
    norm(_qkv_views(8, 12))
    assert [shape[0] for _, shape in seen] == [8, 9]


def test_lm_head_only_inside_target_logits(settings) -> None:
    head = _bf16_layer(settings(), "lm_head")
    assert _calls(head, 8) == [8]  # outside: the drafter's compute_logits
    with rd.target_logits():
        assert _calls(head, 8) == [1] * 8
    assert _calls(head, 8) == [8]


def test_install_keeps_the_settings_of_the_config_it_was_given() -> None:
    """Layers installed under two configs keep their own settings: norms
    (built as RowInvariantQKNorm, same weight name), linears and the
    lm_head."""
    first, second = _decoder_layer(), _decoder_layer()
    head_first, head_second = (
        _Layer(UnquantizedLinearMethod()),
        _Layer(UnquantizedLinearMethod()),
    )
    tokens = _config(row_invariant_qk_norm="tokens", verify_width=4)
    plain = _config(row_invariant_linear_form="plain")
    rd.install_target_layers([first], tokens)
    rd.install_lm_head(head_first, tokens)
    rd.install_target_layers([second], plain)
    rd.install_lm_head(head_second, plain)
    for layer, head, want in (
        (first, head_first, rd.read_settings(tokens)),
        (second, head_second, rd.read_settings(plain)),
    ):
        attn = layer.self_attn
        for norm in (attn.q_norm, attn.k_norm):
            assert isinstance(norm, rd.RowInvariantQKNorm)
            assert norm.settings == want
            assert [name for name, _ in norm.named_parameters()] == ["weight"]
        for linear, kind in (
            (attn.qkv_proj, "qkv_proj"),
            (layer.mlp.up_proj, "dense_mlp"),
            (head, "lm_head"),
        ):
            assert linear.quant_method.apply.settings == want
            assert rd.installed_kind(linear) == kind
    # and they act on it: tokens form up to 4 rows vs plain linears at 8
    assert _calls(first.self_attn.qkv_proj, 4) == [1] * 4
    assert _calls(first.self_attn.qkv_proj, 8) == [8]  # wider than its width
    assert _calls(second.self_attn.qkv_proj, 4) == [4]
    seen = _record(first.self_attn.q_norm)
    first.self_attn.q_norm(_qkv_views(3, 12))
    assert [shape for _, shape in seen] == [(1, 12, 128)] * 3


def test_install_without_a_config_installs_no_forms() -> None:
    """No config (no series): the layers are built but take no form
    (width 0)."""
    layer = _decoder_layer()
    rd.install_target_layers([layer], None)
    assert layer.self_attn.q_norm.settings.width == 0
    assert _calls(layer.self_attn.qkv_proj, 8) == [8]


def test_qk_norm_pad_writes_into_the_norm_s_buffer() -> None:
    """Item 9: the installed q/k norm owns a [W+1, heads, head_dim] buffer;
    every padded call hands the kernel that storage (no allocation per call)
    and the result is the allocating form's."""
    layer = _decoder_layer()
    rd.install_target_layers([layer], _config())
    norm = layer.self_attn.q_norm
    with torch.no_grad():
        norm.weight.copy_(torch.randn(128))
    seen = _record(norm)
    for tokens in (8, 4, 8):
        x = _qkv_views(tokens, 12, seed=tokens)
        out = norm(x)
        assert torch.equal(out, forms.norm_padded(norm._forward_method, x))
    padded = seen[0::2]  # each check above calls the kernel once more
    assert [shape for _, shape in padded] == [(9, 12, 128), (5, 12, 128), (9, 12, 128)]
    assert len({ptr for ptr, _ in padded}) == 1
    assert norm.pad_buffer.buffer is not None
    assert norm.pad_buffer.buffer.shape == (9, 12, 128)
