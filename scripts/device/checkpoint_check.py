"""Check a Laguna INT4 target (and its DFlash drafter) against the format the series is built for.

What only a real-format checkpoint shows, before any engine starts (facts: docs/int4-checkpoint.md):

* the ``quantization_config`` parses with ``compressed-tensors``' own classes at the version vLLM
  pins (they refuse unknown keys) and with vLLM's ``CompressedTensorsConfig.from_config``; its
  ``transform_config`` has no online (runtime) transform; the weights are INT4 symmetric groups
  of 32 without activation quantization, in the ``pack-quantized`` format;
* the quantized modules are the routed experts and nothing else: every module stored packed
  (``weight_packed``, ``weight_scale``, ``weight_shape``) is a routed expert projection that
  vLLM would not ignore, every module stored as a plain ``weight`` is ignored (matched the way
  vLLM matches ``ignore``); a BF16 linear left out of ``ignore`` would be loaded as INT4;
* each expert's scales have one column per group and, at ``--tp``, every rank's input slice of
  every expert projection is whole groups;
* with a ``kv_cache_scheme``, every attention layer has its K and V scale under the name
  vLLM maps (``self_attn.k_scale`` / ``v_scale``); a scale under another name would be dropped
  by the loader, not refused;
* the drafter has no ``quantization_config`` and only BF16 (or float) tensors, and it names the
  target's layers it reads.

Usage (with the CPU runtime's python, or the device's)::

    python -m scripts.device.checkpoint_check --model-dir DIR [--draft-dir DIR] [--tp 4]

Prints one line per problem and exits 1, or a summary and exits 0.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from scripts.errors import ToolError, exit_status

_NOT_PARSED_BY_QUANTIZATION_CONFIG = ("transform_config", "sparsity_config")


def layout() -> ModuleType:
    """The checkpoint layout's one definition: the series' ``vllm.xpu_laguna.checkpoint`` (the
    configuration contract refuses the same problems at load), from the vLLM this runs with."""
    return importlib.import_module("vllm.xpu_laguna.checkpoint")


class CheckpointError(ToolError):
    """The folder is not a checkpoint at all (one line)."""


@dataclass(frozen=True)
class Summary:
    packed: int
    ignored: int
    attention_layers: int
    problems: tuple[str, ...]


def _tensors(model_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype code, e.g. ``BF16``, ``I32``; shape) of every tensor, read from
    the safetensors headers only."""
    tensors: dict[str, tuple[str, tuple[int, ...]]] = layout().tensor_index(model_dir)
    if not tensors:
        raise CheckpointError(f"{model_dir}: no *.safetensors")
    return tensors


