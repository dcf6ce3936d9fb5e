"""Fast subset of the equivalence matrix on CPU (the full one is `nox -s matrix`).

Runs the real driver end to end: teacher and DFlash M8 with prebuilt metadata off and on (fresh
engine each) on 13 prompts; the graph legs on a small prompt subset (long, long-then-next, one
plain prompt) through the emulated device graphs, which must come back "passed (emulated graphs)"
with the expected capture topology; and the stale-input negative controls, which must fail.
Every leg that passes equals the teacher token for token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from scripts.matrix import NOT_RUN_NO_GRAPHS, PASSED_EMULATED_GRAPHS

REPO = Path(__file__).resolve().parents[2]
GRAPH_LEGS = ("dflash-graph1-meta0", "dflash-graph1-meta1")


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp_path / "matrix.json"
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.matrix", "run", "--tiny", str(tmp_path / "tiny"), "--report", str(report),
         *args],
        cwd=REPO, capture_output=True, text=True, timeout=1500)
    print(proc.stdout[-4000:])
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc, data


def test_matrix_fast_subset(tmp_path: Path) -> None:
    proc, data = _run(tmp_path, "--prompts", "13", "--max-tokens", "64", "--no-emulated-graphs")
    assert proc.returncode == 0, proc.stderr[-4000:]
    legs = {leg["name"]: leg for leg in data["legs"]}
    assert data["device"] == "cpu" and len(data["prompts"]) == 13
    assert legs["teacher"]["status"] == "passed"
    for name in ("dflash-graph0-meta0", "dflash-graph0-meta1"):
        assert legs[name]["status"] == "passed", legs[name]["mismatches"]
        assert legs[name]["teacher_exact"] == "13/13"
        assert legs[name]["cached_tokens_zero"] == "13/13"
        assert legs[name]["acceptance_rate"] and legs[name]["acceptance_rate"] > 0
    for name in GRAPH_LEGS:
        assert legs[name]["status"] == NOT_RUN_NO_GRAPHS
    assert data["rollover_prompts"], "no prompt crossed a KV block boundary"
    print(f"acceptance rates: { {n: legs[n]['acceptance_rate'] for n in legs if legs[n]['acceptance_rate']} }")


def test_matrix_emulated_graph_legs(tmp_path: Path) -> None:
    proc, data = _run(tmp_path, "--prompts", "3", "--max-tokens", "128", "--min-graph-replays", "100",
                      "--legs", ",".join(("teacher", *GRAPH_LEGS)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    legs = {leg["name"]: leg for leg in data["legs"]}
    assert [p["role"] for p in data["prompts"]] == ["long", "long-then-next", "plain"]
    assert 0 in data["rollover_prompts"], "the long prompt did not cross a KV block boundary"
    for name in GRAPH_LEGS:
        leg = legs[name]
        assert leg["status"] == PASSED_EMULATED_GRAPHS, leg["mismatches"]
        assert leg["teacher_exact"] == "3/3" and leg["cross_leg_exact"].startswith("3/3")
        for label, layers in (("target", 4), ("drafter", 1)):  # tiny_laguna: 4 target layers, 1 draft layer
            acc = leg["graphs"][label]
            assert "RecordingGraph" in acc["graph_class"]
            assert [(c["graphs"], c["breaks_by_kind"]) for c in acc["captures"]] == [
                (layers + 1, {"attention": layers, "collective": 0})]
            assert acc["replays"] >= 100  # 3 prompts: 163 target replays measured
    meta1 = legs["dflash-graph1-meta1"]["attention"]
    assert meta1["prebuilt_calls"] > 0 and meta1["prebuilt_calls"] == sum(meta1["exact_calls_by_width"].values())


def test_matrix_stale_input_negative_controls(tmp_path: Path) -> None:
    """A refreshed input replaced instead of written in place: the guard refuses the replay; with
    the guard bypassed the emulated graph replays the stale buffer and the tokens go wrong."""
    common = ("--prompts", "3", "--max-tokens", "16", "--min-graph-replays", "1",
              "--legs", "teacher,dflash-graph1-meta0")
    proc, data = _run(tmp_path / "guarded", "--inject-fault", "stale-input", *common)
    assert proc.returncode == 1
    leg = {leg["name"]: leg for leg in data["legs"]}["dflash-graph1-meta0"]
    assert leg["status"].startswith("error: leg process exited"), leg
    assert "StaticInputMismatchError" in proc.stderr and "kwargs['input_ids']" in proc.stderr

    proc, data = _run(tmp_path / "unguarded", "--inject-fault", "stale-input-unguarded", *common)
    assert proc.returncode == 1
    leg = {leg["name"]: leg for leg in data["legs"]}["dflash-graph1-meta0"]
    assert leg["status"] == "failed"
    assert leg["teacher_exact"] != "3/3"
    assert any("teacher-exact" in m for m in leg["mismatches"])
