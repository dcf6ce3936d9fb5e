"""Per-module row-invariance check on CPU (tiny Laguna, FlashAttention on the reference kernels).

With the exact verify path on (the series' option ``exact_verify`` in both engines' config,
``--series-options``) every module's output row of a verify forward must be bitwise the teacher's
decode row of the same token (0009 makes the gate softplus and router sigmoid row-invariant on
CPU); with the option off the check must name the attention as the first module that differs (the
negative control: the check can fail).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.tool_run import run_module


def _run(tmp: Path, exact: bool) -> subprocess.CompletedProcess[str]:
    options = json.dumps({"exact_verify": exact})
    argv = ("--tiny", str(tmp / "tiny"), "--prompts", "1", "--max-tokens", "16", "--series-options", options)
    return run_module("scripts.device.row_invariance_check", *argv, timeout=900)


def test_every_module_is_row_invariant_with_the_exact_path(tmp_path: Path) -> None:
    proc = _run(tmp_path, exact=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = [line for line in proc.stdout.splitlines() if line.startswith("summary:")]
    assert summary and "NOT row-invariant" not in proc.stdout, proc.stdout[-3000:]
    compared, total = summary[0].split()[1].split("/")
    assert compared == total and int(total) > 50


def test_exact_path_off_names_the_attention(tmp_path: Path) -> None:
    proc = _run(tmp_path, exact=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    firsts = [line for line in proc.stdout.splitlines() if "first differing module" in line]
    assert firsts and all(".attn" in line for line in firsts), proc.stdout[-3000:]
