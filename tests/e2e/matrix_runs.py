"""The matrix CLI run the way a user runs it (``python -m scripts.matrix run``), for the e2e tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from scripts import REPO_ROOT
from scripts.layout import Layout
from scripts.matrix.legs import LEGS, TP4_LEGS
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


# Which legs each e2e matrix run starts. Together they start every leg `nox -s matrix` can run
# (tests/test_matrix_ci_coverage.py checks it in the tooling tests, so a leg added to LEGS without
# a CI run fails there; the full matrix once broke on a leg no CI run started).
GRAPH_RUN_LEGS = ("teacher", "dflash-graph1-meta0", "dflash-graph1-meta1")
"""test_matrix_graphs.py: the TP 1 graph legs, with their replay counts and capture topology."""
FAST_RUN_LEGS = tuple(leg.name for leg in LEGS if leg.name not in GRAPH_RUN_LEGS[1:])
"""test_matrix_fast.py: every other default leg (the TP 2 graph leg and both diagnostics included)."""
TP4_RUN_LEGS = tuple(leg.name for leg in TP4_LEGS)
"""test_matrix_tp4.py: the opt-in TP 4 legs."""
CI_MATRIX_RUNS = {"fast": FAST_RUN_LEGS, "graphs": GRAPH_RUN_LEGS, "tp4": TP4_RUN_LEGS}

# The fast run (conftest.py ``fast_matrix_run``): 6 prompts x 64 tokens and the long one. On the
# interpreted 0.34.0 runtime a generated token costs about 10x the 0.32.0 runtime's
# (docs/cpu-runs.md), so it keeps 6 of the full matrix's 13 prompts (every leg, the long-context
# prompt and a KV-block rollover kept); the TP 2 graph leg then replays about 70 times (tiny pair,
# 5.6 tokens per verify step; docs/tiny-laguna.md); the full matrix asks 200 of 13 x 128 tokens.
FAST_PROMPTS = 6
FAST_MIN_REPLAYS = 50
FAST_RUN_ARGS = (
    "--prompts", str(FAST_PROMPTS), "--max-tokens", "64", "--legs", ",".join(FAST_RUN_LEGS),
    "--min-graph-replays", str(FAST_MIN_REPLAYS),
)  # fmt: skip
