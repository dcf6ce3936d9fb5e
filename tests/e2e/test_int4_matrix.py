"""The product's checkpoint format through the matrix (docs/int4-checkpoint.md): the tiny pair
written as compressed-tensors W4A16 group 32 routed experts (``scripts.tiny_laguna_int4``), loaded
by vLLM's own config parsing, quant method, loader and XPU repack; only the experts' kernel call
stands in (``xpu_laguna_standins.int4_experts``: a reference dequantize-and-matmul whose rows, like
the device kernel's, depend on how many rows the call has). In BF16 with a BF16 KV cache (the
recipe's; ``auto`` would resolve to the checkpoint's FP8), the DFlash M8 leg on the exact path must
give the INT4 teacher's tokens and bitwise logprobs at TP 1 and TP 2, with the series' per-row
routed-experts form on its verify rows; negative control: that form off (the series' option
``row_invariant_moe: off``, the matrix's ``--series-options``) and the verify rows differ. The
served recipe with the pair: greedy tokens and logprobs over HTTP bitwise those of the INT4 target
alone offline, from the same arguments (control: the per-row experts form off in the server). CI
runs it (``ci`` marker)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from served_markers import EXACT_ON

from scripts import REPO_ROOT
from scripts import tiny_laguna_int4 as int4
from scripts.recipe import RECIPE_DIR, cpu_tiny_recipe, shell_env
from scripts.series_options import OPTIONS_KEY, server_args
from scripts.tiny_laguna import ensure_models
from tests.tool_run import run_module

pytestmark = pytest.mark.ci

LEGS = ("teacher", "dflash-graph0-meta1")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> int4.Int4Pair:
    src = tmp_path_factory.mktemp("int4-float")
    ensure_models(src, variant="int4")
    return int4.write(src, tmp_path_factory.mktemp("int4"))


def _matrix(pair: int4.Int4Pair, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    from xpu_laguna_standins import int4_experts

    report = tmp / "matrix.json"
    argv = (
        "run", "--model-dir", str(pair.target), "--draft-dir", str(pair.draft), "--dtype", "bfloat16",
        "--kv-cache-dtype", "bfloat16", "--prompts", "3", "--max-tokens", "24", "--long-prompt-tokens", "0",
        "--max-model-len", "1024", "--kv-cache-bytes", str(64 << 20), "--seed", "0", "--legs", ",".join(LEGS),
        "--report", str(report), *args,
    )  # fmt: skip
    proc = run_module("scripts.matrix", *argv, timeout=1500, env={**os.environ, int4_experts.ENV: "1"})
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
    proc, data = _matrix(pair, tmp_path, "--series-options", json.dumps({"row_invariant_moe": "off"}))
    assert proc.returncode != 0, proc.stdout[-3000:]
    leg = _dflash(data)
    assert leg["options"]["row_invariant_moe"] == "off" and leg["options"]["exact_verify"] is True
    lp = leg["logprobs"]
    assert lp["positions"] > 0 and lp["logprobs_bitwise_equal"] < lp["positions"], lp


def _recipe_args(pair: int4.Int4Pair, tp: int = 1, options: dict[str, Any] | None = None) -> list[str]:
    """``vllm serve`` arguments: the tiny CPU recipe with the INT4 pair in place of the tiny one, in
    BF16 with a BF16 cache (``auto`` would resolve to the checkpoint's FP8, which the exact path
    refuses), at ``tp`` ranks, everything else as the recipe says; ``options``: series' options over
    the recipe's (``--additional-config`` replaces the YAML's whole, so it carries the recipe's too)."""
    recipe = cpu_tiny_recipe()
    spec = next(s.value for s in recipe.serve if s.key == "speculative-config")
    served = recipe.additional_config
    extra = server_args({**served.get(OPTIONS_KEY, {}), **options}, replaces=served) if options else []
    return [
        "--config", str(RECIPE_DIR / "cpu-tiny.yaml"), "--model", str(pair.target),
        "--speculative-config", json.dumps({**spec, "model": str(pair.draft)}),
        "--dtype", "bfloat16", "--kv-cache-dtype", "bfloat16", "--tensor-parallel-size", str(tp), *extra,
    ]  # fmt: skip


