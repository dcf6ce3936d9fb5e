"""The day-one run's CPU self-test (``python -m scripts.device.day_one --cpu-self-test``): every
device check in order with its CPU options under the tiny CPU recipe's settings (its env file's
variables, its YAML's series options), one table, one JSON report labelled as no device result, the
recommended options by option key and the ``--additional-config`` they make; and its negative control:
the same run with the option ``exact_verify`` off (``--series-options``) fails on the per-module row
check (and the attention self-test still passes: the control breaks only what it turns off). CI runs
it (``ci`` marker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.device.day_one import RECOMMENDED_FILE, SELF_TEST_LABEL, recipe_options
from tests.tool_run import run_module

pytestmark = pytest.mark.ci


def test_the_self_test_passes_labelled_and_recommends_the_series_options(tmp_path: Path) -> None:
    proc = run_module("scripts.device.day_one", "--cpu-self-test", "--out", str(tmp_path), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "day-one.json").read_text())
    assert report["device_result"] is False and report["label"] == SELF_TEST_LABEL
    statuses = {s["name"]: (s["kind"], s["status"]) for s in report["steps"]}
    assert list(statuses) == [
        "models",
        "stack",
        "checkpoint",
        "split-divergence",
        "attention",
        "ops",
        "moe",
        "graphs",
        "rows",
    ]
    assert all(status == "pass" for kind, status in statuses.values() if kind != "info"), statuses
    assert "EMULATED graphs on CPU, not a device result" in (tmp_path / "logs" / "graphs.log").read_text()
    recommended = {r["key"]: r["value"] for r in report["recommended"]}
    assert recommended["row_invariant_linear_form"] == "rows"  # batch_invariant needs a device
    assert set(recommended) >= {"row_invariant_qk_norm", "row_invariant_moe"}
    config = json.loads((tmp_path / RECOMMENDED_FILE).read_text())
    assert config == report["additional_config"]
    assert config["xpu_laguna"] == {**recipe_options(cpu=True), **recommended}  # the recipe's, recommendations on
    assert SELF_TEST_LABEL in proc.stdout.splitlines()[-1]


def test_with_the_exact_path_off_the_row_check_fails(tmp_path: Path) -> None:
    off = json.dumps({"exact_verify": False})  # over the recipe's options
    argv = ("--cpu-self-test", "--out", str(tmp_path / "out"), "--only", "attention,rows", "--series-options", off)
    proc = run_module("scripts.device.day_one", *argv, timeout=1200)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "day-one.json").read_text())
    assert {s["name"]: s["status"] for s in report["steps"]} == {"attention": "pass", "rows": "FAIL"}
    assert report["failed"] == ["rows: FAIL"] and "FAILED (1): rows: FAIL" in proc.stderr
