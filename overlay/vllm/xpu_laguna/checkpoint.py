# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The layout of a Laguna INT4 checkpoint, read from its safetensors headers
alone, and the two mistakes in it that vLLM does not name.

Laguna-S-2.1-INT4 is compressed-tensors W4A16 (groups of 32) in the routed
experts only; its config group targets every ``Linear`` and its ``ignore``
list names every linear stored BF16. Two mistakes in such a checkpoint go
wrong in vLLM 0.34.0 without naming their cause:

* a linear stored as a plain ``weight`` but missing from ``ignore`` is built
  as a W4A16 layer; the engine then fails on something else (on CPU, with
  the tiny pair: "Failed to find a kernel that can implement the WNA16
  linear layer", from the layer's shape), or its BF16 ``weight`` finds no
  parameter to load into;
* with a ``kv_cache_scheme``, a K/V scale under a name Laguna's loader does
  not map (anything but ``model.layers.N.self_attn.k_scale``/``v_scale``) is
  skipped without a word (``ignore_unexpected_suffixes`` in Laguna's
  ``load_weights``), and an FP8 cache then runs with the default scale.

The configuration contract (:mod:`vllm.xpu_laguna.contract`) refuses
both before any weight loads (the KV scales when the cache is FP8);
``scripts/device/checkpoint_check.py`` reports them with the rest of the
format's checks. The linear leaves and the expert names are the ones
``vllm/model_executor/models/laguna.py`` loads.
"""

from __future__ import annotations

import re
from pathlib import Path

GROUP_SIZE = 32
"""The INT4 weights' group size (the product's and the XPU kernel's)."""
PACKED_PARTS = ("weight_packed", "weight_scale", "weight_shape")
"""A pack-quantized module's tensors."""
ROUTED_EXPERT = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.\d+\.(gate|up|down)_proj$"
)
"""A routed expert projection: the only modules the product quantizes."""
LINEAR_LEAVES = frozenset(
    (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "g_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "gate",
    )
)
"""The last name of every linear module of a Laguna checkpoint (and
``lm_head``)."""
_KV_SCALE = re.compile(r"\.(k|v)_scale$")

Tensors = dict[str, tuple[str, tuple[int, ...]]]
"""Tensor name -> (safetensors dtype code such as ``BF16``; shape)."""


def is_linear(module: str) -> bool:
    """Whether ``module`` (a checkpoint name without ``.weight``) is one of
    Laguna's linears."""
    return module == "lm_head" or module.rsplit(".", 1)[-1] in LINEAR_LEAVES


def tensor_index(model_dir: Path) -> Tensors:
    """Every tensor of the ``*.safetensors`` files in ``model_dir``, from
    their headers (no tensor data is read)."""
    from safetensors import safe_open

    out: Tensors = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                piece = handle.get_slice(name)
                out[name] = (str(piece.get_dtype()), tuple(piece.get_shape()))
    return out


def ignored(module: str, ignore: list[str]) -> bool:
    """``module`` matched by ``ignore`` the way vLLM's compressed-tensors
    config matches it."""
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import (
        should_ignore_layer,
    )

    return should_ignore_layer(module, ignore=ignore)


def unignored_plain_linears(tensors: Tensors, ignore: list[str]) -> list[str]:
    """Linears stored as a plain ``weight`` that ``ignore`` does not name
    (vLLM would build them as INT4 layers)."""
    plain = {
        name.rpartition(".")[0]
        for name in tensors
        if name.endswith(".weight") and is_linear(name.rpartition(".")[0])
    }
    return sorted(m for m in plain if not ignored(m, ignore))


def kv_scale_problems(tensors: Tensors, num_layers: int) -> list[str]:
    """With a ``kv_cache_scheme``: each attention layer's K and V scale
    missing from the names Laguna maps, and each scale under another name
    (the loader would skip it)."""
    known = {
        f"model.layers.{n}.self_attn.{w}_scale"
        for n in range(num_layers)
        for w in ("k", "v")
    }
    problems = [
        f"{name}: missing (kv_cache_scheme is static FP8; vLLM maps only this name)"
        for name in sorted(known - set(tensors))
    ]
    problems += [
        f"{name}: a KV scale vLLM does not map (the loader would drop it)"
        for name in sorted(tensors)
        if _KV_SCALE.search(name) and name not in known
    ]
    return problems
