"""The series leaves a model it was not made for as upstream has it (issue 29, item 3).

A tiny random Llama (``scripts.tiny_llama``) is served by a real vLLM engine at TP 2 (mp executor:
two worker processes on one CPU slot) with the CPU recipe's series options in its config
(``additional_config["xpu_laguna"]``, as ``recipes/cpu-tiny.yaml`` has them; the environment is the
recipe's env file read as a shell reads it, which sets no series variable), prefix caching asked for
and an FP8 KV cache (``fp8``: the CPU attention backend takes it on AVX-512/AMX hosts; the series
refuses it on its exact path). It runs in its own process (``series_scope_probe.py``) and must show:

* the engine's resolved config as asked: prefix caching on, KV cache dtype ``fp8`` (1-byte cache
  elements in both workers), the options carried into both workers by the config; the same prompt
  run twice finds its prefix cached the second time;
* the all-reduce of the TP group decided ``plain`` in both workers while the engine ran (the
  series' collectives cache one mode per group that reduced through the CPU communicator), no
  "all-reduce of group ... runs as" line, and the series' scope decided False there;
* no line of the series' contract except its "inactive for LlamaForCausalLM" note;
* tokens come out;
* the configuration vLLM resolves with the options equal to the one it resolves without them,
  for ``fp8`` and ``auto`` KV caches, compilation modes left to vLLM's defaults (the contract's
  compilation rule would set NONE), all-reduce mode included.

Negative control, in the same process and without a second engine: the same comparison for the
tiny Laguna (same arguments, same environment) must find the series acting: the FP8 KV cache
refused in one line, and with ``auto`` prefix caching turned off and the TP all-reduce decided
``rank-order`` (the mode the workers' communicator would then take). And the options stay with the
engine whose config has them: each config without them is built right after one with them, in the
same process (the series' Llama engine and the Laguna configs already ran there), and is upstream's
(prefix caching on, the all-reduce plain, no options).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from series_scope_probe import CONFIGS_MARKER

from scripts import REPO_ROOT, procs
from scripts.cpu_slots import cpu_lease
from scripts.layout import Layout
from scripts.measure.server import base_env
from scripts.recipe import RECIPE_DIR, cpu_tiny_recipe, shell_env
from scripts.series_options import ENV_PREFIX, OPTIONS_KEY
from scripts.tiny_llama import ARCHITECTURE, ensure_model

PROBE = Path(__file__).with_name("series_scope_probe.py")
RECIPE_ENV = RECIPE_DIR / "cpu-tiny.env"
TP = 2
KV_CACHE_DTYPE = "fp8"
WORD = " lagoon"  # one token of the tiny tokenizer per repetition
PROMPT = "The lagoon:" + WORD * 300  # several KV blocks of any CPU block size up to 256
MAX_TOKENS = 16
TIMEOUT_S = 600.0
INACTIVE_LINE = f"XPU Laguna series: inactive for {ARCHITECTURE}"
SERIES_LINE = "XPU Laguna series:"
REDUCE_LINE = "all-reduce of group"


SERIES_OPTIONS = cpu_tiny_recipe().additional_config[OPTIONS_KEY]
"""The CPU recipe's series options: what the series' engine and configs get in their config."""


def series_effects(series: dict[str, Any], upstream: dict[str, Any]) -> list[str]:
    """What the series changed in a resolved configuration against upstream's (the same
    arguments, no series options): its refusal, or one entry per setting that differs (the
    options themselves left out: they are the difference asked for)."""
    if "refused" in upstream:
        raise AssertionError(f"upstream refused the configuration: {upstream['refused']}")
    if "refused" in series:
        return [f"refused: {series['refused']}"]
    assert series.get("options") == SERIES_OPTIONS and upstream.get("options") is None, (series, upstream)
    return [
        f"{key}: {upstream.get(key)} -> {value}"
        for key, value in series.items()
        if key != "options" and upstream.get(key) != value
    ]


@pytest.fixture(scope="module")
def probe(recipe_models: Path, tmp_path_factory: pytest.TempPathFactory, e2e: Any) -> dict[str, Any]:
    llama = ensure_model(Layout(REPO_ROOT, build_dir=REPO_ROOT / "build").tiny_llama, recipe_models / "target")
    out = tmp_path_factory.mktemp("series_scope")
    config = {
        "llama": str(llama),
        "laguna": str(recipe_models / "target"),
        "tp": TP,
        "kv_cache_dtype": KV_CACHE_DTYPE,
        "max_model_len": 512,
        "kv_cache_bytes": 64 << 20,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "series_options": SERIES_OPTIONS,
    }
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    recipe = shell_env(RECIPE_ENV)
    assert not any(key.startswith(ENV_PREFIX) for key in recipe)  # the options travel in each engine's config
    assert SERIES_OPTIONS["exact_verify"] is True and SERIES_OPTIONS["exact_tp_reduce"] is True
    with cpu_lease("e2e series scope (TP 2)") as lease, (out / "probe.log").open("wb") as sink:
        env = {**base_env(), **recipe, **lease.env(TP)}
        env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "INFO"})
        done = procs.run(  # one stream, in order: the engine's part ends at the probe's marker
            [sys.executable, str(PROBE), str(out / "config.json"), str(out / "result.json")],
            env=env,
            cwd=REPO_ROOT,
            timeout_s=TIMEOUT_S,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    log = (out / "probe.log").read_text(encoding="utf-8", errors="replace")
    assert done.returncode == 0, f"probe exit {done.returncode} after {done.seconds:.0f} s:\n{log[-6000:]}"
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    engine_log, marker, _ = log.partition(CONFIGS_MARKER)
    assert marker, f"no end-of-engine marker in the probe's log:\n{log[-3000:]}"
    result["engine_log"] = engine_log
    result["seconds"] = done.seconds
    return result


def test_engine_keeps_what_it_was_asked(probe: dict[str, Any], e2e: Any) -> None:
    engine = probe["engine"]
    assert engine["enable_prefix_caching"] is True
    assert engine["cache_dtype"] == KV_CACHE_DTYPE
    assert engine["options"] == SERIES_OPTIONS
    workers = engine["workers"]
    assert len(workers) == TP
    for rank in workers:
        assert rank["kv_cache_element_bytes"] == [1], rank  # FP8 cache (float32 model: 4 bytes)
        assert rank["options"] == SERIES_OPTIONS, rank  # the config carried them into the worker
    first, second = engine["runs"]
    assert first["prompt_tokens"] > 300 and first["cached_tokens"] == 0
    assert second["cached_tokens"] >= engine["block_size"], (second, engine["block_size"])
    assert len(first["token_ids"]) == MAX_TOKENS and second["token_ids"] == first["token_ids"]
    hits = engine["prefix_cache_counters"].get("vllm:prefix_cache_hits")
    if hits is not None:
        assert hits >= second["cached_tokens"], engine["prefix_cache_counters"]
    e2e.measured["series scope e2e, tiny Llama TP 2 (recipe options set)"] = (
        f"prefix caching {engine['enable_prefix_caching']}, KV {engine['cache_dtype']} "
        f"({workers[0]['kv_cache_torch_dtypes']}), cached on repeat {second['cached_tokens']}/"
        f"{second['prompt_tokens']} tokens, counters {engine['prefix_cache_counters']}, "
        f"all-reduce {[w['modes'] for w in workers]}, {len(first['token_ids'])} tokens; "
        f"engine {engine['seconds']:.1f} s, probe {probe['seconds']:.1f} s"
    )


def test_tp_all_reduce_is_the_plain_one(probe: dict[str, Any]) -> None:
    log = probe["engine_log"]
    for rank in probe["engine"]["workers"]:
        name, world = rank["tp_group"]
        assert world == TP
        # the series' collectives saw the TP group's all-reduces and left them plain
        assert rank["modes"] == {f"{name}/{TP}": "plain"}, rank
        assert rank["series_in_scope"] is False, rank
    assert REDUCE_LINE not in log


def test_contract_leaves_the_llama_alone(probe: dict[str, Any]) -> None:
    log = probe["engine_log"]
    assert INACTIVE_LINE in log
    lines = [line for line in log.splitlines() if SERIES_LINE in line]
    assert lines and all(INACTIVE_LINE in line for line in lines), lines
    configs = probe["configs"]
    for kv in (KV_CACHE_DTYPE, "auto"):
        series, upstream = configs[f"llama/{kv}/series"], configs[f"llama/{kv}/upstream"]
        assert series_effects(series, upstream) == [], (kv, series, upstream)
        assert series["enable_prefix_caching"] is True and series["cache_dtype"] == kv
        assert series["tp_reduce_mode"] == "plain"


def test_negative_control_the_same_check_finds_the_series_on_laguna(probe: dict[str, Any], e2e: Any) -> None:
    configs = probe["configs"]
    refused = series_effects(configs[f"laguna/{KV_CACHE_DTYPE}/series"], configs[f"laguna/{KV_CACHE_DTYPE}/upstream"])
    assert len(refused) == 1 and "FP8 KV is not token-exact" in refused[0], refused
    effects = series_effects(configs["laguna/auto/series"], configs["laguna/auto/upstream"])
    assert "enable_prefix_caching: True -> False" in effects, effects
    assert "tp_reduce_mode: plain -> rank-order" in effects, effects
    e2e.measured["series scope e2e, negative control (tiny Laguna configs)"] = "; ".join(refused + effects)


def test_a_second_engine_does_not_see_the_firsts_options(probe: dict[str, Any]) -> None:
    """Each config without options was built in the process where the series' Llama engine ran and
    right after the same config with the options: it is upstream's, for the Laguna too (whose
    series config above is refused or changed)."""
    configs = probe["configs"]
    for name in ("llama", "laguna"):
        for kv in (KV_CACHE_DTYPE, "auto"):
            upstream = configs[f"{name}/{kv}/upstream"]
            assert "refused" not in upstream, (name, kv, upstream)
            assert upstream["options"] is None, (name, kv, upstream)
            assert upstream["enable_prefix_caching"] is True and upstream["cache_dtype"] == kv, (name, kv, upstream)
            assert upstream["tp_reduce_mode"] == "plain", (name, kv, upstream)
