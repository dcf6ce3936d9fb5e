# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Which calls of the Laguna target take a row-invariant form (exact verify).

On the exact verify path (the option ``exact_verify`` where it is
available, see ``vllm.xpu_laguna.attention.exact``) a verify step runs 2..M
rows (M = the ``verify_width`` option) through the target; every op between
attention calls must give row ``i`` the bits the q=1 decode of that token
gets (M=1). Calls of the target model (not the DFlash drafter, whose layers
are never installed) with ``1 < rows <= M`` take the forms of
:mod:`vllm.xpu_laguna.row_invariant`; the
``batch_invariant`` linear form, which replaces the GEMM, is taken for
``1 <= rows <= M`` (the q=1 decode too). Other q=1 calls, prefill chunks of
more than M rows, compiled graphs (Inductor:
``torch.compiler.is_compiling()``) and every other model are unchanged.

Options (``VllmConfig.additional_config["xpu_laguna"]``, see
``vllm.xpu_laguna.options``; read from the model's config when its
layers are installed and kept on each installed object; defaults and
evidence: ``docs/row-invariance.md``):

* ``row_invariant_qk_norm`` = ``pad`` (default) | ``tokens``
  | ``off``: q/k RMSNorm over ``[rows, heads, 128]`` views. The pinned XPU
  kernel takes a multi-row kernel when rows x heads is a multiple of 16
  (every width-8 verify at TP4: 96/144/16 rows) and a single-row kernel at
  decode (12/18/2 rows); the two reduce in different orders. ``pad`` adds
  one zero token when that would select the multi-row kernel (one call, one
  copy); ``tokens`` runs one call per token (correct by construction, M
  calls). Default ``pad``: the source reading is exact about the predicate
  and it costs one copy; the lab saw the plain path equal at one layer-0
  trace only.
* ``row_invariant_linears`` = comma list of
  :data:`KINDS`, ``all`` (default) or ``none``: BF16 (unquantized) target
  linears. oneDNN picks kernel and K-split from (m, n, k), so the plain M=8
  GEMM is not row-invariant by construction.
* ``row_invariant_linear_form`` = ``batch_invariant`` |
  ``rows`` | ``plain``; unset: ``batch_invariant`` on XPU, ``rows``
  elsewhere (see :func:`default_linear_form`).

  ``batch_invariant`` replaces the GEMM by upstream's batch-invariant
  matmul (``vllm.model_executor.determinism.batch_invariant``,
  ``linear_batch_invariant`` -> ``mm_batch_invariant``; on XPU the
  persistent Triton kernel with tensor descriptors,
  ``matmul_kernel_descriptor_persistent``). Why it is row-invariant: each
  output tile accumulates ``tl.dot`` over K tiles in order ``ki = 0, 1,
  ...`` into one fp32 accumulator, with ``BLOCK_SIZE_K`` fixed by dtype
  alone (``_get_descriptor_matmul_config``: 64 for BF16) and no split-K
  (one program owns a whole output tile); the whole config is the same for
  every M <= 16; a row's dot product reads only its own row of A. Caveat:
  Triton specializes an integer argument equal to 1 (and one divisible by
  16, and pointers by 16-byte alignment), so an M=1 launch compiles a
  different kernel than M=8, whose DPAS code need not round the same way.
  So this form pads every exact-path call of 1..W rows to exactly W rows
  (:class:`~vllm.xpu_laguna.row_invariant.PaddedRows`,
  zero rows, a buffer per (K, dtype, device)): every call is one identical
  launch. Because it replaces the GEMM's arithmetic it is taken for
  ``1 <= rows <= W`` (the teacher's q=1 decode too), not only 2..W. It reads
  the weight as [N, K] rows: it needs the weight vLLM keeps (not
  ``VLLM_XPU_FORCE_N_CONTIG_WEIGHT=1``, refused by :func:`read_settings`; not
  a CPU layer whose weight vLLM packed away).

  ``rows``: one call of the layer's own GEMM per row (correct by
  construction on any stack; W x the weight traffic on a device).
  ``plain``: the upstream GEMM unchanged (exact only as far as a device
  measurement shows; none exists in this repo for lm_head and router).
