# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Which calls of the Laguna target take a row-invariant form (exact verify).

On the exact verify path (``VLLM_XPU_LAGUNA_EXACT_VERIFY=1`` where it is
available, see ``xpu_laguna_exact``) a verify step runs 2..M rows (M =
``VLLM_XPU_LAGUNA_VERIFY_WIDTH``) through the target; every op between
attention calls must give row ``i`` the bits the q=1 decode of that token
gets (M=1). Calls of the target model (not the DFlash drafter, whose layers
are never installed) with ``1 < rows <= M`` take the forms of
:mod:`vllm.model_executor.layers.xpu_laguna_row_invariant`; a q=1 decode
(1 row), prefill chunks of more than M rows, compiled graphs (Inductor:
``torch.compiler.is_compiling()``) and every other model are unchanged.

Switches (declared in ``vllm/envs.py``, read once per process, defaults and
evidence: ``docs/row-invariance.md``):

* ``VLLM_XPU_LAGUNA_ROW_INVARIANT_QK_NORM`` = ``pad`` (default) | ``tokens``
  | ``off``: q/k RMSNorm over ``[rows, heads, 128]`` views. The pinned XPU
  kernel takes a multi-row kernel when rows x heads is a multiple of 16
  (every width-8 verify at TP4: 96/144/16 rows) and a single-row kernel at
  decode (12/18/2 rows); the two reduce in different orders. ``pad`` adds
  one zero token when that would select the multi-row kernel (one call, one
  copy); ``tokens`` runs one call per token (correct by construction, M
  calls). Default ``pad``: the source reading is exact about the predicate
  and it costs one copy; the lab saw the plain path equal at one layer-0
  trace only.
* ``VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS`` = comma list of
  :data:`KINDS`, ``all`` (default) or ``none``: BF16 (unquantized) target
  linears. oneDNN picks kernel and K-split from (m, n, k); the lab measured
  plain M=8 equal to M=1 for QKV/O and the shared expert, never for the
  router or lm_head, and its exact records ran every kind as lanes.
* ``VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEAR_FORM`` = ``lanes`` (default) |
  ``rows``: ``lanes`` is one stride-zero batched matmul of M=1 lanes (the
  lab's record path, measured equal to sequential M=1 calls and faster than
  native M=8 at the endpoint); it needs a contiguous [N, K] weight, no bias
  and a platform whose plain GEMM is ``F.linear`` (XPU). Elsewhere (CPU:
  vLLM packs the weight for oneDNN/SGL kernels) ``rows`` is used: one call
  of the layer's own GEMM per row.
* ``VLLM_XPU_LAGUNA_ROW_INVARIANT_INT4`` = 1 (default) | 0:
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
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import vllm.envs as envs
from vllm.logger import init_logger
from vllm.model_executor.layers import xpu_laguna_row_invariant as forms
from vllm.platforms import current_platform

logger = init_logger(__name__)

# Target linear kinds (values of VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS).
KINDS = (
    "qkv_proj",
    "o_proj",
    "g_proj",
    "dense_mlp",
    "shared_expert",
    "router",
    "lm_head",
)
QK_NORM_FORMS = ("off", "tokens", "pad")
LINEAR_FORMS = ("lanes", "rows")

# Attributes set on installed target modules.
_NORM_ATTR = "_xpu_laguna_row_invariant_norm"
_KIND_ATTR = "_xpu_laguna_row_invariant_kind"

_TARGET_LOGITS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "xpu_laguna_target_logits", default=False
)


@dataclass(frozen=True)
class Settings:
    """The switches, read once (:func:`settings`; :func:`refresh` re-reads)."""

    width: int  # largest verify width on the exact path (0: path off)
    qk_norm: str
    linears: frozenset[str]
    linear_form: str
    int4: bool


def parse_linears(value: str) -> frozenset[str]:
    """The kinds named by a ``VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS`` value."""
    names = {v.strip().lower() for v in value.split(",") if v.strip()}
    if names == {"all"}:
        return frozenset(KINDS)
    if names <= {"none"}:
        return frozenset()
    bad = sorted(names - set(KINDS))
    if bad:
        raise ValueError(
            f"VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS: unknown kind(s) {bad}; "
            f"valid: all, none or a comma list of {', '.join(KINDS)}"
        )
    return frozenset(names)


_settings: Settings | None = None


def settings() -> Settings:
    global _settings
    if _settings is None:
        from vllm.v1.attention.backends.xpu_laguna_exact import exact_verify_width

        qk = str(envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_QK_NORM).lower()
        form = str(envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEAR_FORM).lower()
        _settings = Settings(
            width=exact_verify_width(),
            qk_norm=qk,
            linears=parse_linears(envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS),
            linear_form=form,
            int4=bool(envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_INT4),
        )
        if _settings.width > 1:
            logger.info_once(
                "XPU Laguna row-invariant forms for verify rows 2..%d: q/k norm "
                "%s, BF16 linears %s (%s), INT4 dense linears %s",
                _settings.width,
                qk,
                ",".join(k for k in KINDS if k in _settings.linears) or "none",
                form,
                "rows" if _settings.int4 else "off",
            )
    return _settings


