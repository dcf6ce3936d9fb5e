# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""CPU stand-in for the XPU routed-experts kernel whose result for a row
depends on the other rows of the call (pure torch, no vLLM imports).

Reproduced behaviour of ``vllm_xpu_kernels`` ``XpuFusedMoe`` (the part that
matters for row invariance, nothing else: no INT4, no tiling, no speed):

* ``remap_hidden_states`` groups the ``[row, slot]`` routes by expert
  (``csrc/moe/remap_hidden_states.cpp``: rows-per-expert counted with
  work-group and device atomics, then a prefix sum), so each expert's block
  holds the routes of every row that picked it, in an order the atomics
  decide.
* The grouped GEMM runs each expert's block as one GEMM whose policy is
  picked from the rows per expert (``grouped_gemm_xe2_interface.hpp``:
  ``A_avg_M``). Modelled M-dependence: a block of one row accumulates K in
  one pass, a block of several rows in two K halves (a different policy and
  K order), for both GEMMs. So a row's result depends on how many rows share
  its experts: a 1-row call (decode) always has one-row blocks, an 8-row
  verify call rarely does.
* ``moe_gather`` sums a row's top-k outputs times their weights in fp32 in
  slot order (``csrc/moe/moe_gather.cpp``): row-invariant, reproduced as is.
"""

import torch
from torch.nn import functional as F


def block_gemm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w.T`` for one expert block; K split in two when it has several
    rows (the modelled policy change)."""
    if a.shape[0] == 1 or a.shape[-1] < 2:
        return F.linear(a, w)
    k = a.shape[-1] // 2
    return F.linear(a[:, :k], w[:, :k]) + F.linear(a[:, k:], w[:, k:])


def grouped_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Routed experts of ``x`` ([rows, hidden]); ``w13`` [E, 2I, hidden]
    (gate then up), ``w2`` [E, hidden, I]; SiLU-and-mul between them."""
    rows, top_k = topk_ids.shape
    inter = w13.shape[1] // 2
    routes = torch.empty(rows, top_k, x.shape[-1], dtype=x.dtype)
    for expert in topk_ids.unique().tolist():
        r, s = (topk_ids == expert).nonzero(as_tuple=True)
        h = block_gemm(x[r], w13[expert])
        act = F.silu(h[:, :inter]) * h[:, inter:]
        routes[r, s] = block_gemm(act, w2[expert])
    acc = torch.zeros(rows, x.shape[-1], dtype=torch.float32)
    for slot in range(top_k):
        acc += routes[:, slot].float() * topk_weights[:, slot : slot + 1].float()
    return acc.to(x.dtype)
