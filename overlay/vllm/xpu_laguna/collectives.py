# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Tensor-parallel all-reduce for the exact XPU Laguna path.

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

* :func:`rank_order_all_reduce`: every element summed as
  ``((x_0 + x_1) + x_2) + ...`` in rank order 0..N-1, rounded to the input
  dtype after each add. Every element of every message gets the same order, so
  the result does not depend on the message size, and every rank gets the same
  bits. Two ways to get there, the same bits by construction (the same adds of
  the same values in the same order, only who computes them differs):

  - below :data:`RANK_ORDER_SCATTER_MIN_BYTES`: one all-gather, then the sum
    written straight into the output (``torch.add(x_0, x_1, out=out)``, then
    ``out.add_(x_r)``): N - 1 add kernels, no clone or copy. Each rank
    receives N - 1 times the message.
  - from that size on: each rank receives every rank's copy of its own
    contiguous 1/N slice (an all-to-all), sums it in rank order, and the
    summed slices are all-gathered: each rank receives 2 (N - 1) / N times
    the message, like a ring, instead of N - 1 times, and holds about twice
    the message instead of N + 1 times.

  Upstream vLLM has the same arithmetic as ``XpuCommunicator._fixed_rank_sum``
  (for ``VLLM_BATCH_INVARIANT``); it is not called from here because it is a
  method of ``XpuCommunicator`` that reads the communicator's ``world_size``
  and ``device_group``, and it cannot write into a caller-owned buffer, which
  the breakable-graph collective break needs. The tests check that both give
  the same bits.
* :func:`tp_reduce_mode`: whether a communicator uses it (or the plain
  all-reduce, or a registered test stand-in), decided from the config when
  the communicator is built and kept on it.
* :class:`SeriesAllReduce`: the series' part of a device communicator, its
  mode kept when it is built and :meth:`~SeriesAllReduce.xpu_laguna_reduce_into`.
  The series' XPU platform builds ``XpuLagunaCommunicator``
  (``vllm/xpu_laguna/communicator.py``);
  the CPU runtime's test-side platform (``xpu_laguna_standins``) builds its
  own CPU communicator with it, which adds the debug stand-in of XCCL's
  ring (``debug_xccl_standin``). No stand-in ships here.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

from vllm.logger import init_logger

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from vllm.config import VllmConfig

logger = init_logger(__name__)

# Messages of at least this many bytes take the reduce-scatter-like form of
# rank_order_all_reduce (each rank sums its own slice, then all-gather), smaller
# ones the single all-gather. Below it a reduction is bound by latency (decode
# and verify: 1 or 8 rows x 3072 bf16 = 6 KiB or 48 KiB, and graph capture
# sizes up to 170 rows stay on one collective), above it by the bytes each rank
# receives (N - 1 times the message gathered, against 2 (N - 1) / N) and by the
# N-fold gather buffer (192 MiB per rank for an 8192-token prefill chunk at
# TP 4). 1 MiB (171 rows) is far above the verify sizes and far below a
# prefill chunk; the crossover itself was not measured, on CPU or device.
RANK_ORDER_SCATTER_MIN_BYTES = 1 << 20


class TpReduceMode(enum.Enum):
    """How a communicator's all-reduce runs."""

    PLAIN = "plain"  # the backend's own all-reduce (XCCL on XPU, gloo/SHM on CPU)
    RANK_ORDER = "rank-order"  # all-gather + fixed rank-order sum
    XCCL_STANDIN = "xccl-standin"  # CPU debug: XCCL's ring ownership rule


class _TpGroup(Protocol):
    """What :func:`all_reduce_into` needs of a group: a device communicator
    (its mode in ``xpu_laguna_mode``, set when it was built) or a
    ``GroupCoordinator`` (then its ``device_communicator``'s)."""

    unique_name: str
    world_size: int
    device_group: ProcessGroup


MODE_ATTR = "xpu_laguna_mode"
"""The attribute a device communicator keeps its :class:`TpReduceMode` in."""


