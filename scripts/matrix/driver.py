"""The matrix's driver: each leg a fresh engine in its own process (``python -m scripts.matrix
leg``), then the verdicts and the report."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scripts.matrix.evaluate import evaluate
from scripts.matrix.graphs import GraphExpectation, decoder_topology
from scripts.matrix.legs import ALL_LEGS, device_kind, long_context_prompt, make_prompts, rollover_prompt
from scripts.matrix.preloaded import PreloadedInterpreter, leg_start
from scripts.matrix.report import finish, series_info
from scripts.matrix.runner import run_legs


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
            # V2's DFlash drafter runs eagerly under PIECEWISE (docs/rebase/0.32.0-to-0.34.0.md)
            drafter_wrapped=False,
            min_replays=args.min_graph_replays,
        )
        for tp, (target, draft) in models.items()
    }


def models_by_tp(args: argparse.Namespace, tps: set[int]) -> dict[int, tuple[str, str]]:
    """Target and drafter folders per TP size: ``--model-dir``/``--draft-dir`` at every size
    (``validate_run`` checked that they split), or with ``--tiny`` the first tiny variant built
    for the size (:func:`scripts.tiny_laguna.variant_for_tp`), generated unless it is there
    already (:func:`scripts.tiny_laguna.ensure_models`)."""
    if not args.tiny:
        return {tp: (args.model_dir, args.draft_dir) for tp in sorted(tps)}
    from scripts.tiny_laguna import ensure_models, variant_dir, variant_for_tp

    out = {}
    for tp in sorted(tps):
        variant = variant_for_tp(tp)
        target, draft = ensure_models(variant_dir(Path(args.tiny), variant), variant=variant.name)
        out[tp] = (str(target), str(draft))
    return out


def drive(args: argparse.Namespace) -> int:
    """Run the legs, evaluate them, write the report; the exit status (``validate_run`` checked
    the options)."""
    device = device_kind()
    series = series_info()  # fail early, before any engine runs
    try:
        start = leg_start(args.leg_start, device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # started now: vLLM's imports overlap with the tiny models and the prompts
    with PreloadedInterpreter() if start == "preloaded" else contextlib.nullcontext() as interpreter:
        return _drive(args, device, series, interpreter)


def _drive(
    args: argparse.Namespace, device: str, series: dict[str, Any], interpreter: PreloadedInterpreter | None
) -> int:
    names = [n.strip() for n in args.legs.split(",") if n.strip()]
    known = {leg.name: leg for leg in ALL_LEGS}
    legs = tuple(known[n] for n in names)  # validate_run checked them
    models = models_by_tp(args, {leg.tp_size(args.tp) for leg in legs})
    prompts = make_prompts(args.prompts, args.max_tokens, args.seed)
    target = next(iter(models.values()))[0]  # every tiny variant has the same tokenizer
    prompts[0] = rollover_prompt(target, prompts[0])
    if args.long_prompt_tokens > 0:
        spec = long_context_prompt(target, args.long_prompt_tokens, args.max_tokens, args.seed)
        if spec.max_tokens + args.long_prompt_tokens + 64 > args.max_model_len:
            print(
                f"error: --max-model-len {args.max_model_len} cannot hold the long-context prompt "
                f"(>= {args.long_prompt_tokens} tokens + {spec.max_tokens} generated)",
                file=sys.stderr,
            )
            return 2
        prompts.append(spec)
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    started = time.monotonic()
    configs = {}
    for leg in legs:
        if leg.graph and device == "cpu" and args.no_emulated_graphs:
            continue  # reported as not run
        target, draft = models[leg.tp_size(args.tp)]
        configs[leg.name] = {
            "leg": asdict(leg),
            "target": target,
            "draft": draft,
            "method": args.method,
            "dtype": dtype,
            "tp": leg.tp_size(args.tp),
            # the series' options of the leg's engine (its additional_config), never its environment
            "options": leg.options(args.tp, args.series_options),
            "max_model_len": args.max_model_len,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "kv_cache_memory_bytes": args.kv_cache_bytes if device == "cpu" else None,
            "kv_cache_dtype": args.kv_cache_dtype,
            "cpu_flash_attn": device == "cpu",
            # a graph leg asks for emulated graphs in its engine's config, which every rank gets
            "emulate_graphs": device == "cpu",
            "fault": args.inject_fault,
            "mutation": leg.mutation,
            "prompts": [asdict(p) for p in prompts],
        }
    outputs = run_legs(legs, configs, args, device, Path(args.report), interpreter=interpreter)
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
        series_options=args.series_options,
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
