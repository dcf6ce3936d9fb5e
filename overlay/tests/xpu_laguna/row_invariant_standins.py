# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU stand-ins for the device kernels whose result depends on the row count.

Reproduced behaviour (the part that matters for row invariance), nothing
else (no tiling, no speed):

* :func:`m_dependent_linear`: oneDNN picks a GEMM kernel and a K-split from
  (m, n, k) (``src/gpu/intel/gemm/jit.hpp`` select_kernel; the k-parallel
  sizing in ``selector/kernel_evaluator.cpp``), so the fp32 accumulation
  order of a row depends on how many rows the call has; torch-xpu folds a
  stride-zero batch of M=1 lanes into that same M-row GEMM. The stand-in
  chooses its K-split from (m, n, k) (:func:`k_splits`: one K pass, i.e.
  ``F.linear``, for one row; two K parts summed for more rows) and is
  installed as a layer's GEMM, so a form is judged by the rows the GEMM
  call sees.
* :func:`xpu_rms_norm`: vllm-xpu-kernels ``rms_norm``
  (``csrc/layernorm.cpp``, call_rms_norm_kernel, HEAD 4543b58): a row is
  split into ``head_dim / vec`` work-items of ``vec`` values (8 for 2-byte
  types, 4 for fp32), each summing its squares in order; when the row count
  is a multiple of 16 and a row has at most 32 items (dividing 32) the
  multi-row kernel reduces the items with a ``shift_group_left`` tree
  (offsets items/2 .. 1), otherwise the single-row kernel uses
  ``reduce_over_group`` (its order is the compiler's; modelled here as a
  left-to-right sum, an order the tree does not have); then
  ``x * rsqrt(var / d + eps) * w`` in fp32, rounded once (#534).
* :func:`row_wise_interpreter_dot` (test-only shim for Triton's
  interpreter): the interpreter computes ``tl.dot`` with one ``np.matmul``
  of the whole block, and OpenBLAS's sgemm computes a row with a micro-kernel
  chosen by the row's position in the block (on this machine rows 6 and 7
  of a block round differently from row 0 for the same values: its M
  unroll). A DPAS ``tl.dot`` computes every row of a tile with the same
  instruction sequence over K, so the shim computes each row of a block by
  its own ``np.matmul`` (the same arithmetic for a row wherever it sits). It
  does not hide a kernel that reads other rows or changes its K order with
  M; whether the device's DPAS code is position-invariant is for the device
  check to show.
"""

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch.nn import functional as F

_ROWS_PER_WG = 16  # the kernel's ROWS_PER_WG (modelled, not imported)
_SUBGROUP = 32


def k_splits(m: int, n: int, k: int) -> int:
    """K parts of the stand-in GEMM for an (m, n, k) call (the device picks
    them from the shape; here: one for a single row, two otherwise)."""
    return 1 if m == 1 or k < 2 else 2


def m_dependent_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    m, k = x.reshape(-1, x.shape[-1]).shape[0], x.shape[-1]
    parts = k_splits(m, weight.shape[0], k)
    if parts == 1:
        return F.linear(x, weight, bias)
    step = -(-k // parts)
    out = sum(
        F.linear(x[..., i : i + step], weight[:, i : i + step])
        for i in range(0, k, step)
    )
    return out if bias is None else out + bias


def xpu_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    vec = 8 if x.element_size() == 2 else 4
    items = d // vec
    rows = x.reshape(-1, d).float()
    sq = (rows * rows).view(rows.shape[0], items, vec)
    partial = sq[..., 0]
    for j in range(1, vec):
        partial = partial + sq[..., j]
    multi = (
        rows.shape[0] % _ROWS_PER_WG == 0
        and items <= _SUBGROUP
        and _SUBGROUP % items == 0
    )
    if multi:
        v, off = partial, items // 2
        while off:
            v = v[:, :off] + v[:, off : 2 * off]
            off //= 2
        var = v[:, 0]
    else:
        var = partial[:, 0]
        for j in range(1, items):
            var = var + partial[:, j]
    scale = torch.rsqrt(var / d + eps).unsqueeze(-1)
    out = rows * scale * weight.float()
    return out.to(x.dtype).view(x.shape)


@contextlib.contextmanager
def row_wise_interpreter_dot() -> Iterator[None]:
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    real = builder.create_dot
    handle = interpreter.TensorHandle

    def create_dot(self, a, b, d, *args):  # type: ignore[no-untyped-def]
        if a.data.ndim != 2:
            return real(self, a, b, d, *args)
        rows = [
            real(
                self,
                handle(a.data[i : i + 1], a.dtype),
                b,
                handle(d.data[i : i + 1], d.dtype),
                *args,
            )
            for i in range(a.data.shape[0])
        ]
        return handle(np.concatenate([r.data for r in rows]), rows[0].dtype)

    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = real
