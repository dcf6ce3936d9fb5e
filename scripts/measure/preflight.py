"""What the crossover checks before it installs, sizes or starts anything (pure, no vLLM, no torch).

Each problem is one :class:`ToolError` line: model and drafter folders with a readable
``config.json``, the runtime python, the gates file, the run folder, option pairs (prior value and
its id; a control value only for a treated variable or option), counts, and whether the longest request
(long prompt + ``--max-tokens``) fits the server's ``--max-model-len`` (from ``--server-args`` or the
recipe, else the model's ``max_position_embeddings``, which is what vLLM falls back to). With
``--recipe`` the model and drafter folders are the recipe's, and the options the recipe replaces
(``--server-args``, ``--model``, ``--draft``, ``--speculative-config``, ``--num-speculative-tokens``)
are refused.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scripts.errors import ToolError
from scripts.measure.leg_recipe import LegRecipe, given_conflicts
from scripts.measure.prompts import plan_kinds


def model_config(option: str, directory: str | None) -> dict[str, Any]:
    """``config.json`` of a model folder named by ``option``; one-line errors."""
    if not directory:
        raise ToolError(f"{option} is required")
    path = Path(directory)
    if not path.is_dir():
        raise ToolError(f"{option} {directory}: no such directory")
    config = path / "config.json"
    if not config.is_file():
        raise ToolError(f"{option} {directory}: no config.json (not a model directory)")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ToolError(f"{option} {directory}: config.json is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ToolError(f"{option} {directory}: config.json is not a JSON object")
    return data


def server_max_model_len(server_args: str) -> int | None:
    """``--max-model-len N`` (or ``=N``) in the extra server arguments."""
    try:
        words = shlex.split(server_args)
    except ValueError as exc:
        raise ToolError(f"--server-args is not a valid shell string ({exc})") from None
    for i, word in enumerate(words):
        value = None
        if word == "--max-model-len":
            if i + 1 >= len(words):
                raise ToolError("--server-args: --max-model-len needs a value")
            value = words[i + 1]
        elif word.startswith("--max-model-len="):
            value = word.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ToolError(f"--server-args: --max-model-len {value!r} is not a number") from None
    return None


def _check_recipe(args: argparse.Namespace, recipe: LegRecipe) -> dict[str, Any]:
    """The recipe's target ``config.json``; the options it replaces must not be given."""
    given = given_conflicts(
        {
            "--server-args": args.server_args,
            "--model": args.model,
            "--draft": args.draft,
            "--speculative-config": args.speculative_config,
            "--num-speculative-tokens": args.num_speculative_tokens,
        }
    )
    if given:
        raise ToolError(
            f"--recipe and {', '.join(given)} both set the servers' options; give the recipe alone "
            "(render a private one: python -m scripts.recipe render --out DIR) or leave out --recipe"
        )
    target = model_config(f"--recipe {recipe.path}: model", recipe.model)
    draft = (recipe.speculative or {}).get("model")
    if isinstance(draft, str):
        model_config(f"--recipe {recipe.path}: speculative-config model", draft)
    return target


def check(args: argparse.Namespace, recipe: LegRecipe | None = None) -> None:
    """Raise :class:`ToolError` (one line) on the first problem with the crossover's options
    (``recipe``: ``--recipe`` as read)."""
    if args.prompts < 1:
        raise ToolError(f"--prompts {args.prompts}: need at least 1")
    if args.window < 2:
        raise ToolError(f"--window {args.window}: need at least 2 tokens")
    if args.max_tokens < args.window:
        raise ToolError(f"--max-tokens {args.max_tokens} < --window {args.window}")
    if args.num_speculative_tokens is not None and args.num_speculative_tokens < 1:
        raise ToolError(f"--num-speculative-tokens {args.num_speculative_tokens}: need at least 1")
    if recipe is not None:
        target = _check_recipe(args, recipe)
    else:
        target = model_config("--model", args.model)
        if args.draft is not None and not args.speculative_config:
            model_config("--draft", args.draft)
    if args.prior_record and args.prior_tok_s is not None:
        raise ToolError("--prior-record and --prior-tok-s both name a prior value; give one")
    if args.prior_id is not None and args.prior_tok_s is None:
        raise ToolError("--prior-id goes with --prior-tok-s (a --prior-record carries its own id)")
    if args.prior_record and not Path(args.prior_record).is_file():
        raise ToolError(f"--prior-record {args.prior_record}: no such file")
    if not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        raise ToolError(f"--python {args.python}: not an executable file")
    out = None if args.out is None else Path(args.out)
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ToolError(f"--out {args.out}: exists and is not an empty directory")
    _check_lengths(args, target, recipe)


JIT_WARMUP_OFF = """--kernel-config '{"enable_jit_warmup": false}'"""
"""What a CPU stand-in runtime's servers need in ``--server-args`` (the CPU recipes carry it)."""


def check_runtime(args: argparse.Namespace, recipe: LegRecipe | None, cpu_runtime: Mapping[str, Any] | None) -> None:
    """Raise :class:`ToolError` (one line) when the servers cannot start on the probed runtime
    (``cpu_runtime``: the CPU runtime the probe found, None elsewhere). On a stand-in runtime,
    whose Triton runs interpreted, vLLM's JIT warm-up launches a sampler kernel the interpreter
    cannot run and every server dies before it is ready. ``--enforce-eager`` turns the warm-up off
    too (vLLM's ``VllmConfig``), and a recipe sets its own kernel config."""
    if recipe is not None or not cpu_runtime or not cpu_runtime.get("triton_interpreted"):
        return
    tokens = shlex.split(args.server_args)
    if "--enforce-eager" in tokens or any("jit_warmup" in t.replace("-", "_") for t in tokens):
        return
    raise ToolError(
        f"--server-args: on this CPU runtime (Triton interpreted) add {JIT_WARMUP_OFF} or --enforce-eager: "
        "vLLM's JIT warm-up runs a kernel the Triton interpreter cannot run"
    )


def _check_lengths(args: argparse.Namespace, target: dict[str, Any], recipe: LegRecipe | None) -> None:
    if recipe is not None:
        limit, where = recipe.max_model_len, f"max-model-len in --recipe {recipe.path}"
    else:
        limit, where = server_max_model_len(args.server_args), "--max-model-len in --server-args"
    if limit is None:
        limit = target.get("max_position_embeddings")
        where = "the model's max_position_embeddings (no max-model-len given)"
    kinds = set(plan_kinds(args.prompts))
    sizes = {"normal": args.prompt_tokens}
    if "long" in kinds:
        sizes["long"] = args.long_prompt_tokens
    if "rollover" in kinds:
        rollover_prompt = args.rollover_at - max(1, args.max_tokens // 2)
        if rollover_prompt < 8:
            raise ToolError(
                f"--rollover-at {args.rollover_at} leaves a {rollover_prompt}-token rollover prompt "
                f"with --max-tokens {args.max_tokens}; raise --rollover-at or lower --max-tokens"
            )
        sizes["rollover"] = rollover_prompt
    if not isinstance(limit, int):
        return
    for kind, tokens in sizes.items():
        if tokens + args.max_tokens > limit:
            option = {"normal": "--prompt-tokens", "long": "--long-prompt-tokens", "rollover": "--rollover-at"}[kind]
            raise ToolError(
                f"the {kind} prompt ({tokens} tokens, {option}) + --max-tokens {args.max_tokens} "
                f"= {tokens + args.max_tokens} > {limit} ({where}); lower {option} or "
                f"--max-tokens, or raise the limit"
            )
