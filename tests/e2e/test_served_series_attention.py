"""Without the series-attention plugin a served CPU leg runs upstream's CPU attention (the negative
control of the served-attention proof).

A CPU ``vllm serve`` resolves attention to upstream's ``CPU_ATTN``; the tooling puts a vLLM
general plugin on the server's ``PYTHONPATH`` (``scripts/measure/series_attention``) that
registers FlashAttention (reference kernels) under ``CPU_ATTN`` in every vLLM process of the
server and logs the overlay's own exact-verify counters. The positive half runs on the recipe
server of ``test_recipe_serve_load.py`` (the plugin on, as docs/serving.md starts it): its log
must show the plugin's registration in the API server, the engine core and the worker, the
overlay's ``info_once`` lines and the counters.

Here one server is started the way the crossover starts its legs (``python -m
vllm.entrypoints.openai.api_server`` on loopback, clean environment, the series' options as
``--additional-config``) with the tiny Laguna target, DFlash speculation (M=8), exact verify and
prebuilt metadata on, but WITHOUT the plugin folder:
the completions still come back, and none of the plugin's or the attention's lines nor any
counters are in its log. It runs under a time limit and is stopped (its own process group only).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from served_markers import PREBUILT_ON

from scripts.cpu_slots import cpu_lease
from scripts.measure import client
from scripts.measure.series_attention.xpu_laguna_cpu_attention import COUNTERS_LINE, REGISTERED_LINE
from scripts.measure.server import HOST, Server, base_env, free_port, serve_argv
from scripts.series_options import server_args
from scripts.tiny_laguna import TinyModels

NUM_SPECULATIVE_TOKENS = 7  # M = 8
MAX_TOKENS = 48
READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 300.0
OPTIONS = {"exact_verify": True, "verify_width": NUM_SPECULATIVE_TOKENS + 1, "prebuilt_metadata": True}
"""The series' options of the server (its ``--additional-config``)."""
SERVER_ARGS = "--dtype float32 --enforce-eager --kv-cache-memory-bytes 268435456 --max-model-len 512 --max-num-seqs 1"


@dataclass
class Served:
    log: str
    token_ids: list[list[int]]
    ready_s: float
    total_s: float


def _serve(models: TinyModels, prompts: tuple[str, ...], out: Path, name: str) -> Served:
    """One server WITHOUT the plugin folder, the prompts one after another through it."""
    env = base_env()
    env.update({"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    spec = {"method": "dflash", "model": str(models.draft), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    extra = [*SERVER_ARGS.split(), "--speculative-config", json.dumps(spec), *server_args(OPTIONS)]
    port = free_port()
    log_path = out / f"server-{name}.log"
    start = time.monotonic()
    token_ids: list[list[int]] = []
    with (
        cpu_lease(f"e2e server {name}") as lease,
        Server(
            serve_argv(sys.executable, str(models.target), port, extra), {**env, **lease.env()}, log_path, port
        ) as server,
    ):
        ready_s = server.wait_ready(READY_TIMEOUT_S)
        for prompt in prompts:
            body = {
                "model": "model",
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "stream": True,
                "return_token_ids": True,
                "ignore_eos": True,
                "seed": 0,
            }
            result = client.stream_completion(HOST, port, body, REQUEST_TIMEOUT_S)
            assert result.error is None, f"{name}: {result.error} (log {server.log_tail()})"
            token_ids.append(result.token_ids)
    return Served(
        log=log_path.read_text(encoding="utf-8", errors="replace"),
        token_ids=token_ids,
        ready_s=ready_s,
        total_s=time.monotonic() - start,
    )


@pytest.fixture(scope="module")
def prompts(e2e: Any) -> tuple[str, ...]:
    return e2e.spec_prompts + e2e.parity_prompts[:2]


def test_without_the_plugin_the_server_runs_upstream_cpu_attention(
    tiny_models: TinyModels, prompts: tuple[str, ...], tmp_path: Path, e2e: Any
) -> None:
    plain = _serve(tiny_models, prompts, tmp_path, "upstream")
    e2e.measured["served CPU leg without the plugin (negative control)"] = (
        f"ready after {plain.ready_s:.0f} s, {plain.total_s:.0f} s in all"
    )
    assert all(len(ids) == MAX_TOKENS for ids in plain.token_ids)
    # EXACT_ON is not among them: the row-invariant forms of patch 0011 read the exact-verify
    # width too (and log that line) whichever attention backend runs; the registration, the
    # attention counters and the prebuilt metadata builder's line are attention-only
    for line in (REGISTERED_LINE, COUNTERS_LINE, PREBUILT_ON):  # on the recipe server's log all three are there
        assert line not in plain.log, line
