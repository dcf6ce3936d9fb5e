"""Command line of the measurement harness; :func:`crossover` and :func:`verify_record` are the
entry points ``noxfile.py`` calls with ``session.posargs``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from scripts.errors import ToolError


def _verify_parser() -> argparse.ArgumentParser:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.measure verify-record",
        description="Re-derive every number of a record file; exit 1 naming each field that disagrees.",
    )
    parser.add_argument("record", type=Path, help="record JSON file")
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=None,
        help="directory holding the raw artifacts (default: the record's directory or its "
        "run_root, when they hold them)",
    )
    parser.add_argument("--internal-only", action="store_true", help="skip the raw artifacts even when present")
    parser.add_argument(
        "--prior",
        type=Path,
        default=None,
        help="the prior record this one claims to beat (default: none)",
    )
    parser.add_argument(
        "--gates",
        type=Path,
        default=None,
        help="gates TOML for version-1 records (default: scripts/measure/gates.toml)",
    )
    return parser


def verify_record(argv: Sequence[str]) -> int:
    """``verify-record FILE``: 0 when every check passes, 1 otherwise (one line per field)."""
    from scripts.measure.gates import GATES_PATH, load_gates
    from scripts.measure.verify_record import find_artifacts_root, load_record, verify

    args = _verify_parser().parse_args(list(argv))
    try:
        record = load_record(args.record)
        prior = load_record(args.prior) if args.prior is not None else None
        root = None
        if not args.internal_only:
            root = args.artifacts or find_artifacts_root(record, args.record)
        report = verify(record, gates=load_gates(args.gates or GATES_PATH), artifacts_root=root, prior=prior)
    except ToolError as exc:
        print(f"verify-record: error: {exc}", file=sys.stderr)
        return exc.exit_code
    where = f"raw artifacts in {root}" if root is not None else "no raw artifacts: internal only"
    stored = record.get("gates")
    current = load_gates(args.gates or GATES_PATH).to_json()
    if isinstance(stored, dict) and stored != current:
        changed = sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
        print(f"verify-record: note: judged with its own gates, which differ from today's in: {', '.join(changed)}")
    for failure in report.failures:
        print(f"verify-record: FAIL {failure}", file=sys.stderr)
    derived = [p for p in report.numeric if p in report.derived]
    bounded = [p for p in report.numeric if p in report.checked and p not in report.derived]
    print(
        f"verify-record: {args.record}: {'OK' if report.ok else 'REJECTED'} ({report.mode}; "
        f"{where}); of {len(report.numeric)} numbers: {len(derived)} re-derived, "
        f"{len(bounded)} only bounded, {len(report.unchecked)} not derivable"
    )
    if bounded:
        print(f"verify-record: only bounded: {', '.join(bounded)}")
    if report.unchecked:
        print(f"verify-record: not derivable from this record alone: {', '.join(report.unchecked)}")
    return 0 if report.ok else 1


def crossover(argv: Sequence[str]) -> int:
    """``crossover --treatment NAME=VALUE ... --model DIR``: run A1, B1, B2, A2 (+ teacher),
    analyze, write the record, the raw artifacts and the plot."""
    from scripts.measure.crossover import main as crossover_main
    from scripts.procs import stopping_on_signals

    try:
        with stopping_on_signals():  # a SIGTERM to the crossover stops its server's group too
            return crossover_main(list(argv))
    except ToolError as exc:
        print(f"crossover: error: {exc}", file=sys.stderr)
        return exc.exit_code


def analyze_run(argv: Sequence[str]) -> int:
    """``analyze RUN_DIR``: re-run the analyzer, record and plot over an existing run's rows."""
    from scripts.measure.crossover import reanalyze_main

    try:
        return reanalyze_main(list(argv))
    except ToolError as exc:
        print(f"analyze: error: {exc}", file=sys.stderr)
        return exc.exit_code


COMMANDS = {"crossover": crossover, "verify-record": verify_record, "analyze": analyze_run}
USAGE = """usage: python -m scripts.measure COMMAND [options]   (COMMAND --help for its options)

  crossover      A1/B1/B2/A2 crossover (+ teacher) against fresh vllm serve legs; record + plot
  analyze        rebuild analysis, record and plot of a run directory from its raw rows
  verify-record  re-derive every number of a record file
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if not args or args[0] not in COMMANDS:
        print(USAGE, end="", file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])
