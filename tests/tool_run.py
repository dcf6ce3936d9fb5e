"""Run a tooling command line as a developer does: ``python -m MODULE ARGS`` from the repository
root, output captured as text, the exit status left to the test.

The command runs in a process group of its own (:mod:`scripts.procs`): what it starts (a matrix
leg, a server, a device check's leg) would outlive a plain ``subprocess.run`` time limit, which
kills only the direct child, and go on holding a CPU slot's cores. At the limit the whole group
is stopped first, then ``subprocess.TimeoutExpired`` fails the test as before."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from scripts import REPO_ROOT, procs


def run_module(
    module: str, *argv: str, timeout: float, python: str = sys.executable, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGV`` in REPO_ROOT (``env``: the whole environment; default: this process's)."""
    command = [python, "-m", module, *argv]
    done = procs.run(command, cwd=REPO_ROOT, env=env, timeout_s=timeout, capture=True)
    if done.timed_out:
        raise subprocess.TimeoutExpired(command, timeout, output=done.stdout, stderr=done.stderr)
    return subprocess.CompletedProcess(command, done.returncode, done.stdout, done.stderr)
