"""Every command line of the tooling explains every option and shows its default; the top-level
help lists every entry point."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from scripts import REPO_ROOT
from scripts.cli import ENTRY_POINTS, HelpFormatter

# module, argv that reaches its parser
MAINS = [
    ("scripts.cli", []),
    ("scripts.measure.cli", ["crossover"]),
    ("scripts.measure.cli", ["analyze"]),
    ("scripts.measure.cli", ["verify-record"]),
    ("scripts.matrix.cli", []),
    ("scripts.cpu_runtime", []),
    ("scripts.tiny_laguna", []),
    ("scripts.tiny_laguna_int4", []),
    ("scripts.device.checkpoint_check", []),
    ("scripts.device.day_one", []),
    ("scripts.matrix.acceptance", []),
    ("scripts.device.graph_check", []),
    ("scripts.device.xpu_attention_check", []),
    ("scripts.device.row_invariance_check", []),
    ("scripts.device.op_invariance_check", []),
    ("scripts.device.moe_invariance_check", []),
    ("scripts.device.split_divergence", []),
    ("scripts.bench.metadata_microbench", []),
    ("scripts.bench.tp_collectives", []),
    ("scripts.bench.verify_step_cost", []),
    ("scripts.old_line", []),
    ("scripts.recipe", []),
]


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(module: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Caught(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    main = importlib.import_module(module).main
    with pytest.raises(_Caught) as caught:
        main(argv)
    return caught.value.parser


def _walk(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += _walk(sub, f"{name} {sub_name}")
    return found


def _problems(root: argparse.ArgumentParser, root_name: str) -> list[str]:
    problems = []
    for name, parser in _walk(root, root_name):
        if not issubclass(parser.formatter_class, HelpFormatter):
            problems.append(f"{name}: defaults not shown (formatter {parser.formatter_class.__name__})")
        one_of = {id(a) for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            label = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                problems.append(f"{label}: no help text")
                continue
            shown = HelpFormatter(name)._get_help_string(action) or ""
            if action.option_strings and not action.required and id(action) not in one_of and "default" not in shown:
                # an optional option: argparse shows the default, or the help states it in words
                problems.append(f"{label}: default {action.default!r} not shown")
    return problems


@pytest.mark.parametrize(("module", "argv"), MAINS, ids=[f"{m} {' '.join(a)}" for m, a in MAINS])
def test_every_option_has_help_and_shows_its_default(module: str, argv: list[str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert _problems(_parser_of(module, argv, monkeypatch), module) == []


def test_negative_control_bare_options_are_caught() -> None:
    plain = argparse.ArgumentParser()
    plain.add_argument("--n", type=int, default=3, help="a number")
    bare = argparse.ArgumentParser(formatter_class=HelpFormatter)
    bare.add_argument("--x")
    bare.add_argument("--y", default=None, help="says nothing of it")
    assert _problems(plain, "plain") == ["plain: defaults not shown (formatter HelpFormatter)"]
    assert _problems(bare, "bare") == ["bare --x: no help text", "bare --y: default None not shown"]


def test_top_level_help_lists_every_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scripts", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    modules = {cmd.split()[2] for cmd, _ in ENTRY_POINTS}
    assert {
        "scripts",
        "scripts.measure",
        "scripts.matrix",
        "scripts.cpu_runtime",
        "scripts.tiny_laguna",
        "scripts.device.xpu_attention_check",
        "scripts.device.graph_check",
    } <= modules
    for module in modules:
        assert f"python -m {module}" in out
    # every public module of scripts/device is a device check (its helpers are _private)
    packages = {p.stem for p in (REPO_ROOT / "scripts" / "device").glob("*.py") if not p.stem.startswith("_")}
    assert {f"scripts.device.{p}" for p in packages} <= modules, "a device check is not listed"


def test_measure_help_lists_its_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scripts.measure", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0
    for command in ("crossover", "analyze", "verify-record"):
        assert command in out.stdout


def test_nox_sessions_have_a_one_line_description() -> None:
    import ast

    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text(encoding="utf-8"))
    sessions = [
        f
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and any("session" in ast.unparse(d) for d in f.decorator_list)
    ]
    assert len(sessions) >= 13
    for func in sessions:
        doc = ast.get_docstring(func)
        assert doc and "\n" not in doc, f"nox session {func.name}: description is not one line"
