"""A served CPU leg runs the series' attention path, proven from the server's own log.

A CPU ``vllm serve`` resolves attention to upstream's ``CPU_ATTN``; the tooling puts a vLLM
general plugin on the server's ``PYTHONPATH`` (``scripts/measure/series_attention``) that
registers FlashAttention (reference kernels) under ``CPU_ATTN`` in every vLLM process of the
server and logs the overlay's own exact-verify counters. One server is started the way the
crossover starts its legs (``python -m vllm.entrypoints.openai.api_server`` on loopback, clean
environment), with the tiny Laguna target, DFlash speculation (M=8), exact verify on and
prebuilt metadata on; a few greedy completions go through it, then its log must show:

* the plugin's registration line, in the API server and in the engine core;
* the overlay's own ``info_once`` lines: exact verify ON (kernel seam: reference), prebuilt
  metadata ON;
* the overlay's counters as the engine core's plugin thread logged them: M=8 verify calls > 0
  and prebuilt-metadata uses == all verify calls of width > 1 (> 0).

Negative control: the same server without the plugin folder runs upstream's CPU attention: the
completions still come back, and none of the overlay's lines nor any counters are in its log.
Each server runs under a time limit and is stopped (its own process group only).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scripts.measure import client
from scripts.measure.emulation import logged_counters, series_attention_env, settled_counters
from scripts.measure.series_attention.xpu_laguna_cpu_attention import COUNTERS_LINE, REGISTERED_LINE
from scripts.measure.server import HOST, Server, base_env, free_port, serve_argv
from scripts.tiny_laguna import TinyModels

NUM_SPECULATIVE_TOKENS = 7  # M = 8
MAX_TOKENS = 48
READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 300.0
COUNTERS_WAIT_S = 10.0
TOGGLES = {
    "VLLM_XPU_LAGUNA_EXACT_VERIFY": "1",
    "VLLM_XPU_LAGUNA_VERIFY_WIDTH": str(NUM_SPECULATIVE_TOKENS + 1),
    "VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA": "1",
}
EXACT_ON = "XPU Laguna exact verify: ON"
PREBUILT_ON = "XPU Laguna prebuilt exact-verify metadata: ON"
SERVER_ARGS = "--dtype float32 --enforce-eager --kv-cache-memory-bytes 268435456 --max-model-len 512 --max-num-seqs 1"


@dataclass
class Served:
    log: str
    token_ids: list[list[int]]
    accepted: int
    ready_s: float
    total_s: float


def _serve(models: TinyModels, prompts: tuple[str, ...], out: Path, name: str, hook: bool) -> Served:
    env = base_env()
    env.update({"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "INFO", **TOGGLES})
    if hook:
        env.update(series_attention_env())
    spec = {"method": "dflash", "model": str(models.draft), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    extra = [*SERVER_ARGS.split(), "--speculative-config", json.dumps(spec)]
    port = free_port()
    log_path = out / f"server-{name}.log"
    start = time.monotonic()
    token_ids: list[list[int]] = []
    with Server(serve_argv(sys.executable, str(models.target), port, extra), env, log_path, port) as server:
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
        spec_counters = client.scrape(HOST, port).spec
        if hook:  # the plugin thread logs every 0.5 s: wait for the last verify calls
            settled_counters(log_path, COUNTERS_WAIT_S)
    return Served(
        log=log_path.read_text(encoding="utf-8", errors="replace"),
        token_ids=token_ids,
        accepted=spec_counters.accepted_tokens if spec_counters else 0,
        ready_s=ready_s,
        total_s=time.monotonic() - start,
    )


@pytest.fixture(scope="module")
def prompts(e2e: Any) -> tuple[str, ...]:
    return e2e.spec_prompts + e2e.parity_prompts[:2]


@pytest.fixture(scope="module")
def served(
    tiny_models: TinyModels, prompts: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory, e2e: Any
) -> Iterator[Served]:
    run = _serve(tiny_models, prompts, tmp_path_factory.mktemp("served"), "series", hook=True)
    e2e.measured["served CPU leg with the series' attention"] = (
        f"ready after {run.ready_s:.0f} s, {len(prompts)} completions x {MAX_TOKENS} tokens, {run.total_s:.0f} s in all"
    )
    yield run


def test_served_cpu_leg_runs_the_series_attention(served: Served, prompts: tuple[str, ...], e2e: Any) -> None:
    assert all(len(ids) == MAX_TOKENS for ids in served.token_ids)
    pids = set(re.findall(rf"{re.escape(REGISTERED_LINE)} \(pid (\d+)\)", served.log))
    assert len(pids) >= 3, pids  # API server, engine core, worker
    assert f"{EXACT_ON} (verify widths 2..{NUM_SPECULATIVE_TOKENS + 1}" in served.log
    assert "kernel seam: reference" in served.log
    assert PREBUILT_ON in served.log
    counters = logged_counters(served.log)
    assert counters is not None, "no exact-verify counters in the server log"
    calls = {int(w): n for w, n in counters["exact_calls_by_width"].items()}
    assert calls.get(NUM_SPECULATIVE_TOKENS + 1, 0) > 0, calls
    verify_calls = sum(n for w, n in calls.items() if w > 1)
    assert counters["prebuilt_calls"] == verify_calls > 0, counters
    assert served.accepted > 0, "no drafted token accepted"
    e2e.measured["served CPU leg, overlay counters from the log"] = (
        f"exact-path layer calls by width {dict(sorted(calls.items()))}, prebuilt {counters['prebuilt_calls']}, "
        f"accepted {served.accepted} drafted tokens"
    )


def test_without_the_plugin_the_server_runs_upstream_cpu_attention(
    tiny_models: TinyModels, prompts: tuple[str, ...], served: Served, tmp_path: Path, e2e: Any
) -> None:
    plain = _serve(tiny_models, prompts, tmp_path, "upstream", hook=False)
    e2e.measured["served CPU leg without the plugin (negative control)"] = (
        f"ready after {plain.ready_s:.0f} s, {plain.total_s:.0f} s in all"
    )
    assert all(len(ids) == MAX_TOKENS for ids in plain.token_ids)
    # EXACT_ON is not among them: the row-invariant forms of patch 0011 read the exact-verify
    # width too (and log that line) whichever attention backend runs; the registration, the
    # attention counters and the prebuilt metadata builder's line are attention-only
    for line in (REGISTERED_LINE, COUNTERS_LINE, PREBUILT_ON):
        assert line not in plain.log, line
        assert line in served.log, line  # the same markers are there with the plugin
