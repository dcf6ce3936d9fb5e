"""Command line of the equivalence matrix: ``run`` (options checked before any engine starts)
and ``leg`` (internal: one leg, run by the driver in its own process)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import scripts.matrix
from scripts.errors import ToolError
from scripts.layout import Layout
from scripts.matrix.driver import drive
from scripts.matrix.engine import FAULTS, run_leg
from scripts.matrix.legs import ALL_LEGS, LEG_OPTIONS, LEGS, LONG_PROMPT_TOKENS, TP4_LEGS
from scripts.matrix.preloaded import LEG_STARTS
from scripts.matrix.runner import LEG_TIMEOUT_BASE_S, LEG_TIMEOUT_PER_TOKEN_S, default_leg_timeout
from scripts.procs import stopping_on_signals
from scripts.series_options import OPTIONS_KEY, checked, refuse_series_env

DEFAULT_PROMPTS = 13
DEFAULT_MAX_TOKENS = 128


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.matrix",
        description=(scripts.matrix.__doc__ or "").split("\n\n")[0],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the matrix and write the report",
        description="Run the equivalence matrix and write the report. Options are checked before any engine starts.",
    )
    models = run.add_mutually_exclusive_group(required=True)
    models.add_argument("--tiny", metavar="DIR", help="generate (or reuse) the tiny random Laguna pair in DIR")
    models.add_argument("--model-dir", help="local target model (e.g. the pinned Laguna-S-2.1-INT4)")
    run.add_argument(
        "--draft-dir", help="local DFlash drafter (required with --model-dir; default: none, --tiny brings its own)"
    )
    run.add_argument("--method", default="dflash", choices=("dflash", "ngram"), help="speculative method")
    run.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS, help="fresh prompts per leg")
    run.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="output tokens per prompt")
    run.add_argument(
        "--legs",
        default=",".join(leg.name for leg in LEGS),
        help="comma-separated leg names; the TP 4 legs run only when named: "
        f"{','.join(leg.name for leg in TP4_LEGS)} (default: every other leg)",
    )
    run.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor-parallel size of the legs without their own (the -tpN legs have theirs); with "
        "--tiny each TP size gets the first tiny variant built for it (scripts.tiny_laguna)",
    )
    run.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on devices")
    run.add_argument(
        "--max-model-len",
        type=int,
        default=8192,
        help="engine max_model_len; must hold the long-context prompt (default: %(default)s)",
    )
    run.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=LONG_PROMPT_TOKENS,
        help="add one prompt of at least this many tokens, generating max(8, max-tokens/4) "
        "tokens (0: none; default: %(default)s)",
    )
    run.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="engine token budget per step, the same in every leg (default: --max-model-len, "
        "so every prompt is prefilled in one chunk; 4096, the CPU default, reproduces "
        "the long-context last-bit residual)",
    )
    run.add_argument("--kv-cache-bytes", type=int, default=512 << 20, help="KV cache bytes (CPU only)")
    run.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="vLLM's --kv-cache-dtype in every leg (auto: the model dtype, or the checkpoint's "
        "kv_cache_scheme; an INT4 checkpoint with a static FP8 scheme needs the model dtype named)",
    )
    run.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="legs at once on CPU, each on its own CPU slot (scripts/cpu_slots.py; 0: as many as "
        "there are slots, VXL_CPU_SLOTS sets the count); on a device the legs always run one by one",
    )
    run.add_argument(
        "--leg-start",
        choices=LEG_STARTS,
        default="auto",
        help="how a leg's process starts: preloaded = a fork of one interpreter that imported vLLM "
        "once (saves ~11 s per leg), fresh = its own `python -m scripts.matrix leg`; auto: "
        "preloaded on CPU, fresh on a device (scripts/matrix/preloaded.py)",
    )
    run.add_argument(
        "--leg-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"time limit per leg; a leg past it is stopped with every process it started and "
        f"reported as an error (default: {LEG_TIMEOUT_BASE_S:.0f} s + {LEG_TIMEOUT_PER_TOKEN_S:g} s "
        f"per token a leg generates, {_default_timeout():.0f} s with the default prompts and tokens)",
    )
    run.add_argument("--seed", type=int, default=None, help="prompt seed (default: fresh per run)")
    run.add_argument("--report", default=str(Layout().build / "matrix-report.json"), help="JSON report path")
    run.add_argument(
        "--check-only",
        action="store_true",
        help="check the options (paths, config.json, sizes) and exit; nothing is installed or run",
    )
    run.add_argument(
        "--min-graph-replays",
        type=int,
        default=200,
        help="each graph leg fails unless target and drafter each replayed at least this often",
    )
    run.add_argument(
        "--inject-fault",
        choices=FAULTS,
        default=None,
        help="negative control for the graph legs: hand the target its input ids in a new "
        "tensor while the captured buffer stays stale; 'stale-input' must trip the replay "
        "guard, 'stale-input-unguarded' (guard bypassed) must break teacher-exactness "
        "(default: none)",
    )
    run.add_argument(
        "--series-options",
        type=series_options,
        default={},
        metavar="JSON",
        help=f"more of the series' options for every leg's engine, a JSON object merged into its "
        f'additional_config[{OPTIONS_KEY!r}] (e.g. \'{{"row_invariant_moe": "off"}}\'); the legs\' own '
        f"switches ({', '.join(LEG_OPTIONS)}) are not allowed; checked as the engine checks them (default: none)",
    )
    run.add_argument(
        "--no-emulated-graphs",
        action="store_true",
        help="on CPU, report the graph legs as not run instead of running them through the "
        "recording stand-in graph (emulated device graphs)",
    )
    leg = sub.add_parser("leg", help="(internal) run one leg from a JSON config file")
    leg.add_argument("config", help="leg config JSON (written by run)")
    leg.add_argument("output", help="where the leg writes its JSON result")
    args = parser.parse_args(argv)
    if args.command == "leg":
        config = json.loads(Path(args.config).read_text())
        Path(args.output).write_text(json.dumps(run_leg(config)))
        return 0
    problem = validate_run(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.check_only:
        print("matrix: options OK", file=sys.stderr)
        return 0
    with stopping_on_signals():  # the legs are waited for in worker threads
        return drive(args)


def series_options(text: str) -> dict[str, object]:
    """``--series-options``: a JSON object of the series' options, checked as the engine checks
    them (:func:`scripts.series_options.checked`), that names none of the legs' own switches
    (:data:`scripts.matrix.legs.LEG_OPTIONS`)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object of option to value, not {text!r}")
    taken = sorted(set(value) & set(LEG_OPTIONS))
    if taken:
        raise argparse.ArgumentTypeError(f"{', '.join(taken)}: set by the legs themselves (see --legs)")
    try:
        return checked(value, OPTIONS_KEY)
    except ToolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def environment_problem(environ: Mapping[str, str]) -> str | None:
    """A ``VLLM_XPU_LAGUNA_*`` variable in ``environ`` (every leg's engine would refuse to start),
    in one line; None: none."""
    try:
        refuse_series_env(environ, "the environment")
    except ToolError as exc:
        return f"{exc} (the matrix sets each leg's own options; --series-options adds others)"
    return None


