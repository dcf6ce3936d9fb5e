# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant forms of Laguna's ops (pure torch, no vLLM imports).

Exact speculative decoding needs row ``i`` of a q-row verify forward to be
computed bitwise like the q=1 decode of the same token. This module holds
the forms that give that; which call takes which form on the exact path is
decided in :mod:`vllm.xpu_laguna.row_dispatch`. It
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
  With a :class:`NormPadBuffer` (one per norm module on the exact path) the
  padded input is written into a buffer the norm owns, whose first token is
  kept zero, instead of a fresh tensor per call.

* :class:`PaddedRows` (linear "batch_invariant"): every call of 1..W rows
  made as one call of exactly W rows (``x`` copied into a zero-padded
  ``[W, K]`` buffer it owns per (K, dtype, device)), so a kernel whose
  compiled form depends on its integer arguments (Triton specializes an
  argument equal to 1 or divisible by 16, and pointers by alignment) is the
  same launch for a q=1 decode and every verify width. The kernel itself
  (upstream's batch-invariant matmul) is called by the dispatch module.
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


class NormPadBuffer:
    """The padded input of one q/k norm: ``[capacity, heads, head_dim]``
    whose token 0 stays zero (never written); a ``tokens``-token input goes
    to tokens ``1..tokens``. Allocated at the first padded call, grown (a new
    tensor) only for a larger call or another dtype/device/shape."""

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity  # tokens incl. the zero token (at least)
        self.buffer: torch.Tensor | None = None

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """``[zero token, *x]`` (``tokens + 1`` tokens, contiguous)."""
        tokens = x.shape[0]
        buf = self.buffer
        if (
            buf is None
            or buf.shape[0] < tokens + 1
            or buf.shape[1:] != x.shape[1:]
            or buf.dtype != x.dtype
            or buf.device != x.device
        ):
            size = max(tokens + 1, self.capacity)
            buf = x.new_zeros((size, *x.shape[1:]))
            self.buffer = buf
        buf[1 : tokens + 1].copy_(x)
        return buf[: tokens + 1]


def norm_padded(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    buffer: NormPadBuffer | None = None,
) -> torch.Tensor:
    """``fn(x)`` for a ``[tokens, heads, head_dim]`` norm input, called with
    a token count whose row count takes the one-token kernel (see module
    doc); the result has ``x``'s shape and is contiguous. The zero token
    goes first (a row's result does not depend on its index in either
    kernel); ``buffer`` holds the padded input (a fresh one if None)."""
    tokens = x.shape[0]
    rows_per_token = x[0].numel() // x.shape[-1] if tokens else 0
    pad = norm_pad_tokens(tokens, rows_per_token) if tokens else 0
    if pad == 0:
        return fn(x)
    buffer = buffer if buffer is not None else NormPadBuffer()
    return fn(buffer.padded(x))[1:]


class PaddedRows:
    """``fn`` called on exactly ``width`` rows: a ``[rows, K]`` input with
    ``1 <= rows <= width`` is copied into a ``[width, K]`` buffer owned per
    (K, dtype, device) whose other rows are zero, and the first ``rows``
    rows of ``fn(buffer)`` are returned. ``fn`` must compute each output row
    from its own input row only (the padding rows then change nothing) and
    must not keep or write its input."""

    def __init__(self, width: int) -> None:
        self.width = width
        # (K, dtype, device) -> (buffer, rows holding data other than zero)
        self._buffers: dict[tuple, tuple[torch.Tensor, int]] = {}

    def buffer(self, x: torch.Tensor) -> torch.Tensor:
        """The ``[width, K]`` buffer of ``x``'s (K, dtype, device)."""
        rows = x.shape[0]
        if not 1 <= rows <= self.width or x.dim() != 2:
            raise ValueError(
                f"PaddedRows: input {tuple(x.shape)} is not [1..{self.width}, K]"
            )
        key = (x.shape[1], x.dtype, x.device)
        entry = self._buffers.get(key)
        if entry is None:
            buf = x.new_zeros((self.width, x.shape[1]))
            filled = 0
        else:
            buf, filled = entry
        if filled > rows:
            buf[rows:filled].zero_()
        buf[:rows].copy_(x)
        self._buffers[key] = (buf, rows)
        return buf

    def __call__(
        self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        return fn(self.buffer(x))[: x.shape[0]]
