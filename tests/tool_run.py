"""Run a tooling command line as a developer does: ``python -m MODULE ARGS`` from the repository
root, output captured as text, the exit status left to the test; and what every tooling command
line owes its caller: ``--help`` naming its options, a bad command line refused with exit status 2.

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


def assert_help_names(proc: subprocess.CompletedProcess[str], *options: str) -> None:
    """``proc`` ran ``--help``: exit status 0, each of ``options`` named on stdout."""
    assert proc.returncode == 0, proc.stderr
    missing = [option for option in options if option not in proc.stdout]
    assert not missing, (missing, proc.stdout)


def assert_usage_error(proc: subprocess.CompletedProcess[str], message: str, *, alone: bool = False) -> None:
    """``proc`` refused its command line: exit status 2, nothing on stdout, ``message`` on stderr's
    last line; ``alone``: that line (``error: ...``) is all of stderr (the tool checked the value
    itself, or its parser prints one line), else argparse's usage lines may stand above it."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines and message in lines[-1], proc.stderr
    if alone:
        assert len(lines) == 1 and proc.stderr.startswith("error: ") and proc.stderr.endswith("\n"), proc.stderr
