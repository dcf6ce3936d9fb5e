"""The process behind ``test_series_scope_e2e.py``: ``python series_scope_probe.py CONFIG OUT``.

Runs in the environment the test gives it (the CPU recipe's variables, none of the series: a CPU
slot's binding, the engine core in this process) and writes what it saw as JSON to OUT; the series'
options come in CONFIG (``series_options``: the CPU recipe's) and go into an engine only through its
own config (``additional_config={"xpu_laguna": ...}``). The engine runs first, and its log (workers'
included) ends at :data:`CONFIGS_MARKER`:

* ``configs``: what ``EngineArgs(...).create_engine_config()`` resolves (no engine) for the tiny
  Llama and, as the negative control, for the tiny Laguna, each with the series' options in its
  ``additional_config`` ("series") and then, in the same process, without them ("upstream"), the
  same arguments otherwise (compilation left unset, so vLLM's defaults and the contract's
  compilation rule both apply): each "upstream" config is built right after a "series" one, so it
  shows that a second engine's config does not see the first's options; plus the TP all-reduce
  mode the series' collectives decide under each config (``tp_reduce_mode`` of a 2-rank ``tp``
  group, the worker's call);
* ``engine``: a real engine of the tiny Llama at TP 2 (mp executor: two worker processes, each
  with the plain CPU communicator unless the series takes it over) with the series' options in its
  config, eager, an explicit KV cache dtype and prefix caching on: its resolved cache config and
  options, the same long prompt generated twice (the second run's cached prompt tokens and vLLM's
  prefix-cache counters), and per worker the TP group, the options its config carried, the
  all-reduce modes the series' collectives decided while the engine ran, the series' scope
  decision and the KV cache's element size.

Only vLLM and the standard library are imported (the runtime's python runs it as a file).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

from vllm.xpu_laguna.options import ADDITIONAL_CONFIG_KEY as OPTIONS_KEY

CONFIGS_MARKER = "series scope probe: engine done, configs next"
SERIES_LINE = "XPU Laguna series:"  # how the contract's lines start


def _engine_args(cfg: dict[str, Any], model: str, kv_cache_dtype: str, series: bool) -> dict[str, Any]:
    """The engine's arguments; ``series``: the series' options in its config, else none."""
    return dict(
        model=model,
        dtype="float32",
        seed=0,
        tensor_parallel_size=cfg["tp"],
        distributed_executor_backend="mp",
        kv_cache_dtype=kv_cache_dtype,
        enable_prefix_caching=True,
        max_model_len=cfg["max_model_len"],
        kv_cache_memory_bytes=cfg["kv_cache_bytes"],
        additional_config={OPTIONS_KEY: cfg["series_options"]} if series else {},
    )


def _resolve(cfg: dict[str, Any], model: str, kv_cache_dtype: str, series: bool) -> dict[str, Any]:
    """The resolved settings the series could touch, or the one-line refusal."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.xpu_laguna import collectives as coll

    try:
        config = EngineArgs(**_engine_args(cfg, model, kv_cache_dtype, series)).create_engine_config()
    except ValueError as exc:
        # pydantic wraps the contract's one line: keep that line
        text = " ".join(str(exc).split())
        return {"refused": text[text.find(SERIES_LINE) :].split(" [type=")[0]}
    cc, comp = config.cache_config, config.compilation_config
    mode = coll.tp_reduce_mode("tp:0", cfg["tp"], config).value
    return {
        "enable_prefix_caching": cc.enable_prefix_caching,
        "cache_dtype": cc.cache_dtype,
        "compilation_mode": comp.mode.name if comp.mode is not None else None,
        "cudagraph_mode": comp.cudagraph_mode.name if comp.cudagraph_mode is not None else None,
        "async_scheduling": config.scheduler_config.async_scheduling,
        "tp_reduce_mode": mode,
        "options": (config.additional_config or {}).get(OPTIONS_KEY),
    }


def _configs(cfg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, model in (("llama", cfg["llama"]), ("laguna", cfg["laguna"])):
        for kv in (cfg["kv_cache_dtype"], "auto"):
            key = f"{name}/{kv}"
            out[f"{key}/series"] = _resolve(cfg, model, kv, series=True)
            out[f"{key}/upstream"] = _resolve(cfg, model, kv, series=False)  # next, in the same process
    return out


def _worker_state(worker: Any) -> dict[str, Any]:
    """In a worker: its TP group, the all-reduce mode its communicator was built with (the series'
    decision from the worker's config), the scope its config gives, the series' options its config
    carried into this process, and the element size of its KV cache."""
    from vllm.distributed import get_tp_group
    from vllm.xpu_laguna import collectives as coll
    from vllm.xpu_laguna.graphs import config as series_config

    group = get_tp_group()
    caches = [t for t in getattr(worker.model_runner, "kv_caches", []) if hasattr(t, "element_size")]
    return {
        "tp_group": [group.unique_name, group.world_size],
        "modes": {f"{group.unique_name}/{group.world_size}": coll.group_mode(group).value},
        "series_in_scope": series_config.series_in_scope(worker.vllm_config),
        "options": (worker.vllm_config.additional_config or {}).get(OPTIONS_KEY),
        "kv_cache_element_bytes": sorted({t.element_size() for t in caches}),
        "kv_cache_torch_dtypes": sorted({str(t.dtype) for t in caches}),
    }


def _engine(cfg: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    start = time.monotonic()
    llm = LLM(
        **_engine_args(cfg, cfg["llama"], cfg["kv_cache_dtype"], series=True),
        enforce_eager=True,  # the compilation modes are compared on the configs above
        disable_log_stats=False,
    )
    try:
        resolved = llm.llm_engine.vllm_config
        params = SamplingParams(temperature=0.0, max_tokens=cfg["max_tokens"], ignore_eos=True)
        runs = []
        for _ in range(2):  # the same prompt twice: the second finds the first one's blocks
            out = llm.generate([cfg["prompt"]], params, use_tqdm=False)[0]
            runs.append(
                {
                    "prompt_tokens": len(out.prompt_token_ids or []),
                    "token_ids": list(out.outputs[0].token_ids),
                    "cached_tokens": int(out.num_cached_tokens or 0),
                }
            )
        counters = {
            m.name.removesuffix("_total"): float(m.value)
            for m in llm.get_metrics()
            if "prefix_cache" in m.name and isinstance(getattr(m, "value", None), (int, float))
        }
        workers = llm.llm_engine.collective_rpc(_worker_state)
        return {
            "enable_prefix_caching": resolved.cache_config.enable_prefix_caching,
            "cache_dtype": resolved.cache_config.cache_dtype,
            "block_size": resolved.cache_config.block_size,
            "options": (resolved.additional_config or {}).get(OPTIONS_KEY),
            "runs": runs,
            "prefix_cache_counters": counters,
            "workers": workers,
            "seconds": time.monotonic() - start,
        }
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def main(argv: list[str]) -> int:
    """The engine first (its log, up to :data:`CONFIGS_MARKER`, is the Llama's alone), then the
    configs, the Laguna control among them."""
    cfg = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result = {"engine": _engine(cfg)}
    print(CONFIGS_MARKER, flush=True)  # in the log stream (vLLM logs to stdout)
    result["configs"] = _configs(cfg)
    Path(argv[1]).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
