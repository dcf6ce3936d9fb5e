"""Fast subset of the equivalence matrix on CPU (the full one is `nox -s matrix`).

Runs the real driver end to end: teacher, DFlash M8 with prebuilt metadata off and on (fresh
engine each) and the diagnostic leg with the exact verify off, on 13 prompts plus one
long-context prompt (>= 4200 tokens, 16 generated tokens, prefilled in one chunk in every leg).
Every exact leg must equal the teacher token for token and its logprobs (sampled + top-5)
bitwise at every position of every prompt, the long-context one included; the diagnostic leg
must NOT be bitwise equal (the logprob gate's negative control). The leg without the KV split
plan runs in the full matrix only (`nox -s matrix`). The graph legs run on a small prompt subset
(long, long-then-next, one plain prompt) through the emulated device graphs, which must come
back "passed (emulated graphs)" with the expected capture topology and bitwise-equal logprobs;
the stale-input negative controls must fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.matrix.legs import LEGS, NOT_RUN_NO_GRAPHS, PASSED_EMULATED_GRAPHS

REPO = Path(__file__).resolve().parents[2]
GRAPH_LEGS = ("dflash-graph1-meta0", "dflash-graph1-meta1")
# 3 prompts x 128 tokens: 46 target and 49 drafter replays measured with the tiny pair accepting
# 68 % of drafted tokens (5.6 tokens per verify step; docs/tiny-laguna.md)
MIN_REPLAYS = 40


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
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


CI_LEGS = ",".join(leg.name for leg in LEGS if leg.name != "dflash-noplan-diagnostic")


def test_matrix_fast_subset(tmp_path: Path) -> None:
    proc, data = _run(tmp_path, "--prompts", "13", "--max-tokens", "64", "--legs", CI_LEGS, "--no-emulated-graphs")
    assert proc.returncode == 0, proc.stderr[-4000:]
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
    for name in GRAPH_LEGS:
        assert legs[name]["status"] == NOT_RUN_NO_GRAPHS
    diagnostic = legs["dflash-exact0-diagnostic"]
    assert diagnostic["status"] == "passed", diagnostic["mismatches"]
    lp = diagnostic["logprobs"]
    assert lp["logprobs_bitwise_equal"] < lp["positions"], "negative control: exact verify off matched bitwise"
    assert data["rollover_prompts"], "no prompt crossed a KV block boundary"
    print(f"acceptance rates: { {n: legs[n]['acceptance_rate'] for n in legs if legs[n]['acceptance_rate']} }")


def test_matrix_emulated_graph_legs(tmp_path: Path) -> None:
    proc, data = _run(
        tmp_path,
        "--prompts",
        "3",
        "--max-tokens",
        "128",
        "--min-graph-replays",
        str(MIN_REPLAYS),
        "--long-prompt-tokens",
        "0",
        "--legs",
        ",".join(("teacher", *GRAPH_LEGS)),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    legs = {leg["name"]: leg for leg in data["legs"]}
    assert [p["role"] for p in data["prompts"]] == ["long", "long-then-next", "plain"]
    assert 0 in data["rollover_prompts"], "the long prompt did not cross a KV block boundary"
    for name in GRAPH_LEGS:
        leg = legs[name]
        assert leg["status"] == PASSED_EMULATED_GRAPHS, leg["mismatches"]
        assert leg["teacher_exact"] == "3/3" and leg["cross_leg_exact"].startswith("3/3")
        lp = leg["logprobs"]  # emulated replays change no bit of the logprobs
        assert lp["positions"] > 0 and lp["logprobs_bitwise_equal"] == lp["positions"], lp
        for label, layers in (("target", 4), ("drafter", 1)):  # tiny_laguna: 4 target layers, 1 draft layer
            acc = leg["graphs"][label]
            assert "RecordingGraph" in acc["graph_class"]
            assert [(c["graphs"], c["breaks_by_kind"]) for c in acc["captures"]] == [
                (layers + 1, {"attention": layers, "collective": 0})
            ]
            assert acc["replays"] >= MIN_REPLAYS
    meta1 = legs["dflash-graph1-meta1"]["attention"]
    assert meta1["prebuilt_calls"] > 0 and meta1["prebuilt_calls"] == sum(meta1["exact_calls_by_width"].values())


def test_matrix_stale_input_negative_controls(tmp_path: Path) -> None:
    """A refreshed input replaced instead of written in place: the guard refuses the replay; with
    the guard bypassed the emulated graph replays the stale buffer and the tokens go wrong."""
    common = (
        "--prompts",
        "3",
        "--max-tokens",
        "16",
        "--min-graph-replays",
        "1",
        "--long-prompt-tokens",
        "0",
        "--legs",
        "teacher,dflash-graph1-meta0",
    )
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


# ---------------------------------------------------------------- TP 2 and the mutation leg

TP2_LEGS = ("teacher-tp2", "dflash-graph0-meta1-tp2")


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The cheapest real TP 2 pair: teacher-tp2 and one exact DFlash leg (mp executor, 2 worker
    processes each, the XCCL ring stand-in on), 3 short prompts."""
    common = ("--prompts", "3", "--max-tokens", "16", "--long-prompt-tokens", "0")
    return _run(tmp_path_factory.mktemp("tp2"), *common, "--legs", ",".join(TP2_LEGS))


