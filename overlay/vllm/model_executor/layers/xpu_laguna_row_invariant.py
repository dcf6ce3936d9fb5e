# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Row-invariant elementwise math on CPU for the XPU Laguna series.

Exact speculative decoding needs row ``i`` of a q-row verify forward to be
computed bitwise like the q=1 decode of the same token. PyTorch's CPU
elementwise kernels break that for transcendental functions: the vectorised
loop (``aten/src/ATen/native/cpu/Loops.h`` ``vectorized_loop``) runs chunks
of ``2 * Vectorized<float>::size()`` values (32 with AVX-512, 16 with AVX2)
through SIMD math (Sleef) and the remaining tail through scalar ``std::``
math, which rounds differently. Which path a value takes depends on how many
values the call sees: Laguna's output gate (4 heads: 8 x 4 = 32 values in a
width-8 verify, all SIMD; 1 x 4 in decode, all scalar) and the router's
sigmoid differ in the last bit between verify and decode.

:func:`apply` pads the flattened input with zeros to a multiple of 64 values
(a multiple of every SIMD chunk width), so every value takes the SIMD path,
in slices of at most :data:`_SLICE` values (below ATen's parallel grain size,
so a slice is never split across threads at an arbitrary point). SIMD math
is lane-independent, so each value's result is then independent of the call
shape. Off CPU the function runs unchanged (device kernels are checked by
``scripts/device``).

Why this and not vLLM's batch-invariant mode: ``VLLM_BATCH_INVARIANT``
replaces GEMM/reduction kernels with Triton kernels on CUDA; it does not touch
CPU elementwise math and would change the CPU GEMM paths.
"""

from collections.abc import Callable

import torch

_MULTIPLE = 64
_SLICE = 16384  # < at::internal::GRAIN_SIZE (32768), a multiple of 64


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
