"""User errors of the measurement CLI are one line and a non-zero exit, never a traceback; a burst
run is written, re-derived and verified like any other run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _measure_run import manifest_for
from test_measure_burst import burst_legs

from _measure_synth import teacher
from scripts import REPO_ROOT
from scripts.errors import ToolError
from scripts.measure import preflight
from scripts.measure.artifacts import RECORD_FILE, finish_run, write_rows
from scripts.measure.cli import analyze_run
from scripts.measure.crossover import parser
from scripts.measure.gates import load_gates
from scripts.measure.leg_recipe import load_recipe
from scripts.measure.record import RecordMeta
from scripts.measure.verify_record import load_record, verify

TREATMENT = {"sole_difference": "X", "control_value": None, "candidate_value": "1"}


def write_run(out: Path) -> dict:
    raw = write_rows(out, burst_legs(), teacher())
    for leg in ("a1", "b1", "b2", "a2", "teacher"):
        (out / f"server-{leg}.log").write_text(f"log of {leg}\n")
        raw[f"{leg}_server_log"] = f"server-{leg}.log"
    meta = RecordMeta(
        "test-record",
        "2026-11-30",
        str(out),
        {"vllm_commit": "f2654939e"},
        TREATMENT,
        {"method": "dflash", "num_speculative_tokens": 3},
        {},
        {},
    )
    _, record = finish_run(out, manifest_for(meta), raw, meta, load_gates())
    return record


def test_burst_run_is_not_a_record_and_verifies_from_raw(tmp_path: Path) -> None:
    record = write_run(tmp_path)
    assert record["status"] == "UNSUBMITTED_NOT_A_RECORD"
    assert record["quality"]["plausible_chunk_timing"] == "11/12"
    assert "plausible_chunk_timing" in record["audits"]["failing_gates"]
    report = verify(load_record(tmp_path / RECORD_FILE), gates=load_gates(), artifacts_root=tmp_path)
    assert report.failures == []
    # negative control: claiming the burst row was plausible is caught from the raw rows
    record["quality"]["plausible_chunk_timing"] = "12/12"
    report = verify(record, gates=load_gates(), artifacts_root=tmp_path)
    assert any("quality.plausible_chunk_timing" in str(f) for f in report.failures)


def test_analyze_names_a_missing_artifact_in_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    write_run(tmp_path)
    assert analyze_run([str(tmp_path), "--no-plot"]) == 0  # complete run: re-analyzed
    capsys.readouterr()
    (tmp_path / "server-b1.log").unlink()
    assert analyze_run([str(tmp_path), "--no-plot"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "raw artifact(s) missing: b1_server_log (server-b1.log)" in err[0]
    (tmp_path / RECORD_FILE).unlink()
    assert analyze_run([str(tmp_path)]) == 1
    assert f"cannot read record {tmp_path / RECORD_FILE}: No such file or directory" in capsys.readouterr().err


def _run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m ARGV`` in the repository."""
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO_ROOT, capture_output=True, text=True, check=False)


def test_no_traceback_for_bad_options(tmp_path: Path) -> None:
    cases = [
        (
            ["scripts.measure", "analyze", str(tmp_path / "nope")],
            f"cannot read run manifest {tmp_path / 'nope' / 'run.json'}: No such file or directory",
        ),
        (["scripts.measure", "crossover", "--treatment", "X=1", "--model", str(tmp_path)], "no config.json"),
        (
            ["scripts.matrix", "run", "--model-dir", "/nonexistent", "--draft-dir", "/nonexistent2"],
            "--model-dir /nonexistent: no such directory",
        ),
        (["scripts.matrix", "run", "--model-dir", str(REPO_ROOT)], "no config.json"),
    ]
    for argv, message in cases:
        proc = _run_module(*argv)
        assert proc.returncode != 0, argv
        assert "Traceback" not in proc.stderr, proc.stderr
        assert message in proc.stderr, proc.stderr


def test_crossover_refuses_a_long_prompt_that_does_not_fit(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    base = [
        "scripts.measure",
        "crossover",
        "--treatment",
        "X=1",
        "--model",
        str(tmp_path),
        "--prompts",
        "3",
        "--max-tokens",
        "32",
        "--window",
        "32",
        "--check-only",
    ]
    # the README's old command: default --long-prompt-tokens 1024 + 32 > --max-model-len 1024
    proc = _run_module(*base, "--server-args", "--max-model-len 1024")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "crossover: error: the long prompt (1024 tokens, --long-prompt-tokens) + --max-tokens 32 = 1056 > 1024 "
        "(--max-model-len in --server-args); lower --long-prompt-tokens or --max-tokens, or raise the limit"
    )
    proc = _run_module(*base, "--server-args", "--max-model-len 1024", "--long-prompt-tokens", "200")
    assert proc.returncode == 0, proc.stderr
    # without --max-model-len the model's max_position_embeddings is the limit
    proc = _run_module(*base, "--max-tokens", "4000", "--rollover-at", "4000")
    assert proc.returncode == 1 and "max_position_embeddings" in proc.stderr


def test_crossover_refuses_server_args_a_stand_in_runtime_cannot_start(tmp_path: Path) -> None:
    """On a CPU runtime whose Triton runs interpreted, servers from --server-args need vLLM's JIT
    warm-up off: one line naming the argument to add. Negative controls: the argument given,
    --enforce-eager, a recipe (it carries its own kernel config), a runtime without the interpreter, no CPU runtime."""
    (tmp_path / "config.json").write_text("{}")
    argv = ["--treatment", "X=1", "--model", str(tmp_path), "--server-args", "--dtype float32"]
    stand_in = {"mode": "stand-in", "triton_interpreted": "3.9.0"}
    with pytest.raises(ToolError) as info:
        preflight.check_runtime(parser().parse_args(argv), None, stand_in)
    text = str(info.value)
    assert text.startswith("--server-args: ") and preflight.JIT_WARMUP_OFF in text and "\n" not in text
    given = [*argv[:-1], "--dtype float32 " + preflight.JIT_WARMUP_OFF]
    preflight.check_runtime(parser().parse_args(given), None, stand_in)
    eager = [*argv[:-1], "--dtype float32 --enforce-eager"]  # turns the warm-up off too
    preflight.check_runtime(parser().parse_args(eager), None, stand_in)
    preflight.check_runtime(parser().parse_args(argv), None, {"mode": "whole", "triton_interpreted": None})
    preflight.check_runtime(parser().parse_args(argv), None, None)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {json.dumps(str(tmp_path))}\n")
    (tmp_path / "r.env").write_text("")
    args = parser().parse_args(["--recipe", str(recipe), "--treatment", "X=1"])
    preflight.check_runtime(args, load_recipe(recipe), stand_in)


def test_bench_shows_the_failing_step_output() -> None:
    import pytest

    from scripts.bench.tooling import _checked
    from scripts.errors import ToolError

    with pytest.raises(ToolError) as caught:
        _checked(
            [sys.executable, "-c", "print('CMake 3.26 or higher is required'); raise SystemExit(3)"],
            "baseline pip wheel",
        )
    text = str(caught.value)
    assert text.startswith("bench: baseline pip wheel failed (exit 3)")
    assert "CMake 3.26 or higher is required" in text
