"""The device's day-one run (scripts/device/day_one.py): its steps run in order as child groups
with time limits, one table, one JSON report, a non-zero exit on an exactness failure, and the
options it recommends from the measurements. The checks themselves are stood in for by short
``python -c`` children; the CPU self-test of the real checks runs in CI (``nox -s day_one``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from scripts.device import day_one as acc
from scripts.series_options import DEFAULTS


def _step(name: str, code: str, kind: str = acc.EXACTNESS, limit_s: float = 60, json_out: str = "") -> acc.Step:
    return acc.Step(name, ("-c", code), limit_s, kind, json_out=json_out)


def _linear(switch: str, equal: int, compared: int | None = 8, shape: str = "8x64:64x32") -> dict[str, object]:
    return {"op": "linear:qkv", "shape": shape, "switch": switch, "compared": compared, "equal": equal}


def _moe(form: str, equal: int, repeat_equal: int | None = None) -> dict[str, object]:
    return {"rows": 8, "form": form, "compared": 8, "equal": equal, "repeat_equal": repeat_equal}


def test_recommend_takes_the_fastest_form_that_is_row_invariant_everywhere() -> None:
    ops = [
        _linear("plain", 5),
        _linear("batch_invariant", 8),
        _linear("rows", 8),
        _linear("batch_invariant", 7, shape="8x64:64x256"),  # one shape breaks batch_invariant
        _linear("rows", 8, shape="8x64:64x256"),
        {"op": "qk_norm", "shape": "s", "switch": "pad", "compared": 8, "equal": 8},
        {"op": "all_reduce", "shape": "s", "switch": "gather+rank-sum", "compared": 8, "equal": 8},
    ]
    moe = [_moe("plain", 3, repeat_equal=6), _moe("rows", 8)]
    got = {r.key: r.value for r in acc.recommend(ops, moe)}
    assert got == {
        "row_invariant_linear_form": "rows",
        "row_invariant_qk_norm": "pad",
        "exact_tp_reduce": True,
        "row_invariant_moe": "rows",
    }
    assert set(got) <= set(DEFAULTS)  # option keys the engine knows


def test_recommend_turns_the_experts_form_off_only_when_plain_is_invariant_and_repeatable() -> None:
    assert acc.recommend([], [_moe("plain", 8, repeat_equal=8), _moe("rows", 8)])[0].value == "off"
    # equal rows once, but two plain calls of one input disagree (the atomic remap): keep rows
    assert acc.recommend([], [_moe("plain", 8, repeat_equal=7), _moe("rows", 8)])[0].value == "rows"


def test_no_invariant_form_is_a_failure_and_never_set_in_the_recommended_config() -> None:
    recs = acc.recommend([_linear("batch_invariant", 7), _linear("rows", 6), _linear("plain", 8)], [])
    assert [(r.key, r.value) for r in recs] == [("row_invariant_linear_form", None)]
    run = {"exact_verify": True, "row_invariant_linears": "all"}
    assert acc.recommended_config(recs, run) == {"xpu_laguna": run}  # the run's own value, nothing chosen
    assert acc.verdict([], recs) == ["row_invariant_linear_form: no linear form row-invariant"]


def test_the_recommended_config_is_the_runs_options_with_the_recommendations_applied() -> None:
    recs = acc.recommend([{"op": "qk_norm", "shape": "s", "switch": "tokens", "compared": 8, "equal": 8}], [])
    run = {"exact_verify": True, "row_invariant_qk_norm": "pad", "verify_width": 8}
    assert acc.recommended_config(recs, run) == {
        "xpu_laguna": {"exact_verify": True, "row_invariant_qk_norm": "tokens", "verify_width": 8}
    }


def test_not_run_rows_recommend_nothing() -> None:
    assert acc.recommend([_linear("batch_invariant", 0, compared=None), _linear("rows", 8)], [])[0].value == "rows"


def _rows_json(path: str, rows: list[dict[str, object]]) -> str:
    return f"import json; open({path!r}, 'w').write(json.dumps({{'header': [], 'rows': {rows!r}}}))"


def test_run_all_writes_the_report_the_env_file_and_the_table(tmp_path: Path, capsys) -> None:
    ops = [_linear("batch_invariant", 8), _linear("rows", 8)]
    steps = [
        _step("split-divergence", "print('info line')", kind=acc.INFO),
        _step("ops", _rows_json(str(tmp_path / "ops.json"), ops), kind=acc.MEASUREMENT, json_out="ops.json"),
        _step("attention", "print('PASS (3 cases)')"),
        acc.Step("rows", None, 60, acc.EXACTNESS, why="needs --model-dir and --draft-dir"),
    ]
    options = {"exact_verify": True, "verify_width": 8}
    acc.run_all(steps, sys.executable, tmp_path, "test label", device_result=False, options=options)
    out = capsys.readouterr().out
    assert "[1/4] split-divergence" in out and "[4/4] rows: not run (needs --model-dir" in out
    assert "OK: test label" in out
    report = json.loads((tmp_path / "day-one.json").read_text())
    assert report["device_result"] is False and report["failed"] == []
    assert [s["status"] for s in report["steps"]] == ["pass", "pass", "pass", "not run"]
    assert report["steps"][2]["last_line"] == "PASS (3 cases)"
    recommended = json.loads((tmp_path / "recommended.json").read_text())
    assert recommended == {"xpu_laguna": {**options, "row_invariant_linear_form": "batch_invariant"}}
    assert report["additional_config"] == recommended
    assert "recommend xpu_laguna.row_invariant_linear_form=batch_invariant" in out
    assert (tmp_path / "logs" / "attention.log").read_text().strip() == "PASS (3 cases)"


def test_an_exactness_failure_fails_the_run_and_later_steps_still_run(tmp_path: Path, capsys) -> None:
    steps = [
        _step("attention", "import sys; print('FAILED (1)'); sys.exit(1)"),
        _step("split-divergence", "import sys; sys.exit(3)", kind=acc.INFO),  # info: shown, never gated
        _step("graphs", "print('OK')"),
    ]
    with pytest.raises(acc.DayOneError, match=r"FAILED \(1\): attention: FAIL"):
        acc.run_all(steps, sys.executable, tmp_path, "t", device_result=True)
    report = json.loads((tmp_path / "day-one.json").read_text())
    assert [s["status"] for s in report["steps"]] == ["FAIL", "FAIL", "pass"]
    assert report["failed"] == ["attention: FAIL"]


def test_a_step_past_its_limit_is_stopped_with_its_children(tmp_path: Path) -> None:
    """The child starts a grandchild that would outlive it; both are gone when the step ends."""
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )
    began = time.monotonic()
    with pytest.raises(acc.DayOneError, match="slow: timed out"):
        acc.run_all([_step("slow", code, limit_s=3)], sys.executable, tmp_path, "t", device_result=True)
    assert time.monotonic() - began < 60
    assert not _alive(int(pid_file.read_text()))


def _alive(pid: int) -> bool:
    """Running, not gone or a zombie waiting for a reaper (a killed orphan's state here)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_a_stale_json_from_an_earlier_run_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "ops.json").write_text(json.dumps({"rows": [_linear("rows", 8)]}))
    steps = [_step("ops", "import sys; sys.exit(1)", kind=acc.MEASUREMENT, json_out="ops.json")]
    with pytest.raises(acc.DayOneError):
        acc.run_all(steps, sys.executable, tmp_path, "t", device_result=True)
    assert json.loads((tmp_path / "day-one.json").read_text())["recommended"] == []


def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    old_env = tmp_path / "old.env"
    old_env.write_text("HF_HUB_OFFLINE=1\nVLLM_XPU_LAGUNA_EXACT_VERIFY=0\n")
    for argv, line in (
        (["--only", "nope"], "--only: unknown step(s) nope"),
        (["--model-dir", str(tmp_path)], "--model-dir and --draft-dir go together"),
        (["--model-dir", str(tmp_path), "--draft-dir", str(tmp_path)], "no config.json there"),
        (["--series-options", '{"verify_width": 40}'], "must be 1..16, not 40"),
        (["--series-options", '{"exact_verfy": false}'], "unknown option 'exact_verfy'"),
        (["--env-file", str(old_env)], f"--env-file {old_env}: VLLM_XPU_LAGUNA_EXACT_VERIFY is no longer read"),
    ):
        with pytest.raises(SystemExit) as exc:
            acc.main(argv)
        assert exc.value.code == 2
        assert line in capsys.readouterr().err
    assert acc.main(["--check-only"]) == 0  # the negative control: nothing wrong
    monkeypatch.setenv("VLLM_XPU_LAGUNA_BREAKABLE_GRAPH", "1")  # the checks' engines would refuse it
    with pytest.raises(SystemExit) as exc:
        acc.main(["--check-only"])
    assert exc.value.code == 2
    assert "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH is no longer read" in capsys.readouterr().err


def test_the_device_steps_are_in_order_and_the_pair_steps_wait_for_the_pair(tmp_path: Path) -> None:
    names = [s.name for s in acc.device_steps(tmp_path, None, None)]
    assert names == ["stack", "checkpoint", "split-divergence", "attention", "ops", "moe", "graphs", "rows"]
    assert [s.name for s in acc.device_steps(tmp_path, None, None) if s.argv is None] == ["checkpoint", "rows"]
    with_pair = acc.device_steps(tmp_path, tmp_path / "m", tmp_path / "d")
    assert all(s.argv is not None for s in with_pair)
    assert all("--device" not in s.argv or "xpu" in s.argv for s in with_pair if s.argv)
    self_test = acc.self_test_steps(tmp_path, tmp_path / "tiny", tmp_path / "int4")
    assert [s.name for s in self_test][0] == "models" and set(acc.STEP_NAMES) == {s.name for s in self_test}


def test_the_checks_that_take_options_get_the_runs(tmp_path: Path) -> None:
    options = {"exact_verify": True, "prebuilt_metadata": True, "verify_width": 8}
    series = ("--series-options", json.dumps(options))
    doctor = ("--additional-config", json.dumps({"xpu_laguna": options}))
    for steps in (
        acc.device_steps(tmp_path, tmp_path / "m", tmp_path / "d", options),
        acc.self_test_steps(tmp_path, tmp_path / "tiny", tmp_path / "int4", options),
    ):
        argv = {s.name: " ".join(s.argv or ()) for s in steps}
        assert {name for name, line in argv.items() if " ".join(series) in line} == {"ops", "graphs", "rows"}
        assert " ".join(doctor) in argv["stack"]
        assert not any("VLLM_XPU_LAGUNA_" in line for line in argv.values())


def test_the_default_options_are_the_recipes(tmp_path: Path) -> None:
    from scripts.recipe import cpu_tiny_recipe

    assert acc.recipe_options(cpu=True) == cpu_tiny_recipe().additional_config["xpu_laguna"]
    assert acc.recipe_options(cpu=True)["exact_verify"] is True  # on CPU the series is asked for explicitly
    assert acc.recipe_options(cpu=False)["breakable_graph"] is True
    assert "VLLM_XPU_LAGUNA_" not in acc.recipe_env(cpu=False).read_text()
