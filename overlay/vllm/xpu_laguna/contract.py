# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Configuration contract of the XPU Laguna series.

While a series toggle is in effect (breakable graphs, prebuilt exact
metadata, or the exact verify on XPU: ``xpu_laguna_series_active``),
``VllmConfig.__post_init__`` calls :func:`check_series_contract` after the
model, speculative, cache, parallel and quantization configs exist and
before anything loads weights (series patch 0012). Settings that would
silently break exactness, or crash later in a worker, are refused with one
``ValueError`` line that names the setting and the fix; where only one value
is safe and the user could not have asked for another (an unset default),
the series sets it and logs one line.

The series' options are read from ``additional_config["xpu_laguna"]``
(:mod:`vllm.xpu_laguna.options`) and validated for every
configuration; a ``VLLM_XPU_LAGUNA_*`` variable still set is refused in one
line naming the option that replaced it. The options travel with the
configuration into every worker, whatever the executor (Ray included).

Rules that hold whenever the series is active:

* vLLM's plugin allow-list (``VLLM_PLUGINS``), when set, names the series'
  general plugin, which registers its Laguna class;
* the speculative width (``num_speculative_tokens + 1``) must not exceed
  the ``verify_width`` option;
* a DFlash drafter must fit the target (hidden size, vocabulary, target
  layer ids); for a compressed-tensors INT4 Laguna target, a drafter
  identified by content as the BF16 one is refused and one not identified
  as the INT4-matched one gets a warning (:mod:`vllm.xpu_laguna.drafter`).

Rules of the exact path (the ``exact_verify`` option on as well):

* standard rejection sampling only;
* DFlash without async scheduling (unset: turned off; explicit: refused);
* prefix caching off (turned off: vLLM resolves the default to on before
  this runs, so an explicit choice cannot be told apart);
