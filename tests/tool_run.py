"""Run a tooling command line as a developer does: ``python -m MODULE ARGS`` from the repository
root, output captured as text, the exit status left to the test."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from scripts import REPO_ROOT


def run_module(
    module: str, *argv: str, timeout: float, python: str = sys.executable, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGV`` in REPO_ROOT (``env``: the whole environment; default: this process's)."""
    return subprocess.run(
        [python, "-m", module, *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
