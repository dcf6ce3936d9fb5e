"""The tiny Laguna pair in the real checkpoint's format: INT4 routed experts, BF16 elsewhere.

The product's target (Laguna-S-2.1-INT4) is a ``compressed-tensors`` checkpoint: the routed
experts pack-quantized W4A16 (int, 4 bits, symmetric, group strategy, group size 32, no
activation quantization; ``weight_packed`` int32, BF16 ``weight_scale``, ``weight_shape``),
every other linear BF16 and named in ``ignore`` (attention q/k/v/o and ``g_proj``, the shared
expert, the dense layer-0 MLP, the router gate, ``lm_head``), a ``transform_config`` (an offline
Hadamard rotation: no runtime module) and a ``kv_cache_scheme`` (FP8 per tensor, static, so the
checkpoint carries K/V scale tensors). Its DFlash drafter is BF16 without a
``quantization_config``. Facts: ``docs/int4-checkpoint.md``.

This module writes that format from the ``int4`` tiny variant (:mod:`scripts.tiny_laguna`:
routed experts 64 wide, so at TP 2 each rank's ``down_proj`` input is one group of 32) with
``compressed-tensors``' own classes, at the version vLLM pins (its quantization and transform
configs, ``calculate_qparams``, the pack-quantized compressor and ``ModelCompressor``'s config
writer): ``OUT/target`` (INT4 + BF16), ``OUT/draft`` (the drafter in BF16) and ``OUT/reference``
(the target with every expert dequantized by the same library, BF16, no quantization: what the
INT4 model must compute). Tiny sizes stand in for the real ones; the rotation is declared, not
applied (random weights rotated are random weights).

Run it with the CPU runtime's python (it needs torch, safetensors and compressed-tensors)::

    python -m scripts.tiny_laguna_int4 --out DIR [--src DIR]
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scripts.device.checkpoint_check import layout
from scripts.errors import ToolError, exit_status

if TYPE_CHECKING:
    import torch

NUM_BITS = 4
KV_SCALE = 1.0
"""The K and V scale every attention layer's checkpoint carries (FP8 per tensor, static): 1.0, the
scale vLLM gives an FP8 cache of an unquantized model, so the BF16 reference run with
``--kv-cache-dtype fp8`` stores the same cache bytes."""
TENSOR_FILE = "model.safetensors"


class Int4Error(ToolError):
    """Expected failure with a one-line message."""


@dataclass(frozen=True)
class Int4Pair:
    target: Path
    draft: Path
    reference: Path
    quantized: tuple[str, ...]  # module names of the packed experts
    ignored: tuple[str, ...]


def weight_args() -> Any:
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(
        num_bits=NUM_BITS, type="int", symmetric=True, strategy="group", group_size=layout().GROUP_SIZE
    )


def kv_cache_args() -> Any:
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="tensor", dynamic=False)


def scheme() -> Any:
    from compressed_tensors.quantization import QuantizationScheme

    return QuantizationScheme(targets=["Linear"], weights=weight_args())


def linear_modules(keys: list[str]) -> list[str]:
    """Every linear module of a Laguna state dict (its ``.weight`` keys), experts included."""
    out = []
    for key in keys:
        if not key.endswith(".weight"):
            continue
        module = key.removesuffix(".weight")
        if layout().is_linear(module):
            out.append(module)
    return sorted(out)


def quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """One expert projection (N, K) as the checkpoint stores it: ``weight_packed`` (N, K/8)
    int32, ``weight_scale`` (N, K/32) BF16, ``weight_shape``; scales from the group's absolute
    maximum (``calculate_qparams``, symmetric) rounded up to a power of two, packed by the
    library's compressor."""
    import torch
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    rows, cols = weight.shape
    group = layout().GROUP_SIZE
    if cols % group:
        raise Int4Error(f"an expert's input width {cols} is not a multiple of the group size {group}")
    w = weight.to(torch.bfloat16)
    groups = w.float().reshape(rows, cols // group, group)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), weight_args())
    # Rounded up to a power of two: every dequantized value (an int4 times its scale) is then
    # exact in BF16 and float32, so the BF16 reference holds the INT4 model's weights exactly.
    scale = torch.exp2(torch.ceil(torch.log2(scale.float()))).to(torch.bfloat16)
    return PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme())


def dequantize(packed: dict[str, torch.Tensor]) -> torch.Tensor:
    """The library's own inverse of :func:`quantize` (BF16)."""
    import torch
    from compressed_tensors.compressors import PackedQuantizationCompressor

    return PackedQuantizationCompressor.decompress(dict(packed), scheme())["weight"].to(torch.bfloat16)


