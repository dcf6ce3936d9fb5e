"""The pristine proof's figures in the terminal summary: the runtime's line (what stands in) and
each case's wall time, slot wait and engine start (the session's cost, docs/cpu-runs.md)."""

from __future__ import annotations

import json
from typing import Any

from proof_log import RESULTS


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from scripts.cpu_stand_in import this_runtime

    terminalreporter.section("stand-in pristine proof")
    terminalreporter.write_line(f"CPU runtime: {this_runtime()['line']}")
    keys = ("case", "got", "wall_s", "slot_wait_s", "startup_s", "generate_s", "error")
    for result in RESULTS:
        terminalreporter.write_line(json.dumps({k: result[k] for k in keys if k in result}))
