# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant CPU elementwise math (Laguna's gate softplus, MLP silu, router
sigmoid).

Row i of a q-row call must give the bits the 1-row call of the same values
gives. Plain PyTorch CPU kernels do not (SIMD chunks vs scalar tail): that is
the negative control; :func:`xpu_laguna_row_invariant.apply` does.
"""

import pytest
import torch
from torch.nn import functional as F

from vllm.model_executor.layers.fused_moe.router import cpu_router
from vllm.model_executor.models.laguna import LagunaMLP
from vllm.xpu_laguna import row_invariant as ri

FUNCTIONS = {"softplus": F.softplus, "sigmoid": torch.sigmoid, "silu": F.silu}
# (rows, values per row): Laguna gate (4 heads), tiny router (8 experts),
# Laguna-S router (128 experts), a width-16 verify, the tiny target's shared
# expert at TP 2 (16 columns per rank)
SHAPES = [(8, 4), (8, 8), (8, 128), (16, 4), (3, 40), (8, 16)]


def _rows_differing(fn, x, apply):
    batch = apply(fn, x)
    return [
        i
        for i in range(x.shape[0])
        if not torch.equal(batch[i], apply(fn, x[i : i + 1])[0])
    ]


def _plain(fn, x):
    return fn(x)


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rows_equal_single_row_calls(name, shape):
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    x = torch.randn(*shape, generator=gen) * 4
    assert _rows_differing(FUNCTIONS[name], x, ri.apply) == []


@pytest.mark.parametrize("name", FUNCTIONS)
def test_plain_cpu_kernels_are_not_row_invariant(name):
    """Negative control: without the helper some rows differ (8 x 4 values go
    through the SIMD loop, 1 x 4 through the scalar tail)."""
    differing = 0
    for seed in range(20):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed)) * 4
        differing += len(_rows_differing(FUNCTIONS[name], x, _plain))
    assert differing > 0


def test_values_are_the_functions_values():
    x = torch.randn(5, 7) * 3
    for fn in FUNCTIONS.values():
        torch.testing.assert_close(ri.apply(fn, x), fn(x), atol=1e-6, rtol=1e-6)
        assert ri.apply(fn, x).shape == x.shape


def test_large_inputs_are_sliced_and_still_invariant():
    x = torch.randn(40000) * 3
    full = ri.apply(torch.sigmoid, x)
    assert torch.equal(full[-3:], ri.apply(torch.sigmoid, x[-3:]))


def test_router_sigmoid_is_row_invariant():
    """The CPU MoE router (sigmoid scoring with a correction bias: vLLM
    0.34.0's CPURouter runs upstream's _grouped_topk with one group)."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(8, 8, generator=gen) * 3
    bias = torch.randn(8, generator=gen) * 0.1

    def route(x):
        return cpu_router._grouped_topk(
            x,
            topk=2,
            renormalize=True,
            num_expert_group=1,
            topk_group=1,
            scoring_func="sigmoid",
            routed_scaling_factor=1.0,
            e_score_correction_bias=bias,
        )

    weights, ids = route(logits)
    for i in range(8):
        w1, i1 = route(logits[i : i + 1])
        assert torch.equal(ids[i], i1[0])
        assert torch.equal(weights[i], w1[0])


class _Proj:
    """A linear's ``(output, bias)`` call: ``x @ w.T`` one row at a time, so
    the GEMM itself is row-invariant and only the activation is under test."""

    def __init__(self, out_features, in_features, seed):
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(out_features, in_features, generator=gen)

    def __call__(self, x):
        return torch.cat([r @ self.weight.T for r in x.split(1)]), None


def _mlp(intermediate, hidden=64):
    """LagunaMLP.forward over stand-in projections (no TP group needed)."""
    mlp = LagunaMLP.__new__(LagunaMLP)
    mlp.gate_proj = _Proj(intermediate, hidden, 1)
    mlp.up_proj = _Proj(intermediate, hidden, 2)
    mlp.down_proj = _Proj(hidden, intermediate, 3)
    return mlp


def _mlp_rows_differing(intermediate):
    mlp = _mlp(intermediate)
    differing = 0
    for seed in range(10):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))
        batch = LagunaMLP.forward(mlp, x)
        differing += sum(
            not torch.equal(batch[i], LagunaMLP.forward(mlp, x[i : i + 1])[0])
            for i in range(8)
        )
    return differing


@pytest.mark.parametrize("intermediate", [16, 32, 48])
def test_laguna_mlp_silu_is_row_invariant(intermediate):
    """LagunaMLP (dense layer, shared expert) at per-rank intermediate widths:
    16 is the tiny target's shared expert at TP 2."""
    assert _mlp_rows_differing(intermediate) == 0


def test_laguna_mlp_plain_silu_is_not_row_invariant(monkeypatch):
    """Negative control: with the helper replaced by the plain call, rows of
    a width-8 verify differ from the 1-row decode at 16 columns."""
    monkeypatch.setattr(ri, "apply", _plain)
    assert _mlp_rows_differing(16) > 0
