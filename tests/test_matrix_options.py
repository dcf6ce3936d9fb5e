"""The matrix gives each leg's engine the series' options in its config, never in its environment:
``additional_config["xpu_laguna"]`` (``Leg.options``), ``--series-options`` for the others, a
``VLLM_XPU_LAGUNA_*`` variable refused before anything runs, the options recorded per leg in the
report (pure: stand-in ``vllm`` and ``torch`` modules, no engine)."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from scripts.matrix import cli, driver, engine
from scripts.matrix.evaluate import evaluate
from scripts.matrix.legs import ALL_LEGS, LEG_OPTIONS, LEGS
from scripts.matrix.runner import leg_environment
from scripts.series_options import DEFAULTS, ENV_PREFIX

LEG = {leg.name: leg for leg in ALL_LEGS}

# What the legs set, spelled out: the same explicit switches the environment used to carry
# (VLLM_XPU_LAGUNA_{BREAKABLE_GRAPH,M8_PREBUILT_EXACT_ATTN_METADATA,EXACT_VERIFY} always, the
# debug and TP switches where a leg sets them), now typed.
EXPECTED = {
    "teacher": {"breakable_graph": False, "prebuilt_metadata": False, "exact_verify": True},
    "dflash-graph1-meta1": {"breakable_graph": True, "prebuilt_metadata": True, "exact_verify": True},
    "dflash-exact0-diagnostic": {"breakable_graph": False, "prebuilt_metadata": False, "exact_verify": False},
    "dflash-noplan-diagnostic": {
        "breakable_graph": False,
        "prebuilt_metadata": False,
        "exact_verify": True,
        "debug_no_split_plan": True,
    },
    "teacher-tp2": {
        "breakable_graph": False,
        "prebuilt_metadata": False,
        "exact_verify": True,
        "exact_tp_reduce": True,
        "debug_xccl_standin": True,
    },
    "dflash-ring-tp2-diagnostic": {
        "breakable_graph": False,
        "prebuilt_metadata": True,
        "exact_verify": True,
        "exact_tp_reduce": False,
        "debug_xccl_standin": True,
    },
    "teacher-ring-tp4": {
        "breakable_graph": False,
        "prebuilt_metadata": False,
        "exact_verify": True,
        "exact_tp_reduce": False,
        "debug_xccl_standin": True,
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_leg_names_its_switches_as_typed_options(name: str) -> None:
    assert LEG[name].options() == EXPECTED[name]


def test_every_leg_names_its_three_switches_and_sets_only_its_own() -> None:
    """On CPU a switch named true is how an engine asks for the series (the overlay's scope rule):
    every leg names its three switches explicitly, as its environment did, typed."""
    assert set(LEG_OPTIONS) <= set(DEFAULTS)  # every one an option of the series (the overlay's names)
    for leg in ALL_LEGS:
        options = leg.options()
        assert set(options) <= set(LEG_OPTIONS), leg.name
        assert all(isinstance(v, bool) for v in options.values()), leg.name
        assert {"breakable_graph", "prebuilt_metadata", "exact_verify"} <= set(options), leg.name


def test_a_tp1_leg_at_a_tp2_run_gets_the_tp_switches() -> None:
    assert "exact_tp_reduce" not in LEG["dflash-graph0-meta0"].options(1)
    assert LEG["dflash-graph0-meta0"].options(2)["exact_tp_reduce"] is True


def test_extra_options_go_under_the_legs_own() -> None:
    options = LEG["dflash-exact0-diagnostic"].options(1, {"row_invariant_moe": "off", "exact_verify": True})
    assert options["row_invariant_moe"] == "off" and options["exact_verify"] is False  # the leg's own wins


def test_no_leg_environment_carries_a_series_variable() -> None:
    base = {"PATH": "/bin"}
    for leg in ALL_LEGS:
        for device in ("cpu", "xpu"):
            env = leg_environment(leg, 1, device, base)
            assert not [k for k in env if k.startswith(ENV_PREFIX)], (leg.name, device)
    assert leg_environment(LEG["teacher"], 1, "xpu", base) == base


# ---------------------------------------------------------------- the command line


def _check(*extra: str) -> list[str]:
    return ["run", "--tiny", "/tmp/nowhere-tiny", "--legs", "teacher,dflash-graph0-meta0", "--check-only", *extra]


def test_a_series_variable_in_the_environment_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(_check()) == 0
    assert capsys.readouterr().err.strip() == "matrix: options OK"
    monkeypatch.setenv("VLLM_XPU_LAGUNA_ROW_INVARIANT_MOE", "off")
    assert cli.main(_check()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the environment: VLLM_XPU_LAGUNA_ROW_INVARIANT_MOE"), err
    assert "--series-options" in err[0]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "not JSON"),
        ('["row_invariant_moe"]', "must be a JSON object"),
        ('{"exact_verify": false}', "exact_verify: set by the legs themselves"),
        ('{"breakable_graph": true, "debug_xccl_standin": true}', "breakable_graph, debug_xccl_standin: set by"),
        ('{"row_invariant_moe": "sometimes"}', "row_invariant_moe"),  # the engine's own check, before any leg
        ('{"verify_width": "8"}', "verify_width"),
        ('{"no_such_option": 1}', "unknown option 'no_such_option'"),
    ],
)
def test_series_options_that_are_not_an_object_or_name_a_leg_switch_are_refused(
    text: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(_check("--series-options", text))
    assert stop.value.code == 2
    assert why in capsys.readouterr().err


def test_series_options_reach_every_legs_config_and_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the command line to the configs the leg processes get, and to the verdicts."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    seen: list[Any] = []
    monkeypatch.setattr(cli, "drive", lambda args: seen.append(args) or 0)
    argv = ["run", "--model-dir", str(model), "--draft-dir", str(model), "--long-prompt-tokens", "0"]
    argv += ["--legs", "teacher,dflash-noplan-diagnostic,dflash-graph1-meta1", "--max-model-len", "1024"]
    assert cli.main([*argv, "--series-options", '{"row_invariant_moe": "off", "verify_width": 8}']) == 0
    (args,) = seen
    configs: dict[str, dict[str, Any]] = {}

    def run_legs(legs: Any, given: dict[str, dict[str, Any]], *rest: Any, **kw: Any) -> dict[str, Any]:
        configs.update(given)
        return {}

    monkeypatch.setattr(driver, "run_legs", run_legs)
    # the long prompt's block crossing needs the target's tokenizer (tests/test_matrix_rollover.py)
    monkeypatch.setattr(driver, "rollover_prompt", lambda target, spec: spec)
    assert driver._drive(args, "cpu", {}, None) == 1  # no leg ran: the teacher is missing
    extra = {"row_invariant_moe": "off", "verify_width": 8}
    for name in ("teacher", "dflash-noplan-diagnostic", "dflash-graph1-meta1"):
        assert configs[name]["options"] == {**extra, **EXPECTED[name]}, name
        json.dumps(configs[name])  # the leg process reads its config from a JSON file
    assert configs["dflash-noplan-diagnostic"]["options"]["debug_no_split_plan"] is True
    results = {r.name: r for r in evaluate({}, tuple(LEGS[:2]), 3, series_options=extra)}
    assert results["teacher"].options == {**extra, **EXPECTED["teacher"]}
    assert results["dflash-graph0-meta0"].options["row_invariant_moe"] == "off"


# ---------------------------------------------------------------- the leg's engine


class _Built(Exception):
    """Raised by the stand-in LLM: the engine arguments are what the test wants."""


def _stand_in_vllm(monkeypatch: pytest.MonkeyPatch, built: list[dict[str, Any]]) -> None:
    """Just enough ``torch`` and ``vllm`` for :func:`scripts.matrix.engine.run_leg` to reach
    ``LLM(**kwargs)``."""

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            built.append(kwargs)
            raise _Built

    counters = types.SimpleNamespace(reset=lambda: None)
    modules = {
        "torch": types.ModuleType("torch"),
        "vllm": types.ModuleType("vllm"),
        "vllm.plugins": types.ModuleType("vllm.plugins"),
        "vllm.xpu_laguna": types.ModuleType("vllm.xpu_laguna"),
        "vllm.xpu_laguna.attention": types.ModuleType("vllm.xpu_laguna.attention"),
        "vllm.xpu_laguna.attention.exact": types.ModuleType("vllm.xpu_laguna.attention.exact"),
    }
    modules["vllm"].LLM = LLM  # type: ignore[attr-defined]
    modules["vllm"].SamplingParams = object  # type: ignore[attr-defined]
    modules["vllm.plugins"].load_general_plugins = lambda: None  # type: ignore[attr-defined]
    exact = modules["vllm.xpu_laguna.attention.exact"]
    exact.counters = counters  # type: ignore[attr-defined]
    exact.kernel_seam_name = lambda: "stand-in"  # type: ignore[attr-defined]
    modules["vllm.xpu_laguna.attention"].exact = exact  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize("name", ["dflash-ring-tp2-diagnostic", "teacher"])
def test_the_legs_engine_gets_its_options_in_additional_config(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[dict[str, Any]] = []
    _stand_in_vllm(monkeypatch, built)
    leg = LEG[name]
    options = leg.options(1, {"row_invariant_moe": "off"})
    config = {
        "leg": asdict(leg),
        "target": "/t",
        "draft": "/d",
        "method": "dflash",
        "dtype": "float32",
        "tp": leg.tp_size(1),
        "options": options,
        "max_model_len": 1024,
        "prompts": [],
    }
    with pytest.raises(_Built):
        engine.run_leg(config)
    (kwargs,) = built
    assert kwargs["additional_config"] == {"xpu_laguna": options}
    assert kwargs["additional_config"]["xpu_laguna"] is not options  # a copy: the config stays the leg's
