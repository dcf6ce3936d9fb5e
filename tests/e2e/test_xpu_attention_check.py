"""The device attention check's non-device paths (self-test on the reference kernels).

On this machine there is no XPU: the script must refuse ``--device xpu`` with one line, and its
``--device cpu`` self-test must run the long-context cases, print the split counts per side and
never call the result PASS (only a device run can pass).
"""

from __future__ import annotations

import subprocess

from tests.tool_run import run_module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("scripts.device.xpu_attention_check", *args, timeout=900)


def test_refuses_xpu_without_a_device() -> None:
    proc = _run("--device", "xpu")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no XPU platform here")
    assert "Traceback" not in proc.stderr


def test_self_test_long_context_reports_split_counts_and_never_passes() -> None:
    proc = _run("--device", "cpu", "--quick", "--widths", "8", "--lengths", "600,8192")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "SELF-TEST on the reference kernels" in out and "no device result" in out
    assert "PASS" not in out
    rows = [line.split() for line in out.splitlines() if line.startswith("global")]
    by_len = {int(r[4]): r for r in rows}
    # global 12:2 at 8192: decode 32 splits, plan 32, the kernel alone would pick 10 for q=8
    assert by_len[8192][5:8] == ["32", "32", "10"]
    assert by_len[8192][8] == "8/8" and by_len[8192][9] == "0/8"  # plan exact, no plan differs
    assert by_len[600][8] == "8/8" and by_len[600][9] == "8/8"  # one split on both sides
    assert "planned decode == kernel decode 4/4 cases" in out


def test_bad_option_is_one_line() -> None:
    proc = _run("--device", "cpu", "--widths", "two")
    assert proc.returncode == 2 and "expected comma-separated integers" in proc.stderr
    assert "Traceback" not in proc.stderr
