"""``--emulate-graphs`` and the matrix's graph legs: emulated breakable graphs are asked in the
engine's own config (``xpu_laguna_standins.emulation_entry``, an ``additional_config`` entry beside
the series' options), never in the environment or in process-wide state. The crossover puts the
entry into the ``--additional-config`` of the legs whose options turn breakable graphs on, and of
no other; ``emulation_asked`` reads it from the config it is given, so two configs in one process
do not see each other's ask. The live runs against real engines are the matrix's graph legs and
the crossover's e2e test."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from scripts.cpu_standins import standin_module
from scripts.measure.crossover import leg_argv, leg_inputs, parser
from scripts.measure.leg_recipe import load_recipe
from scripts.series_options import OPTIONS_KEY

STANDINS = standin_module()
KEY = STANDINS.EMULATION_KEY


def _config(additional_config: Any) -> SimpleNamespace:
    return SimpleNamespace(additional_config=additional_config)


def test_the_ask_is_read_from_the_config_it_is_given() -> None:
    asking = _config({OPTIONS_KEY: {"breakable_graph": True}, **STANDINS.emulation_entry()})
    other = _config({OPTIONS_KEY: {"breakable_graph": True}})
    assert STANDINS.emulation_asked(asking) is True
    # negative controls: an engine without the entry in the same process, no additional_config
    assert STANDINS.emulation_asked(other) is False
    assert STANDINS.emulation_asked(_config(None)) is False
    assert STANDINS.emulation_asked(None) is False
    assert STANDINS.emulation_asked(_config({KEY: {"emulated_graphs": False}})) is False
    assert STANDINS.emulation_entry() == {KEY: {"emulated_graphs": True}}


@pytest.mark.parametrize("entry", [True, {"emulated_graphs": "yes"}, {"emulated_graphs": True, "x": 1}, {}])
def test_a_malformed_ask_is_one_line_naming_the_key(entry: Any) -> None:
    with pytest.raises(ValueError) as info:
        STANDINS.emulation_asked(_config({KEY: entry}))
    text = str(info.value)
    assert f"additional_config[{KEY!r}]" in text and "emulated_graphs" in text and "\n" not in text


def _model(tmp_path: Path) -> str:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    return str(tmp_path / "target")


def _additional_configs(argv: list[str], recipe: Any = None) -> dict[str, dict[str, Any]]:
    """Each leg's ``--additional-config`` (the last one: it wins; none: ``{}``) as the crossover
    starts it."""
    args = parser().parse_args(argv)
    legs, _, _ = leg_inputs(args, recipe)
    out: dict[str, dict[str, Any]] = {}
    for name, setup in legs.items():
        command = leg_argv(args, setup, [], 8000, recipe)
        given = [i for i, arg in enumerate(command) if arg == "--additional-config"]
        out[name] = json.loads(command[given[-1] + 1]) if given else {}
    return out


def test_the_crossover_asks_only_in_the_legs_with_breakable_graphs(tmp_path: Path) -> None:
    argv = ["--model", _model(tmp_path), "--treatment", "xpu_laguna.breakable_graph=true", "--emulate-graphs"]
    configs = _additional_configs(argv)
    assert {leg for leg, config in configs.items() if KEY in config} == {"B1", "B2"}
    assert all(configs[leg][OPTIONS_KEY]["breakable_graph"] is True for leg in ("B1", "B2"))
    # the other way round (graphs in the control legs): the ask follows the option
    argv[3:4] = ["xpu_laguna.breakable_graph=false", "--control", "xpu_laguna.breakable_graph=true"]
    configs = _additional_configs(argv)
    assert {leg for leg, config in configs.items() if KEY in config} == {"A1", "A2", "teacher"}


def test_negative_control_no_ask_without_emulate_graphs_or_without_graphs(tmp_path: Path) -> None:
    model = _model(tmp_path)
    configs = _additional_configs(["--model", model, "--treatment", "xpu_laguna.breakable_graph=true"])
    assert not any(KEY in config for config in configs.values())  # not asked for
    argv = ["--model", model, "--treatment", "xpu_laguna.prebuilt_metadata=true", "--emulate-graphs"]
    configs = _additional_configs(argv)
    assert not any(KEY in config for config in configs.values())  # no leg has graphs


def test_a_recipe_with_breakable_graphs_asks_in_every_leg_and_keeps_its_entries(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {json.dumps(_model(tmp_path))}\n"
        'additional-config: {"xpu_laguna": {"breakable_graph": true, "prebuilt_metadata": true}, "other": 1}\n'
    )
    (tmp_path / "r.env").write_text("")
    argv = ["--recipe", str(recipe), "--treatment", "xpu_laguna.prebuilt_metadata=false", "--emulate-graphs"]
    configs = _additional_configs(argv, load_recipe(recipe))
    assert all(config[KEY] == {"emulated_graphs": True} and config["other"] == 1 for config in configs.values())


def test_no_leg_environment_carries_an_emulation_marker(tmp_path: Path) -> None:
    argv = ["--model", _model(tmp_path), "--treatment", "xpu_laguna.breakable_graph=true", "--emulate-graphs"]
    legs, _, _ = leg_inputs(parser().parse_args(argv), None)
    for setup in legs.values():
        assert not any("EMULAT" in name for name in setup.env)
    assert "--emulate-graphs" in parser().format_help()
