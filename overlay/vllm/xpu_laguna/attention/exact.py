# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Exact speculative verify for the FlashAttention backend on XPU (Laguna).

With speculative decoding of width M the target verifies 2..M query rows of
one request per step. On XPU a q=1 decode and a q>1 verify go through
different kernels (paged decode vs chunked prefill) whose results are close
but not bitwise equal; Laguna's narrow logit margins then change greedy
tokens and the speculative server stops matching the non-speculative one.

The exact path runs the q verify rows as q one-token pseudo-sequences in a
single paged-decode call:

* query offsets ``arange(q + 1)``, ``max_seqlen_q = 1``, non-causal;
* KV lengths ``seq_len - q + [1..q]`` (row ``i`` sees exactly the keys a
  plain decode of that token would see);
* the request's block-table row repeated ``q`` times.

Each verify row is then computed by the same kernel, with the same inputs, as
the q=1 decode of that token, so the verify logits are bitwise equal to
non-speculative decoding.

Which steps take the path (:meth:`StepPlanner.plan`, called once per step and
KV cache group by the metadata builder): exactly one request, 1 <= q <= M query
rows (M = the ``verify_width`` option; q = 1 is the plain decode, one row
with the planned split count), all rows real (no padding), no
decode context parallelism, causal attention without multimodal prefix ranges
or R-SWA. Per layer (:func:`run_exact_verify`): decoder
self-attention without ALiBi, soft-cap or sinks. Everything else takes the
unchanged upstream code. The option ``exact_verify`` false (default true)
disables the path.

