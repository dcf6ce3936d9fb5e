"""The matrix CLI run the way a user runs it (``python -m scripts.matrix run``), for the e2e tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from scripts import REPO_ROOT
from scripts.layout import Layout
from tests.tool_run import run_module

TINY = Layout(REPO_ROOT, build_dir=REPO_ROOT / "build").tiny_models
"""The tiny pair every matrix run of the e2e tests uses (what ``nox -s cpu_runtime`` makes, the
folder ``recipes/cpu-tiny.yaml`` names): generated once, reused by every run after
(:func:`scripts.tiny_laguna.ensure_models`; the TP 4 variant in its ``tp4/`` sub-folder)."""


def run_matrix(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp_path / "matrix.json"
    argv = ("run", "--tiny", str(TINY), "--report", str(report), *args)
    proc = run_module("scripts.matrix", *argv, timeout=1500)
    print(proc.stdout[-4000:])
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc, data
