"""Pure parts of the equivalence matrix: prompts, comparison, verdicts (no vLLM needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.matrix.evaluate import LegResult, evaluate
from scripts.matrix.graphs import GraphExpectation, Topology, decoder_topology
from scripts.matrix.legs import LEGS, NOT_RUN_NO_GRAPHS, PASSED_EMULATED_GRAPHS, make_prompts
from scripts.matrix.report import table
from scripts.tokens import first_difference


def _logprobs(tokens: list[int]) -> list:
    return [[t, (-0.1 * t).hex(), [[t, (-0.1 * t).hex()]]] for t in tokens]


def _rows(tokens: list[list[int]], cached: int = 0) -> dict:
    return {
        "rows": [
            {"token_ids": t, "cached_tokens": cached, "seconds": 0.1, "prompt_tokens": 5, "logprobs": _logprobs(t)}
            for t in tokens
        ],
        "draft_tokens": 70,
        "accepted_tokens": 7,
        "acceptance_rate": 0.1,
    }


def test_prompts_are_fresh_unique_and_have_the_required_roles() -> None:
    first = make_prompts(13, 128, seed=1)
    second = make_prompts(13, 128, seed=2)
    assert len(first) == 13 and len({p.text for p in first}) == 13
    assert not {p.text for p in first} & {p.text for p in second}
    assert first[0].role == "long" and len(first[0].text.split()) > 100
    assert first[1].role == "long-then-next" and first[1].max_tokens < first[0].max_tokens
    assert all(p.max_tokens == 128 for p in first if p.role == "plain")


def test_first_difference_reports_position_and_both_tokens() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == (1, 2, 9)
    assert first_difference([1, 2], [1, 2, 5]) == (2, None, 5)


def test_evaluate_passes_equal_legs_and_marks_graph_legs_not_run() -> None:
    teacher = [[1, 2, 3], [4, 5, 6]]
    outputs = {
        "teacher": _rows(teacher),
        "dflash-graph0-meta0": _rows(teacher),
        "dflash-graph0-meta1": _rows(teacher),
        "dflash-graph1-meta0": {"status": NOT_RUN_NO_GRAPHS},
        "dflash-graph1-meta1": {"status": NOT_RUN_NO_GRAPHS},
    }
    results = {r.name: r for r in evaluate(outputs, LEGS, 2)}
    assert results["dflash-graph0-meta1"].status == "passed"
    assert results["dflash-graph0-meta1"].teacher_exact == "2/2"
    assert results["dflash-graph0-meta1"].cross_leg_exact == "2/2"
    assert results["dflash-graph1-meta1"].status == NOT_RUN_NO_GRAPHS  # never "passed"
    assert "not run" in table(list(results.values()))


def test_evaluate_fails_on_a_token_mismatch_and_names_the_position() -> None:
    teacher = [[1, 2, 3], [4, 5, 6]]
    outputs = {
        "teacher": _rows(teacher),
        "dflash-graph0-meta0": _rows(teacher),
        "dflash-graph0-meta1": _rows([[1, 2, 3], [4, 7, 6]]),
    }
    results = {r.name: r for r in evaluate(outputs, LEGS[:3], 2)}
    bad = results["dflash-graph0-meta1"]
    assert bad.status == "failed" and bad.teacher_exact == "1/2" and bad.cross_leg_exact == "1/2"
    assert "prompt 1 differs first at token 1: expected 5, got 7" in bad.mismatches[0]


def test_evaluate_fails_when_cached_tokens_were_used() -> None:
    teacher = [[1, 2, 3]]
    outputs = {"teacher": _rows(teacher), "dflash-graph0-meta0": _rows(teacher, cached=16)}
    result = evaluate(outputs, LEGS[:2], 1)[1]
    assert result.status == "failed" and result.cached_tokens_zero == "0/1"


def test_a_non_positive_token_budget_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.matrix.cli import main

    assert main(["run", "--tiny", str(tmp_path / "tiny"), "--max-num-batched-tokens", "0"]) == 2
    assert "--max-num-batched-tokens must be positive" in capsys.readouterr().err
    assert not (tmp_path / "tiny").exists()


def _graph_accounting(
    graphs: int = 5,
    attention: int = 4,
    collective: int = 0,
    replays: int = 300,
    graph_class: str = "RecordingGraph (emulated device graph)",
) -> dict:
    capture = {
        "graphs": graphs,
        "breaks": attention + collective,
        "breaks_by_kind": {"attention": attention, "collective": collective},
        "replays": replays,
    }
    return {
        "graph_class": graph_class,
        "captures": [capture],
        "graphs": graphs,
        "breaks": attention + collective,
        "replays": replays,
    }


# tiny target: 4 layers, TP 1 (numbers written out, not derived by the code under test); the DFlash
# drafter is eager under Model Runner V2's PIECEWISE policy (EXPECT), or, for the check's other
# branch, a 1-layer drafter under a wrapper (EXPECT_WRAPPED_DRAFTER)
EXPECT = GraphExpectation(
    target=Topology(attention=4, collective=0), drafter=Topology(attention=1, collective=0), min_replays=200
)
EXPECT_WRAPPED_DRAFTER = GraphExpectation(
    target=Topology(attention=4, collective=0),
    drafter=Topology(attention=1, collective=0),
    min_replays=200,
    drafter_wrapped=True,
)


def _graph_leg(graphs: dict, expect: GraphExpectation = EXPECT) -> LegResult:
    teacher = [[1, 2, 3]]
    outputs = {"teacher": _rows(teacher), "dflash-graph1-meta0": {**_rows(teacher), "graphs": graphs}}
    return evaluate(outputs, (LEGS[0], LEGS[3]), 1, graph_expectation={1: expect})[1]


def test_decoder_topology_matches_the_laguna_counts() -> None:
    assert decoder_topology(48, 4) == Topology(attention=48, collective=97)
    assert decoder_topology(48, 4).graphs == 146
    assert decoder_topology(4, 1).graphs == 5


def test_emulated_graph_leg_passes_labelled_and_never_plain_passed() -> None:
    result = _graph_leg({"target": _graph_accounting()})
    assert result.status == PASSED_EMULATED_GRAPHS, result.mismatches
    assert "RecordingGraph" in table([result]) and "replays 300" in table([result])


def test_device_graph_leg_passes_plain() -> None:
    result = _graph_leg({"target": _graph_accounting(graph_class="torch.xpu.XPUGraph")})
    assert result.status == "passed"


def test_graph_leg_fails_on_wrong_topology_a_wrapped_eager_drafter_or_few_replays() -> None:
    wrong = _graph_leg({"target": _graph_accounting(6, 5)})
    assert wrong.status == "failed"
    assert "target captured graphs=6 attention=5 collective=0, expected graphs=5 attention=4" in wrong.mismatches[0]
    wrapped = _graph_leg({"target": _graph_accounting(), "drafter": _graph_accounting(2, 1)})
    assert wrapped.status == "failed" and "drafter is under a breakable-graph wrapper" in wrapped.mismatches[0]
    few = _graph_leg({"target": _graph_accounting(replays=10)})
    assert few.status == "failed" and "target replayed 10 times" in few.mismatches[0]
    nothing = _graph_leg({})
    assert nothing.status == "failed" and nothing.mismatches == [
        "graphs: no breakable-graph wrapper accounting for the target"
    ]


def test_graph_leg_with_a_drafter_topology_needs_the_drafter_wrapped() -> None:
    both = {"target": _graph_accounting(), "drafter": _graph_accounting(2, 1)}
    assert _graph_leg(both, EXPECT_WRAPPED_DRAFTER).status == PASSED_EMULATED_GRAPHS
    missing = _graph_leg({"target": _graph_accounting()}, EXPECT_WRAPPED_DRAFTER)
    assert missing.status == "failed" and "for the drafter" in missing.mismatches[0]


def test_the_time_table_splits_each_legs_wall_time_into_start_up_generation_and_the_rest() -> None:
    """The matrix prints where each leg's time went, so a slower start-up or generation shows in the
    log of the change that caused it; a leg that did not run has no row."""
    from scripts.matrix.report import time_table

    teacher = [[1, 2, 3], [4, 5, 6]]
    timed = _rows(teacher) | {
        "startup_seconds": 30.0,
        "wall_seconds": 42.5,
        "interpreter": {"seconds": 7.25, "launches": 90},
    }
    outputs = {
        "teacher": timed,
        "dflash-graph0-meta0": _rows(teacher),
        "dflash-graph1-meta0": {"status": NOT_RUN_NO_GRAPHS},
    }
    results = {r.name: r for r in evaluate(outputs, LEGS, 2)}
    assert (results["teacher"].startup_seconds, results["teacher"].wall_seconds) == (30.0, 42.5)
    text = time_table(list(results.values())).splitlines()
    assert text[0].split() == ["leg", "wall", "s", "start-up", "s", "generate", "s", "other", "s", "interp", "s"]
    rows = {line.split()[0]: line.split()[1:] for line in text[2:]}
    assert rows["teacher"] == ["42.5", "30.0", "0.2", "12.3", "7.2"]  # 2 prompts x 0.1 s generating
    assert rows["dflash-graph0-meta0"] == ["0.0", "0.0", "0.2", "0.0", "-"]  # no timing reported (a device)
    assert "dflash-graph1-meta0" not in rows
