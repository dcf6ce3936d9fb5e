# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU stand-ins for the device kernels whose result depends on the row count.

Reproduced behaviour (the part that matters for row invariance), nothing
else (no tiling, no speed):

* :func:`m_dependent_linear`: oneDNN picks a GEMM kernel and a K-split from
  (m, n, k) (``src/gpu/intel/gemm/jit.hpp`` select_kernel; the k-parallel
  sizing in ``selector/kernel_evaluator.cpp``), so the fp32 accumulation
  order of a row depends on how many rows the call has. The stand-in runs one
  K pass for one row (``F.linear``) and sums two K halves for more rows.
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
"""

import torch
from torch.nn import functional as F

_ROWS_PER_WG = 16  # the kernel's ROWS_PER_WG (modelled, not imported)
_SUBGROUP = 32


def m_dependent_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    if x.shape[0] == 1 or x.shape[-1] < 2:
        return F.linear(x, weight, bias)
    k = x.shape[-1] // 2
    out = F.linear(x[..., :k], weight[:, :k]) + F.linear(x[..., k:], weight[:, k:])
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
