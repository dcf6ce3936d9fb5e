"""Fast subset of the equivalence matrix on CPU (the full one is `nox -s matrix`).

Runs the real driver end to end: teacher, DFlash M8 with prebuilt metadata off and on (fresh
engine each), the graph legs, which must come back "not run" on a machine without device
graphs, and the diagnostic leg with the exact verify off. Every exact leg that runs must equal
the teacher token for token and its logprobs (sampled + top-5) bitwise at every position of the
short prompts and of one long-context prompt (>= 4200 tokens, 16 generated tokens, prefilled in
one chunk in every leg); the diagnostic leg must NOT be bitwise equal (the logprob gate's negative control). The leg without the KV split
plan runs in the full matrix only (`nox -s matrix`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts.matrix import LEGS, NOT_RUN_NO_GRAPHS

REPO = Path(__file__).resolve().parents[2]


CI_LEGS = ",".join(leg.name for leg in LEGS if leg.name != "dflash-noplan-diagnostic")


def test_matrix_fast_subset(tmp_path: Path) -> None:
    report = tmp_path / "matrix.json"
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.matrix", "run", "--tiny", str(tmp_path / "tiny"), "--prompts", "13",
         "--max-tokens", "64", "--report", str(report), "--legs", CI_LEGS],
        cwd=REPO, capture_output=True, text=True, timeout=1500)
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(report.read_text())
    legs = {leg["name"]: leg for leg in data["legs"]}
    assert data["device"] == "cpu" and len(data["prompts"]) == 14  # 13 + the long-context prompt
    (long_context,) = data["long_context_prompts"]
    assert long_context["prompt_tokens"] >= 4200
    assert legs["teacher"]["status"] == "passed"
    for name in ("dflash-graph0-meta0", "dflash-graph0-meta1"):
        assert legs[name]["status"] == "passed", legs[name]["mismatches"]
        assert legs[name]["teacher_exact"] == "14/14"
        assert legs[name]["cached_tokens_zero"] == "14/14"
        lp = legs[name]["logprobs"]
        assert lp["positions"] > 0 and lp["logprobs_bitwise_equal"] == lp["positions"], lp
        assert legs[name]["longest_context"] >= long_context["prompt_tokens"] + 8
        # the long-context prompt: gated like the short ones (one prefill chunk in every leg)
        lc = lp["long_context"]
        assert lc["positions"] >= 8 and lc["logprobs_bitwise_equal"] == lc["positions"], lc
        assert legs[name]["acceptance_rate"] and legs[name]["acceptance_rate"] > 0
    for name in ("dflash-graph1-meta0", "dflash-graph1-meta1"):
        assert legs[name]["status"] == NOT_RUN_NO_GRAPHS
    diagnostic = legs["dflash-exact0-diagnostic"]
    assert diagnostic["status"] == "passed", diagnostic["mismatches"]
    lp = diagnostic["logprobs"]
    assert lp["logprobs_bitwise_equal"] < lp["positions"], "negative control: exact verify off matched bitwise"
    assert data["rollover_prompts"], "no prompt crossed a KV block boundary"
    print(f"acceptance rates: { {n: legs[n]['acceptance_rate'] for n in legs if legs[n]['acceptance_rate']} }")