Split plan: the paged-decode kernel splits each sequence's KV into a number
of chunks it picks from the whole call (batch size, longest KV length), and a
different count is a different accumulation order. So whenever the path is
active, both the q=1 decode of one request (width 1) and every verify row run
with an explicit count: the one a single-request q=1 decode of that row's own
KV length gets (:mod:`vllm.xpu_laguna.attention.split_plan`, a port of
the pinned kernel's heuristic). Rows of one step that need different counts go
in separate calls (at most a few per step). The debug option
``debug_no_split_plan`` drops the explicit count (one call,
the kernel picks): the negative control of the tests, never for serving.

The exact KV length of the request comes from the host copy of ``seq_lens``
(``seq_lens_cpu_upper_bound``) when it is exact (always, except for decode
rows under async speculative decoding, where it assumes every draft was
accepted), else from the device (one small copy per step and metadata
builder); ``max_seq_len`` is only an upper bound and is never used for it.

Kernel seam (:func:`varlen_attention`): the kernels of
:data:`vllm.xpu_laguna.attention.kernels.registry`: on XPU
``vllm._xpu_ops.xpu_ops.flash_attn_varlen_func``, the same function (and so
the same ``vllm_xpu_kernels`` op, with the pinned version's signature) that
upstream uses for q=1 decode, a missing kernel package being one clear error;
on a platform without FlashAttention kernels (CPU) only what a plugin
registered (the CPU runtime's test-side reference kernels). The path is
active on XPU, and wherever the FlashAttention backend runs without
FlashAttention kernels of the platform (CPU tests); on CUDA/ROCm it is never
taken.

Split plan once per step: the kernel calls of a step (:func:`call_groups`)
depend on the step (width, KV length) and on the layer's attention shape
(window, heads, block size), which all layers of one metadata share. They
are computed at the first layer forward of the step and kept on the step's
:class:`ExactVerifyMetadata` (:meth:`ExactVerifyMetadata.call_groups`), so the
other layers reuse them; ``counters.plans`` counts the computations.
"""

import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from vllm.config import get_current_vllm_config_or_none
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.xpu_laguna.attention import split_plan
from vllm.xpu_laguna.attention.kernels import registry as kernel_registry
from vllm.xpu_laguna.options import XpuLagunaOptions

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.flash_attn import (
        FlashAttentionImpl,
        FlashAttentionMetadata,
    )

logger = init_logger(__name__)

# Cache dtype strings naming a native float cache. The XPU cache-write kernel
# stores a native float cache only under "auto" (= the model dtype).
_NATIVE_FLOAT_CACHE_DTYPES = frozenset(
    {"bfloat16", "float16", "half", "float", "float32"}
)


class ExactMetadataOwner(Protocol):
    """An owner of prebuilt exact-verify metadata, as this module uses it
    (implemented by ``prebuilt.PrebuiltExactMetadata``; defined
    here so that this module does not import that one)."""

    def refresh(
        self,
        q: int,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        seq_len: int | None = None,
    ) -> "ExactVerifyMetadata": ...

    def check_source(
        self, exact: "ExactVerifyMetadata", block_table: torch.Tensor
    ) -> None: ...


# Kernel calls of one layer forward: (first_row, end_row, num_splits,
# max_seqlen_k); num_splits None = the kernel picks (debug switch).
CallGroups = tuple[tuple[int, int, int | None, int], ...]


@dataclass(eq=False)
class ExactVerifyMetadata:
    """Per-step exact-verify description attached to FlashAttentionMetadata.

    ``width`` is the number of rows q (1: a plain decode run with the planned
    split count). ``seq_len`` is the request's exact KV length on the host
    (including this step's rows). When the tensors are None the layer forward
    builds them inline (:func:`build_inline`); when the builder owns prebuilt
    buffers they are views into those buffers, refreshed in place each step,
    and ``owner`` is the owner.
    """

    width: int
    seq_len: int = 0
    query_start_loc: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    kv_offsets: torch.Tensor | None = None
    owner: ExactMetadataOwner | None = None
    # False only under the debug option ``debug_no_split_plan`` (decided
    # from the builder's config when the step is planned).
    split_plan: bool = True
    # The step's kernel calls per layer shape (see call_groups).
    plans: dict[tuple[int, ...], CallGroups] = field(default_factory=dict)

    def call_groups(
        self, window_left: int, num_heads_q: int, num_heads_kv: int, block_size: int
    ) -> "CallGroups":
        """This step's kernel calls for one layer shape: computed at the
        first layer forward, reused by the others (:func:`call_groups`).

        The key holds the width and KV length too: a prebuilt object is the
        same object step after step (refreshed in place), so a plan of an
        earlier step is never reused for another one.
        """
        key = (
            self.width,
            self.seq_len,
            window_left,
            num_heads_q,
            num_heads_kv,
            block_size,
            self.split_plan,
        )
        groups = self.plans.get(key)
        if groups is None:
            if self.plans and next(iter(self.plans))[:2] != key[:2]:
                self.plans.clear()  # a new step in a reused (prebuilt) object
            groups = call_groups(
                self, window_left, num_heads_q, num_heads_kv, block_size
            )
            self.plans[key] = groups
        return groups


@dataclass
class ExactVerifyCounters:
    """Process-wide counts of the exact path (read by the equivalence matrix
    and the tests; :meth:`reset` starts over)."""

    calls_by_width: Counter = field(default_factory=Counter)
    kernel_calls_by_width: Counter = field(default_factory=Counter)
    prebuilt_calls: int = 0
    longest_seq_len: int = 0
    # KV split plans computed (call_groups): one per step and layer shape.
    plans: int = 0

    def reset(self) -> None:
        self.calls_by_width.clear()
        self.kernel_calls_by_width.clear()
        self.prebuilt_calls = 0
        self.longest_seq_len = 0
        self.plans = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "exact_calls_by_width": {
                str(w): n for w, n in sorted(self.calls_by_width.items())
            },
            "kernel_calls_by_width": {
                str(w): n for w, n in sorted(self.kernel_calls_by_width.items())
            },
            "prebuilt_calls": self.prebuilt_calls,
            "longest_seq_len": self.longest_seq_len,
            "plans": self.plans,
        }


counters = ExactVerifyCounters()


def kernel_seam_name() -> str:
    """``"xpu"`` on XPU, else the registered kernels' name (``"reference"``:
    the CPU runtime's pure-torch kernels), ``"none"`` when none are."""
    return kernel_registry.registered_name() or "none"


_available: bool | None = None


def exact_path_available() -> bool:
    """Whether the platform runs FLASH_ATTN on the XPU or reference kernels."""
    global _available
    if _available is None:
        if current_platform.is_xpu():
            _available = True
        else:
            from vllm.v1.attention.backends.fa_utils import (
                is_flash_attn_varlen_func_available,
            )

            _available = not is_flash_attn_varlen_func_available()
    return _available


def exact_verify_width(vllm_config: "VllmConfig | None") -> int:
    """The largest verify width M that takes the exact path (0 = off): the
    ``exact_verify`` option on, the series in scope for ``vllm_config`` (a
    Laguna target on XPU, or a CPU run that asks: ``series_in_scope``) and
    the platform running FLASH_ATTN on the XPU or reference kernels."""
    from vllm.xpu_laguna.graphs.config import series_in_scope

    if not series_in_scope(vllm_config):
        return 0
    options = XpuLagunaOptions.from_config(vllm_config)
    on = options.exact_verify and exact_path_available()
    width = options.verify_width if on else 0
    if on:
        logger.info_once(
            "XPU Laguna exact verify: ON (verify widths 2..%d run as one-token "
            "paged-decode pseudo-sequences, kernel seam: %s, KV split plan: %s)",
            width,
            kernel_seam_name(),
            "OFF (debug switch)" if options.debug_no_split_plan else "on",
        )
        if options.debug_no_split_plan:
            logger.warning_once(
                "xpu_laguna.debug_no_split_plan: verify rows past ~2K tokens of "
                "context are no longer bitwise equal to decode (debug switch, "
                "not for serving)"
            )
    else:
        logger.info_once(
            "XPU Laguna exact verify: OFF (%s); verify uses the upstream path",
            "xpu_laguna.exact_verify false"
            if not options.exact_verify
            else "platform has native FlashAttention kernels",
        )
    return width


def eligible_width(
    common_attn_metadata: "CommonAttentionMetadata", dcp_world_size: int, width: int
) -> int:
    """Q if this step is eligible for the exact path of a config whose exact
    verify width is ``width`` (1 = a single-request decode, which then runs
    with the planned split count), else 0."""
    cm = common_attn_metadata
    q = cm.max_query_len
    if (
        width == 0
        or q < 1
        or q > width
        or cm.num_reqs != 1
        or cm.num_actual_tokens != q
        or dcp_world_size != 1
        or cm.causal is not True
        or cm.mm_req_doc_ranges is not None
        or cm.rswa_prefix_lens is not None
    ):
        return 0
    return q


def host_seq_lens_exact(vllm_config: "VllmConfig") -> bool:
    """Whether ``seq_lens_cpu_upper_bound`` is exact: it is optimistic only
    for decode rows under async speculative decoding (every draft assumed
    accepted)."""
    return not (
        vllm_config.scheduler_config.async_scheduling
        and vllm_config.speculative_config is not None
    )


def exact_seq_len(
    common_attn_metadata: "CommonAttentionMetadata", host_exact: bool
) -> int:
    """The single request's exact KV length on the host (see module doc):
    the host copy when it is exact, else one device-to-host copy."""
    cm = common_attn_metadata
    host = cm.seq_lens_cpu_upper_bound
    if host_exact and host is not None:
        return int(host[0])
    return int(cm.seq_lens[0].item())


@dataclass(frozen=True)
class StepPlanner:
    """What planning a step reads of the config, decided once: a metadata
    builder makes one when it is built (its config does not change), so a
    step reads no option. ``width`` 0: the series is not for this config and
    every step takes upstream's path."""

    width: int
    host_seq_lens_exact: bool = True
    split_plan: bool = True

    @classmethod
    def from_config(cls, vllm_config: "VllmConfig") -> "StepPlanner":
        width = exact_verify_width(vllm_config)
        if width == 0:
            return cls(0)
        return cls(
            width,
            host_seq_lens_exact(vllm_config),
            not XpuLagunaOptions.from_config(vllm_config).debug_no_split_plan,
        )

    def plan(
        self,
        common_attn_metadata: "CommonAttentionMetadata",
        dcp_world_size: int,
        prebuilt: ExactMetadataOwner | None = None,
    ) -> ExactVerifyMetadata | None:
        """The step's exact-verify metadata, or None (upstream path).

        ``prebuilt`` is the builder's prebuilt-metadata owner (widths 2..M),
        if any; width 1 is always built inline.
        """
        q = eligible_width(common_attn_metadata, dcp_world_size, self.width)
        if q == 0:
            return None
        seq_len = exact_seq_len(common_attn_metadata, self.host_seq_lens_exact)
        if prebuilt is not None and q >= 2:
            return prebuilt.refresh(
                q,
                common_attn_metadata.seq_lens,
                common_attn_metadata.block_table_tensor,
                seq_len,
            )
        return ExactVerifyMetadata(width=q, seq_len=seq_len, split_plan=self.split_plan)


def build_inline(
    seq_lens: torch.Tensor, block_table: torch.Tensor, q: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Freshly allocated (query offsets, KV lengths, expanded block table).

    KV lengths are computed on the device from ``seq_lens`` (no host sync).
    """
    device = seq_lens.device
    cu_seqlens_q = torch.arange(q + 1, dtype=torch.int32, device=device)
    kv_lens = seq_lens[:1] + torch.arange(1 - q, 1, dtype=seq_lens.dtype, device=device)
    table = block_table[:1].repeat(q, 1)
    return cu_seqlens_q, kv_lens, table


def cache_write_dtype(
    kv_cache_dtype: str, model_dtype: torch.dtype, cache_dtype: torch.dtype
) -> str:
    """The dtype string to pass to the cache-write kernel.

    The XPU kernel (and the reference kernel that mirrors it) stores a
    native float cache only under ``"auto"``, which means "store the model
    dtype as is". A native float string (``--kv-cache-dtype bfloat16``) is
    mapped to ``"auto"`` only when it names the model dtype (and the cache
    has it); any other native float combination would be stored mistyped,
    so it is refused with a clear error. FP8 strings and ``"auto"`` pass
    unchanged, and so does everything on platforms with their own
    FlashAttention kernels (upstream behaviour).
    """
    if kv_cache_dtype not in _NATIVE_FLOAT_CACHE_DTYPES or not exact_path_available():
        return kv_cache_dtype
    wanted = STR_DTYPE_TO_TORCH_DTYPE[kv_cache_dtype]
    if wanted == model_dtype and cache_dtype == model_dtype:
        return "auto"
    raise ValueError(
        f"--kv-cache-dtype {kv_cache_dtype} with model dtype "
        f"{str(model_dtype).removeprefix('torch.')} (cache "
        f"{str(cache_dtype).removeprefix('torch.')}): the XPU cache write stores "
        "a native float cache only in the model dtype; use --kv-cache-dtype "
        "auto (or the model dtype), or an fp8 cache"
    )


def varlen_attention(**kwargs: Any) -> torch.Tensor:
    """The kernel seam: the registry's ``flash_attn_varlen_func``.

    ``num_splits_kv`` is the decode kernel's split count (None: it picks);
    forwarded by ``vllm._xpu_ops`` (series patch).
    """
    return kernel_registry.get().flash_attn_varlen_func(**kwargs)


# Layer-level eligibility, computed once per impl (impls are created once per
# layer; the weak map does not keep them alive).
_impl_ok: "weakref.WeakKeyDictionary[FlashAttentionImpl, bool]" = (
    weakref.WeakKeyDictionary()
)


def impl_supports_exact(impl: "FlashAttentionImpl") -> bool:
    """Decoder self-attention without ALiBi, soft-cap, sinks or DCP."""
    ok = _impl_ok.get(impl)
    if ok is None:
        from vllm.v1.attention.backend import AttentionType

        ok = (
            impl.attn_type == AttentionType.DECODER
            and impl.alibi_slopes is None
            and not impl.logits_soft_cap
            and impl.sinks is None
            and impl.dcp_world_size == 1
        )
        _impl_ok[impl] = ok
    return ok


def call_groups(
    exact: ExactVerifyMetadata,
    window_left: int,
    num_heads_q: int,
    num_heads_kv: int,
    block_size: int,
) -> CallGroups:
    """Compute the kernel calls of one layer forward (the KV split plan;
    counted in ``counters.plans``). Layers take them from
    :meth:`ExactVerifyMetadata.call_groups`, once per step."""
    counters.plans += 1
    q, seq_len = exact.width, exact.seq_len
    if not exact.split_plan:
        return ((0, q, None, seq_len),)
    kv_lens = tuple(range(seq_len - q + 1, seq_len + 1))
    return split_plan.row_groups(
        kv_lens,
        num_heads_q,
        num_heads_kv,
        block_size,
        window_left,
        split_plan.device_xe_cores(),
    )


def run_exact_verify(
    impl: "FlashAttentionImpl",
    layer: torch.nn.Module,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    attn_metadata: "FlashAttentionMetadata",
) -> bool:
    """Impl hook: run the exact verify; False means take the upstream path."""
    exact = attn_metadata.laguna_exact
    assert exact is not None
    if not impl_supports_exact(impl):
        return False
    q = exact.width
    if exact.owner is None:
        cu_seqlens_q, kv_lens, table = build_inline(
            attn_metadata.seq_lens, attn_metadata.block_table, q
        )
    else:
        exact.owner.check_source(exact, attn_metadata.block_table)
        assert (
            exact.query_start_loc is not None
            and exact.seq_lens is not None
            and exact.block_table is not None
        )
        cu_seqlens_q = exact.query_start_loc
        kv_lens = exact.seq_lens
        table = exact.block_table
    # The layer's own window, as upstream's forward uses it.
    window = impl.sliding_window
    window_left = int(window[0]) if window is not None else -1
    groups = exact.call_groups(
        window_left, impl.num_heads, key_cache.shape[2], key_cache.shape[1]
    )
    for first, end, num_splits, longest in groups:
        rows = end - first
        descale_shape = (rows, impl.num_kv_heads)
        q_descale = (
            layer._q_scale.expand(descale_shape)
            if impl.supports_quant_query_input
            else None
        )
        varlen_attention(
            q=query[first:end],
            k=key_cache,
            v=value_cache,
            out=output[first:end],
            cu_seqlens_q=cu_seqlens_q[: rows + 1],
            max_seqlen_q=1,
            seqused_k=kv_lens[first:end],
            max_seqlen_k=longest,
            softmax_scale=impl.scale,
            causal=False,
            alibi_slopes=None,
            window_size=list(window) if window is not None else None,
            block_table=table[first:end],
            softcap=impl.logits_soft_cap,
            scheduler_metadata=None,
            fa_version=impl.vllm_flash_attn_version,
            q_descale=q_descale,
            k_descale=layer._k_scale.expand(descale_shape),
            v_descale=layer._v_scale.expand(descale_shape),
            num_splits=attn_metadata.max_num_splits,
            num_splits_kv=num_splits,
            s_aux=None,
        )
    counters.calls_by_width[q] += 1
    counters.kernel_calls_by_width[q] += len(groups)
    counters.prebuilt_calls += exact.owner is not None
    counters.longest_seq_len = max(counters.longest_seq_len, exact.seq_len)
    return True


def checked_fa_version(version: int | None) -> int | None:
    """Impl hook: the FA version for the impl, once the kernels the series
    calls are known to be there (one clear error otherwise): on XPU with the
    exact path on, ``vllm_xpu_kernels`` at its pinned version; on a platform
    without FlashAttention kernels, registered ones (then version 2)."""
    if current_platform.is_xpu():
        # the impl is built under its model's config
        if exact_verify_width(get_current_vllm_config_or_none()):
            kernel_registry.get()
        return version
    if version is None and exact_path_available():
        kernel_registry.get()
        return 2
    return version