def tp_reduce_mode(
    unique_name: str, world_size: int, vllm_config: VllmConfig | None
) -> TpReduceMode:
    """The all-reduce mode of the group ``unique_name`` under ``vllm_config``
    (the series' communicators, :class:`SeriesAllReduce`, decide it when
    they are built, under the worker's VllmConfig, and keep it in
    :data:`MODE_ATTR`).

    ``PLAIN`` wherever the series is not in scope (``series_in_scope``: a
    Laguna target on XPU, or a CPU run that asks). Else ``RANK_ORDER`` for a
    tensor-parallel group (``tp:N``) of more than one rank when the options
    ``exact_verify`` and ``exact_tp_reduce`` are on; otherwise
    ``XCCL_STANDIN`` there when ``debug_xccl_standin`` is on (run only by
    a communicator whose ``reduce_modes`` has it: the CPU runtime's
    test-side one);
    otherwise ``PLAIN``. Other groups (pp, dp, ep, ...) always get ``PLAIN``.
    """
    from vllm.xpu_laguna.graphs.config import series_in_scope
    from vllm.xpu_laguna.options import XpuLagunaOptions

    if world_size <= 1 or unique_name.split(":")[0] != "tp":
        return TpReduceMode.PLAIN
    if not series_in_scope(vllm_config):
        # Not a Laguna target (or CPU without a series switch): upstream's
        # all-reduce (XCCL, CPU SHM/gloo), the debug stand-in included.
        return TpReduceMode.PLAIN
    options = XpuLagunaOptions.from_config(vllm_config)
    if options.exact_verify and options.exact_tp_reduce:
        mode = TpReduceMode.RANK_ORDER
    elif options.debug_xccl_standin:
        mode = TpReduceMode.XCCL_STANDIN
    else:
        return TpReduceMode.PLAIN
    logger.info_once(
        "XPU Laguna: all-reduce of group %s (%d ranks) runs as %s.",
        unique_name,
        world_size,
        "all-gather + fixed rank-order sum"
        if mode is TpReduceMode.RANK_ORDER
        else "the XCCL ring stand-in (debug)",
    )
    return mode


def communicator_mode(communicator: _TpGroup) -> TpReduceMode:
    """Communicator hook: the mode of a device communicator being built,
    decided under the current VllmConfig (the worker's: vLLM builds the
    communicators in ``init_device`` under ``set_current_vllm_config``)."""
    from vllm.config import get_current_vllm_config_or_none

    return tp_reduce_mode(
        communicator.unique_name,
        communicator.world_size,
        get_current_vllm_config_or_none(),
    )


def group_mode(group: object) -> TpReduceMode:
    """The mode a communicator (or a GroupCoordinator's communicator) was
    built with; ``PLAIN`` for a communicator the series does not build."""
    communicator = getattr(group, "device_communicator", None) or group
    return getattr(communicator, MODE_ATTR, TpReduceMode.PLAIN)