def swap_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Control: the same int4 values with the two nibbles of every byte exchanged."""
    import torch

    b = packed.contiguous().view(torch.uint8)
    return ((b >> 4) | (b << 4)).view(torch.int32)


def _load(model_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    if not tensors:
        raise Int4Error(f"{model_dir}: no safetensors")
    return config, tensors


def _save(model_dir: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], src: Path) -> None:
    from safetensors.torch import save_file

    model_dir.mkdir(parents=True, exist_ok=True)
    for extra in src.iterdir():  # tokenizer, generation config
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name != "config.json":
            shutil.copy2(extra, model_dir / extra.name)
    config = {**config, "torch_dtype": "bfloat16", "dtype": "bfloat16"}
    (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(model_dir / TENSOR_FILE))


def _quantization_config(ignored: list[str]) -> tuple[Any, Any]:
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus
    from compressed_tensors.transform import TransformArgs, TransformConfig, TransformScheme

    quant = QuantizationConfig(
        config_groups={"group_0": scheme()},
        format="pack-quantized",
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=ignored,
        kv_cache_scheme=kv_cache_args(),
    )
    # R1: an offline Hadamard rotation of the residual stream (weights only; no runtime module)
    rotation = TransformScheme(
        type="hadamard",
        head_dim=layout().GROUP_SIZE,
        apply=[
            TransformArgs(targets=["Embedding"], location="weight_output"),
            TransformArgs(targets=["Linear"], location="weight_input", inverse=True, ignore=["lm_head"]),
        ],
    )
    return quant, TransformConfig(config_groups={"R1": rotation})


def write(
    src: Path,
    out: Path,
    *,
    nibbles_swapped: bool = False,
    not_ignored: str | None = None,
) -> Int4Pair:
    """Write ``out/target``, ``out/draft`` and ``out/reference`` from the float pair in ``src``.

    Controls for the tests: ``nibbles_swapped`` exchanges the nibbles of every packed byte (the
    reference stays the true one); ``not_ignored`` leaves that BF16 linear out of ``ignore``.
    """
    import torch
    from compressed_tensors.compressors import ModelCompressor

    src, out = Path(src), Path(out)
    config, tensors = _load(src / "target")
    width = config.get("moe_intermediate_size", 0)
    group = layout().GROUP_SIZE
    if width % (2 * group):  # at TP 2 each rank's down_proj input must be whole groups
        raise Int4Error(
            f"{src}: routed experts {width} wide; INT4 groups of {group} need the int4 variant "
            "(python -m scripts.tiny_laguna --variant int4)"
        )
    target: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    quantized = []
    for key, value in sorted(tensors.items()):
        module = key.removesuffix(".weight")
        if not key.endswith(".weight") or layout().ROUTED_EXPERT.match(module) is None:
            target[key] = reference[key] = value.to(torch.bfloat16) if value.is_floating_point() else value
            continue
        packed = quantize(value)
        reference[key] = dequantize(packed)
        if nibbles_swapped:
            packed["weight_packed"] = swap_nibbles(packed["weight_packed"])
        for name, tensor in packed.items():
            target[f"{module}.{name}"] = tensor
        quantized.append(module)
    if not quantized:
        raise Int4Error(f"{src}/target: no routed expert weights to quantize")
    ignored = [m for m in linear_modules(list(tensors)) if m not in quantized and m != not_ignored]
    num_layers = int(config["num_hidden_layers"])
    for layer in range(num_layers):  # static FP8 KV: one K and one V scale per attention layer
        for which in ("k", "v"):
            target[f"model.layers.{layer}.self_attn.{which}_scale"] = torch.tensor(KV_SCALE, dtype=torch.float32)
    quant, transform = _quantization_config(ignored)
    _save(out / "target", config, target, src / "target")
    ModelCompressor(quantization_config=quant, transform_config=transform).update_config(str(out / "target"))
    _save(out / "reference", config, reference, src / "target")
    draft_config, draft = _load(src / "draft")
    _save(out / "draft", draft_config, {k: v.to(torch.bfloat16) for k, v in draft.items()}, src / "draft")
    return Int4Pair(out / "target", out / "draft", out / "reference", tuple(quantized), tuple(ignored))


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.tiny_laguna_int4",
        description="Write the tiny Laguna pair in the INT4 checkpoint's format (compressed-tensors W4A16 "
        "group 32 routed experts, BF16 elsewhere) and its dequantized BF16 reference.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (gets target/, draft/, reference/)")
    parser.add_argument(
        "--src",
        type=Path,
        default=None,
        help="the float int4 variant (target/, draft/) to convert (default: generated into OUT/float)",
    )
    args = parser.parse_args(argv)

    def run() -> None:
        src = args.src
        try:
            if src is None:
                from scripts.tiny_laguna import ensure_models

                src = args.out / "float"
                ensure_models(src, variant="int4")
            pair = write(src, args.out)
        except (OSError, ImportError) as exc:
            raise Int4Error(str(exc)) from None
        counts = f"{len(pair.quantized)} INT4 expert projections, {len(pair.ignored)} BF16 linears ignored"
        print(f"target: {pair.target} ({counts})\ndraft: {pair.draft}\nreference: {pair.reference}")

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
