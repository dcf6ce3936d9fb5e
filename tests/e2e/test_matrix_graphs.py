"""The matrix's graph legs on CPU through the emulated device graphs, and the stale-input
negative controls (their own file: pytest-xdist hands out whole files, so these run beside the
fast subset of test_matrix_fast.py).

The graph legs run on a small prompt subset (long, long-then-next, one plain prompt) through the
emulated device graphs, which must come back "passed (emulated graphs)" with the expected capture
topology and bitwise-equal logprobs; the stale-input negative controls must fail.
"""

from __future__ import annotations

from pathlib import Path

from matrix_runs import GRAPH_RUN_LEGS, run_matrix

from scripts.matrix.legs import PASSED_EMULATED_GRAPHS

GRAPH_LEGS = GRAPH_RUN_LEGS[1:]
# 3 prompts x 128 tokens: 46 target replays measured with the tiny pair accepting 68 % of drafted
# tokens (5.6 tokens per verify step; docs/tiny-laguna.md)
MIN_REPLAYS = 40


def test_matrix_emulated_graph_legs(tmp_path: Path) -> None:
    proc, data = run_matrix(
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
        ",".join(GRAPH_RUN_LEGS),
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
        # the target (tiny_laguna: 4 layers) under the series' wrapper; the DFlash drafter eager
        # (Model Runner V2: FULL decode graphs or none, never PIECEWISE)
        assert set(leg["graphs"]) == {"target"}
        acc = leg["graphs"]["target"]
        assert "RecordingGraph" in acc["graph_class"]
        assert [(c["graphs"], c["breaks_by_kind"]) for c in acc["captures"]] == [(5, {"attention": 4, "collective": 0})]
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
    proc, data = run_matrix(tmp_path / "guarded", "--inject-fault", "stale-input", *common)
    assert proc.returncode == 1
    leg = {leg["name"]: leg for leg in data["legs"]}["dflash-graph1-meta0"]
    assert leg["status"].startswith("error: leg process exited"), leg
    assert "StaticInputMismatchError" in proc.stderr and "kwargs['input_ids']" in proc.stderr

    proc, data = run_matrix(tmp_path / "unguarded", "--inject-fault", "stale-input-unguarded", *common)
    assert proc.returncode == 1
    leg = {leg["name"]: leg for leg in data["legs"]}["dflash-graph1-meta0"]
    assert leg["status"] == "failed"
    assert leg["teacher_exact"] != "3/3"
    assert any("teacher-exact" in m for m in leg["mismatches"])


# ---------------------------------------------------------------- TP 2 and the mutation leg
