"""Speculative-decoding acceptance per draft depth, from vLLM's own spec-decode counters.

vLLM 0.32.0 counts, per engine (``vllm/v1/spec_decode/metrics.py``; read in process with
``LLM.get_metrics()``, ``vllm/v1/metrics/reader.py``):

* ``vllm:spec_decode_num_drafts``: verify steps that carried drafted tokens;
* ``vllm:spec_decode_num_draft_tokens``: drafted tokens (drafts x speculative tokens);
* ``vllm:spec_decode_num_accepted_tokens``: drafted tokens the target accepted;
* ``vllm:spec_decode_num_accepted_tokens_per_pos``: a ``Vector``, ``values[i]`` = drafts whose
  token at depth ``i + 1`` was accepted (a depth is accepted only with every depth before it).

:func:`from_metrics` turns them into accepted tokens per depth 1..N and an acceptance rate;
:func:`format_line` writes the one-line per-leg report. Metric objects are duck-typed (``name``
and ``value`` or ``values``), so nothing here imports vLLM.

``python -m scripts.spec_acceptance --tiny DIR`` measures it: one DFlash M8 leg of the
equivalence matrix (``scripts.matrix.engine.run_leg``: the matrix's own engine setup, in this process)
over the matrix's prompt set, long-context prompt included, and prints the line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scripts.errors import ToolError

__all__ = ["SpecAcceptance", "SpecAcceptanceError", "format_line", "from_metrics", "main"]

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
DEPTHS = 7  # DFlash M8: 7 drafted tokens per verify step


class SpecAcceptanceError(ToolError):
    """The counters are missing or do not add up."""


@dataclass(frozen=True)
class SpecAcceptance:
    """vLLM's spec-decode counters of one run."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_depth: tuple[int, ...]  # accepted tokens at depth 1, 2, ... (index 0 = depth 1)

    @property
    def rate(self) -> float | None:
        """Accepted / drafted tokens (None: nothing drafted)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def depth_rates(self) -> tuple[float, ...]:
        """Share of drafts accepted at each depth (unconditional)."""
        return tuple(n / self.drafts for n in self.per_depth) if self.drafts else ()

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per verify step: 1 (the target's own) + accepted drafted tokens."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    def problems(self) -> list[str]:
        """What does not add up (empty: consistent)."""
        notes = []
        if sum(self.per_depth) != self.accepted:
            notes.append(f"per-depth counts sum to {sum(self.per_depth)}, accepted is {self.accepted}")
        if any(b > a for a, b in zip(self.per_depth, self.per_depth[1:])):
            notes.append(f"per-depth counts increase with depth: {list(self.per_depth)}")
        if self.per_depth and self.per_depth[0] > self.drafts:
            notes.append(f"{self.per_depth[0]} accepted at depth 1 in {self.drafts} drafts")
        if self.draft_tokens != self.drafts * len(self.per_depth):
            notes.append(f"{self.draft_tokens} draft tokens != {self.drafts} drafts x {len(self.per_depth)} depths")
        return notes


def _name(metric: object) -> str:
    return str(getattr(metric, "name", "")).removesuffix("_total")


def from_metrics(metrics: Iterable[object], depths: int = DEPTHS) -> SpecAcceptance:
    """Sum the spec-decode counters over every label set (engine) in ``metrics``.

    Raises SpecAcceptanceError when a counter is missing, the per-depth vector is not ``depths``
    long, or the counts contradict each other (see :meth:`SpecAcceptance.problems`).
    """
    totals = {DRAFTS: 0, DRAFT_TOKENS: 0, ACCEPTED: 0}
    seen: set[str] = set()
    per_depth = [0] * depths
    for metric in metrics:
        name = _name(metric)
        if name in totals:
            totals[name] += int(getattr(metric, "value", 0))
            seen.add(name)
        elif name == PER_POS:
            values = [int(v) for v in getattr(metric, "values", [])]
            if len(values) != depths:
                raise SpecAcceptanceError(f"{PER_POS} has {len(values)} positions, expected {depths}")
            per_depth = [a + b for a, b in zip(per_depth, values)]
            seen.add(name)
    missing = sorted({DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS} - seen)
    if missing:
        raise SpecAcceptanceError(f"spec-decode metrics missing: {', '.join(missing)} (disable_log_stats=False?)")
    result = SpecAcceptance(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], tuple(per_depth))
    problems = result.problems()
    if problems:
        raise SpecAcceptanceError("; ".join(problems))
    return result


def format_line(label: str, acc: SpecAcceptance) -> str:
    """One line: drafts, acceptance rate, mean accepted length and accepted tokens per depth."""
    rate = f"{acc.rate:.1%}" if acc.rate is not None else "-"
    length = f"{acc.mean_accepted_length:.2f}" if acc.mean_accepted_length is not None else "-"
    depths = " ".join(f"d{i}={n}" for i, n in enumerate(acc.per_depth, 1))
    return (
        f"{label}: {acc.drafts} drafts, accepted {acc.accepted}/{acc.draft_tokens} = {rate}, "
        f"mean length {length}; accepted per depth {depths}"
    )


# ---------------------------------------------------------------- measurement (vLLM, in process)


def measure(models: Path, args: argparse.Namespace) -> tuple[SpecAcceptance, dict[str, Any]]:
    """One DFlash M8 leg of the matrix (its own ``run_leg``) over the matrix's prompts.

    ``run_leg`` reads the two total counters itself; ``LLM.get_metrics`` is wrapped to keep the
    whole snapshot, per-depth vector included."""
    from scripts.matrix import engine as matrix_engine
    from scripts.matrix import legs as matrix

    leg = next(leg for leg in matrix.LEGS if leg.name == args.leg)
    os.environ.update(leg.env())
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
    from scripts.cli import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="python -m scripts.spec_acceptance",
        description="Accepted drafted tokens per depth of one DFlash M8 matrix leg on CPU (needs the CPU runtime).",
        formatter_class=HelpFormatter,
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
        from scripts.matrix import legs as matrix

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