def test_matrix_tp2_legs_run_the_series_in_every_rank(tp2_run: tuple[Any, dict[str, Any]]) -> None:
    _, data = tp2_run
    legs = {leg["name"]: leg for leg in data["legs"]}
    leg = legs["dflash-graph0-meta1-tp2"]
    assert leg["tp"] == 2 and leg["teacher"] == "teacher-tp2"
    assert (
        leg["env"]["VLLM_XPU_LAGUNA_EXACT_TP_REDUCE"] == "1" and leg["env"]["VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN"] == "1"
    )
    assert leg["teacher_exact"] == "3/3" and leg["cached_tokens_zero"] == "3/3"
    ranks = leg["attention"]["ranks"]  # the series' attention ran in both worker processes
    assert len(ranks) == 2 and all(r["exact_calls_by_width"].get("8", 0) > 0 for r in ranks)
    assert all(r["prebuilt_calls"] > 0 for r in ranks)
    assert leg["collectives_per_step"]["target"] == 2 * 4 + 1  # tiny target: 4 layers
    assert len(leg["accepted_per_depth"]) == 7 and leg["accepted_per_depth"][0] > 0


def test_matrix_tp2_exact_leg_is_bitwise_equal_to_its_teacher(tp2_run: tuple[Any, dict[str, Any]]) -> None:
    """Was a strict xfail until patch 0009 made LagunaMLP's SiLU row-invariant (the shared expert
    has 16 columns per rank at TP 2): docs/matrix-tp.md."""
    proc, data = tp2_run
    lp = {leg["name"]: leg for leg in data["legs"]}["dflash-graph0-meta1-tp2"]["logprobs"]
    assert lp["positions"] > 0 and lp["logprobs_bitwise_equal"] == lp["positions"], lp
    assert proc.returncode == 0


def test_matrix_catches_a_one_ulp_fault_in_the_last_verify_row(tmp_path: Path) -> None:
    """Negative control of the gate's reach: every logit of verify row M-1 one ulp up (the
    row used only when all 7 drafts are accepted) must make the leg differ from the teacher."""
    proc, data = _run(
        tmp_path, "--prompts", "3", "--max-tokens", "32", "--long-prompt-tokens", "0",
        "--legs", "teacher,dflash-lastrow-mutation",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    leg = {leg["name"]: leg for leg in data["legs"]}["dflash-lastrow-mutation"]
    assert leg["status"] == "passed", leg["mismatches"]  # a diagnostic leg passes when it differs
    assert leg["accepted_per_depth"][6] > 0  # full acceptance happened: row M-1 was used
    lp = leg["logprobs"]
    assert lp["logprobs_bitwise_equal"] < lp["positions"], lp