def _config(model_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{model_dir}/config.json: {exc}") from None


def _refusal(exc: Any) -> str:
    """``field.path: message`` of a pydantic error's first entry (validator steps left out)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"] if not (isinstance(p, str) and "[" in p))
    return f"{where}: {first['msg']}"


def parse_problems(quant: dict[str, Any]) -> list[str]:
    """The ``quantization_config`` through compressed-tensors' own models and vLLM's parser."""
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.transform import TransformConfig
    from pydantic import ValidationError

    problems = []
    core = {k: v for k, v in quant.items() if k not in _NOT_PARSED_BY_QUANTIZATION_CONFIG}
    try:
        parsed = QuantizationConfig.model_validate(core)
    except ValidationError as exc:
        return [f"quantization_config.{_refusal(exc)} (compressed-tensors refuses it)"]
    if parsed.format != "pack-quantized":
        problems.append(f"quantization_config.format is {parsed.format!r}, not 'pack-quantized'")
    group_size = layout().GROUP_SIZE
    expected = (4, "int", True, "group", group_size)
    for name, group in parsed.config_groups.items():
        w = getattr(group, "weights", None)
        if w is None or (w.num_bits, w.type, w.symmetric, w.strategy, w.group_size) != expected:
            problems.append(f"config group {name}: weights are not INT4 symmetric groups of {group_size}")
        if getattr(group, "input_activations", None) is not None:
            problems.append(f"config group {name}: activations are quantized (W4A16 quantizes weights only)")
    if "transform_config" in quant:
        try:
            transforms = TransformConfig.model_validate(quant["transform_config"])
        except ValidationError as exc:
            return [*problems, f"quantization_config.transform_config.{_refusal(exc)} (compressed-tensors refuses it)"]
        for name, scheme in transforms.config_groups.items():
            online = [a.location for a in scheme.apply if a.location not in ("weight_input", "weight_output")]
            if online:
                problems.append(f"transform {name}: applied at runtime ({', '.join(map(str, online))}); offline only")
    try:
        from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
            CompressedTensorsConfig,
        )

        CompressedTensorsConfig.from_config(json.loads(json.dumps(quant)))
    except Exception as exc:  # noqa: BLE001 - any refusal of vLLM's parser is the finding
        problems.append(f"vLLM's CompressedTensorsConfig refuses the config: {type(exc).__name__}: {exc}")
    return problems


def target_problems(model_dir: Path, tp: int) -> Summary:
    config = _config(model_dir)
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return Summary(0, 0, 0, (f"{model_dir}: config.json has no quantization_config",))
    problems = parse_problems(quant)
    tensors = _tensors(model_dir)
    ignore = list(quant.get("ignore") or [])
    ct = layout()
    packed: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    for name, meta in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf in ct.PACKED_PARTS:
            packed.setdefault(module, {})[leaf] = meta
    for module in ct.unignored_plain_linears(tensors, ignore):
        problems.append(f"{module}: stored as a plain weight but not in ignore (vLLM would load it as INT4)")
    for module, parts in sorted(packed.items()):
        if ct.ROUTED_EXPERT.match(module) is None:
            problems.append(f"{module}: packed INT4 but not a routed expert projection")
        if ct.ignored(module, ignore):
            problems.append(f"{module}: packed INT4 but in ignore")
        missing = [p for p in ct.PACKED_PARTS if p not in parts]
        if missing:
            problems.append(f"{module}: missing {', '.join(missing)}")
            continue
        _, (rows, cols_packed) = parts["weight_packed"]
        k = cols_packed * 8
        _, scale_shape = parts["weight_scale"]
        if parts["weight_packed"][0] != "I32" or scale_shape != (rows, k // ct.GROUP_SIZE):
            problems.append(
                f"{module}: weight_packed {parts['weight_packed']} and weight_scale {scale_shape} "
                f"are not I32 (N, K/8) and (N, K/{ct.GROUP_SIZE})"
            )
        if module.endswith("down_proj") and (k % tp or (k // tp) % ct.GROUP_SIZE):
            problems.append(
                f"{module}: input width {k} splits at TP {tp} into {k / tp:g}, not whole groups of {ct.GROUP_SIZE}"
            )
        if not module.endswith("down_proj") and k % ct.GROUP_SIZE:
            problems.append(f"{module}: input width {k} is not whole groups of {ct.GROUP_SIZE}")
    if not packed:
        problems.append(f"{model_dir}: no packed INT4 module")
    layers = int(config.get("num_hidden_layers", 0))
    if quant.get("kv_cache_scheme"):
        problems += ct.kv_scale_problems(tensors, layers)
    return Summary(len(packed), len(ignore), layers, tuple(problems))


def draft_problems(draft_dir: Path) -> list[str]:
    config = _config(draft_dir)
    problems = []
    if "quantization_config" in config:
        problems.append(f"{draft_dir}: the drafter has a quantization_config (the product's is BF16)")
    odd = sorted(n for n, (dtype, _) in _tensors(draft_dir).items() if dtype != "BF16")
    if odd:
        problems.append(f"{draft_dir}: tensors not BF16: {', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''}")
    layer_ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    if not layer_ids:
        problems.append(f"{draft_dir}: config.json names no dflash_config.target_layer_ids (not a DFlash drafter)")
    return problems


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.device.checkpoint_check",
        description="Check an INT4 Laguna target (and its DFlash drafter) against the checkpoint format "
        "the series is built for; one line per problem.",
    )
    parser.add_argument("--model-dir", type=Path, required=True, help="the INT4 target's folder")
    parser.add_argument("--draft-dir", type=Path, default=None, help="its DFlash drafter's folder (default: none)")
    parser.add_argument("--tp", type=int, default=4, help="tensor-parallel size to check splits for (default: 4)")
    args = parser.parse_args(argv)
    if args.tp < 1:
        parser.error(f"--tp {args.tp}: must be at least 1")

    def run() -> None:
        try:
            summary = target_problems(args.model_dir, args.tp)
            problems = list(summary.problems)
            if args.draft_dir is not None:
                problems += draft_problems(args.draft_dir)
        except ImportError as exc:
            raise CheckpointError(str(exc)) from None
        for problem in problems:
            print(problem)
        if problems:
            raise CheckpointError(f"{len(problems)} problem(s) in the checkpoint")
        drafter = ", drafter BF16" if args.draft_dir is not None else ""
        print(
            f"checkpoint OK at TP {args.tp}: {summary.packed} INT4 expert projections, {summary.ignored} modules "
            f"ignored, KV scales for {summary.attention_layers} attention layers{drafter}"
        )

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
