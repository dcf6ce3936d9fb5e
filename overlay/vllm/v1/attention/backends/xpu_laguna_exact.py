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

Which steps take the path (:func:`plan_step`, called once per step and KV
cache group by the metadata builder): exactly one request, 2 <= q <= M query
rows (M = ``VLLM_XPU_LAGUNA_VERIFY_WIDTH``), all rows real (no padding), no
cascade, no decode context parallelism, causal attention without multimodal
prefix ranges or R-SWA. Per layer (:func:`run_exact_verify`): decoder
self-attention without ALiBi, soft-cap or sinks. Everything else takes the
unchanged upstream code. ``VLLM_XPU_LAGUNA_EXACT_VERIFY=0`` (default 1)
disables the path.

Kernel seam (:func:`varlen_attention`): on XPU the call goes to
``vllm._xpu_ops.xpu_ops.flash_attn_varlen_func``, the same function (and so
the same ``vllm_xpu_kernels`` op, with the pinned version's signature) that
upstream uses for q=1 decode; on any other device to the pure-torch reference
in :mod:`vllm.v1.attention.ops.xpu_laguna_reference`. The path is active on
XPU, and wherever the FlashAttention backend runs on the reference kernels
(no FlashAttention kernels on the platform, e.g. CPU tests); on CUDA/ROCm it
is never taken.
"""

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import vllm.envs as envs
from vllm.logger import init_logger
from vllm.platforms import current_platform

if TYPE_CHECKING:
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.xpu_laguna_prebuilt import (
        PrebuiltExactMetadata,
    )

logger = init_logger(__name__)

# Cache dtype strings the XPU cache-write kernel only accepts as "auto".
_NATIVE_FLOAT_CACHE_DTYPES = frozenset(
    {"bfloat16", "float16", "half", "float", "float32"}
)


@dataclass(eq=False)
class ExactVerifyMetadata:
    """Per-step exact-verify description attached to FlashAttentionMetadata.

    ``width`` is the number of verify rows q. When the tensors are None the
    layer forward builds them inline (:func:`build_inline`); when the builder
    owns prebuilt buffers they are views into those buffers, refreshed in
    place each step, and ``owner`` is the owner.
    """

    width: int
    query_start_loc: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    kv_offsets: torch.Tensor | None = None
    owner: "PrebuiltExactMetadata | None" = None


def kernel_seam_name() -> str:
    """``"xpu"`` on XPU, else ``"reference"`` (pure torch)."""
    return "xpu" if current_platform.is_xpu() else "reference"


@functools.cache
def exact_path_available() -> bool:
    """Whether the platform runs FLASH_ATTN on the XPU or reference kernels."""
    if current_platform.is_xpu():
        return True
    from vllm.v1.attention.backends.fa_utils import (
        is_flash_attn_varlen_func_available,
    )

    return not is_flash_attn_varlen_func_available()


_logged = False


def exact_verify_width() -> int:
    """The largest verify width M that takes the exact path (0 = off)."""
    global _logged
    on = bool(envs.VLLM_XPU_LAGUNA_EXACT_VERIFY) and exact_path_available()
    width = int(envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH) if on else 0
    if not _logged:
        _logged = True
        if on:
            logger.info(
                "XPU Laguna exact verify: ON (verify widths 2..%d run as "
                "one-token paged-decode pseudo-sequences, kernel seam: %s)",
                width,
                kernel_seam_name(),
            )
        else:
            logger.info(
                "XPU Laguna exact verify: OFF (%s); verify uses the upstream path",
                "VLLM_XPU_LAGUNA_EXACT_VERIFY=0"
                if not envs.VLLM_XPU_LAGUNA_EXACT_VERIFY
                else "platform has native FlashAttention kernels",
            )
    return width


def step_width(
    common_attn_metadata: "CommonAttentionMetadata",
    use_cascade: bool,
    dcp_world_size: int,
) -> int:
    """q if this step is eligible for the exact path, else 0."""
    width = exact_verify_width()
    cm = common_attn_metadata
    q = cm.max_query_len
    if (
        q < 2
        or q > width
        or cm.num_reqs != 1
        or cm.num_actual_tokens != q
        or use_cascade
        or dcp_world_size != 1
        or cm.causal is not True
        or cm.mm_req_doc_ranges is not None
        or cm.rswa_prefix_lens is not None
    ):
        return 0
    return q


def plan_step(
    common_attn_metadata: "CommonAttentionMetadata",
    use_cascade: bool,
    dcp_world_size: int,
    prebuilt: "PrebuiltExactMetadata | None" = None,
) -> ExactVerifyMetadata | None:
    """Builder hook: the step's exact-verify metadata, or None (upstream path)."""
    q = step_width(common_attn_metadata, use_cascade, dcp_world_size)
    if q == 0:
        return None
    if prebuilt is not None:
        return prebuilt.refresh(
            q,
            common_attn_metadata.seq_lens,
            common_attn_metadata.block_table_tensor,
        )
    return ExactVerifyMetadata(width=q)


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


def cache_write_dtype(kv_cache_dtype: str) -> str:
    """The dtype string to pass to the cache-write kernel.

    The XPU kernel (and the reference kernel that mirrors it) stores a
    native float cache only under ``"auto"``; ``--kv-cache-dtype bfloat16``
    (or float16) would otherwise be rejected. FP8 strings pass unchanged.
    On platforms with their own FlashAttention kernels nothing changes.
    """
    if kv_cache_dtype in _NATIVE_FLOAT_CACHE_DTYPES and exact_path_available():
        return "auto"
    return kv_cache_dtype


_varlen_fn: Any = None


def varlen_attention(**kwargs: Any) -> torch.Tensor:
    """The kernel seam: XPU ``flash_attn_varlen_func`` or the reference."""
    global _varlen_fn
    if _varlen_fn is None:
        if current_platform.is_xpu():
            from vllm._xpu_ops import xpu_ops

            _varlen_fn = xpu_ops.flash_attn_varlen_func
        else:
            from vllm.v1.attention.ops import xpu_laguna_reference

            _varlen_fn = xpu_laguna_reference.flash_attn_varlen_func
    return _varlen_fn(**kwargs)


def impl_supports_exact(impl: Any) -> bool:
    """Layer-level eligibility of a FlashAttentionImpl (cached on it)."""
    ok = getattr(impl, "_laguna_exact_ok", None)
    if ok is None:
        from vllm.v1.attention.backend import AttentionType

        ok = (
            impl.attn_type == AttentionType.DECODER
            and impl.alibi_slopes is None
            and not impl.logits_soft_cap
            and impl.sinks is None
            and impl.dcp_world_size == 1
        )
        impl._laguna_exact_ok = ok
    return ok


def run_exact_verify(
    impl: Any,
    layer: torch.nn.Module,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    attn_metadata: Any,
) -> bool:
    """Impl hook: run the exact verify; False means take the upstream path."""
    exact: ExactVerifyMetadata = attn_metadata.laguna_exact
    if not impl_supports_exact(impl):
        return False
    q = exact.width
    if exact.owner is None:
        cu_seqlens_q, kv_lens, table = build_inline(
            attn_metadata.seq_lens, attn_metadata.block_table, q
        )
    else:
        exact.owner.check_source(exact, attn_metadata.block_table)
        cu_seqlens_q = exact.query_start_loc
        kv_lens = exact.seq_lens
        table = exact.block_table
    window = (
        attn_metadata.sliding_window
        if attn_metadata.sliding_window is not None
        else impl.sliding_window
    )
    descale_shape = (q, impl.num_kv_heads)
    q_descale = (
        layer._q_scale.expand(descale_shape)
        if impl.supports_quant_query_input
        else None
    )
    varlen_attention(
        q=query[:q],
        k=key_cache,
        v=value_cache,
        out=output[:q],
        cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=1,
        seqused_k=kv_lens,
        max_seqlen_k=attn_metadata.max_seq_len,
        softmax_scale=impl.scale,
        causal=False,
        alibi_slopes=None,
        window_size=list(window) if window is not None else None,
        block_table=table,
        softcap=impl.logits_soft_cap,
        scheduler_metadata=None,
        fa_version=impl.vllm_flash_attn_version,
        q_descale=q_descale,
        k_descale=layer._k_scale.expand(descale_shape),
        v_descale=layer._v_scale.expand(descale_shape),
        num_splits=attn_metadata.max_num_splits,
        s_aux=None,
    )
    return True


def fa_version_or_reference(version: int | None) -> int | None:
    """FA version for the impl; 2 where the backend runs on the reference."""
    if version is None and exact_path_available():
        return 2
    return version
