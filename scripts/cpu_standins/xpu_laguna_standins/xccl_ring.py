# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Test-side stand-in of XCCL's ring all-reduce on CPU (never in the wheel).

With the series' option ``debug_xccl_standin`` on where the exact reduction
(``exact_tp_reduce``) is off, the tensor-parallel all-reduce of the runtime's test-side CPU
communicator (:class:`.standin_communicator.StandInCpuCommunicator`, built by the test-side platform in
every worker) runs this stand-in, so that CPU runs show the device's message-size dependence;
the wheel's XPU communicator has no such mode. The patch tests
(``tests/xpu_laguna/test_tp_collectives.py``) call it in their gloo ranks. It is a CPU stand-in
only: no device ever runs it.

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

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

# oneCCL's ring splits the message in units of its protocol's message_t,
# sycl::vec<uint32_t, 4> (Rt64_PCIE and Rt64_128_PCIE alike).
XCCL_MESSAGE_BYTES = 16


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
            f"bad ring split: numel={numel} elem_size={elem_size} nranks={nranks} message_bytes={message_bytes}"
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


def xccl_ring_all_reduce(
    input_: torch.Tensor,
    group: ProcessGroup,
    out: torch.Tensor | None = None,
    gathered: torch.Tensor | None = None,
) -> torch.Tensor:
    """CPU stand-in for XCCL's LL256 ring all-reduce.

    Chunk ``c`` of the flattened message (:func:`ring_chunk_bounds`) is summed
    as ``((x_c + x_{c+1}) + ...) + x_{c+N-1}``, rounded to the input dtype
    after each add, the same bits on every rank (module docstring: what is and
    is not reproduced). Returns a new tensor, or ``out`` filled with the sum;
    ``gathered``: a caller-owned buffer of at least ``N x numel`` elements.
    """
    world = dist.get_world_size(group)
    flat = input_.contiguous().view(-1)
    numel = flat.numel()
    if gathered is None:
        gathered = torch.empty(world * numel, dtype=flat.dtype, device=flat.device)
    rows = gathered.view(-1)[: world * numel]
    dist.all_gather_single(rows, flat, group=group)
    rows = rows.view(world, numel)
    acc = torch.empty_like(flat)
    for chunk, (offset, count) in enumerate(ring_chunk_bounds(numel, flat.element_size(), world)):
        if count == 0:
            continue
        piece = acc[offset : offset + count]
        piece.copy_(rows[chunk, offset : offset + count])
        for step in range(1, world):
            piece.add_(rows[(chunk + step) % world, offset : offset + count])
    if out is None:
        return acc.view(input_.shape)
    out.copy_(acc.view(input_.shape))
    return out
