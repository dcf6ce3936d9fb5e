"""Whether a Laguna target or Laguna DFlash drafter ``config.json`` can run at a tensor-parallel
size in vLLM 0.32.0 (pure: no torch, no vLLM).

The rules, each from the pinned tree (``build/worktree`` after ``nox -s apply``):

* query heads of every layer divide by TP: ``LagunaAttention`` asserts
  ``total_num_heads % tp_size == 0`` (``models/laguna.py``), the per-head ``g_proj`` and
  ``QKVParallelLinear`` divide the same count (``layers/linear.py``, ``divide``);
* KV heads: at least TP of them divide by TP, fewer are replicated, so TP must divide by them
  (``LagunaAttention``; ``QKVParallelLinear``'s ``num_kv_head_replicas``);
* every rank's query heads group evenly over its KV heads (``Attention`` asserts
  ``num_heads % num_kv_heads == 0``, ``layers/attention/attention.py``);
* at most as many ranks as routed experts (``LagunaMoE`` raises otherwise);
* the column-sharded MLP widths divide by TP: the dense ``intermediate_size`` (layers whose MLP
  is dense: ``mlp_layer_types``, or every layer of a model without experts), the shared expert's
  and the routed experts' intermediate sizes (``MergedColumnParallelLinear`` and
  ``RowParallelLinear`` ``divide``; ``FusedMoEConfig`` floors ``intermediate_size // tp_size``
  without a check, so an odd split would load the wrong weights).

Not checked: quantization group sizes (the tiny pairs are float32), the vocabulary (vLLM pads
the vocab-parallel embedding and lm_head per rank) and expert parallelism (the series refuses it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["config_problems", "model_problems"]


def _layer_heads(cfg: Mapping[str, Any]) -> list[int]:
    per_layer = cfg.get("num_attention_heads_per_layer")
    if per_layer:
        return [int(n) for n in per_layer]
    return [int(cfg["num_attention_heads"])] * int(cfg.get("num_hidden_layers", 1))


def _has_dense_mlp(cfg: Mapping[str, Any]) -> bool:
    if not cfg.get("num_experts"):
        return True
    return "dense" in (cfg.get("mlp_layer_types") or [])


def config_problems(config: Mapping[str, Any], tp: int) -> list[str]:
    """Why a model with this ``config.json`` content cannot run at TP ``tp`` (empty: it can)."""
    if tp < 1:
        return [f"TP {tp} is not a tensor-parallel size"]
    if tp == 1:
        return []
    cfg = config.get("text_config", config)
    if not (cfg.get("num_attention_heads_per_layer") or cfg.get("num_attention_heads")):
        return ["config.json names no attention heads (num_attention_heads)"]
    heads = _layer_heads(cfg)
    kv = int(cfg.get("num_key_value_heads") or max(heads))
    problems = []
    odd = sorted({h for h in heads if h % tp})
    if odd:
        problems.append(f"query heads {odd} do not divide by TP {tp}")
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        problems.append(f"{kv} KV heads neither divide by TP {tp} nor divide it")
    kv_per_rank = max(1, kv // tp)
    ungrouped = sorted({h for h in heads if h % tp == 0 and (h // tp) % kv_per_rank})
    if ungrouped:
        problems.append(f"query heads {ungrouped} over TP {tp} do not group over {kv_per_rank} KV head(s) per rank")
    experts = int(cfg.get("num_experts") or 0)
    if experts and tp > experts:
        problems.append(f"TP {tp} is more than the {experts} routed experts")
    widths = {}
    if _has_dense_mlp(cfg) and cfg.get("intermediate_size"):
        widths["intermediate_size"] = int(cfg["intermediate_size"])
    if experts:
        for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            if cfg.get(key):
                widths[key] = int(cfg[key])
    for key, width in widths.items():
        if width % tp:
            problems.append(f"{key} {width} does not divide by TP {tp}")
    return problems


def model_problems(model_dir: str | Path, tp: int) -> list[str]:
    """:func:`config_problems` of ``model_dir/config.json``, each line naming the folder."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return [f"{model_dir}: {p}" for p in config_problems(config, tp)]
