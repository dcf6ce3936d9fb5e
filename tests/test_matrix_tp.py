"""The matrix's TP legs, their teachers and the mutation leg (pure: no vLLM needed)."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from scripts.cpu_slots import OMP_BIND_ENV
from scripts.matrix.cli import main
from scripts.matrix.evaluate import evaluate
from scripts.matrix.legs import EQUAL_BY_ARITHMETIC, LEGS, STANDIN_ENV, TP4_LEGS, TP_REDUCE_ENV
from scripts.matrix.runner import leg_environment, standin_dir
from scripts.measure.emulation import PLUGIN_DIR
from tests.test_matrix_logprobs import TEACHER, _out

LEG = {leg.name: leg for leg in LEGS}
REPO = Path(__file__).resolve().parents[1]


def test_tp2_legs_carry_the_reduction_toggles_and_no_fixed_cpu_binding() -> None:
    env = LEG["dflash-graph0-meta1-tp2"].env()
    assert (env[TP_REDUCE_ENV], env[STANDIN_ENV]) == ("1", "1")
    assert OMP_BIND_ENV not in env  # the cores come from the leg's CPU slots (runner), not the leg
    assert LEG["dflash-ring-tp2-diagnostic"].env()[TP_REDUCE_ENV] == "0"
    assert TP_REDUCE_ENV not in LEG["dflash-graph0-meta0"].env()  # TP 1 legs unchanged


def test_tp_legs_install_the_series_hooks_in_their_workers() -> None:
    env = leg_environment(LEG["dflash-graph1-meta1-tp2"], 1, "cpu", {"PYTHONPATH": "/x"})
    assert env["XPU_LAGUNA_CPU_SERIES_ATTENTION"] == "1" and env["XPU_LAGUNA_EMULATED_GRAPHS"] == "1"
    assert env["PYTHONPATH"].endswith(":/x") and "series_attention" in env["PYTHONPATH"]
    assert "XPU_LAGUNA_CPU_SERIES_ATTENTION" not in leg_environment(LEG["teacher"], 1, "cpu", {})


def test_ring_legs_reach_the_test_side_xccl_standin() -> None:
    """The ring stand-in is test code in the tree's tests/xpu_laguna; a TP leg with it on gets that
    folder on PYTHONPATH (the series-attention folder's plugin registers it in each worker), and the
    plugin folder names the entry point."""
    ring = leg_environment(LEG["dflash-ring-tp2-diagnostic"], 1, "cpu", {})
    assert ring[STANDIN_ENV] == "1" and TP_REDUCE_ENV in ring
    folders = ring["PYTHONPATH"].split(os.pathsep)
    assert str(standin_dir()) in folders and any("series_attention" in f for f in folders)
    assert (REPO / "overlay" / "tests" / "xpu_laguna" / "xccl_ring_standin.py").is_file()
    assert standin_dir().parts[-2:] == ("tests", "xpu_laguna")
    entry = next(PLUGIN_DIR.glob("*.dist-info")) / "entry_points.txt"
    assert "xpu_laguna_cpu_xccl_standin = xpu_laguna_cpu_xccl_standin:register" in entry.read_text()
    # negative control: a TP leg without the stand-in gets no test folder
    plain = leg_environment(replace(LEG["dflash-ring-tp2-diagnostic"], xccl_standin=False), 1, "cpu", {})
    assert str(standin_dir()) not in plain["PYTHONPATH"].split(os.pathsep)


def test_each_leg_is_gated_against_its_own_teacher() -> None:
    differs = copy.deepcopy(TEACHER)
    differs[1][0][1] = (-0.1251).hex()
    names = ("teacher", "teacher-tp2", "dflash-graph0-meta1-tp2", "dflash-lastrow-mutation")
    outputs = {
        "teacher": _out(differs),  # TP 1 teacher: other bits than TP 2's
        "teacher-tp2": _out(TEACHER),
        "dflash-graph0-meta1-tp2": _out(copy.deepcopy(TEACHER)),
        "dflash-lastrow-mutation": _out(copy.deepcopy(differs)),
    }
    results = {r.name: r for r in evaluate(outputs, tuple(LEG[n] for n in names), 2, require_bitwise=True)}
    assert results["dflash-graph0-meta1-tp2"].status == "passed"
    assert (results["dflash-graph0-meta1-tp2"].teacher, results["dflash-graph0-meta1-tp2"].tp) == ("teacher-tp2", 2)
    # the mutation leg is a negative control: equal to its teacher means the gate missed the fault
    assert results["dflash-lastrow-mutation"].status == "failed"
    assert results["dflash-lastrow-mutation"].logprobs["verdict"] == "negative control FAILED"
    outputs["dflash-lastrow-mutation"] = _out(copy.deepcopy(TEACHER))
    results = {r.name: r for r in evaluate(outputs, tuple(LEG[n] for n in names), 2, require_bitwise=True)}
    assert results["dflash-lastrow-mutation"].status == "passed"


def test_fixed_order_off_at_two_ranks_must_still_be_equal() -> None:
    differs = copy.deepcopy(TEACHER)
    differs[0][0][1] = (-0.2501).hex()
    legs = (LEG["teacher-tp2"], LEG["dflash-ring-tp2-diagnostic"])
    outputs = {"teacher-tp2": _out(TEACHER), "dflash-ring-tp2-diagnostic": _out(copy.deepcopy(TEACHER))}
    result = evaluate(outputs, legs, 2, require_bitwise=True)[1]
    assert result.status == "passed" and result.logprobs["verdict"] == EQUAL_BY_ARITHMETIC
    outputs["dflash-ring-tp2-diagnostic"] = _out(differs)
    assert evaluate(outputs, legs, 2, require_bitwise=True)[1].status == "failed"


def test_run_refuses_a_leg_without_its_teacher(capsys: object) -> None:
    assert (
        main(["run", "--tiny", "/tmp/nowhere-tiny", "--legs", "teacher,dflash-graph0-meta1-tp2", "--check-only"]) == 2
    )


# ---------------------------------------------------------------- TP 4

TP4 = {leg.name: leg for leg in TP4_LEGS}


def test_tp4_legs_are_opt_in_and_named_by_the_cli() -> None:
    assert not {leg.name for leg in TP4_LEGS} & set(LEG)  # not in the default run
    assert all(leg.tp == 4 and leg.xccl_standin for leg in TP4_LEGS)
    env = TP4["dflash-graph0-meta1-tp4"].env()
    assert (env[TP_REDUCE_ENV], env[STANDIN_ENV]) == ("1", "1") and OMP_BIND_ENV not in env
    assert TP4["teacher-ring-tp4"].env()[TP_REDUCE_ENV] == "0"
    assert TP4["dflash-ring-tp4-diagnostic"].teacher == "teacher-ring-tp4"
    assert main(["run", "--tiny", "/tmp/nowhere-tiny", "--legs", ",".join(TP4), "--check-only"]) == 0


def test_the_tp4_ring_leg_is_a_negative_control_not_equal_by_arithmetic() -> None:
    """At 4 ranks the fixed order off must change bits: the ring leg fails when equal."""
    differs = copy.deepcopy(TEACHER)
    differs[0][1][1] = (-0.5001).hex()
    legs = (TP4["teacher-ring-tp4"], TP4["dflash-ring-tp4-diagnostic"])
    outputs = {"teacher-ring-tp4": _out(TEACHER), "dflash-ring-tp4-diagnostic": _out(differs)}
    result = evaluate(outputs, legs, 2, require_bitwise=True)[1]
    assert result.status == "passed" and result.logprobs["verdict"].startswith("negative control holds"), result
    outputs["dflash-ring-tp4-diagnostic"] = _out(copy.deepcopy(TEACHER))
    result = evaluate(outputs, legs, 2, require_bitwise=True)[1]
    assert result.status == "failed" and result.logprobs["verdict"] == "negative control FAILED"


def test_tp4_legs_are_refused_where_the_model_cannot_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_attention_heads_per_layer": [4, 4, 4, 2]}
    (model / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 2}))
    argv = ["run", "--model-dir", str(model), "--draft-dir", str(model), "--check-only", "--legs"]
    assert main([*argv, "teacher-tp4,dflash-graph0-meta1-tp4"]) == 2
    assert "runs at TP 4, which the model cannot" in capsys.readouterr().err
    assert main([*argv, "teacher-tp2,dflash-graph0-meta1-tp2"]) == 0  # the same model splits at TP 2
    assert main(["run", "--tiny", str(tmp_path / "tiny"), "--tp", "3", "--legs", "teacher", "--check-only"]) == 2
    assert "no tiny Laguna variant runs at TP 3" in capsys.readouterr().err
