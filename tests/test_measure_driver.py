"""Pure parts of the crossover driver: environments, prompt plan, /metrics parsing, arguments."""

from __future__ import annotations

import argparse

import pytest

from scripts.errors import ToolError
from scripts.measure import client
from scripts.measure.crossover import leg_environments, parse_assignments, speculative_config
from scripts.measure.prompts import build_prompts, plan_kinds
from scripts.measure.schema import SpecCounters
from scripts.measure.server import HOST, free_port, serve_argv


def test_assignments() -> None:
    assert parse_assignments(["A=1", "B_C=x=y"], "--env") == {"A": "1", "B_C": "x=y"}
    for bad in (["A"], ["=1"], ["A-B=1"], ["A=1", "A=2"]):
        with pytest.raises(ToolError, match="--env"):
            parse_assignments(bad, "--env")


def test_option_assignments_are_typed_and_series_variables_refused() -> None:
    given = ["xpu_laguna.verify_width=4", "xpu_laguna.row_invariant_qk_norm=tokens", "xpu_laguna.exact_verify=false"]
    assert parse_assignments(given, "--env") == {
        "xpu_laguna.verify_width": 4,
        "xpu_laguna.row_invariant_qk_norm": "tokens",
        "xpu_laguna.exact_verify": False,
    }
    with pytest.raises(
        ToolError,
        match="--env: VLLM_XPU_LAGUNA_VERIFY_WIDTH is no longer read by the series; "
        "set the option xpu_laguna.verify_width instead",
    ):
        parse_assignments(["VLLM_XPU_LAGUNA_VERIFY_WIDTH=4"], "--env")
    for bad in (["xpu_laguna.=1"], ["other.key=1"], ["xpu_laguna.a-b=1"]):
        with pytest.raises(ToolError, match="--env expects NAME=VALUE or xpu_laguna.KEY=VALUE"):
            parse_assignments(bad, "--env")


def test_only_the_treatment_differs_between_legs() -> None:
    base = {"PATH": "/bin", "HF_HUB_OFFLINE": "1"}
    envs = leg_environments(base, {"T": "0"}, {"T": "1"})
    assert envs["A1"] == envs["A2"] == envs["teacher"] == {**base, "T": "0"}
    assert envs["B1"] == envs["B2"] == {**base, "T": "1"}
    # control unset: the A legs do not carry the variable at all
    assert "T" not in leg_environments(base, {}, {"T": "1"})["A1"]


@pytest.mark.parametrize(
    ("base", "control", "treatment", "fragment"),
    [
        ({"T": "0"}, {}, {"T": "1"}, "--env also sets"),
        ({}, {"U": "0"}, {"T": "1"}, "not treated"),
        ({}, {"T": "1"}, {"T": "1"}, "treatment must change"),  # no difference at all
    ],
)
def test_environment_errors(base: dict, control: dict, treatment: dict, fragment: str) -> None:
    with pytest.raises(ToolError, match=fragment):
        leg_environments(base, control, treatment)


def test_plan_kinds() -> None:
    # 13 rows: long rows 3 and 8 (each followed by an ordinary row), rollover row 11
    kinds = plan_kinds(13)
    assert [i for i, k in enumerate(kinds) if k == "long"] == [3, 8]
    assert [i for i, k in enumerate(kinds) if k == "rollover"] == [11]
    assert plan_kinds(3) == ["long", "rollover", "normal"]
    assert plan_kinds(1) == ["normal"]
    with pytest.raises(ToolError):
        plan_kinds(0)


def words(text: str) -> int:
    return len(text.split())


def _thirteen_prompts() -> list:
    return build_prompts(13, "tag", 7, words, prompt_tokens=20, long_prompt_tokens=300, rollover_at=100, max_tokens=64)


def test_prompts_are_unique_and_sized() -> None:
    prompts = _thirteen_prompts()
    assert len({p.text for p in prompts}) == 13
    assert len({p.sha256 for p in prompts}) == 13
    assert [p.index for p in prompts] == list(range(13))
    for prompt in prompts:
        assert prompt.text.startswith(f"Note tag-{prompt.index}: ")
        expected = {"long": 300, "rollover": 100 - 32, "normal": 20}[prompt.kind]
        assert words(prompt.text) == expected  # the counter decides the size exactly
    again = _thirteen_prompts()
    assert [p.text for p in again] == [p.text for p in prompts]  # seeded
    with pytest.raises(ToolError, match="rollover"):
        build_prompts(3, "t", 1, words, prompt_tokens=5, long_prompt_tokens=9, rollover_at=20, max_tokens=64)


METRICS = """\
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="model"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="model"} 3.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="model"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="model"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="model"} 57.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="model",position="0"} 30.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="model"} 1.7e+09
"""


def test_metrics_snapshot() -> None:
    snap = client.snapshot(client.parse_metrics(METRICS))
    assert snap.finished_requests == 5  # summed over finished_reason
    assert snap.spec == SpecCounters(drafts=40, draft_tokens=120, accepted_tokens=57)
    no_spec = client.snapshot(client.parse_metrics(METRICS.split("vllm:spec")[0]))
    assert no_spec.spec is None


def test_speculative_config_and_serve_argv(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = argparse.Namespace(speculative_config=None, draft=str(tmp_path), num_speculative_tokens=7)
    assert speculative_config(args) == {
        "method": "dflash",
        "model": str(tmp_path.resolve()),
        "num_speculative_tokens": 7,
    }
    args.speculative_config = '{"method": "ngram"}'
    with pytest.raises(ToolError, match="num_speculative_tokens"):
        speculative_config(args)
    args.draft, args.speculative_config = None, None
    assert speculative_config(args) is None
    argv = serve_argv("py", "/m", 1234, ["--dtype", "float32"])
    assert argv[argv.index("--host") + 1] == HOST == "127.0.0.1"
    assert "--no-enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv
    assert argv[-2:] == ["--dtype", "float32"]
    assert 0 < free_port() < 65536


def test_prompt_suffix_is_kept_and_counted() -> None:
    prompts = build_prompts(
        3,
        "t",
        1,
        words,
        prompt_tokens=12,
        long_prompt_tokens=40,
        rollover_at=30,
        max_tokens=8,
        suffix=" repeat lagoon lagoon",
    )
    for prompt in prompts:
        assert prompt.text.endswith(" repeat lagoon lagoon")
        assert words(prompt.text) == {"long": 40, "rollover": 26, "normal": 12}[prompt.kind]
