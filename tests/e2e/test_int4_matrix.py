"""The product's checkpoint format through the matrix (docs/int4-checkpoint.md): the tiny pair
written as compressed-tensors W4A16 group 32 routed experts (``scripts.tiny_laguna_int4``), loaded
by vLLM's own config parsing, quant method, loader and XPU repack; only the experts' kernel call
stands in (``xpu_laguna_standins.int4_experts``: a reference dequantize-and-matmul whose rows, like
the device kernel's, depend on how many rows the call has). In BF16 with a BF16 KV cache (the
recipe's; ``auto`` would resolve to the checkpoint's FP8), the DFlash M8 leg on the exact path must
give the INT4 teacher's tokens and bitwise logprobs at TP 1 and TP 2, with the series' per-row
routed-experts form on its verify rows; negative control: that form off
(``VLLM_XPU_LAGUNA_ROW_INVARIANT_MOE=off``) and the verify rows differ. CI runs it (``ci`` marker)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scripts import tiny_laguna_int4 as int4
from scripts.tiny_laguna import ensure_models
from tests.tool_run import run_module

pytestmark = pytest.mark.ci

LEGS = ("teacher", "dflash-graph0-meta1")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> int4.Int4Pair:
    src = tmp_path_factory.mktemp("int4-float")
    ensure_models(src, variant="int4")
    return int4.write(src, tmp_path_factory.mktemp("int4"))


def _matrix(pair: int4.Int4Pair, tmp: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    from xpu_laguna_standins import int4_experts

    report = tmp / "matrix.json"
    argv = (
        "run", "--model-dir", str(pair.target), "--draft-dir", str(pair.draft), "--dtype", "bfloat16",
        "--kv-cache-dtype", "bfloat16", "--prompts", "3", "--max-tokens", "24", "--long-prompt-tokens", "0",
        "--max-model-len", "1024", "--kv-cache-bytes", str(64 << 20), "--seed", "0", "--legs", ",".join(LEGS),
        "--report", str(report), *args,
    )  # fmt: skip
    proc = run_module("scripts.matrix", *argv, timeout=1500, env={**os.environ, int4_experts.ENV: "1", **env})
    print(proc.stdout[-3000:])
    return proc, json.loads(report.read_text()) if report.exists() else {}


def _dflash(data: dict[str, Any]) -> dict[str, Any]:
    return {leg["name"]: leg for leg in data["legs"]}["dflash-graph0-meta1"]


@pytest.mark.parametrize("tp", [1, 2])
def test_dflash_on_the_int4_target_is_bitwise_the_teacher(pair: int4.Int4Pair, tmp_path: Path, tp: int) -> None:
    proc, data = _matrix(pair, tmp_path, "--tp", str(tp))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    leg = _dflash(data)
    lp = leg["logprobs"]
    assert leg["status"] == "passed" and lp["positions"] > 0 and lp["logprobs_bitwise_equal"] == lp["positions"], lp
    assert data["dtype"] == "bfloat16"


def test_without_the_per_row_experts_form_the_verify_rows_differ(pair: int4.Int4Pair, tmp_path: Path) -> None:
    proc, data = _matrix(pair, tmp_path, VLLM_XPU_LAGUNA_ROW_INVARIANT_MOE="off")
    assert proc.returncode != 0, proc.stdout[-3000:]
    lp = _dflash(data)["logprobs"]
    assert lp["positions"] > 0 and lp["logprobs_bitwise_equal"] < lp["positions"], lp
