"""``--emulate-graphs``: the sitecustomize hook that installs the emulated breakable graphs in
every vLLM process of a CPU server whose environment has the marker, and only there; the crossover
sets the marker in the legs whose options turn breakable graphs on, and in no other. Runs against a
stand-in ``vllm`` package and a stand-in test-side package (the hook's contract: call
``install_cpu_emulation`` once the breakable-graph package, or one of its modules, or the CPU runner
module is imported); the live run against the real server is in the README."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.measure.crossover import leg_inputs, parser
from scripts.measure.emulation import MARK_ENV, SITE_DIR, emulated_graphs_env
from scripts.measure.leg_recipe import load_recipe

PROBE = """
import sys
started_with_vllm = any(m.split(".")[0] == "vllm" for m in sys.modules)
import {module}
import xpu_laguna_standins.emulated_graphs as emulation
print(started_with_vllm, emulation.CALLS)
"""


def _fake_vllm(root: Path) -> Path:
    pkg = root / "vllm"
    (pkg / "compilation").mkdir(parents=True)
    (pkg / "v1" / "worker").mkdir(parents=True)
    for init in (pkg, pkg / "compilation", pkg / "v1", pkg / "v1" / "worker"):
        (init / "__init__.py").write_text("")
    (pkg / "xpu_laguna" / "graphs").mkdir(parents=True)
    (pkg / "xpu_laguna" / "__init__.py").write_text("")
    (pkg / "xpu_laguna" / "graphs" / "__init__.py").write_text("")
    (pkg / "xpu_laguna" / "graphs" / "config.py").write_text("")
    (pkg / "v1" / "worker" / "cpu_worker.py").write_text("")
    (pkg / "other.py").write_text("")
    # the CPU runtime's test-side stand-ins (laid next to vllm/ by cpu_runtime sync)
    standins = root / "xpu_laguna_standins"
    standins.mkdir()
    (standins / "__init__.py").write_text("")
    (standins / "emulated_graphs.py").write_text(
        "CALLS = 0\n\ndef install_cpu_emulation():\n    global CALLS\n    CALLS += 1\n"
    )
    return root


def _run(tmp_path: Path, module: str, **env: str) -> str:
    root = _fake_vllm(tmp_path)
    clean = {k: v for k, v in os.environ.items() if k != MARK_ENV and not k.startswith("VLLM_XPU_LAGUNA_")}
    full = {**clean, **env, "PYTHONPATH": f"{env.get('PYTHONPATH', '')}{os.pathsep}{root}"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)], env=full, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    "module",
    [
        "vllm.xpu_laguna.graphs",
        "vllm.xpu_laguna.graphs.config",  # what the config's checks import
        "vllm.v1.worker.cpu_worker",  # what a CPU worker process imports before it loads the model
    ],
)
def test_hook_installs_once_when_vllm_loads_the_wrapper_or_the_cpu_worker(tmp_path: Path, module: str) -> None:
    out = _run(tmp_path, module, **emulated_graphs_env())
    assert out == "False 1"  # nothing of vLLM imported at start-up; installed once


def test_hook_installs_once_for_both_modules(tmp_path: Path) -> None:
    module = "vllm.xpu_laguna.graphs, vllm.v1.worker.cpu_worker"
    out = _run(tmp_path, module, **emulated_graphs_env())
    assert out == "False 1"


def test_hook_does_nothing_for_other_modules(tmp_path: Path) -> None:
    out = _run(tmp_path, "vllm.other", **emulated_graphs_env())
    assert out == "False 0"


@pytest.mark.parametrize(
    "env",
    [
        {},  # a leg without graphs (control legs, teacher): the hook on the path, no marker
        {MARK_ENV: "0"},  # not asked for
    ],
)
def test_hook_stays_off_without_the_marker(tmp_path: Path, env: dict[str, str]) -> None:
    full = {**env, "PYTHONPATH": str(SITE_DIR)}
    assert _run(tmp_path, "vllm.xpu_laguna.graphs", **full) == "False 0"


def test_crossover_option_puts_the_hook_on_the_path() -> None:
    args = parser().parse_args(["--treatment", "A=1", "--model", "m", "--emulate-graphs"])
    assert args.emulate_graphs is True
    assert (SITE_DIR / "sitecustomize.py").is_file()
    assert emulated_graphs_env() == {"PYTHONPATH": str(SITE_DIR), MARK_ENV: "1"}
    assert "--emulate-graphs" in parser().format_help()


def _model(tmp_path: Path) -> str:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    return str(tmp_path / "target")


def test_the_crossover_sets_the_marker_only_in_the_legs_with_breakable_graphs(tmp_path: Path) -> None:
    argv = ["--model", _model(tmp_path), "--treatment", "xpu_laguna.breakable_graph=true", "--emulate-graphs"]
    legs, _, _ = leg_inputs(parser().parse_args(argv), None)
    assert {leg for leg, setup in legs.items() if MARK_ENV in setup.env} == {"B1", "B2"}
    assert all(legs[leg].env[MARK_ENV] == "1" for leg in ("B1", "B2"))
    assert all(str(SITE_DIR) in setup.env["PYTHONPATH"].split(os.pathsep) for setup in legs.values())
    # the other way round (graphs in the control legs): the marker follows the option
    argv[3:4] = ["xpu_laguna.breakable_graph=false", "--control", "xpu_laguna.breakable_graph=true"]
    legs, _, _ = leg_inputs(parser().parse_args(argv), None)
    assert {leg for leg, setup in legs.items() if MARK_ENV in setup.env} == {"A1", "A2", "teacher"}


def test_negative_control_no_marker_without_emulate_graphs_or_without_graphs(tmp_path: Path) -> None:
    model = _model(tmp_path)
    argv = ["--model", model, "--treatment", "xpu_laguna.breakable_graph=true"]
    legs, _, _ = leg_inputs(parser().parse_args(argv), None)
    assert not any(MARK_ENV in setup.env for setup in legs.values())  # not asked for
    argv = ["--model", model, "--treatment", "xpu_laguna.prebuilt_metadata=true", "--emulate-graphs"]
    legs, _, _ = leg_inputs(parser().parse_args(argv), None)
    assert not any(MARK_ENV in setup.env for setup in legs.values())  # no leg has graphs


def test_a_recipe_with_breakable_graphs_emulates_them_in_every_leg(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {json.dumps(_model(tmp_path))}\n"
        'additional-config: {"xpu_laguna": {"breakable_graph": true, "prebuilt_metadata": true}}\n'
    )
    (tmp_path / "r.env").write_text("")
    args = parser().parse_args(
        ["--recipe", str(recipe), "--treatment", "xpu_laguna.prebuilt_metadata=false", "--emulate-graphs"]
    )
    legs, _, _ = leg_inputs(args, load_recipe(args.recipe))
    assert all(setup.env.get(MARK_ENV) == "1" for setup in legs.values())