def _default_timeout() -> float:
    return default_leg_timeout(DEFAULT_PROMPTS, DEFAULT_MAX_TOKENS, LONG_PROMPT_TOKENS)


def _model_problem(option: str, directory: str | None) -> str | None:
    if not directory:
        return f"{option} is required"
    path = Path(directory)
    if not path.is_dir():
        return f"{option} {directory}: no such directory"
    config = path / "config.json"
    if not config.is_file():
        return f"{option} {directory}: no config.json (not a model directory)"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{option} {directory}: config.json is not readable JSON ({exc})"
    return None


def _tp_problem(args: argparse.Namespace, tps: list[int]) -> str | None:
    """Why a leg's TP size cannot run the models: no tiny variant for it, or a named model that
    vLLM cannot split that way (:mod:`scripts.tp_fit`)."""
    from scripts.tiny_laguna import TinyLagunaError, variant_for_tp
    from scripts.tp_fit import model_problems

    for tp in tps:
        if args.tiny:
            try:
                variant_for_tp(tp)
            except TinyLagunaError as exc:
                return f"--legs: {exc}"
            continue
        dirs = [args.model_dir] + ([args.draft_dir] if args.method == "dflash" else [])
        problems = [p for d in dirs for p in model_problems(d, tp)]
        if problems:
            return f"--legs: a leg runs at TP {tp}, which the model cannot: {problems[0]}"
    return None


def validate_run(args: argparse.Namespace) -> str | None:
    """What is wrong with ``run``'s options, in one line (None: nothing). Runs before anything is
    installed, generated or started; needs neither torch nor vLLM."""
    problem = environment_problem(os.environ)
    if problem:
        return problem
    if args.model_dir:
        problem = _model_problem("--model-dir", args.model_dir)
        if problem:
            return problem
        if args.method == "dflash":
            problem = _model_problem("--draft-dir", args.draft_dir)
            if problem:
                return problem + " (the DFlash drafter, with --model-dir)"
    elif args.draft_dir:
        return "--draft-dir goes with --model-dir (--tiny generates its own drafter)"
    elif Path(args.tiny).exists() and not Path(args.tiny).is_dir():
        return f"--tiny {args.tiny}: exists and is not a directory"
    names = [n.strip() for n in args.legs.split(",") if n.strip()]
    known = {leg.name: leg for leg in ALL_LEGS}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        return f"--legs: unknown leg(s) {unknown} or none; known: {', '.join(known)}"
    missing = sorted({known[n].teacher for n in names if known[n].speculative} - set(names))
    if missing or all(known[n].speculative for n in names):
        return (
            f"--legs: the teacher leg(s) {missing or ['teacher']} must run too (each leg is compared with its teacher)"
        )
    if args.prompts < 3:
        return f"--prompts {args.prompts}: the matrix needs at least 3 (long, long-then-next, plain)"
    if args.jobs < 0:
        return f"--jobs {args.jobs}: must be >= 0 (0: one leg per CPU slot)"
    if args.tp < 1:
        return f"--tp {args.tp}: must be >= 1"
    if args.leg_timeout is not None and not args.leg_timeout > 0:
        return f"--leg-timeout {args.leg_timeout:g}: must be > 0 seconds"
    problem = _tp_problem(args, sorted({known[n].tp_size(args.tp) for n in names}))
    if problem:
        return problem
    if not 1 <= args.max_tokens < args.max_model_len:
        return (
            f"--max-tokens {args.max_tokens} must be >= 1 and leave room for the prompt in "
            f"--max-model-len {args.max_model_len}"
        )
    if args.long_prompt_tokens < 0:
        return f"--long-prompt-tokens {args.long_prompt_tokens}: must be >= 0 (0: no long-context prompt)"
    if args.long_prompt_tokens and args.long_prompt_tokens + max(8, args.max_tokens // 4) + 64 > args.max_model_len:
        return (
            f"--max-model-len {args.max_model_len} cannot hold the long-context prompt (>= "
            f"{args.long_prompt_tokens} tokens + {max(8, args.max_tokens // 4)} generated); raise it or "
            "pass --long-prompt-tokens 0"
        )
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < 1:
        return f"--max-num-batched-tokens must be positive, got {args.max_num_batched_tokens}"
    report = Path(args.report)
    if report.is_dir():
        return f"--report {args.report}: is a directory"
    return None
