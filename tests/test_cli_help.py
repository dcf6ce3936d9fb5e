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
    ("scripts.matrix", []),
    ("scripts.cpu_runtime", []),
    ("scripts.tiny_laguna", []),
    ("scripts.device.graph_check", []),
    ("scripts.device.xpu_attention_check", []),
    ("scripts.bench.metadata_microbench", []),
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


@pytest.mark.parametrize(("module", "argv"), MAINS, ids=[f"{m} {' '.join(a)}" for m, a in MAINS])
def test_every_option_has_help_and_shows_its_default(module: str, argv: list[str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name, parser in _walk(_parser_of(module, argv, monkeypatch), module):
        assert issubclass(parser.formatter_class, HelpFormatter), f"{name}: defaults not shown"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            label = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help, f"{label}: no help text"
            shown = HelpFormatter(name)._get_help_string(action) or ""
            if action.default not in (None, argparse.SUPPRESS) and action.option_strings:
                assert "default" in shown, f"{label}: default {action.default!r} not shown"
            elif action.option_strings and not action.required:
                assert "default" in shown or action.default is not None, f"{label}: default not stated"


def test_negative_control_a_bare_option_is_caught() -> None:
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    action = parser.add_argument("--x", default=None)
    assert not action.help  # the check above fails on this option


def test_top_level_help_lists_every_entry_point() -> None:
    out = subprocess.run([sys.executable, "-m", "scripts", "--help"], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True).stdout
    modules = {cmd.split()[2] for cmd, _ in ENTRY_POINTS}
    assert {"scripts", "scripts.measure", "scripts.matrix", "scripts.cpu_runtime", "scripts.tiny_laguna",
            "scripts.device.xpu_attention_check", "scripts.device.graph_check"} <= modules
    for module in modules:
        assert f"python -m {module}" in out
    packages = {p.stem for p in (REPO_ROOT / "scripts" / "device").glob("*.py") if p.stem != "__init__"}
    assert {f"scripts.device.{p}" for p in packages} <= modules, "a device check is not listed"


def test_measure_help_lists_its_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "scripts.measure", "--help"], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("crossover", "analyze", "verify-record"):
        assert command in out.stdout
