# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant forms of Laguna's ops (pure torch, no vLLM imports).

Exact speculative decoding needs row ``i`` of a q-row verify forward to be
computed bitwise like the q=1 decode of the same token. This module holds
the forms that give that; which call takes which form on the exact path is
decided in :mod:`vllm.model_executor.layers.xpu_laguna_row_dispatch`. It
imports only torch, so ``scripts/device/op_invariance_check.py`` can run the
same forms on a machine without vLLM.

* :func:`apply` (CPU elementwise math). PyTorch's CPU elementwise kernels
  are not row-invariant for transcendental functions: the vectorised loop
  (``aten/src/ATen/native/cpu/Loops.h`` ``vectorized_loop``) runs chunks of
  ``2 * Vectorized<float>::size()`` values (32 with AVX-512, 16 with AVX2)
  through SIMD math (Sleef) and the remaining tail through scalar ``std::``
  math, which rounds differently. Which path a value takes depends on how
  many values the call sees: Laguna's output gate (4 heads: 8 x 4 = 32
  values in a width-8 verify, all SIMD; 1 x 4 in decode, all scalar) and the
  router's sigmoid differ in the last bit between verify and decode.
  :func:`apply` pads the flattened input with zeros to a multiple of 64
  values (a multiple of every SIMD chunk width), so every value takes the
  SIMD path, in slices of at most :data:`_SLICE` values (below ATen's
  parallel grain size, so a slice is never split across threads at an
  arbitrary point). SIMD math is lane-independent, so each value's result is
  then independent of the call shape. Off CPU the function runs unchanged
  (device kernels are checked by ``scripts/device``). Why this and not
  vLLM's batch-invariant mode: ``VLLM_BATCH_INVARIANT`` replaces GEMM and
  reduction kernels with Triton kernels on CUDA; it does not touch CPU
  elementwise math and would change the CPU GEMM paths.

* :func:`per_row` (q/k norm "tokens", linear "rows"): the op called once per
  row on ``x[i:i+1]``, the shape, strides and alignment of a q=1 decode
  call. Correct by construction for any kernel whose result depends only on
  its own call.

* :func:`norm_padded` (q/k norm "pad"): one call whose row count takes the
  kernel a q=1 decode takes. vllm-xpu-kernels' ``rms_norm``
  (``csrc/layernorm.cpp``, ``call_rms_norm_kernel``; since #371, in
  v0.1.15.4 which vLLM 0.32.0 pins) packs :data:`XPU_RMS_NORM_ROWS_PER_WG`
  rows into one work-group and reduces each row with a ``shift_group_left``
  tree when the row count (tokens x heads for a 3-D q/k view) is a multiple
  of 16 and a row is at most 32 vector items (head_dim 128 in BF16: 16);
  otherwise it runs one work-group per row (``reduce_over_group``, block =
  head_dim / 8 = 16 items whatever the row count). Laguna-S TP4 decode has
  12/18 q and 2 k rows (single-row kernel); a width-8 verify has 96/144/16
  (multi-row kernel). Adding one zero token when tokens x heads is a
  multiple of 16 (and heads is not) keeps the single-row kernel; one
  padded row is always enough (consecutive token counts differ by heads,
  which is not a multiple of 16). Needs the kernel source to be as read.

* :func:`linear_lanes` (linear "lanes"): ``F.linear(x, w)`` as ``rows``
  independent M=1 lanes of one batched matmul, the weight's transpose
  expanded to ``[rows, K, N]`` with batch stride 0 (what the reference lab
  ran on Arc B70; it measured the lanes bitwise equal to sequential M=1
  ``F.linear`` calls for Laguna's projection, router and vocabulary shapes).
  Reproduces ``F.linear`` at M=1 only where the platform's plain GEMM is
  ``F.linear`` (XPU); elsewhere the dispatch module uses :func:`per_row`.
"""

from collections.abc import Callable

import torch

_MULTIPLE = 64
_SLICE = 16384  # < at::internal::GRAIN_SIZE (32768), a multiple of 64

# vllm-xpu-kernels csrc/layernorm.cpp, call_rms_norm_kernel: ROWS_PER_WG of
# the multi-row RMSNorm kernel (taken when the row count is a multiple of it).
XPU_RMS_NORM_ROWS_PER_WG = 16


def apply(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for an elementwise ``fn``, row-invariant on CPU."""
    if x.device.type != "cpu" or x.numel() == 0:
        return fn(x)
    flat = x.reshape(-1)
    n = flat.numel()
    padded = torch.zeros(n + (-n) % _MULTIPLE, dtype=x.dtype)
    padded[:n] = flat
    out = torch.cat(
        [fn(padded[i : i + _SLICE]) for i in range(0, padded.numel(), _SLICE)]
    )
    return out[:n].reshape(x.shape)


def per_row(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """``fn`` called on each ``x[i:i+1]`` (dim 0), results concatenated."""
    return torch.cat([fn(x[i : i + 1]) for i in range(x.shape[0])])


def norm_pad_tokens(tokens: int, rows_per_token: int) -> int:
    """Zero tokens to append so that a ``tokens``-token q/k norm call takes
    the kernel a one-token call takes (0 or 1; see module doc)."""
    per_wg = XPU_RMS_NORM_ROWS_PER_WG
    if rows_per_token % per_wg == 0:
        return 0  # the one-token call takes the multi-row kernel too
    return 1 if (tokens * rows_per_token) % per_wg == 0 else 0


def norm_padded(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """``fn(x)`` for a ``[tokens, heads, head_dim]`` norm input, called with
    a token count whose row count takes the one-token kernel (see module
    doc); the result has ``x``'s shape and is contiguous."""
    tokens = x.shape[0]
    rows_per_token = x[0].numel() // x.shape[-1] if tokens else 0
    pad = norm_pad_tokens(tokens, rows_per_token) if tokens else 0
    if pad == 0:
        return fn(x)
    padded = x.new_zeros((tokens + pad, *x.shape[1:]))
    padded[:tokens] = x
    return fn(padded)[:tokens]


def linear_lanes(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` (``x`` [rows, K], ``weight`` [N, K], no bias)
    as ``rows`` stride-zero batched M=1 lanes."""
    rows = x.shape[0]
    w_t = weight.t()
    lanes = w_t.unsqueeze(0).expand(rows, *w_t.shape)
    return torch.bmm(x.unsqueeze(1), lanes).squeeze(1)