class SeriesAllReduce:
    """The series' part of a device communicator (a mixin before the
    platform's communicator class): the all-reduce mode, decided when the
    communicator is built (:meth:`init_series_mode`, under the worker's
    config, at the end of its ``__init__``), and the reduction into a
    caller-owned buffer that the communicator's ``all_reduce`` and the breakable
    graphs' collective break (:func:`all_reduce_into`) both run."""

    unique_name: str
    world_size: int
    device_group: ProcessGroup
    xpu_laguna_mode: TpReduceMode = TpReduceMode.PLAIN

    # the modes this communicator runs (another mode: its plain all-reduce)
    reduce_modes: frozenset[TpReduceMode] = frozenset({TpReduceMode.RANK_ORDER})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # the platform's communicator
        self.init_series_mode()

    def init_series_mode(self) -> None:
        """Decide and keep the mode (``__init__`` does, once the platform's
        communicator is built)."""
        self.xpu_laguna_mode = communicator_mode(self)

    def xpu_laguna_reduce_into(
        self,
        input_: torch.Tensor,
        out: torch.Tensor,
        gathered: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """``out`` filled with the sum of ``input_`` over the group in this
        communicator's mode, or None for the plain all-reduce. ``gathered``:
        a caller-owned scratch buffer (see :func:`rank_order_all_reduce`)."""
        if self.xpu_laguna_mode is TpReduceMode.RANK_ORDER:
            return rank_order_all_reduce(input_, self.device_group, out, gathered)
        return None


def _group_world(group: ProcessGroup) -> int:
    if group is None:
        raise ValueError("the exact all-reduce needs an explicit process group")
    return dist.get_world_size(group)


def _scratch(
    gathered: torch.Tensor | None, numel: int, like: torch.Tensor
) -> torch.Tensor:
    """``numel`` elements of ``like``'s dtype: the head of the caller-owned
    ``gathered`` (the breakable-graph collective break allocates it before
    capture), else a new tensor."""
    if gathered is None:
        return torch.empty(numel, dtype=like.dtype, device=like.device)
    if gathered.dtype != like.dtype or gathered.numel() < numel:
        raise ValueError(
            f"gather buffer {tuple(gathered.shape)} {gathered.dtype} cannot hold "
            f"{numel} {like.dtype}"
        )
    return gathered.view(-1)[:numel]


def _sum_rows_into(rows: torch.Tensor, out: torch.Tensor) -> None:
    """``out = ((rows[0] + rows[1]) + rows[2]) + ...``, one add kernel per
    rank after the first, each rounded to the dtype (``rows``: ``[N, *out
    shape]``, N >= 2; ``out`` may be any view of that shape, ``rows[0]``
    itself included)."""
    torch.add(rows[0], rows[1], out=out)
    for rank in range(2, rows.shape[0]):
        out.add_(rows[rank])


def _gather_sum(
    flat: torch.Tensor,
    group: ProcessGroup,
    world: int,
    out: torch.Tensor,
    gathered: torch.Tensor | None,
) -> None:
    """All-gather, then the rank-order sum straight into ``out``."""
    numel = flat.numel()
    rows = _scratch(gathered, world * numel, flat)
    dist.all_gather_single(rows, flat, group=group)
    _sum_rows_into(rows.view(world, *out.shape), out)


def _scatter_sum(
    flat: torch.Tensor,
    group: ProcessGroup,
    world: int,
    out: torch.Tensor,
    gathered: torch.Tensor | None,
) -> None:
    """Each rank sums its own slice in rank order, then all-gather.

    Slice ``r`` is ``[r * L, min((r + 1) * L, numel))`` with ``L =
    ceil(numel / N)`` (only trailing slices are short or empty). An all-to-all
    gives rank ``r`` every rank's copy of slice ``r``, in rank order; it sums
    them into its first copy with the same adds as :func:`_gather_sum`, and an
    all-gather of ``L``-element slices puts the slices back in order. Scratch:
    ``N * L`` elements when every slice is full and ``out`` is contiguous,
    else ``(N + 1) * L`` (padded slice, then a gather buffer and one copy).
    """
    numel = flat.numel()
    rank = dist.get_rank(group)
    size = -(-numel // world)
    splits = [max(0, min(size, numel - r * size)) for r in range(world)]
    mine = splits[rank]
    even = numel == world * size
    direct = even and out.is_contiguous()
    scratch = _scratch(gathered, world * size + (0 if direct else size), flat)
    received = scratch[: world * mine]
    dist.all_to_all_single(
        received, flat, output_split_sizes=[mine] * world, input_split_sizes=splits
    )
    if even:
        own = received[:size]
    else:
        own = scratch[world * size :]
        own[mine:].zero_()  # padding past the message: gathered, never read
    if mine:
        _sum_rows_into(received.view(world, mine), own[:mine])
    if direct:
        dist.all_gather_single(out.view(-1), own, group=group)
        return
    slices = scratch[: world * size]
    dist.all_gather_single(slices, own, group=group)
    out.copy_(slices[:numel].view(out.shape))


def rank_order_all_reduce(
    input_: torch.Tensor,
    group: ProcessGroup,
    out: torch.Tensor | None = None,
    gathered: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum ``input_`` over ``group`` as ``((x_0 + x_1) + x_2) + ...``.

    Every element is the sum of the ranks' values in rank order, each add
    rounded to the input dtype; the same bits on every rank and for every
    message size. Messages of :data:`RANK_ORDER_SCATTER_MIN_BYTES` or more sum
    each rank's slice on that rank, then all-gather; smaller ones all-gather
    and sum everything (module docstring). Returns a new tensor, or ``out``
    (any tensor of the input's shape and dtype, ``input_`` itself included)
    filled with the sum; ``gathered``: a caller-owned scratch buffer of at
    least ``N x numel`` elements of the input dtype (then nothing is
    allocated, unless ``input_`` is not contiguous).
    """
    world = _group_world(group)
    if out is None:
        out = torch.empty_like(input_, memory_format=torch.contiguous_format)
    elif out.shape != input_.shape or out.dtype != input_.dtype:
        raise ValueError(
            f"all-reduce output {tuple(out.shape)} {out.dtype} does not match "
            f"the input {tuple(input_.shape)} {input_.dtype}"
        )
    flat = input_.contiguous().view(-1)
    if world == 1:
        out.copy_(input_)
    elif flat.numel() * flat.element_size() >= RANK_ORDER_SCATTER_MIN_BYTES:
        _scatter_sum(flat, group, world, out, gathered)
    else:
        _gather_sum(flat, group, world, out, gathered)
    return out


def all_reduce_into(
    input_: torch.Tensor,
    out: torch.Tensor,
    group: object,
    gathered: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Reduce ``input_`` into ``out`` the way the group's communicator does
    (a :class:`SeriesAllReduce`), or return None: a communicator the series
    did not build, or its plain mode (the caller keeps its plain path).
    ``group``: a device communicator or a ``GroupCoordinator``."""
    communicator = getattr(group, "device_communicator", None) or group
    if not isinstance(communicator, SeriesAllReduce):
        return None
    return communicator.xpu_laguna_reduce_into(input_, out, gathered)
