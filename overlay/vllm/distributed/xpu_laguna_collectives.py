# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tensor-parallel all-reduce for the exact XPU Laguna path, and a CPU stand-in
for XCCL's ring all-reduce.

Why: an exact speculative verify needs every verify row to get the bits the
teacher's q=1 decode of the same token gets. On Intel Arc, oneCCL's all-reduce
for Laguna's message sizes (1 or 8 rows x 3072 bf16: 6 KiB, 48 KiB) is the
LL256 ring (``allreduce_sycl_single_node`` in ``allreduce_sycl.cpp``:
``is_arc_card`` and ``total_size <= CCL_SYCL_ALLREDUCE_SIMPLE_THRESHOLD``,
default 4 MiB; ``CCL_SYCL_ALLREDUCE_LL`` default ``ring``). Its work split is
``SplitType::NoOverlap``: rank ``c`` starts the sum of a contiguous 1/N of the
flattened message and the ring adds the other ranks in order ``c+1, c+2, ...``.
Which 1/N an element falls in depends on the message size, so an element's
summation order, and with bf16 rounding after each add its bits, differ between
a verify row (M=8) and the same token's decode (M=1).

What this module provides:

* :func:`rank_order_all_reduce`: all-gather, then ``((x_0 + x_1) + x_2) + ...``
  in rank order 0..N-1, rounded to the input dtype after each add. Every
  element of every message gets the same order, so the result does not depend
  on the message size, and every rank computes the same bits from the same
  gathered data. Upstream vLLM 0.32.0 has the same arithmetic as
  ``XpuCommunicator._fixed_rank_sum`` (for ``VLLM_BATCH_INVARIANT``); it is
  not called from here because it is a method of ``XpuCommunicator`` that
  reads the communicator's ``world_size`` and ``device_group`` (no free
  function a CPU communicator or a plain gloo group can call without faking an
  ``XpuCommunicator``), and it cannot write into a caller-owned buffer, which
  the breakable-graph collective break needs. The tests check that both give
  the same bits.
* :func:`xccl_ring_standin_all_reduce`: the CPU stand-in for the device's
  XCCL ring, for CPU runs that must show the message-size dependence (debug
  toggle ``VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN``).
* :func:`tp_reduce_mode`: which of the above (or the plain all-reduce) a
  communicator uses, decided once per group.

Stand-in: what it reproduces of the device and what not (oneCCL
``uxlfoundation/oneCCL``, ``deps/libccl/src/coll/algorithms``, 2026 sources,
commits d67031d5 / f98dcfa2):

Reproduced:

* The split. ``AllReduce`` (``allreduce/sycl/allreduce_pcie.hpp``) builds
  ``WorkSizeData<message_t>(nRanks, count * sizeof(T), sizeof(T),
  RingTransmit::splitType)`` with ``splitType = SplitType::NoOverlap``
  (``utils/transmit/ring_transmit.hpp``). ``message_t`` is
  ``sycl::vec<uint32_t, 4>`` (16 bytes) for both protocols the ring uses
  (``Rt64_PCIE`` up to ``CCL_SYCL_ALLREDUCE_LL_THRESHOLD`` = 4096 bytes,
  ``Rt64_128_PCIE`` above; ``allreduce_pcie.cpp``). ``WorkSizeData``
  (``utils/transmit/work_size_data.hpp``) gives every chunk
  ``(size / 16 / nRanks) * 16`` bytes, one more 16-byte message to each of
  the first ``remainder / 16`` chunks, the last ``remainder % 16`` bytes to
  the last chunk, offsets as running sums (:func:`ring_chunk_bounds`). For
  Laguna at TP 4: 1 x 3072 bf16 gives four chunks of 768 elements (row 0
  spans all four), 8 x 3072 gives four chunks of 6144 (rows 0-1 start at
  rank 0, rows 2-3 at rank 1, ...).
* The order. ``RingTransmit::runAllreduce``: step 0 rank ``r`` sends its own
  chunk ``r`` to rank ``r+1``; steps 1..N-2 rank ``r`` receives chunk
  ``r-i``, adds its own input and forwards; step N-1 adds the last input and
  writes back; the gather phase only copies. So chunk ``c`` is
  ``((x_c + x_{c+1}) + x_{c+2}) + ... + x_{c+N-1}`` (indices mod N), the same
  on every rank. The stand-in sums each chunk in that order.
* The rounding. ``accumMessages`` adds ``sycl::vec<T, n>`` values and the
  partial sums travel as ``T``: rounded to the message dtype after every add.
  The stand-in adds tensors of the input dtype (PyTorch rounds bf16 and fp16
  adds to the dtype per op), so bf16 and fp32 round as on the device.
* Consequences that follow: at N = 2 the sum is a single add and IEEE addition
  is commutative, so the ring is message-size independent at TP 2; at N >= 3
  it is not. All ranks get the same bits.

Not reproduced:

* The data movement (LL256 flags, slots, wires, the kernel's loop over the
  work in ``wireCapacity`` pieces): it moves data but does not change any
  element's order. The stand-in all-gathers the inputs and computes every
  chunk locally instead of a reduce-scatter plus broadcast; the bits are the
  same, the traffic and timing are not the device's.
