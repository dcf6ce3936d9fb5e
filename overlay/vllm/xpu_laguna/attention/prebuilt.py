# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Prebuilt, fixed-address metadata for the XPU Laguna exact verify path.

The exact verify path (:mod:`vllm.xpu_laguna.attention.exact`)
needs three small tensors per step: query offsets ``arange(q + 1)``, KV
lengths ``seq_len - q + [1..q]`` and the block-table row repeated q times.
Built inline they cost host time in every layer forward, and fresh tensors
break device-graph replay, which needs stable addresses.

With the option ``prebuilt_metadata`` true (default false) each
FlashAttention metadata builder owns one :class:`PrebuiltExactMetadata`:

* buffers allocated once, at the first eligible step (their column count,
  dtype and device come from that step's block table): query offsets
  ``arange(M + 1)``, KV lengths (M), expanded block table (M x columns), a
  constant KV-offset vector per width (``[1 - q .. 0]``) and a zero index
  vector used to expand the table in one op;
* one :class:`ExactVerifyMetadata` per width 2..M whose tensors are views
  into those buffers.

Each eligible step refreshes the views of its width in place on the current
stream (KV lengths from the device ``seq_lens``, never from a host upper
bound) and returns the same object, so every layer reads the same addresses
step after step.

Drift guards, default policy: on every refresh, identity of every per-width
object and of every view it holds, and pointer, storage offset, shape,
stride, dtype and device of every buffer and of the views being refreshed
and handed out; the same full fingerprint of all widths' views at the first
use and whenever the width changes (so no view is ever handed out
unchecked); agreement of the incoming tensors' dtype, device and column
count with the buffers. The literal every-call fingerprint of all views of
all widths roughly doubles the refresh cost and is a debug mode: the
option ``debug_prebuilt_full_guard`` (read when the owner is created). Any
drift raises :class:`PrebuiltMetadataDriftError`; nothing is ever
reallocated after the first use.

Width 1 (a single-request decode on the exact path) never uses the buffers:
it is built inline.

KV-cache groups: Model Runner V2 (``vllm/v1/worker/gpu/attn_utils.py``)
builds each attention group's metadata with that group's own builder (it
reuses metadata through ``update_block_table`` for Mamba groups only), so
each builder refreshes its own buffers. Laguna has several sliding-window
groups with different block tables; should a runner hand one group's
metadata to another through ``update_block_table`` (the V1 runner did), the
builder re-expands into its own buffers (:meth:`rebind`), and the layer
forward checks (:meth:`check_source`) that the expanded table was made from
the block table of the metadata it runs with.
"""

from typing import TYPE_CHECKING

import torch

from vllm.logger import init_logger
from vllm.xpu_laguna.attention.exact import (
    ExactVerifyMetadata,
    exact_verify_width,
)
from vllm.xpu_laguna.options import XpuLagunaOptions

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

_Fingerprint = tuple[
    int, int, tuple[int, ...], tuple[int, ...], torch.dtype, torch.device
]


class PrebuiltMetadataDriftError(RuntimeError):
    """A prebuilt exact-verify buffer, view or object changed under us."""


def _fingerprint(t: torch.Tensor) -> _Fingerprint:
    return (
        t.data_ptr(),
        t.storage_offset(),
        t.shape,
        t.stride(),
        t.dtype,
        t.device,
    )


_FIELDS = ("query_start_loc", "seq_lens", "block_table", "kv_offsets")
_FP_NAMES = ("pointer", "storage offset", "shape", "stride", "dtype", "device")


class PrebuiltExactMetadata:
    """Fixed-address exact-verify metadata owned by one metadata builder."""

    def __init__(
        self,
        max_width: int,
        device: torch.device | str,
        full_guard_every_call: bool = False,
        split_plan: bool = True,
    ) -> None:
        if not 2 <= max_width <= 16:
            raise ValueError(f"verify width must be in 2..16, got {max_width}")
        # Fingerprint every view of every width on each refresh (not only the
        # refreshed width's): the debug mode of the guard.
        self.full_guard_every_call = full_guard_every_call
        # False only under the debug option debug_no_split_plan.
        self.split_plan = split_plan
        self.max_width = max_width
        self.device = torch.device(device)
        self.num_cols: int | None = None
        self.table_dtype: torch.dtype | None = None
        self.lens_dtype: torch.dtype | None = None
        self.by_width: dict[int, ExactVerifyMetadata] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self._zero_index: dict[int, torch.Tensor] = {}
        self._expected_buffers: list[tuple[str, torch.Tensor, _Fingerprint]] = []
        self._expected_views: list[tuple[int, str, torch.Tensor, _Fingerprint]] = []
        self._expected_objects: list[tuple[int, ExactVerifyMetadata]] = []
        self._view_owners: list[ExactVerifyMetadata] = []
        self._tracked: list[torch.Tensor] = []
        self._tracked_for: dict[
            int | None, tuple[list[torch.Tensor], list[_Fingerprint]]
        ] = {}
        self._last_width = 0
        self._source_table: torch.Tensor | None = None

    @property
    def allocated(self) -> bool:
        return self.num_cols is not None

    def _allocate(
        self, num_cols: int, table_dtype: torch.dtype, lens_dtype: torch.dtype
    ) -> None:
        m, dev = self.max_width, self.device
        qsl = torch.arange(m + 1, dtype=torch.int32, device=dev)
        lens = torch.zeros(m, dtype=lens_dtype, device=dev)
        table = torch.zeros(m, num_cols, dtype=table_dtype, device=dev)
        offsets = torch.zeros(m + 1, m, dtype=lens_dtype, device=dev)
        for q in range(2, m + 1):
            offsets[q, :q] = torch.arange(1 - q, 1, dtype=lens_dtype, device=dev)
        zero_index = torch.zeros(m, dtype=torch.long, device=dev)
        self._buffers = {
            "query_start_loc": qsl,
            "seq_lens": lens,
            "block_table": table,
            "kv_offsets": offsets,
            "zero_index": zero_index,
        }
        for q in range(2, m + 1):
            self.by_width[q] = ExactVerifyMetadata(
                width=q,
                query_start_loc=qsl[: q + 1],
                seq_lens=lens[:q],
                block_table=table[:q],
                kv_offsets=offsets[q, :q],
                owner=self,
                split_plan=self.split_plan,
            )
            self._zero_index[q] = zero_index[:q]
        self.num_cols = num_cols
        self.table_dtype = table_dtype
        self.lens_dtype = lens_dtype
        self._expected_buffers = [
            (name, t, _fingerprint(t)) for name, t in self._buffers.items()
        ]
        self._expected_views = []
        for q, obj in self.by_width.items():
            for field in _FIELDS:
                view = getattr(obj, field)
                self._expected_views.append((q, field, view, _fingerprint(view)))
            zi = self._zero_index[q]
            self._expected_views.append((q, "zero_index", zi, _fingerprint(zi)))
        self._expected_objects = list(self.by_width.items())
        self._view_owners = [self.by_width[q] for q, _, _, _ in self._expected_views]
        self._tracked = [t for _, t, _ in self._expected_buffers] + [
            v for _, _, v, _ in self._expected_views
        ]
        # Fingerprint sets: everything (None), or the buffers + one width.
        buffers = [t for _, t, _ in self._expected_buffers]
        self._tracked_for = {
            None: (self._tracked, [_fingerprint(t) for t in self._tracked])
        }
        for q in self.by_width:
            mine = buffers + [v for w, _, v, _ in self._expected_views if w == q]
            self._tracked_for[q] = (mine, [_fingerprint(t) for t in mine])
        logger.debug(
            "Allocated prebuilt exact-verify metadata: width %d, %d columns, %s",
            m,
            num_cols,
            dev,
        )

    # ------------------------------------------------------------------ guards
    def _drift(self, what: str, expected: _Fingerprint, got: _Fingerprint) -> None:
        diffs = [
            f"{name} {e} -> {g}"
            for name, e, g in zip(_FP_NAMES, expected, got)
            if e != g
        ]
        raise PrebuiltMetadataDriftError(
            f"prebuilt exact-verify metadata drifted: {what}: {'; '.join(diffs)}"
        )

    def verify(self, width: int | None = None) -> None:
        """Check the buffers, views and per-width objects against allocation.

        Always: identity of every per-width object and of every view it
        holds, and pointer, storage offset, shape, stride, dtype and device of
        every buffer. The same fingerprint of the views: of all widths when
        ``width`` is None, else of the views of ``width`` (the ones about to be
        refreshed and handed out). The fast path compares flat lists; the slow
        path runs only on a mismatch, to name what drifted.
        """
        objs = [self.by_width.get(q) for q, _ in self._expected_objects]
        ok = len(self.by_width) == len(self._expected_objects) and all(
            o is e and o.width == q and o.owner is self
            for o, (q, e) in zip(objs, self._expected_objects)
        )
        if ok:
            held = [self._buffers.get(name) for name, _, _ in self._expected_buffers]
            held += [
                self._zero_index[q] if field == "zero_index" else getattr(o, field)
                for o, (q, field, _, _) in zip(self._view_owners, self._expected_views)
            ]
            ok = all(h is t for h, t in zip(held, self._tracked))
        if ok:
            tracked, expected = self._tracked_for[width]
            ok = list(map(_fingerprint, tracked)) == expected
        if not ok:
            self._explain_drift()

    def _explain_drift(self) -> None:
        for name, t, fp in self._expected_buffers:
            if self._buffers.get(name) is not t:
                raise PrebuiltMetadataDriftError(
                    f"prebuilt exact-verify metadata drifted: buffer {name} "
                    "was replaced"
                )
            got = _fingerprint(t)
            if got != fp:
                self._drift(f"buffer {name}", fp, got)
        for q, obj in self._expected_objects:
            if self.by_width.get(q) is not obj:
                raise PrebuiltMetadataDriftError(
                    f"prebuilt exact-verify metadata drifted: the width-{q} "
                    "metadata object was replaced"
                )
            if obj.width != q or obj.owner is not self:
                raise PrebuiltMetadataDriftError(
                    f"prebuilt exact-verify metadata drifted: the width-{q} "
                    "metadata object was modified"
                )
        if len(self.by_width) != len(self._expected_objects):
            raise PrebuiltMetadataDriftError(
                "prebuilt exact-verify metadata drifted: per-width objects "
                "were added or removed"
            )
        for q, field, view, fp in self._expected_views:
            held = (
                self._zero_index[q]
                if field == "zero_index"
                else getattr(self.by_width[q], field)
            )
            if held is not view:
                raise PrebuiltMetadataDriftError(
                    f"prebuilt exact-verify metadata drifted: width-{q} "
                    f"{field} view was replaced"
                )
            got = _fingerprint(view)
            if got != fp:
                self._drift(f"width-{q} {field} view", fp, got)
        raise PrebuiltMetadataDriftError(  # unreachable unless state is odd
            "prebuilt exact-verify metadata drifted"
        )

    def _check_incoming(self, seq_lens: torch.Tensor, table: torch.Tensor) -> None:
        problems = []
        if table.dtype != self.table_dtype:
            problems.append(f"block table dtype {table.dtype} != {self.table_dtype}")
        if table.device != self.device:
            problems.append(f"block table device {table.device} != {self.device}")
        if table.dim() != 2 or table.shape[1] != self.num_cols:
            problems.append(
                f"block table columns {tuple(table.shape)} != {self.num_cols}"
            )
        if seq_lens.dtype != self.lens_dtype:
            problems.append(f"seq_lens dtype {seq_lens.dtype} != {self.lens_dtype}")
        if seq_lens.device != self.device:
            problems.append(f"seq_lens device {seq_lens.device} != {self.device}")
        if problems:
            raise PrebuiltMetadataDriftError(
                "prebuilt exact-verify metadata does not match this step "
                "(buffers are never reallocated): " + "; ".join(problems)
            )

    # ----------------------------------------------------------------- refresh
    def refresh(
        self,
        q: int,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        seq_len: int | None = None,
    ) -> ExactVerifyMetadata:
        """Refresh the width-q views in place from this step; same object back.

        ``seq_len`` is the request's exact KV length on the host (read from
        ``seq_lens`` when not given: a device copy).
        """
        if not 2 <= q <= self.max_width:
            raise ValueError(f"width {q} outside 2..{self.max_width}")
        if not self.allocated:
            if block_table.device != self.device or seq_lens.device != self.device:
                raise PrebuiltMetadataDriftError(
                    "prebuilt exact-verify metadata: step tensors on "
                    f"{block_table.device}/{seq_lens.device}, builder on "
                    f"{self.device}"
                )
            self._allocate(block_table.shape[1], block_table.dtype, seq_lens.dtype)
        self._check_incoming(seq_lens, block_table)
        # Full check whenever the width changes (and at first use), else the
        # views of this width; see verify().
        full = self.full_guard_every_call or q != self._last_width
        self.verify(None if full else q)
        self._last_width = q
        obj = self.by_width[q]
        assert obj.seq_lens is not None and obj.block_table is not None
        torch.add(seq_lens[:1], obj.kv_offsets, out=obj.seq_lens)
        torch.index_select(block_table, 0, self._zero_index[q], out=obj.block_table)
        self._source_table = block_table
        obj.seq_len = int(seq_lens[0].item()) if seq_len is None else seq_len
        return obj

    def rebind(
        self,
        exact: ExactVerifyMetadata | None,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
    ) -> ExactVerifyMetadata | None:
        """``update_block_table`` hook: re-expand for this group's table.

        Inline metadata (width 1, or built without an owner) is returned as
        is: the layer forward expands it from the metadata's own table.
        """
        if exact is None or exact.owner is None:
            return exact
        return self.refresh(exact.width, seq_lens, block_table, exact.seq_len)

    def check_source(
        self, exact: ExactVerifyMetadata, block_table: torch.Tensor
    ) -> None:
        """Layer-forward guard: the expansion belongs to this metadata's table."""
        if self._source_table is not block_table:
            raise PrebuiltMetadataDriftError(
                "prebuilt exact-verify metadata was expanded from another "
                "block table (another KV-cache group's metadata reused without "
                "update_block_table re-expansion)"
            )
        if self.by_width.get(exact.width) is not exact:
            raise PrebuiltMetadataDriftError(
                f"prebuilt exact-verify metadata: width-{exact.width} object "
                "is not the one this builder owns"
            )


def maybe_create(
    vllm_config: "VllmConfig", device: torch.device | str
) -> "PrebuiltExactMetadata | None":
    """Builder hook: an owner when ``vllm_config`` turns the prebuilt metadata
    on (``prebuilt_metadata``) and the exact verify is active for it."""
    options = XpuLagunaOptions.from_config(vllm_config)
    want = options.prebuilt_metadata
    width = exact_verify_width(vllm_config) if want else 0
    if not want:
        logger.info_once("XPU Laguna prebuilt exact-verify metadata: OFF (inline)")
    elif width < 2:
        logger.warning_once(
            "xpu_laguna.prebuilt_metadata has no effect: the exact verify path "
            "is not active"
        )
    else:
        logger.info_once(
            "XPU Laguna prebuilt exact-verify metadata: ON (widths 2..%d, guard: %s)",
            width,
            "full fingerprint every call (debug)"
            if options.debug_prebuilt_full_guard
            else "identity every call, full fingerprint on first use/width change",
        )
    if width < 2:
        return None
    return PrebuiltExactMetadata(
        width,
        device,
        full_guard_every_call=options.debug_prebuilt_full_guard,
        split_plan=not options.debug_no_split_plan,
    )
