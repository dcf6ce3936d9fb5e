"""The matrix's driver: each leg a fresh engine in its own process (``python -m scripts.matrix
leg``), then the verdicts and the report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from scripts.matrix.evaluate import evaluate
from scripts.matrix.graphs import GraphExpectation, decoder_topology
from scripts.matrix.legs import LEGS, device_kind, long_context_prompt, make_prompts
from scripts.matrix.report import finish, series_info
from scripts.matrix.runner import run_legs


def _num_layers(model_dir: str) -> int:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config = config.get("text_config", config)
    return int(config["num_hidden_layers"])


def _graph_expectation(
    target: str, draft: str, args: argparse.Namespace, tps: set[int]
) -> dict[int, GraphExpectation] | None:
    """Expected topology per TP size from the models' own config files (not from the code under
    test)."""
    if args.method != "dflash":
        return None
    return {
        tp: GraphExpectation(
            target=decoder_topology(_num_layers(target), tp),
            drafter=decoder_topology(_num_layers(draft), tp),
            min_replays=args.min_graph_replays,
        )
        for tp in tps
    }


def drive(args: argparse.Namespace) -> int:
    """Run the legs, evaluate them, write the report; the exit status (``validate_run`` checked
    the options)."""
    device = device_kind()
    series = series_info()  # fail early, before any engine runs
    if args.tiny:
        from scripts.tiny_laguna import generate

        models = generate(Path(args.tiny))
        target, draft = str(models.target), str(models.draft)
    else:
        target, draft = args.model_dir, args.draft_dir
    names = [n.strip() for n in args.legs.split(",") if n.strip()]
    known = {leg.name: leg for leg in LEGS}
    legs = tuple(known[n] for n in names)  # validate_run checked them
    prompts = make_prompts(args.prompts, args.max_tokens, args.seed)
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
    configs = {
        leg.name: {
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
        for leg in legs
        if not (leg.graph and device == "cpu" and args.no_emulated_graphs)
    }
    outputs = run_legs(legs, configs, args, device, Path(args.report))
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
        graph_expectation=_graph_expectation(target, draft, args, {leg.tp_size(args.tp) for leg in legs}),
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
    )
