"""Bad command lines of the device checks and of the verify-step bench, in one table: each is
refused with exit status 2, nothing on stdout and the error on stderr's last line
(tests/tool_run.py's ``assert_usage_error``); graph_check and the bench check their values
themselves and print that line alone. Negative controls: the helper fails on an accepted command
line, and on argparse's usage lines where the line is to stand alone."""

from __future__ import annotations

import pytest

from tests.tool_run import assert_usage_error, run_module

BENCH = "scripts.bench.verify_step_cost"
GRAPH = "scripts.device.graph_check"
MOE = "scripts.device.moe_invariance_check"
OPS = "scripts.device.op_invariance_check"
ALONE = frozenset({BENCH, GRAPH})
"""The commands whose refusal is the one ``error: ...`` line, with no usage lines above it."""
CASES = [
    (BENCH, ["--rows", "1"], "--rows must be 2..16"),
    (BENCH, ["--rows", "eight"], "argument --rows: invalid int value"),
    (BENCH, ["--parts", "forms,bogus"], "--parts must be a comma list of forms, collectives"),
    (BENCH, ["--steps", "0"], "--steps must be at least 1"),
    (BENCH, ["--world", "1"], "--world must be 2..16"),
    (BENCH, ["--shapes", "huge"], "argument --shapes: invalid choice"),
    (GRAPH, ["--width", "0"], "--width must be 1..16"),
    (GRAPH, ["--width", "17"], "--width must be 1..16"),
    (GRAPH, ["--width", "1", "--spec", "ngram"], "--spec needs --width >= 2"),
    (GRAPH, ["--tokens", "0"], "--tokens must be 1..4096"),
    (GRAPH, ["--prompts", "9"], "--prompts must be 1..4"),
    (GRAPH, ["--models", "/nonexistent"], "no target/ folder"),
    (GRAPH, ["--leg-timeout", "5"], "--leg-timeout must be >= 30"),
    (GRAPH, ["--long-prompt-tokens", "-1"], "--long-prompt-tokens must be 0..16384"),
    (GRAPH, ["--min-cycles", "-1"], "--min-cycles must be >= 0"),
    (MOE, ["--rows", "0"], "--rows must be a comma list of integers 1..16"),
    (MOE, ["--rows", "8,x"], "--rows must be a comma list of integers 1..16"),
    (MOE, ["--trials", "0"], "--trials must be 1..64"),
    (OPS, ["--rows", "1"], "--rows must be 2..16"),
    (OPS, ["--trials", "0"], "--trials must be 1..64"),
    (OPS, ["--ops", "qk_norm,bogus"], "--ops must be a comma list"),
    (OPS, ["--ranks", "1"], "--ranks must be 0 (skip) or 2..16"),
    (OPS, ["--rank-timeout", "1"], "--rank-timeout must be >= 10"),
]


@pytest.mark.parametrize(
    ("module", "argv", "message"), CASES, ids=[f"{m.rsplit('.', 1)[1]}:{' '.join(a)}" for m, a, _ in CASES]
)
def test_bad_command_line_is_refused_with_exit_2(module: str, argv: list[str], message: str) -> None:
    assert_usage_error(run_module(module, *argv, timeout=120), message, alone=module in ALONE)


def test_an_accepted_command_line_is_not_a_usage_error() -> None:
    with pytest.raises(AssertionError):
        assert_usage_error(run_module(GRAPH, "--help", timeout=120), "usage")


def test_usage_lines_above_the_error_are_not_one_line() -> None:
    proc = run_module(OPS, "--rows", "1", timeout=120)
    assert_usage_error(proc, "--rows must be 2..16")
    with pytest.raises(AssertionError):
        assert_usage_error(proc, "--rows must be 2..16", alone=True)