* Other oneCCL algorithms: ``CCL_SYCL_ALLREDUCE_LL=twoshots`` (also
  ``NoOverlap``, not checked line by line here) or ``oneshot`` (each rank sums
  the whole buffer from its own rank: row-invariant but different bits per
  rank), ``CCL_SYCL_ALLREDUCE_ARC=1``, the Level-Zero scheduler
  (``CCL_ENABLE_SYCL_KERNELS=0``), messages above the 4 MiB simple threshold
  (with peer-to-peer access other kernels run; the stand-in applies the ring
  rule to every size), non-Arc devices, multi-node.
* ``CCL_SYCL_ALLREDUCE_CHUNKING_THRESHOLD``: the default 0 is modelled as one
  pack (``calculate_chunking_pack_count`` was not read); a set threshold would
  split the message into packs with their own ring split.
* Reductions other than sum and dtypes other than float ones (the model's
  reductions are float sums).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

import vllm.envs as envs
from vllm.logger import init_logger

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

logger = init_logger(__name__)

# oneCCL's ring splits the message in units of its protocol's message_t,
# sycl::vec<uint32_t, 4> (Rt64_PCIE and Rt64_128_PCIE alike).
XCCL_MESSAGE_BYTES = 16


class TpReduceMode(enum.Enum):
    """How a communicator's all-reduce runs."""

    PLAIN = "plain"  # the backend's own all-reduce (XCCL on XPU, gloo/SHM on CPU)
    RANK_ORDER = "rank-order"  # all-gather + fixed rank-order sum
    XCCL_STANDIN = "xccl-standin"  # CPU debug: XCCL's ring ownership rule


class _TpGroup(Protocol):
    """What :func:`all_reduce_into` needs of a group (a GroupCoordinator)."""

    unique_name: str
    world_size: int
    device_group: ProcessGroup


_MODES: dict[tuple[str, int], TpReduceMode] = {}


def tp_reduce_mode(unique_name: str, world_size: int) -> TpReduceMode:
    """The all-reduce mode of the group ``unique_name`` (cached per group).

    ``PLAIN`` wherever the series is not in scope (``series_in_scope``: a
    Laguna target on XPU, or a CPU run that asks). Else ``RANK_ORDER`` for a
    tensor-parallel group (``tp:N``) of more than one
    rank when ``VLLM_XPU_LAGUNA_EXACT_VERIFY`` and
    ``VLLM_XPU_LAGUNA_EXACT_TP_REDUCE`` are on; otherwise ``XCCL_STANDIN``
    there when ``VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN`` is on (the caller
    decides whether it honours it: only the CPU communicator does); otherwise
    ``PLAIN``. Other groups (pp, dp, ep, ...) always get ``PLAIN``.
    """
    key = (unique_name, world_size)
    mode = _MODES.get(key)
    if mode is None:
        mode = _decide(unique_name, world_size)
        _MODES[key] = mode
        if mode is not TpReduceMode.PLAIN:
            logger.info_once(
                "XPU Laguna: all-reduce of group %s (%d ranks) runs as %s.",
                unique_name,
                world_size,
                "all-gather + fixed rank-order sum"
                if mode is TpReduceMode.RANK_ORDER
                else "the XCCL ring stand-in (debug)",
            )
    return mode


def _decide(unique_name: str, world_size: int) -> TpReduceMode:
    from vllm.compilation.xpu_breakable_graph.config import series_in_scope

    if world_size <= 1 or unique_name.split(":")[0] != "tp":
        return TpReduceMode.PLAIN
    if not series_in_scope():
        # Not a Laguna target (or CPU without a series toggle): upstream's
        # all-reduce (XCCL, CPU SHM/gloo), the debug stand-in included.
        return TpReduceMode.PLAIN
    if envs.VLLM_XPU_LAGUNA_EXACT_VERIFY and envs.VLLM_XPU_LAGUNA_EXACT_TP_REDUCE:
        return TpReduceMode.RANK_ORDER
    if envs.VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN:
        return TpReduceMode.XCCL_STANDIN
    return TpReduceMode.PLAIN


def reset_tp_reduce_mode_cache() -> None:
    """Forget the cached modes (tests that change the toggles)."""
    _MODES.clear()


def _gather_flat(
    input_: torch.Tensor, group: ProcessGroup, gathered: torch.Tensor | None = None
) -> torch.Tensor:
    """``[world, numel]``: every rank's flattened input, in rank order.

    Into ``gathered`` when given (a caller-owned buffer of at least
    ``world * numel`` elements of the input dtype: the breakable-graph
    collective break allocates it before capture), else into a new tensor.
    """
    if group is None:
        raise ValueError("the exact all-reduce needs an explicit process group")
    world = dist.get_world_size(group)
    flat = input_.contiguous().view(-1)
    if gathered is None:
        gathered = torch.empty(
            (world, flat.numel()), dtype=input_.dtype, device=input_.device
        )
    else:
        if gathered.dtype != input_.dtype or gathered.numel() < world * flat.numel():
            raise ValueError(
                f"gather buffer {tuple(gathered.shape)} {gathered.dtype} cannot "
                f"hold {world} x {flat.numel()} {input_.dtype}"
            )
        gathered = gathered.view(-1)[: world * flat.numel()].view(world, -1)
    dist.all_gather_single(gathered.view(-1), flat, group=group)
    return gathered