* ``row_invariant_int4`` = true (default) | false:
  compressed-tensors WNA16 (INT4) dense target linears run one
  ``int4_gemm_w4a16`` call per row. The oneDNN primitive is built per m
  (m is in its cache key), so not row-invariant by construction. Laguna-S
  2.1 INT4 quantizes only routed experts, so this is reached only with a
  checkpoint that quantizes a dense layer (some lab notes call g_proj
  INT4; it is covered either way).

A linear is wrapped at its quantization method's ``apply`` (the GEMM only:
bias handling, input splitting and the tensor-parallel all-reduce of the
layer's own ``forward`` are unchanged and run once). The lm_head, which the
DFlash proposer shares with the drafter, takes a form only inside
:func:`target_logits` (the target's ``compute_logits``).
"""

import contextlib
import contextvars
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

import vllm.envs as envs
from vllm.logger import init_logger
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.platforms import current_platform
from vllm.xpu_laguna import row_invariant as forms
from vllm.xpu_laguna import row_invariant_moe as moe_forms
from vllm.xpu_laguna.options import XpuLagunaOptions

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

# Target linear kinds (values of the row_invariant_linears option).
KINDS = (
    "qkv_proj",
    "o_proj",
    "g_proj",
    "dense_mlp",
    "shared_expert",
    "router",
    "lm_head",
)

_TARGET_LOGITS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "xpu_laguna_target_logits", default=False
)


@dataclass(frozen=True)
class Settings:
    """The forms of one model, read from its config when it is built."""

    width: int  # largest verify width on the exact path (0: path off)
    qk_norm: str
    linears: frozenset[str]
    linear_form: str
    int4: bool
    # The padded-rows form of this model's batch-invariant linears (its
    # buffers are shared by every layer of one K; calls run one at a time).
    padded_rows: forms.PaddedRows | None = field(
        default=None, compare=False, repr=False
    )


def parse_linears(value: str) -> frozenset[str]:
    """The kinds named by a ``row_invariant_linears`` value."""
    names = {v.strip().lower() for v in value.split(",") if v.strip()}
    if names == {"all"}:
        return frozenset(KINDS)
    if names <= {"none"}:
        return frozenset()
    bad = sorted(names - set(KINDS))
    if bad:
        raise ValueError(
            f"xpu_laguna.row_invariant_linears: unknown kind(s) {bad}; "
            f"valid: all, none or a comma list of {', '.join(KINDS)}"
        )
    return frozenset(names)


def default_linear_form() -> str:
    """The linear form when the switch is unset: ``batch_invariant`` on XPU
    (row-invariant by construction, see module doc); ``rows`` elsewhere. On
    CPU (the stand-in runtime) Triton runs interpreted, which would make
    every exact-path GEMM, the q=1 decode included, orders of magnitude
    slower, and vLLM's CPU GEMMs are row-invariant per call, which is all
    ``rows`` needs."""
    return "batch_invariant" if current_platform.is_xpu() else "rows"


def read_settings(vllm_config: "VllmConfig | None") -> Settings:
    """The row-invariant forms ``vllm_config`` asks for (no caching, no
    logging of its own; the config contract and the install call it).
    Raises ``ValueError`` with one line for a combination that cannot work."""
    from vllm.xpu_laguna.attention.exact import exact_verify_width

    options = XpuLagunaOptions.from_config(vllm_config)
    form = options.row_invariant_linear_form or default_linear_form()
    width = exact_verify_width(vllm_config)
    s = Settings(
        width=width,
        qk_norm=options.row_invariant_qk_norm,
        linears=parse_linears(options.row_invariant_linears),
        linear_form=form,
        int4=options.row_invariant_int4,
        padded_rows=forms.PaddedRows(width) if width else None,
    )
    if (
        s.width > 1
        and s.linears
        and s.linear_form == "batch_invariant"
        and envs.VLLM_XPU_FORCE_N_CONTIG_WEIGHT
    ):
        raise ValueError(
            "VLLM_XPU_FORCE_N_CONTIG_WEIGHT=1 stores BF16 weights K-major; "
            "xpu_laguna.row_invariant_linear_form batch_invariant reads them as "
            "[N, K] rows (it would copy each weight per call): unset "
            "VLLM_XPU_FORCE_N_CONTIG_WEIGHT or set the form to rows"
        )
    return s


def _log_settings(s: Settings) -> None:
    if s.width > 1:
        logger.info_once(
            "XPU Laguna row-invariant forms on the exact path (up to %d "
            "rows): q/k norm %s, BF16 linears %s (%s), INT4 dense linears %s",
            s.width,
            s.qk_norm,
            ",".join(k for k in KINDS if k in s.linears) or "none",
            s.linear_form,
            "rows" if s.int4 else "off",
        )


@dataclass
class Counters:
    """Calls that took a form, keyed (op, kind, form); for tests and debug."""

    calls: Counter

    def reset(self) -> None:
        self.calls.clear()


counters = Counters(Counter())


def _rows_active(rows: int, s: Settings) -> bool:
    return 1 < rows <= s.width


# -- q/k norm ---------------------------------------------------------------


class RowInvariantQKNorm(RMSNorm):
    """A target q/k norm over ``[rows, heads, head_dim]`` views that takes
    the form of the model's ``row_invariant_qk_norm`` on exact verify rows.
    Built from (and in place of) the ``RMSNorm`` it replaces, before the
    weights load: the same parameter (``weight``), so the checkpoint's
    names are unchanged."""

    def __init__(self, norm: RMSNorm, settings: Settings) -> None:
        super().__init__(
            norm.hidden_size,
            eps=norm.variance_epsilon,
            var_hidden_size=norm.variance_size_override,
            has_weight=norm.has_weight,
            dtype=norm.weight.dtype,
        )
        self.settings = settings
        self.pad_buffer = forms.NormPadBuffer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.settings
        plain = super().forward
        if (
            torch.compiler.is_compiling()
            or s.qk_norm == "off"
            or not _rows_active(x.shape[0], s)
        ):
            return plain(x)
        counters.calls["qk_norm", "qk_norm", s.qk_norm] += 1
        if s.qk_norm == "tokens":
            return forms.per_row(plain, x)
        self.pad_buffer.capacity = s.width + 1
        return forms.norm_padded(plain, x, self.pad_buffer)


# -- linears ----------------------------------------------------------------


def _is_unquantized(method: Any) -> bool:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
    )

    return isinstance(method, (UnquantizedLinearMethod, UnquantizedEmbeddingMethod))


def _is_wna16(layer: nn.Module) -> bool:
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        CompressedTensorsWNA16,
    )

    return isinstance(getattr(layer, "scheme", None), CompressedTensorsWNA16)


def _batch_invariant_weight(layer: nn.Module) -> torch.Tensor:
    weight = getattr(layer, "weight", None)
    if (
        not isinstance(weight, torch.Tensor)
        or weight.dim() != 2
        or weight.numel() == 0
        or not weight.is_contiguous()
    ):
        shape = None if weight is None else tuple(weight.shape)
        raise RuntimeError(
            "xpu_laguna.row_invariant_linear_form batch_invariant needs a "
            f"contiguous [N, K] weight; {getattr(layer, 'prefix', '')} has "
            f"{shape}: set the form to rows"
        )
    return weight


def linear_batch_invariant(
    layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, pad: forms.PaddedRows
) -> torch.Tensor:
    """The layer's GEMM as upstream's batch-invariant matmul on exactly
    ``pad.width`` rows (see module doc: every call one identical launch)."""
    from vllm.model_executor.determinism import batch_invariant

    weight = _batch_invariant_weight(layer)
    if x.device.type != "cpu":
        # Tensor descriptors need Triton's global-memory allocator (a
        # context variable: set where the forward runs).
        from vllm.triton_utils.allocation import set_triton_allocator

        set_triton_allocator(x.device)
    return pad(
        lambda rows: batch_invariant.linear_batch_invariant(rows, weight, bias), x
    )


class RowInvariantApply:
    """Replaces a target layer's ``quant_method.apply``: the form of the
    model's linears/INT4 options for a linear of ``kind`` (one of
    :data:`KINDS`) on exact verify rows, else the original."""

    def __init__(
        self, inner: Callable[..., torch.Tensor], settings: Settings, kind: str
    ) -> None:
        self.inner = inner
        self.settings = settings
        self.kind = kind
        self.method = getattr(inner, "__self__", None)
        self._class: str | None = None  # "bf16" | "int4" | "other"

    def _classify(self, layer: nn.Module) -> str:
        if self._class is None:
            if _is_unquantized(self.method):
                self._class = "bf16"
            elif _is_wna16(layer):
                self._class = "int4"
            else:
                self._class = "other"
                logger.info_once(
                    "XPU Laguna row-invariant forms: %s (%s) is not covered; "
                    "it runs unchanged on verify rows",
                    getattr(layer, "prefix", type(layer).__name__),
                    type(self.method).__name__,
                )
        return self._class

    def form(self, layer: nn.Module, x: torch.Tensor) -> str | None:
        kind = self.kind
        if x.dim() != 2 or torch.compiler.is_compiling():
            return None
        if kind == "lm_head" and not _TARGET_LOGITS.get():
            return None  # the drafter's compute_logits (shared lm_head)
        s = self.settings
        rows = x.shape[0]
        if not 0 < rows <= s.width:
            return None
        cls = self._classify(layer)
        if cls == "bf16" and kind in s.linears and s.linear_form != "plain":
            if s.linear_form == "batch_invariant":
                return "batch_invariant"  # replaces the GEMM: 1..W rows
            return "rows" if rows > 1 else None
        if cls == "int4" and s.int4 and rows > 1:
            return "rows"
        return None

    def __call__(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        form = self.form(layer, x)
        if form is None:
            return self.inner(layer, x, bias)
        counters.calls["linear", self.kind, form] += 1
        if form == "batch_invariant":
            assert self.settings.padded_rows is not None  # width > 0 here
            return linear_batch_invariant(layer, x, bias, self.settings.padded_rows)
        return forms.per_row(lambda row: self.inner(layer, row, bias), x)


def _install_linear(layer: nn.Module | None, kind: str, s: Settings) -> None:
    method = getattr(layer, "quant_method", None)
    if layer is None or method is None:
        return
    if not isinstance(method.apply, RowInvariantApply):
        method.apply = RowInvariantApply(method.apply, s, kind)


def installed_kind(layer: nn.Module) -> str | None:
    """The kind a target linear was installed as (None: not installed)."""
    apply = getattr(getattr(layer, "quant_method", None), "apply", None)
    return apply.kind if isinstance(apply, RowInvariantApply) else None


def install_target_layers(
    layers: Iterable[nn.Module], vllm_config: "VllmConfig | None"
) -> None:
    """Build the q/k norms as :class:`RowInvariantQKNorm` and wrap the
    linears of the target's decoder layers (``LagunaDecoderLayer``;
    pipeline-missing layers are skipped) with the forms of ``vllm_config``,
    the config the model is built with (the series' Laguna class calls it
    in its constructor). A module installed before keeps its first
    settings."""
    s = read_settings(vllm_config)
    _log_settings(s)
    moe_form = moe_forms.read_form(vllm_config)
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            continue
        for name in ("q_norm", "k_norm"):
            norm = getattr(attn, name)
            if not isinstance(norm, RowInvariantQKNorm):
                setattr(attn, name, RowInvariantQKNorm(norm, s))
        _install_linear(attn.qkv_proj, "qkv_proj", s)
        _install_linear(attn.o_proj, "o_proj", s)
        _install_linear(getattr(attn, "g_proj", None), "g_proj", s)
        mlp = layer.mlp
        if hasattr(mlp, "gate_proj"):  # LagunaMLP: the dense layer
            dense: tuple[nn.Module | None, str] = (mlp, "dense_mlp")
        else:  # LagunaMoE
            _install_linear(mlp.gate, "router", s)
            moe_forms.install(mlp.experts, moe_form)  # routed experts (own option)
            dense = (mlp.shared_expert, "shared_expert")
        module, kind = dense
        if module is not None:
            for proj in (module.gate_proj, module.up_proj, module.down_proj):
                _install_linear(proj, kind, s)


def install_lm_head(lm_head: nn.Module, vllm_config: "VllmConfig | None") -> None:
    """Wrap the target's lm_head (a form only inside :func:`target_logits`)."""
    _install_linear(lm_head, "lm_head", read_settings(vllm_config))


@contextlib.contextmanager
def target_logits() -> Iterator[None]:
    """Scope of the target's ``compute_logits``."""
    token = _TARGET_LOGITS.set(True)
    try:
        yield
    finally:
        _TARGET_LOGITS.reset(token)
