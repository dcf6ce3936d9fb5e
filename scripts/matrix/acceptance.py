"""Accepted drafted tokens per depth of one DFlash M8 matrix leg, measured on CPU.

``python -m scripts.matrix.acceptance --tiny DIR``: one speculative leg of the equivalence matrix
(:func:`scripts.matrix.engine.run_leg`: the matrix's own engine setup, in this process) over the
matrix's prompt set, long-context prompt included; prints the line of
:func:`scripts.spec_acceptance.format_line` (counts from vLLM's own spec-decode counters).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scripts.errors import ToolError
from scripts.matrix import legs as matrix
from scripts.spec_acceptance import SpecAcceptance, SpecAcceptanceError, format_line, from_metrics


def measure(models: Path, args: argparse.Namespace) -> tuple[SpecAcceptance, dict[str, Any]]:
    """One DFlash M8 leg of the matrix (its own ``run_leg``) over the matrix's prompts.

    ``run_leg`` reads the two total counters itself; ``LLM.get_metrics`` is wrapped to keep the
    whole snapshot, per-depth vector included."""
    from scripts.matrix import engine as matrix_engine

    leg = next(leg for leg in matrix.LEGS if leg.name == args.leg)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine, as the matrix's CPU legs
    target, draft = models / "target", models / "draft"
    prompts = matrix.make_prompts(args.prompts, args.max_tokens, args.seed)
    if args.long_prompt_tokens:
        prompts.append(matrix.long_context_prompt(str(target), args.long_prompt_tokens, args.max_tokens, args.seed))
    config = {
        "leg": asdict(leg),
        "target": str(target),
        "draft": str(draft),
        "method": "dflash",
        "dtype": "float32",
        "tp": 1,
        "options": leg.options(),  # the series' options of its engine (additional_config)
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": None,
        "kv_cache_memory_bytes": args.kv_cache_bytes,
        "cpu_flash_attn": True,
        "emulate_graphs": True,
        "fault": None,
        "prompts": [asdict(p) for p in prompts],
    }
    from vllm import LLM

    snapshots: list[list[object]] = []
    real = LLM.get_metrics

    def keep(self: Any) -> list[object]:
        snapshot = real(self)
        snapshots.append(snapshot)
        return snapshot

    LLM.get_metrics = keep  # type: ignore[method-assign]
    try:
        out = matrix_engine.run_leg(config)
    finally:
        LLM.get_metrics = real  # type: ignore[method-assign]
    if not snapshots:
        raise SpecAcceptanceError("the leg read no metrics")
    return from_metrics(snapshots[-1], matrix.WIDTH - 1), out


def main(argv: Sequence[str] | None = None) -> int:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.matrix.acceptance",
        description="Accepted drafted tokens per depth of one DFlash M8 matrix leg on CPU (needs the CPU runtime).",
    )
    parser.add_argument("--tiny", type=Path, required=True, help="folder with target/ and draft/ (scripts.tiny_laguna)")
    parser.add_argument("--leg", default="dflash-graph0-meta0", help="matrix leg to run (a speculative one)")
    parser.add_argument("--prompts", type=int, default=13, help="matrix prompts (scripts.matrix.legs.make_prompts)")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per prompt")
    parser.add_argument("--long-prompt-tokens", type=int, default=4200, help="long-context prompt size (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed")
    parser.add_argument("--max-model-len", type=int, default=8192, help="engine max_model_len")
    parser.add_argument("--kv-cache-bytes", type=int, default=512 << 20, help="KV cache bytes")
    parser.add_argument("--label", default=None, help="label of the report line (default: the --tiny folder)")
    parser.add_argument("--json", type=Path, default=None, help="also write counts and tokens here (default: none)")
    args = parser.parse_args(argv)
    try:
        names = {leg.name: leg for leg in matrix.LEGS}
        if args.leg not in names or not names[args.leg].speculative:
            raise SpecAcceptanceError(f"--leg {args.leg}: not a speculative matrix leg")
        if args.prompts < 3:
            raise SpecAcceptanceError(f"--prompts {args.prompts}: the matrix's prompt set needs at least 3")
        if not (args.tiny / "target" / "config.json").is_file() or not (args.tiny / "draft" / "config.json").is_file():
            raise SpecAcceptanceError(f"--tiny {args.tiny}: no target/ and draft/ model there")
        acc, out = measure(args.tiny, args)
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(format_line(args.label or str(args.tiny), acc))
    if args.json:
        record = {
            "drafts": acc.drafts,
            "draft_tokens": acc.draft_tokens,
            "accepted": acc.accepted,
            "per_depth": list(acc.per_depth),
            "tokens": [r["token_ids"] for r in out["rows"]],
            "prompt_tokens": [r["prompt_tokens"] for r in out["rows"]],
        }
        args.json.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
