"""The matrix CLI run the way a user runs it (``python -m scripts.matrix run``), for the e2e tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_matrix(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp_path / "matrix.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.matrix",
            "run",
            "--tiny",
            str(tmp_path / "tiny"),
            "--report",
            str(report),
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    print(proc.stdout[-4000:])
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc, data
