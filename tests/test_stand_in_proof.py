"""scripts.measure.stand_in_proof without an engine: a case's fresh interpreter is given the same
engine settings the run was given, and the served form gets them as ``vllm serve`` options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scripts.measure import stand_in_proof
from scripts.measure.stand_in_proof import MAX_NUM_SEQS, Engine


def _child_engine(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[Engine, bool]:
    """The engine and the DFlash flag a case's interpreter runs with, given ``argv``."""
    seen: list[tuple[Engine, bool]] = []

    def engine_case(engine: Engine, dflash: bool) -> dict[str, Any]:
        seen.append((engine, dflash))
        return {}

    monkeypatch.setattr(stand_in_proof, "engine_case", engine_case)
    assert stand_in_proof.main(argv) == 0
    (got,) = seen
    return got


@pytest.mark.parametrize(
    "engine",
    [
        Engine(Path("/models"), 16),
        Engine(Path("/m"), 4, tp=2, max_num_seqs=None, profile=True, in_process=True),
    ],
)
def test_a_case_interpreter_gets_the_run_engine(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _child_engine(monkeypatch, [*engine.options(), "--engine", "dflash"]) == (engine, True)
    assert _child_engine(monkeypatch, [*engine.options(), "--engine", "target"]) == (engine, False)


def test_an_option_left_out_changes_the_child_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: without ``--in-process`` the interpreter runs another engine."""
    engine = Engine(Path("/m"), 4, in_process=True)
    argv = [option for option in engine.options() if option != "--in-process"]
    assert _child_engine(monkeypatch, [*argv, "--engine", "target"])[0] != engine


def test_serve_options_follow_the_engine() -> None:
    args = Engine(Path("/m"), 4, tp=2).serve_args(dflash=True)
    assert args[args.index("--max-num-seqs") + 1] == str(MAX_NUM_SEQS)
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert '"model": "/m/draft"' in args[args.index("--speculative-config") + 1]
    plain = Engine(Path("/m"), 4, max_num_seqs=None).serve_args(dflash=False)
    assert "--max-num-seqs" not in plain and "--speculative-config" not in plain  # vLLM's defaults