* the KV cache (target and, if set, the drafter's override) in the model
  dtype, including ``auto`` resolving to FP8 from the checkpoint's
  ``kv_cache_scheme``;
* no expert parallelism and no data parallelism for MoE targets: the
  supported topology is tensor parallelism only, where every target
  reduction is an all-reduce;
* ``max_num_seqs > 1`` is allowed with one warning.

DFlash's proposer rebuilds its VllmConfig from the target's in every worker
(``dataclasses.replace``, with the drafter's ``kv_cache_dtype`` override),
which runs this contract again there; the rules are written so that the
rebuilt configuration passes whenever the original did.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import vllm.envs as envs
from vllm.logger import init_logger
from vllm.xpu_laguna import checkpoint as int4_layout
from vllm.xpu_laguna import drafter, plugin
from vllm.xpu_laguna.graphs.config import (
    LAGUNA_TARGET_ARCHITECTURES,
    xpu_laguna_series_active,
)
from vllm.xpu_laguna.options import XpuLagunaOptions, refuse_environment

if TYPE_CHECKING:
    from vllm.config import ModelConfig, SpeculativeConfig, VllmConfig

logger = init_logger(__name__)

PREFIX = "XPU Laguna series"
_NATIVE_CACHE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class SeriesConfigError(ValueError):
    """A setting the XPU Laguna series refuses while one of its toggles is on."""


def series_active(vllm_config: VllmConfig | None) -> bool:
    """Whether a toggle of the series is in effect for this configuration
    (Laguna target, XPU or a CPU run that asks). The one place that names
    the series switch's module (repoint here when it moves)."""
    return xpu_laguna_series_active(vllm_config)


def _fail(setting: str, fix: str) -> None:
    raise SeriesConfigError(f"{PREFIX}: {setting}; {fix}")


def check_series_contract(vllm_config: VllmConfig) -> None:
    """Refuse (one line, ``ValueError``) or set what the series needs. Every
    configuration: no ``VLLM_XPU_LAGUNA_*`` variable, valid options. The
    rest is a no-op while every series switch is off, the target is not
    Laguna, or there is no target (a ``VllmConfig()`` built without a model,
    as vLLM's own tests and tools do)."""
    refuse_environment(os.environ)
    options = XpuLagunaOptions.from_config(vllm_config)
    mc = vllm_config.model_config
    if mc is None:
        return
    if not series_active(vllm_config):
        _note_inactive(vllm_config, options)
        return
    _check_plugin()
    _check_communicator(vllm_config)
    _check_width(vllm_config, options)
    _check_drafter(vllm_config)
    # off the exact path an FP8 cache is allowed: its scales must load
    _check_int4_layout(vllm_config, kv_scales=not options.exact_verify)
    if not options.exact_verify:
        return
    _check_rejection(vllm_config)
    _check_async_scheduling(vllm_config)
    _check_prefix_caching(vllm_config)
    _check_kv_cache_dtype(vllm_config)
    _check_topology(vllm_config)
    _check_compilation(vllm_config, options)
    _check_exact_forms(vllm_config, options)
    _warn_max_num_seqs(vllm_config)


def _note_inactive(vllm_config: VllmConfig, options: XpuLagunaOptions) -> None:
    """One info line when the configuration asks for the series for a model
    that is not Laguna (the configuration is then upstream's)."""
    mc = vllm_config.model_config
    if mc is None or is_laguna_target(mc) or not options.asks_for_series:
        return
    logger.info_once(
        "%s: inactive for %s (the series acts on %s on XPU, or on CPU when "
        "additional_config asks for it)",
        PREFIX,
        ",".join(mc.architectures),
        ",".join(LAGUNA_TARGET_ARCHITECTURES),
    )


# ------------------------------------------------------------------- width


def _check_plugin() -> None:
    """The series' Laguna class reaches an engine through its general plugin
    (:mod:`vllm.xpu_laguna.plugin`), which vLLM loads unless its allow-list
    leaves it out."""
    allowed = envs.VLLM_PLUGINS
    if plugin.plugin_left_out(allowed):
        _fail(
            f"VLLM_PLUGINS={','.join(allowed or [])} leaves out the series' "
            f"plugin '{plugin.PLUGIN_NAME}' (vLLM would build "
            "upstream's Laguna: no routing bias, no row-invariant forms)",
            f"add {plugin.PLUGIN_NAME} to VLLM_PLUGINS or unset it",
        )


def _check_communicator(vllm_config: VllmConfig) -> None:
    """The tensor-parallel all-reduce mode the options ask for must be one
    the platform's device communicator runs (the series' XPU platform's;
    on CPU, the CPU runtime's test-side platform's): otherwise the TP sum
    would silently be the backend's own."""
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.xpu_laguna import collectives

    tp = vllm_config.parallel_config.tensor_parallel_size
    mode = collectives.tp_reduce_mode("tp", tp, vllm_config)
    if mode is collectives.TpReduceMode.PLAIN:
        return
    name = current_platform.get_device_communicator_cls()
    cls = resolve_obj_by_qualname(name)
    modes = getattr(cls, "reduce_modes", frozenset())
    if not (isinstance(cls, type) and issubclass(cls, collectives.SeriesAllReduce)):
        modes = frozenset()
    if mode not in modes:
        _fail(
            f"the {mode.value} all-reduce at tensor parallel {tp} needs the "
            f"series' device communicator; this platform "
            f"({type(current_platform).__name__}) builds {name.rsplit('.', 1)[-1]}",
            "run on the series' XPU platform (its plugin 'xpu_laguna'), or on "
            "CPU in the runtime with the series' test-side platform",
        )


def _speculative_tokens(sc: SpeculativeConfig) -> int:
    counts = [sc.num_speculative_tokens or 0]
    schedule = getattr(sc, "num_speculative_tokens_per_batch_size", None) or []
    counts += [int(entry[2]) for entry in schedule]
    return max(counts)


def _check_width(vllm_config: VllmConfig, options: XpuLagunaOptions) -> None:
    sc = vllm_config.speculative_config
    if sc is None:
        return
    width = options.verify_width
    tokens = _speculative_tokens(sc)
    if tokens + 1 > width:
        _fail(
            f"speculative width num_speculative_tokens + 1 = {tokens + 1} exceeds "
            f"xpu_laguna.verify_width {width} (wider verify steps leave the "
            "exact path)",
            f"set num_speculative_tokens <= {width - 1} in --speculative-config "
            "or raise xpu_laguna.verify_width",
        )


# ----------------------------------------------------------------- drafter


def _quantization_dict(model_config: ModelConfig) -> dict[str, Any]:
    cfg = getattr(model_config.hf_config, "quantization_config", None)
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return cfg
    to_dict = getattr(cfg, "to_dict", None)
    return to_dict() if callable(to_dict) else {}


def is_laguna_target(model_config: ModelConfig) -> bool:
    return bool(set(model_config.architectures) & set(LAGUNA_TARGET_ARCHITECTURES))


def target_is_int4_laguna(model_config: ModelConfig) -> bool:
    """A Laguna target quantized with compressed-tensors to 4-bit integer
    weights (as poolside's Laguna-S-2.1-INT4: routed experts W4, group 32)."""
    if not is_laguna_target(model_config):
        return False
    quant = _quantization_dict(model_config)
    if quant.get("quant_method") != "compressed-tensors":
        return False
    groups = quant.get("config_groups") or {}
    for group in groups.values():
        weights = (group or {}).get("weights") or {}
        if weights.get("num_bits") == 4 and weights.get("type", "int") == "int":
            return True
    return False


def _check_int4_layout(vllm_config: VllmConfig, kv_scales: bool) -> None:
    """An INT4 Laguna target in a local folder (a hub id with no local folder
    yet is not checked), from its safetensors headers
    (:mod:`vllm.xpu_laguna.checkpoint`): refuse a linear stored unquantized
    that ``ignore`` does not name (vLLM would build it as an INT4 layer and
    fail later without naming the cause); with ``kv_scales``, an FP8 cache
    and the checkpoint's ``kv_cache_scheme``, refuse K/V scales under names
    Laguna's loader skips (the cache would run with the default scale)."""
    mc = vllm_config.model_config
    if mc is None or not target_is_int4_laguna(mc) or not Path(mc.model).is_dir():
        return
    quant = _quantization_dict(mc)
    tensors = int4_layout.tensor_index(Path(mc.model))
    ignore = list(quant.get("ignore") or [])
    unignored = int4_layout.unignored_plain_linears(tensors, ignore)
    if unignored:
        _fail(
            f"{_first(unignored)} stored unquantized but not in the checkpoint's "
            "quantization_config.ignore (vLLM would build it as an INT4 layer "
            "and fail later on another error)",
            "add it to ignore (scripts/device/checkpoint_check.py lists all)",
        )
    cache = resolved_kv_cache_dtype(vllm_config.cache_config.cache_dtype, vllm_config)
    if not (kv_scales and quant.get("kv_cache_scheme") and cache.startswith("fp8")):
        return
    layers = int(getattr(mc.hf_text_config, "num_hidden_layers", 0))
    problems = int4_layout.kv_scale_problems(tensors, layers)
    if problems:
        _fail(
            f"KV cache {cache} with {_first(problems)}",
            "store each layer's scales as model.layers.N.self_attn.k_scale and v_scale",
        )


def _first(items: list[str]) -> str:
    more = len(items) - 1
    return items[0] + (f" (and {more} more)" if more else "")


def _check_drafter(vllm_config: VllmConfig) -> None:
    sc = vllm_config.speculative_config
    mc = vllm_config.model_config
    if sc is None or mc is None or sc.method != "dflash":
        return
    dc = sc.draft_model_config
    if dc is None:
        return
    hf = dc.hf_config
    # DFlash shares the target's embeddings and lm_head: the same sizes.
    sizes = (
        ("hidden_size", mc.get_hidden_size(), "", "embeddings and lm_head"),
        ("draft_vocab_size", mc.get_vocab_size(), " vocabulary", "lm_head"),
    )
    for name, target, what, shared in sizes:
        draft = getattr(hf, name, None)
        if draft is not None and draft != target:
            _fail(
                f"drafter {sc.model} has {name} {draft}, the target{what} "
                f"{target} (DFlash shares the target's {shared})",
                "use the DFlash drafter trained for this target",
            )
    dflash = getattr(hf, "dflash_config", None) or {}
    layer_ids = dflash.get("target_layer_ids") if isinstance(dflash, dict) else None
    layers = mc.get_total_num_hidden_layers()
    outside = [i for i in layer_ids or [] if not 0 <= int(i) < layers]
    if outside:
        _fail(
            f"drafter {sc.model} reads target layers {outside} "
            f"(dflash_config.target_layer_ids), the target has layers "
            f"0..{layers - 1}",
            "use the DFlash drafter trained for this target",
        )
    if target_is_int4_laguna(mc):
        _check_drafter_identity(sc)


def _check_drafter_identity(sc: SpeculativeConfig) -> None:
    """The INT4 target's drafter, told by content (the two drafters have the
    same shapes and config): the BF16 one is refused, one not identified
    gets a warning. A wrong drafter costs acceptance, never exactness."""
    dc = sc.draft_model_config
    known = drafter.known_drafters()
    identity = drafter.identify(
        str(dc.model or sc.model), dc.revision or sc.revision, known
    )
    use = drafter.pinned_drafter(known)
    if identity.kind == drafter.BF16:
        _fail(
            f"drafter {sc.model} is the BF16 DFlash drafter ({identity.evidence}), "
            "not the INT4-matched one this compressed-tensors INT4 target needs "
            "(it accepts ~0% of its proposals: the INT4 target's residual "
            "stream is rotated)",
            f"use {use} (pins.toml [models.draft])",
        )
    if identity.kind == drafter.UNKNOWN:
        logger.warning_once(
            "%s: drafter %s is not identified as the INT4-matched DFlash "
            "drafter (%s): acceptance may collapse (the BF16 drafter accepted 0 "
            "of 8,449 proposals against the INT4 target), exactness does not "
            "change; use %s, a hub snapshot of it or a copy whose fingerprint "
            "(python -m vllm.xpu_laguna.drafter DIR) pins.toml records",
            PREFIX,
            sc.model,
            identity.evidence,
            use,
        )


# ------------------------------------------------------------- exact path


def _check_rejection(vllm_config: VllmConfig) -> None:
    sc = vllm_config.speculative_config
    method = getattr(sc, "rejection_sample_method", "standard") if sc else "standard"
    if method != "standard":
        _fail(
            f"rejection_sample_method {method!r} on the exact path (only standard "
            "rejection keeps the output the target's own tokens)",
            '"rejection_sample_method": "standard" in --speculative-config, or '
            "xpu_laguna.exact_verify false",
        )


def _check_async_scheduling(vllm_config: VllmConfig) -> None:
    sc = vllm_config.speculative_config
    sched = vllm_config.scheduler_config
    if sc is None or sc.method != "dflash":
        return
    if sched.async_scheduling:
        _fail(
            "--async-scheduling with DFlash on the exact path (DFlash state leaks "
            "across requests: the next request's first tokens can differ)",
            "use --no-async-scheduling",
        )
    if sched.async_scheduling is None:
        sched.async_scheduling = False
        logger.info_once(
            "%s: async scheduling off (DFlash on the exact path needs "
            "--no-async-scheduling)",
            PREFIX,
        )


def _check_prefix_caching(vllm_config: VllmConfig) -> None:
    cc = vllm_config.cache_config
    if cc.enable_prefix_caching:
        cc.enable_prefix_caching = False
        logger.info_once(
            "%s: prefix caching off on the exact path (a cached prefix was "
            "computed in another request's step shape)",
            PREFIX,
        )


def resolved_kv_cache_dtype(cache_dtype: str, vllm_config: VllmConfig) -> str:
    """What ``auto`` becomes once the attention layers are built: ``fp8``
    when the checkpoint declares a ``kv_cache_scheme`` (compressed-tensors;
    vllm/model_executor/layers/attention/attention.py), else ``auto`` (the
    model dtype). ModelOpt's KV algorithms were already resolved by
    ``EngineArgs`` (``resolve_kv_cache_dtype_string``)."""
    if cache_dtype != "auto":
        return cache_dtype
    scheme = getattr(vllm_config.quant_config, "kv_cache_scheme", None)
    if scheme is None and vllm_config.model_config is not None:
        scheme = _quantization_dict(vllm_config.model_config).get("kv_cache_scheme")
    return "fp8" if scheme is not None else "auto"


def _check_kv_cache_dtype(vllm_config: VllmConfig) -> None:
    mc = vllm_config.model_config
    if mc is None:
        return
    model_dtype = mc.dtype
    model_name = str(model_dtype).removeprefix("torch.")
    native = {v: k for k, v in _NATIVE_CACHE_DTYPES.items()}
    fix = (
        f"set --kv-cache-dtype {native[model_dtype]}"
        if model_dtype in native
        else "set --kv-cache-dtype auto"
    )
    sc = vllm_config.speculative_config
    asked = [("--kv-cache-dtype", vllm_config.cache_config.cache_dtype)]
    if sc is not None and getattr(sc, "kv_cache_dtype", None) is not None:
        asked.append(("--speculative-config kv_cache_dtype", sc.kv_cache_dtype))
    for flag, dtype in asked:
        resolved = resolved_kv_cache_dtype(dtype, vllm_config)
        if resolved == "auto" or _NATIVE_CACHE_DTYPES.get(resolved) == model_dtype:
            continue
        source = (
            f"{flag} auto resolves to fp8 from the checkpoint's kv_cache_scheme"
            if dtype == "auto"
            else f"{flag} {dtype} differs from the model dtype {model_name}"
        )
        _fail(
            f"{source} on the exact path (the exact path is proven with a KV "
            "cache in the model dtype only; FP8 KV is not token-exact)",
            f"{fix} (the model dtype)",
        )


def _check_topology(vllm_config: VllmConfig) -> None:
    pc = vllm_config.parallel_config
    mc = vllm_config.model_config
    if mc is None or not mc.is_moe:
        return
    ranks = pc.tensor_parallel_size * pc.data_parallel_size
    if pc.enable_expert_parallel and ranks > 1:
        _fail(
            f"--enable-expert-parallel at tensor_parallel_size "
            f"{pc.tensor_parallel_size} on the exact path (expert outputs are "
            "then combined by all-to-all/reduce-scatter, not by the all-reduce "
            "the series makes fixed-rank-order)",
            "drop --enable-expert-parallel (the supported topology is tensor "
            "parallelism without expert parallelism)",
        )
    if pc.data_parallel_size > 1:
        _fail(
            f"--data-parallel-size {pc.data_parallel_size} on the exact path (the "
            "MoE layers then combine tokens of every data-parallel rank in one "
            "step)",
            "use --data-parallel-size 1 with tensor parallelism",
        )


def _check_compilation(vllm_config: VllmConfig, options: XpuLagunaOptions) -> None:
    """Compilation mode NONE and no device graphs, unless the breakable-graph
    toggle is on (its configuration, patch 0007, then sets mode NONE and
    PIECEWISE graphs of the verify width and refuses other explicit modes).

    Runs before ``VllmConfig`` resolves the optimization level: an unset
    ``mode``/``cudagraph_mode`` (None: the user chose none, ``-O`` levels only
    fill unset fields) is set to NONE here and stays NONE through the level
    defaults and the platform hook (XPU and CPU lower graph modes, never
    raise them); an explicit other value is refused."""
    from vllm.config import CompilationMode, CUDAGraphMode

    if options.breakable_graph:
        return
    cc = vllm_config.compilation_config
    if cc.mode not in (None, CompilationMode.NONE):
        _fail(
            f"compilation mode {CompilationMode(cc.mode).name} on the exact path "
            "(Inductor fuses the norms and gates into its own reductions: verify "
            "rows and the decode then run different arithmetic)",
            "use -cc.mode=NONE (or --enforce-eager), or "
            "xpu_laguna.breakable_graph true for graphs",
        )
    if cc.cudagraph_mode not in (None, CUDAGraphMode.NONE):
        _fail(
            f"cudagraph_mode {cc.cudagraph_mode.name} on the exact path (graphs "
            "bake the attention split counts at capture time)",
            "use -cc.cudagraph_mode=NONE (or --enforce-eager), or "
            "xpu_laguna.breakable_graph true for the series' breakable graphs",
        )
    changed = []
    if cc.mode is None:
        cc.mode = CompilationMode.NONE
        changed.append("compilation mode NONE")
    if cc.cudagraph_mode is None:
        cc.cudagraph_mode = CUDAGraphMode.NONE
        changed.append("cudagraph_mode NONE")
    if changed:
        logger.info_once(
            "%s: %s on the exact path (Inductor's fused reductions and device "
            "graphs' captured split counts would make verify rows differ from "
            "the decode; xpu_laguna.breakable_graph true for graphs)",
            PREFIX,
            " and ".join(changed),
        )


def _check_exact_forms(vllm_config: VllmConfig, options: XpuLagunaOptions) -> None:
    """The row-invariant forms and the fixed rank-order reduction on; the
    debug options only with a warning (they are set explicitly, by the
    matrix's diagnostic legs and the device checks' negative controls)."""
    from vllm.xpu_laguna.row_dispatch import (
        KINDS,
        read_settings,
    )

    try:
        settings = read_settings(vllm_config)
    except ValueError as err:
        _fail(str(err).splitlines()[0], "fix the option")
    if settings.qk_norm == "off":
        _fail(
            "xpu_laguna.row_invariant_qk_norm off on the exact path (the q/k "
            "norm kernel reduces verify rows in another order than the decode)",
            "set xpu_laguna.row_invariant_qk_norm to pad (or tokens)",
        )
    missing = [kind for kind in KINDS if kind not in settings.linears]
    if missing:
        _fail(
            f"xpu_laguna.row_invariant_linears leaves {','.join(missing)} "
            "without a row-invariant form on the exact path",
            "set xpu_laguna.row_invariant_linears to all",
        )
    if not settings.int4:
        _fail(
            "xpu_laguna.row_invariant_int4 false on the exact path (the INT4 "
            "GEMM primitive is built per row count)",
            "set xpu_laguna.row_invariant_int4 true",
        )
    tp = vllm_config.parallel_config.tensor_parallel_size
    standin = options.debug_xccl_standin
    if tp > 1 and not options.exact_tp_reduce:
        if not standin:
            _fail(
                f"xpu_laguna.exact_tp_reduce false at tensor_parallel_size {tp} "
                "on the exact path (the backend's all-reduce sums in an order "
                "set by the message size)",
                "set xpu_laguna.exact_tp_reduce true (a diagnostic run of the "
                "ring sets xpu_laguna.debug_xccl_standin true as well)",
            )
        logger.warning_once(
            "%s: xpu_laguna.exact_tp_reduce false at tensor_parallel_size %d "
            "(diagnostic run: not exact, not for serving)",
            PREFIX,
            tp,
        )
    for name, on in (
        ("debug_xccl_standin", standin),
        ("debug_no_split_plan", options.debug_no_split_plan),
    ):
        if on:
            logger.warning_once(
                "%s: debug option xpu_laguna.%s (diagnostic run, not for serving)",
                PREFIX,
                name,
            )


def _warn_max_num_seqs(vllm_config: VllmConfig) -> None:
    n = vllm_config.scheduler_config.max_num_seqs
    if n > 1:
        logger.warning_once(
            "%s: max_num_seqs %d > 1: steps with more than one request run "
            "upstream numerics (not bitwise equal to a single-request run); "
            "use --max-num-seqs 1 for exact serving",
            PREFIX,
            n,
        )