def read_settings() -> Settings:
    """The row-invariant switches, read and validated (``ValueError``, one
    line, for a bad value), without logging or caching (the contract's
    config-time check)."""
    return Settings(
        width=int(envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH),
        qk_norm=str(envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_QK_NORM).lower(),
        linears=parse_linears(envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS),
        linear_form=str(envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEAR_FORM).lower(),
        int4=bool(envs.VLLM_XPU_LAGUNA_ROW_INVARIANT_INT4),
    )


def refresh() -> Settings:
    """Re-read the switches (tests; the process default is read once)."""
    global _settings
    _settings = None
    return settings()


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


def qk_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` for a target q/k norm over a ``[rows, heads, head_dim]``
    view, in the form of the QK_NORM switch on exact verify rows."""
    if not getattr(norm, _NORM_ATTR, False) or torch.compiler.is_compiling():
        return norm(x)
    s = settings()
    if s.qk_norm == "off" or not _rows_active(x.shape[0], s):
        return norm(x)
    counters.calls["qk_norm", "qk_norm", s.qk_norm] += 1
    if s.qk_norm == "tokens":
        return forms.per_row(norm, x)
    return forms.norm_padded(norm, x)


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


_lanes_platform: bool | None = None


def lanes_platform() -> bool:
    """Whether the plain GEMM of unquantized linears here is ``F.linear``
    (XPU: ``default_unquantized_gemm``), which :func:`forms.linear_lanes`
    reproduces at M=1."""
    global _lanes_platform
    if _lanes_platform is None:
        _lanes_platform = current_platform.is_xpu()
    return _lanes_platform and not envs.VLLM_BATCH_INVARIANT


def _lanes_ok(layer: nn.Module, bias: torch.Tensor | None) -> bool:
    weight = getattr(layer, "weight", None)
    return (
        bias is None
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.numel() > 0
        and weight.is_contiguous()
        and lanes_platform()
    )


class RowInvariantApply:
    """Replaces a target layer's ``quant_method.apply``: the form of the
    LINEARS/INT4 switches on exact verify rows, else the original."""

    def __init__(self, inner: Callable[..., torch.Tensor]) -> None:
        self.inner = inner
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

    def form(self, layer: nn.Module, x: torch.Tensor, bias: Any) -> str | None:
        kind = getattr(layer, _KIND_ATTR, None)
        if kind is None or x.dim() != 2 or torch.compiler.is_compiling():
            return None
        if kind == "lm_head" and not _TARGET_LOGITS.get():
            return None  # the drafter's compute_logits (shared lm_head)
        s = settings()
        if not _rows_active(x.shape[0], s):
            return None
        cls = self._classify(layer)
        if cls == "bf16" and kind in s.linears:
            if s.linear_form == "lanes" and _lanes_ok(layer, bias):
                return "lanes"
            return "rows"
        if cls == "int4" and s.int4:
            return "rows"
        return None

    def __call__(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        form = self.form(layer, x, bias)
        if form is None:
            return self.inner(layer, x, bias)
        counters.calls["linear", getattr(layer, _KIND_ATTR), form] += 1
        if form == "lanes":
            return forms.linear_lanes(x, layer.weight)
        return forms.per_row(lambda row: self.inner(layer, row, bias), x)


def _install_linear(layer: nn.Module | None, kind: str) -> None:
    method = getattr(layer, "quant_method", None)
    if layer is None or method is None:
        return
    setattr(layer, _KIND_ATTR, kind)
    if not isinstance(method.apply, RowInvariantApply):
        method.apply = RowInvariantApply(method.apply)


def install_target_layers(layers: Iterable[nn.Module]) -> None:
    """Mark the q/k norms and wrap the linears of the target's decoder
    layers (``LagunaDecoderLayer``; pipeline-missing layers are skipped)."""
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            continue
        setattr(attn.q_norm, _NORM_ATTR, True)
        setattr(attn.k_norm, _NORM_ATTR, True)
        _install_linear(attn.qkv_proj, "qkv_proj")
        _install_linear(attn.o_proj, "o_proj")
        _install_linear(getattr(attn, "g_proj", None), "g_proj")
        mlp = layer.mlp
        if hasattr(mlp, "gate_proj"):  # LagunaMLP: the dense layer
            dense: tuple[nn.Module | None, str] = (mlp, "dense_mlp")
        else:  # LagunaMoE
            _install_linear(mlp.gate, "router")
            dense = (mlp.shared_expert, "shared_expert")
        module, kind = dense
        if module is not None:
            for proj in (module.gate_proj, module.up_proj, module.down_proj):
                _install_linear(proj, kind)


def install_lm_head(lm_head: nn.Module) -> None:
    """Wrap the target's lm_head (a form only inside :func:`target_logits`)."""
    _install_linear(lm_head, "lm_head")


@contextlib.contextmanager
def target_logits() -> Iterator[None]:
    """Scope of the target's ``compute_logits``."""
    token = _TARGET_LOGITS.set(True)
    try:
        yield
    finally:
        _TARGET_LOGITS.reset(token)