def _finish(
    acc: torch.Tensor, input_: torch.Tensor, out: torch.Tensor | None
) -> torch.Tensor:
    result = acc.view(input_.shape)
    if out is None:
        return result
    out.copy_(result)
    return out


def rank_order_all_reduce(
    input_: torch.Tensor,
    group: ProcessGroup,
    out: torch.Tensor | None = None,
    gathered: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum ``input_`` over ``group`` as ``((x_0 + x_1) + x_2) + ...``.

    All-gather, then add the ranks' inputs in rank order, each add rounded to
    the input dtype (in-place adds of that dtype). The result does not depend
    on the message size and is the same on every rank. Returns a new tensor,
    or ``out`` (any tensor of the input's shape, ``input_`` itself included)
    filled with the sum; ``gathered``: a caller-owned gather buffer.
    """
    gathered = _gather_flat(input_, group, gathered)
    acc = gathered[0].clone()
    for rank in range(1, gathered.shape[0]):
        acc.add_(gathered[rank])
    return _finish(acc, input_, out)


def ring_chunk_bounds(
    numel: int, elem_size: int, nranks: int, message_bytes: int = XCCL_MESSAGE_BYTES
) -> list[tuple[int, int]]:
    """``(offset, count)`` in elements of each rank's chunk of a ring all-reduce.

    oneCCL's ``WorkSizeData`` with ``SplitType::NoOverlap`` (see the module
    docstring): whole ``message_bytes`` units split evenly, the first chunks
    take one extra unit each, the last chunk the bytes short of a unit.
    """
    if nranks < 1 or elem_size < 1 or message_bytes < 1 or numel < 0:
        raise ValueError(
            f"bad ring split: numel={numel} elem_size={elem_size} "
            f"nranks={nranks} message_bytes={message_bytes}"
        )
    size = numel * elem_size
    basic = (size // message_bytes // nranks) * message_bytes
    remainder = size - basic * nranks
    full_spillover = remainder // message_bytes
    last_spillover = remainder % message_bytes
    bounds = []
    offset = 0
    for chunk in range(nranks):
        nbytes = basic
        if chunk < full_spillover:
            nbytes += message_bytes
        elif chunk == nranks - 1:
            nbytes += last_spillover
        count = nbytes // elem_size
        bounds.append((offset, count))
        offset += count
    return bounds


def xccl_ring_standin_all_reduce(
    input_: torch.Tensor,
    group: ProcessGroup,
    out: torch.Tensor | None = None,
    gathered: torch.Tensor | None = None,
) -> torch.Tensor:
    """CPU stand-in for XCCL's LL256 ring all-reduce (debug).

    Chunk ``c`` of the flattened message (:func:`ring_chunk_bounds`) is summed
    as ``((x_c + x_{c+1}) + ...) + x_{c+N-1}``, rounded to the input dtype
    after each add, the same bits on every rank (module docstring: what is and
    is not reproduced). Returns a new tensor, or ``out`` filled with the sum.
    """
    gathered = _gather_flat(input_, group, gathered)
    world, numel = gathered.shape
    acc = torch.empty_like(gathered[0])
    for chunk, (offset, count) in enumerate(
        ring_chunk_bounds(numel, input_.element_size(), world)
    ):
        if count == 0:
            continue
        piece = acc[offset : offset + count]
        piece.copy_(gathered[chunk, offset : offset + count])
        for step in range(1, world):
            piece.add_(gathered[(chunk + step) % world, offset : offset + count])
    return _finish(acc, input_, out)


def all_reduce_into(
    input_: torch.Tensor,
    out: torch.Tensor,
    group: _TpGroup,
    gathered: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Reduce ``input_`` into ``out`` the group's non-plain way, or return None.

    For callers that own the output buffer (a collective break of a device
    graph): ``out`` filled by :func:`rank_order_all_reduce` when the group's
    mode is ``RANK_ORDER``, by :func:`xccl_ring_standin_all_reduce` when it is
    ``XCCL_STANDIN`` and the tensors are on CPU (the stand-in replaces the
    plain all-reduce of CPU runs only, as in the CPU communicator); None
    otherwise (the caller keeps its plain path). ``gathered``: a caller-owned
    gather buffer (see :func:`_gather_flat`).
    """
    mode = tp_reduce_mode(group.unique_name, group.world_size)
    if mode is TpReduceMode.RANK_ORDER:
        return rank_order_all_reduce(input_, group.device_group, out, gathered)
    if mode is TpReduceMode.XCCL_STANDIN and input_.device.type == "cpu":
        return xccl_ring_standin_all_reduce(input_, group.device_group, out, gathered)
    return None