def _served_env() -> dict[str, str]:
    """The server's environment as docs/serving.md sets it on CPU (a clean one, the recipe's env
    file, the series-attention plugin), with the INT4 experts stand-in on."""
    from xpu_laguna_standins import int4_experts

    from scripts.measure.emulation import series_attention_env
    from scripts.measure.server import base_env

    return {**base_env(), **shell_env(RECIPE_DIR / "cpu-tiny.env"), **series_attention_env(), int4_experts.ENV: "1"}


@pytest.fixture(scope="module")
def offline_teacher(pair: int4.Int4Pair, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``teacher(tp)``: the INT4 target alone at ``tp`` ranks, offline, built from the served
    arguments by vLLM's own parser (``tests/e2e/int4_engine.py --no-speculation``), in the server's
    environment; run once per ``tp``."""
    from int4_engine import NO_SPECULATION, run

    done: dict[int, list[Any]] = {}

    def teacher(tp: int) -> list[Any]:
        if tp not in done:
            out = tmp_path_factory.mktemp(f"int4-teacher-tp{tp}") / "teacher.json"
            args = [*_recipe_args(pair, tp), NO_SPECULATION]
            proc, done[tp] = run(out, args, stand_in=True, tp=tp, env=_served_env())
            assert proc.returncode == 0, proc.stderr[-3000:]
        return done[tp]

    return teacher


@pytest.mark.parametrize(("tp", "moe_form"), [(1, "recipe"), (2, "recipe"), (1, "off")])
def test_the_served_recipe_on_the_int4_pair_is_bitwise_its_offline_teacher(
    pair: int4.Int4Pair, offline_teacher: Any, tmp_path: Path, tp: int, moe_form: str
) -> None:
    """The recipe served as docs/serving.md starts it on CPU with the INT4 pair and DFlash: each
    prompt's greedy tokens and chosen-token logprobs over HTTP are bitwise those of the INT4 target
    alone, offline, from the same arguments (``offline_teacher``), at TP 1 and 2. The offline INT4 target against
    its dequantized reference is test_int4_checkpoint.py's. Control (``off``): the same server with
    the series' per-row experts form off (the option ``row_invariant_moe: off`` in its
    ``--additional-config``): the verify rows leave the teacher's bits."""
    import sys

    import httpx
    from int4_engine import MAX_TOKENS, PROMPTS
    from xpu_laguna_standins import int4_experts

    from scripts.cpu_slots import cpu_lease
    from scripts.measure.emulation import settled_counters
    from scripts.measure.server import HOST, Server, api_server_argv, free_port

    env = _served_env()
    port, log_path = free_port(), tmp_path / "server.log"
    options = {"row_invariant_moe": "off"} if moe_form == "off" else None
    argv = api_server_argv(sys.executable, port, _recipe_args(pair, tp, options))
    served = []
    with (
        cpu_lease("int4 recipe server") as lease,
        Server(argv, env | lease.env(tp), log_path, port, cwd=REPO_ROOT) as srv,
    ):
        srv.wait_ready(600)
        for prompt in PROMPTS:
            body = {"model": str(pair.target), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0}
            body.update(logprobs=1, ignore_eos=True, return_token_ids=True)
            reply = httpx.post(f"http://{HOST}:{port}/v1/completions", json=body, timeout=300)
            assert reply.status_code == 200, reply.text[:500]
            choice = reply.json()["choices"][0]
            served.append({"tokens": choice["token_ids"], "logprobs": choice["logprobs"]["token_logprobs"]})
        counters = settled_counters(log_path, 10.0) or {"exact_calls_by_width": {}}
    log = log_path.read_text(encoding="utf-8", errors="replace")
    for line in (EXACT_ON, "Using XPUExpertsWNA16", int4_experts.STAND_IN_LINE):
        assert line in log, line
    assert sum(n for w, n in counters["exact_calls_by_width"].items() if int(w) > 1) > 0, counters
    assert all(len(r["tokens"]) == MAX_TOKENS for r in served)
    total, teacher = len(PROMPTS) * MAX_TOKENS, offline_teacher(tp)
    equal = sum(a == b for s, t in zip(served, teacher) for a, b in zip(s["logprobs"], t["logprobs"]))
    print(f"served INT4 pair + DFlash at TP {tp} ({moe_form}) vs offline INT4 teacher: {equal}/{total} bitwise")
    if moe_form == "off":
        assert equal < total
        return
    assert [r["tokens"] for r in served] == [r["tokens"] for r in teacher]
    assert equal == total
