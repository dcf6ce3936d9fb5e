"""The matrix's driver: each leg a fresh engine in its own process (``python -m scripts.matrix
leg``), then the verdicts and the report."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scripts.matrix.evaluate import evaluate
from scripts.matrix.graphs import GraphExpectation, decoder_topology
from scripts.matrix.legs import ALL_LEGS, NOT_RUN_NO_GRAPHS, Leg, device_kind, long_context_prompt, make_prompts
from scripts.matrix.report import finish, series_info


def _num_layers(model_dir: str) -> int:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config = config.get("text_config", config)
    return int(config["num_hidden_layers"])


def _graph_expectation(
    models: dict[int, tuple[str, str]], args: argparse.Namespace
) -> dict[int, GraphExpectation] | None:
    """Expected topology per TP size from the config files of the models run at that size (not
    from the code under test)."""
    if args.method != "dflash":
        return None
    return {
        tp: GraphExpectation(
            target=decoder_topology(_num_layers(target), tp),
            drafter=decoder_topology(_num_layers(draft), tp),
            min_replays=args.min_graph_replays,
        )
        for tp, (target, draft) in models.items()
    }


def models_by_tp(args: argparse.Namespace, tps: set[int]) -> dict[int, tuple[str, str]]:
    """Target and drafter folders per TP size: ``--model-dir``/``--draft-dir`` at every size
    (``validate_run`` checked that they split), or with ``--tiny`` the first tiny variant built
    for the size (:func:`scripts.tiny_laguna.variant_for_tp`), each variant generated once."""
    if not args.tiny:
        return {tp: (args.model_dir, args.draft_dir) for tp in sorted(tps)}
    from scripts.tiny_laguna import generate, variant_dir, variant_for_tp

    made: dict[str, tuple[str, str]] = {}
    out = {}
    for tp in sorted(tps):
        variant = variant_for_tp(tp)
        if variant.name not in made:
            models = generate(variant_dir(Path(args.tiny), variant), variant=variant.name)
            made[variant.name] = (str(models.target), str(models.draft))
        out[tp] = made[variant.name]
    return out


def leg_environment(leg: Leg, default_tp: int, device: str, base: dict[str, str]) -> dict[str, str]:
    """The leg process's environment. On CPU the engine runs in-process (the backend override
    applies); past TP 1 the ranks are worker processes of vLLM's mp executor, so the series'
    attention (and for a graph leg the graph emulation) is installed in each of them through
    the hooks a CPU server uses (:func:`scripts.measure.emulation.server_hooks_env`)."""
    env = {**base, **leg.env(default_tp)}
    if device != "cpu":
        return env
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if leg.tp_size(default_tp) > 1:
        from scripts.measure.emulation import server_hooks_env

        hooks = server_hooks_env(series_attention=True, emulate_graphs=leg.graph)
        if base.get("PYTHONPATH"):
            hooks["PYTHONPATH"] = os.pathsep.join((hooks["PYTHONPATH"], base["PYTHONPATH"]))
        env.update(hooks)
    return env


def drive(args: argparse.Namespace) -> int:
    """Run the legs, evaluate them, write the report; the exit status (``validate_run`` checked
    the options)."""
    device = device_kind()
    series = series_info()  # fail early, before any engine runs
    names = [n.strip() for n in args.legs.split(",") if n.strip()]
    known = {leg.name: leg for leg in ALL_LEGS}
    legs = tuple(known[n] for n in names)  # validate_run checked them
    models = models_by_tp(args, {leg.tp_size(args.tp) for leg in legs})
    prompts = make_prompts(args.prompts, args.max_tokens, args.seed)
    if args.long_prompt_tokens > 0:
        # every tiny variant has the same tokenizer
        spec = long_context_prompt(next(iter(models.values()))[0], args.long_prompt_tokens, args.max_tokens, args.seed)
        if spec.max_tokens + args.long_prompt_tokens + 64 > args.max_model_len:
            print(
                f"error: --max-model-len {args.max_model_len} cannot hold the long-context prompt "
                f"(>= {args.long_prompt_tokens} tokens + {spec.max_tokens} generated)",
                file=sys.stderr,
            )
            return 2
        prompts.append(spec)
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    outputs: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    for number, leg in enumerate(legs, 1):
        if leg.graph and device == "cpu" and args.no_emulated_graphs:
            outputs[leg.name] = {"status": NOT_RUN_NO_GRAPHS}
            print(f"==> [{number}/{len(legs)}] {leg.name}: {NOT_RUN_NO_GRAPHS}", file=sys.stderr)
            continue
        target, draft = models[leg.tp_size(args.tp)]
        config = {
            "leg": asdict(leg),
            "target": target,
            "draft": draft,
            "method": args.method,
            "dtype": dtype,
            "tp": leg.tp_size(args.tp),
            "max_model_len": args.max_model_len,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "kv_cache_memory_bytes": args.kv_cache_bytes if device == "cpu" else None,
            "cpu_flash_attn": device == "cpu",
            # past TP 1 the graph hook of the leg's environment installs it in every process
            "emulate_graphs": device == "cpu" and leg.tp_size(args.tp) == 1,
            "fault": args.inject_fault,
            "mutation": leg.mutation,
            "prompts": [asdict(p) for p in prompts],
        }
        with tempfile.TemporaryDirectory(prefix="vxl-leg-") as tmp:
            cfg, out = Path(tmp) / "config.json", Path(tmp) / "out.json"
            cfg.write_text(json.dumps(config))
            env = leg_environment(leg, args.tp, device, dict(os.environ))
            print(
                f"==> [{number}/{len(legs)}] {leg.name}: fresh engine, TP {leg.tp_size(args.tp)}, "
                f"{len(prompts)} prompts, {' '.join(f'{k}={v}' for k, v in leg.env(args.tp).items())}",
                file=sys.stderr,
                flush=True,
            )
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "scripts.matrix", "leg", str(cfg), str(out)], env=env, check=False
            )
            print(f"    {leg.name} took {time.monotonic() - t0:.1f}s (exit {proc.returncode})", file=sys.stderr)
            outputs[leg.name] = (
                json.loads(out.read_text())
                if proc.returncode == 0 and out.exists()
                else {"status": f"error: leg process exited {proc.returncode}"}
            )
    for name in sorted({leg.teacher for leg in legs if leg.speculative} | {"teacher"} & set(names)):
        if "rows" not in outputs.get(name, {}):
            print(f"error: the teacher leg {name} did not run: {outputs.get(name)}", file=sys.stderr)
            return 1
    long_ones = frozenset(i for i, p in enumerate(prompts) if p.role == "long-context")
    results = evaluate(
        outputs,
        legs,
        len(prompts),
        require_bitwise=device == "cpu",
        long_context=long_ones,
        graph_expectation=_graph_expectation(models, args),
        default_tp=args.tp,
    )
    return finish(
        Path(args.report),
        device=device,
        series=series,
        method=args.method,
        dtype=dtype,
        prompts=prompts,
        outputs=outputs,
        results=results,
        started=started,
        models=models,
    )
