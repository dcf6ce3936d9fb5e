"""The crossover harness end to end on CPU: five fresh ``vllm serve`` processes (A1, B1, B2, A2,
teacher) against the tiny Laguna with ngram drafting, then analysis, record, raw artifacts and
``verify-record`` from the raw rows. The treatment is one of the series' options
(``xpu_laguna.exact_verify``): each leg's server gets it in its ``--additional-config``, and the
record names it as the sole difference. Throughput numbers are meaningless here; every step, file
and check is exercised. Takes several minutes (five server start-ups)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from scripts.measure.cli import verify_record
from scripts.tiny_laguna import TinyModels
from tests.tool_run import run_module

PROMPTS = 3
TOKENS = 32

pytestmark = pytest.mark.ci  # CI only (nox -s cpu_tests_ci): tests/e2e/conftest.py CI_ONLY


def test_crossover_end_to_end(tiny_models: TinyModels, tmp_path: Path) -> None:
    out = tmp_path / "run"
    plot = importlib.util.find_spec("matplotlib") is not None
    command = [
        "crossover",
        "--treatment",
        "xpu_laguna.exact_verify=true",
        "--control",
        "xpu_laguna.exact_verify=false",
        "--env",
        "HF_HUB_OFFLINE=1",
        "--model",
        str(tiny_models.target),
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}',
        "--prompts",
        str(PROMPTS),
        "--max-tokens",
        str(TOKENS),
        "--window",
        str(TOKENS),
        "--prompt-tokens",
        "16",
        "--long-prompt-tokens",
        "200",
        "--rollover-at",
        "32",  # the tiny target's sliding window
        "--server-args",
        "--dtype float32 --enforce-eager --kv-cache-memory-bytes 268435456 --max-model-len 1024 --max-num-seqs 1",
        "--prior-tok-s",
        "1.0",
        "--out",
        str(out),
    ] + ([] if plot else ["--no-plot"])
    done = run_module("scripts.measure", *command, timeout=1700)  # its servers' groups go with it
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "record.json").read_text())
    rows = {leg: (out / f"rows-{leg}.jsonl").read_text().splitlines() for leg in ("A1", "B1", "B2", "A2", "teacher")}
    assert all(len(lines) == PROMPTS for lines in rows.values())
    first = json.loads(rows["B1"][0])
    assert len(first["token_ids"]) == TOKENS and len(first["token_times_s"]) == TOKENS
    assert first["requests_before"] == 0  # no warm-up generation on a fresh server
    assert first["cached_tokens"] == 0
    assert first["spec_after"]["drafts"] > first["spec_before"]["drafts"]
    quality = record["quality"]
    # ngram drafting is lossless: every leg must reproduce the non-speculative teacher
    assert quality["teacher_exact"] == f"{4 * PROMPTS}/{4 * PROMPTS}"
    assert quality["cross_leg_exact"] == f"{3 * PROMPTS}/{3 * PROMPTS}"
    assert quality["cached_tokens_zero"] == f"{4 * PROMPTS}/{4 * PROMPTS}"
    assert quality["rollover"] == "4/4"
    assert quality["no_warmup_generation"] and quality["single_active_generation"]
    assert record["metric"] == f"median_tok_s_1_{TOKENS}_after_ttft"
    assert set(record["sha256"]) == set(record["artifacts"])
    if plot:
        assert (out / "crossover.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert verify_record([str(out / "record.json")]) == 0
    treatment = record["treatment"]
    assert treatment["sole_difference"] == "xpu_laguna.exact_verify"
    assert (treatment["control_value"], treatment["candidate_value"]) == (False, True)
    manifest = json.loads((out / "run.json").read_text())
    for leg, exact in (("A1", False), ("B1", True), ("B2", True), ("A2", False), ("teacher", False)):
        argv = manifest["servers"][leg]["argv"]
        options = json.loads(argv[argv.index("--additional-config") + 1])
        assert options == {"xpu_laguna": {"exact_verify": exact}}, (leg, argv)
        assert not any(k.startswith("VLLM_XPU_LAGUNA_") for k in manifest["environments"][leg])
