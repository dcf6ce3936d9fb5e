"""The tiny Laguna pair in the real INT4 checkpoint's format (scripts/tiny_laguna_int4.py) and the
checkpoint check (scripts/device/checkpoint_check.py), in the CPU runtime (compressed-tensors at
vLLM's pin, vLLM's own parser and repack), and at load (the configuration contract).

* The INT4 target in an engine against its dequantized reference (marker ``ci``: CI runs it);
  controls: the nibbles swapped, the bias fix (0002) off (the routing bias the router then keeps:
  zero), no stand-in (no CPU backend); the run is labelled as a stand-in in its log.

* The written target passes the check at TP 1 and 2 and is refused at TP 4 (per-rank expert
  input 16 wide: not a group of 32).
* vLLM's XPU weight repack (``_process_weights_xpu``, plain torch, the code the device runs at
  load) applied to the checkpoint's packed experts, decoded the way the XPU kernel reads it (low
  nibble first, minus 8, times the group's scale), gives bitwise the weights compressed-tensors
  dequantizes; control: the checkpoint with every byte's nibbles swapped does not.
* Controls, one line each: a BF16 linear left out of ``ignore``, an unknown key in the
  quantization config, a KV scale under a name vLLM does not map, a drafter with a
  ``quantization_config``; the first and the third refused at load as well.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import int4_engine
import pytest

pytest.importorskip("compressed_tensors")
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from scripts import tiny_laguna_int4 as int4  # noqa: E402
from scripts.device import checkpoint_check  # noqa: E402
from scripts.tiny_laguna import ensure_models  # noqa: E402
from tests.tool_run import run_module  # noqa: E402

CHECK = "scripts.device.checkpoint_check"


@pytest.fixture(scope="module")
def float_int4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int4-float")
    ensure_models(out, variant="int4")
    return out


@pytest.fixture(scope="module")
def pair(float_int4: Path, tmp_path_factory: pytest.TempPathFactory) -> int4.Int4Pair:
    return int4.write(float_int4, tmp_path_factory.mktemp("int4"))


def _check(pair: int4.Int4Pair, *, tp: int = 2, target: Path | None = None) -> Any:
    """The check's command line, in this process (importing vLLM once): (exit status, stdout)."""
    argv = ["--model-dir", str(target or pair.target), "--draft-dir", str(pair.draft), "--tp", str(tp)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = checkpoint_check.main(argv)
    return subprocess.CompletedProcess(argv, status, out.getvalue(), "")


def test_the_written_pair_passes_at_tp_1_and_2_and_tp_4_is_refused(pair: int4.Int4Pair) -> None:
    for tp in (1, 2):
        proc = (
            _check(pair, tp=tp)
            if tp == 1
            else run_module(
                CHECK, "--model-dir", str(pair.target), "--draft-dir", str(pair.draft), "--tp", "2", timeout=300
            )
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == (
            f"checkpoint OK at TP {tp}: 72 INT4 expert projections, 36 modules ignored, "
            "KV scales for 4 attention layers, drafter BF16"
        )
    proc = _check(pair, tp=4)
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 24 and all("splits at TP 4 into 16, not whole groups of 32" in line for line in lines)
    config = json.loads((pair.target / "config.json").read_text())["quantization_config"]
    assert "model.layers.1.mlp.gate" in config["ignore"] and "lm_head" in config["ignore"]
    assert not any(".experts." in name for name in config["ignore"])
    assert config["kv_cache_scheme"]["type"] == "float" and config["transform_config"]["config_groups"]["R1"]


def _layer_experts(model_dir: Path, layer: int) -> dict[str, torch.Tensor]:
    tensors = load_file(str(model_dir / int4.TENSOR_FILE))
    return {k: v for k, v in tensors.items() if k.startswith(f"model.layers.{layer}.mlp.experts.")}


def _xpu_dequantized(target: Path, layer: int, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w13 and w2 of one layer: stacked as vLLM's loader stacks them (gate then up), repacked by
    vLLM's XPU repack, decoded as the XPU kernel reads the bytes."""
    from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import _process_weights_xpu

    t = _layer_experts(target, layer)

    def stack(proj: tuple[str, ...], part: str) -> torch.Tensor:
        return torch.stack(
            [
                torch.cat([t[f"model.layers.{layer}.mlp.experts.{e}.{p}.{part}"] for p in proj])
                for e in range(num_experts)
            ]
        )

    w13, w2, s13, s2, _, _ = _process_weights_xpu(
        None, None, stack(("gate_proj", "up_proj"), "weight_packed"), stack(("down_proj",), "weight_packed"),
        stack(("gate_proj", "up_proj"), "weight_scale"), stack(("down_proj",), "weight_scale"),
    )  # fmt: skip

    def decode(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        assert q.dtype == torch.uint8
        values = torch.stack([q & 0xF, q >> 4], dim=-1).flatten(-2).to(torch.int8) - 8  # low nibble first
        return values.to(scale.dtype) * scale.repeat_interleave(checkpoint_check.layout().GROUP_SIZE, dim=-1)

    return decode(w13, s13), decode(w2, s2)


def _reference(reference: Path, layer: int, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = _layer_experts(reference, layer)
    p = f"model.layers.{layer}.mlp.experts"
    w13 = torch.stack(
        [torch.cat([t[f"{p}.{e}.gate_proj.weight"], t[f"{p}.{e}.up_proj.weight"]]) for e in range(num_experts)]
    )
    w2 = torch.stack([t[f"{p}.{e}.down_proj.weight"] for e in range(num_experts)])
    return w13, w2


def test_the_xpu_repack_reads_what_compressed_tensors_packed(
    pair: int4.Int4Pair, float_int4: Path, tmp_path: Path
) -> None:
    experts = json.loads((pair.target / "config.json").read_text())["num_experts"]
    for layer in (1, 2, 3):
        got, want = _xpu_dequantized(pair.target, layer, experts), _reference(pair.reference, layer, experts)
        assert got[0].shape == want[0].shape == (experts, 2 * 64, 64) and got[1].shape == (experts, 64, 64)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), layer
        assert want[0].abs().sum() > 0
    swapped = int4.write(float_int4, tmp_path / "swapped", nibbles_swapped=True)
    got, want = _xpu_dequantized(swapped.target, 1, experts), _reference(swapped.reference, 1, experts)
    assert not torch.equal(got[0], want[0]) and not torch.equal(got[1], want[1])


def test_a_bf16_linear_missing_from_ignore_is_named(float_int4: Path, tmp_path: Path) -> None:
    bad = int4.write(float_int4, tmp_path / "bad", not_ignored="model.layers.1.self_attn.g_proj")
    proc = _check(bad)
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines() == [
        "model.layers.1.self_attn.g_proj: stored as a plain weight but not in ignore (vLLM would load it as INT4)"
    ]


_BUILD_CONFIG = (
    "import json, sys; from vllm.engine.arg_utils import EngineArgs; "
    "EngineArgs(model=sys.argv[1], dtype='bfloat16', kv_cache_dtype=sys.argv[2], max_model_len=512, "
    "max_num_seqs=1, enable_prefix_caching=False, async_scheduling=False, enforce_eager=True, "
    "kv_cache_memory_bytes=64 << 20, additional_config=json.loads(sys.argv[3])).create_engine_config(); "
    "print('config built')"
)


def _series_config(target: Path, kv_cache_dtype: str, **options: object) -> subprocess.CompletedProcess[str]:
    """vLLM builds the engine configuration of ``target`` (no engine starts) with the tiny CPU
    recipe's series options in its config (``options`` over them) and the recipe's env file in its
    environment, as ``vllm serve --config recipes/cpu-tiny.yaml`` would before loading a weight."""
    import os
    import sys

    from scripts.device.day_one import recipe_env, recipe_options
    from scripts.recipe import shell_env
    from scripts.series_options import additional_config

    env = {**os.environ, **shell_env(recipe_env(cpu=True))}
    config = json.dumps(additional_config({**recipe_options(cpu=True), **options}))
    command = [sys.executable, "-c", _BUILD_CONFIG, str(target), kv_cache_dtype, config]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)


def _refusal(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if "XPU Laguna series:" in line]
    return lines[-1] if lines else proc.stderr[-2000:]


def test_at_load_the_series_refuses_a_bf16_linear_missing_from_ignore(
    float_int4: Path, pair: int4.Int4Pair, tmp_path: Path
) -> None:
    """The configuration contract refuses it before any weight loads (vLLM itself would build the
    linear as INT4: layout in vllm/xpu_laguna/checkpoint.py); the written pair passes."""
    bad = int4.write(float_int4, tmp_path / "bad", not_ignored="model.layers.1.self_attn.g_proj")
    proc = _series_config(bad.target, "bfloat16")
    assert proc.returncode != 0
    assert (
        "model.layers.1.self_attn.g_proj stored unquantized but not in the checkpoint's "
        "quantization_config.ignore" in _refusal(proc)
    ), proc.stderr[-3000:]
    good = _series_config(pair.target, "bfloat16")
    assert good.returncode == 0 and "config built" in good.stdout, good.stderr[-3000:]


def test_at_load_the_series_refuses_unmapped_kv_scales_with_an_fp8_cache(pair: int4.Int4Pair, tmp_path: Path) -> None:
    """Off the exact path (which refuses any FP8 cache) with the prebuilt metadata still on: an FP8
    cache with a K scale under a name Laguna's loader skips is refused, not dropped; with a BF16
    cache (the recipe's) the scales are unused and the configuration builds."""
    target = _renamed_k_scale(pair, tmp_path)
    off = {"exact_verify": False}
    proc = _series_config(target, "fp8", **off)
    assert proc.returncode != 0
    assert "KV cache fp8 with model.layers.2.self_attn.k_scale: missing (kv_cache_scheme is static FP8" in _refusal(
        proc
    ), proc.stderr[-3000:]
    assert _series_config(target, "bfloat16", **off).returncode == 0
    assert _series_config(pair.target, "fp8", **off).returncode == 0  # the written pair's scales map


def _renamed_k_scale(pair: int4.Int4Pair, tmp_path: Path) -> Path:
    """The target with layer 2's K scale under ``self_attn.attn.k_scale`` (a name vLLM skips)."""

    def rename(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.2.self_attn.attn.k_scale"] = tensors.pop("model.layers.2.self_attn.k_scale")

    return _edit_tensors(pair, tmp_path, rename)


def _zero_routing_bias(pair: int4.Int4Pair, tmp_path: Path) -> Path:
    """The target as vLLM without the bias fix (0002) computes it: every routing correction bias
    zero, what the router keeps when the checkpoint's bias is dropped (LagunaMoE starts it at 0)."""

    def zero(tensors: dict[str, torch.Tensor]) -> None:
        biases = [k for k in tensors if k.endswith(".mlp.experts.e_score_correction_bias")]
        assert biases and all(tensors[k].abs().min() > 0 for k in biases)
        for key in biases:
            tensors[key] = torch.zeros_like(tensors[key])

    return _edit_tensors(pair, tmp_path, zero)


def _edit_tensors(pair: int4.Int4Pair, tmp_path: Path, edit: Any) -> Path:
    """A copy of the target (in ``tmp_path/target``) whose tensors ``edit`` changed in place."""
    target = _edit_config(pair, tmp_path, lambda c: None)
    tensors = load_file(str(target / int4.TENSOR_FILE))
    edit(tensors)
    save_file(tensors, str(target / int4.TENSOR_FILE))
    return target


def _edit_config(pair: int4.Int4Pair, tmp_path: Path, edit: Any) -> Path:
    target = tmp_path / "target"
    target.mkdir()
    for file in pair.target.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_an_unknown_key_in_the_quantization_config_is_refused(pair: int4.Int4Pair, tmp_path: Path) -> None:
    target = _edit_config(
        pair,
        tmp_path,
        lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(packing="nibble"),
    )
    proc = _check(pair, target=target)
    assert proc.returncode == 1
    first = proc.stdout.strip().splitlines()[0]
    assert first.startswith("quantization_config.config_groups.group_0.weights.packing:"), first
    assert "compressed-tensors refuses it" in first


def test_a_kv_scale_vllm_does_not_map_is_named_not_dropped(pair: int4.Int4Pair, tmp_path: Path) -> None:
    target = _renamed_k_scale(pair, tmp_path)
    proc = _check(pair, target=target)
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines() == [
        "model.layers.2.self_attn.k_scale: missing (kv_cache_scheme is static FP8; vLLM maps only this name)",
        "model.layers.2.self_attn.attn.k_scale: a KV scale vLLM does not map (the loader would drop it)",
    ]


def test_a_quantized_drafter_is_refused(pair: int4.Int4Pair, tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    for file in pair.draft.iterdir():
        (draft / file.name).write_bytes(file.read_bytes())
    config = json.loads((draft / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors"}
    (draft / "config.json").write_text(json.dumps(config))
    assert checkpoint_check.draft_problems(draft) == [
        f"{draft}: the drafter has a quantization_config (the product's is BF16)"
    ]
    assert checkpoint_check.draft_problems(pair.draft) == []


def test_the_writer_refuses_experts_that_do_not_split_into_groups_at_tp_2(tmp_path: Path) -> None:
    default = tmp_path / "default"
    ensure_models(default)
    with pytest.raises(int4.Int4Error, match="routed experts 32 wide"):
        int4.write(default, tmp_path / "out")


# ------------------------------------------------------------- through an engine
def _engine(
    model: Path, out: Path, *, stand_in: bool, kv_cache_dtype: str = "auto", tp: int = 1
) -> tuple[Any, list[Any]]:
    """tests/e2e/int4_engine.py in a process of its own on a leased CPU slot, float32, one request at
    a time: (process, rows)."""
    args = ["--model", str(model), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512"]
    args += ["--kv-cache-memory-bytes", str(64 << 20), "--kv-cache-dtype", kv_cache_dtype, "--seed", "0"]
    args += ["--max-num-seqs", "1", "--no-enable-prefix-caching", "--tensor-parallel-size", str(tp)]
    if tp > 1:
        args += ["--distributed-executor-backend", "mp"]
    return int4_engine.run(out, args, stand_in=stand_in, tp=tp)


@pytest.mark.ci  # four engines (about 110 s): CI's, with the INT4 matrix (test_int4_matrix.py)
def test_the_int4_target_runs_vllms_xpu_path_and_matches_its_reference(
    pair: int4.Int4Pair, float_int4: Path, tmp_path: Path
) -> None:
    """vLLM's config parsing, quant method, loader and XPU repack on CPU, only the experts' kernel
    call standing in (labelled: a reference dequantize-and-matmul); the cache FP8 as the checkpoint's
    kv_cache_scheme asks, the reference given the same FP8 cache. Greedy tokens equal, logprobs
    within float32 rounding (the stand-in and the CPU's unquantized MoE sum in other orders)."""
    proc, got = _engine(pair.target, tmp_path / "int4.json", stand_in=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from xpu_laguna_standins.int4_experts import STAND_IN_LINE

    for line in ("Using CompressedTensorsWNA16MoEMethod", "Using XPU WNA16 MoE backend", "Using XPUExpertsWNA16"):
        assert line in proc.stdout + proc.stderr, line
    assert STAND_IN_LINE in proc.stdout + proc.stderr  # the run is labelled
    ref_proc, want = _engine(pair.reference, tmp_path / "ref.json", stand_in=False, kv_cache_dtype="fp8")
    assert ref_proc.returncode == 0, ref_proc.stderr[-3000:]
    assert [r["tokens"] for r in got] == [r["tokens"] for r in want]
    worst = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g["logprobs"], w["logprobs"]))
    assert worst < 1e-4, worst
    print(
        f"INT4 target (stand-in experts kernel) vs dequantized BF16 reference: tokens equal, max |dlogprob| {worst:.2e}"
    )
    # control: the same checkpoint with every byte's nibbles swapped computes something else
    swapped = int4.write(float_int4, tmp_path / "swapped", nibbles_swapped=True)
    proc, wrong = _engine(swapped.target, tmp_path / "swapped.json", stand_in=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["logprobs"] for r in wrong] != [r["logprobs"] for r in want]
    # control: the bias fix (0002) off, as its router computes it: the logprobs leave the reference
    proc, unbiased = _engine(_zero_routing_bias(pair, tmp_path), tmp_path / "unbiased.json", stand_in=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    off = max(abs(a - b) for g, w in zip(unbiased, want) for a, b in zip(g["logprobs"], w["logprobs"]))
    print(f"bias fix off (routing bias zero): max |dlogprob| {off:.2e} against the reference")
    assert off > 1e-2, off
    # control: without the stand-in, CPU vLLM has no backend for this MoE (the reason for it)
    proc, _ = _engine(pair.target, tmp_path / "none.json", stand_in=False)
    assert proc.returncode != 0
    assert "No WNA16 MoE backend supports the deployment configuration." in proc.stdout + proc.stderr


@pytest.mark.ci  # two 2-rank engines: CI's
def test_the_int4_target_at_tp_2_matches_its_reference(pair: int4.Int4Pair, tmp_path: Path) -> None:
    """At TP 2 every rank holds all experts with half of each expert's intermediate width (one
    group of 32 for the down projection's input): vLLM's loader and XPU repack shard the packed
    weights and their group scales, the stand-in reads each rank's shard; the reference is sharded
    the same way. Greedy tokens equal, logprobs within float32 rounding."""
    proc, got = _engine(pair.target, tmp_path / "int4.json", stand_in=True, tp=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref_proc, want = _engine(pair.reference, tmp_path / "ref.json", stand_in=False, kv_cache_dtype="fp8", tp=2)
    assert ref_proc.returncode == 0, ref_proc.stderr[-3000:]
    assert [r["tokens"] for r in got] == [r["tokens"] for r in want]
    worst = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g["logprobs"], w["logprobs"]))
    assert worst < 1e-4, worst
    print(f"INT4 target at TP 2 vs its reference at TP 2: tokens equal, max |dlogprob| {worst:.2e}")
