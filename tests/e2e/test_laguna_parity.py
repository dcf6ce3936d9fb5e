"""vLLM (CPU, patched tree) against transformers' LagunaForCausalLM.

transformers' implementation is the independent reference: the same tiny
random checkpoint (float32, sliding + global layers, gating, sigmoid MoE with a
non-zero routing correction bias) must give

* identical greedy tokens (transformers generates on its own, token by token);
* teacher-forced log-probabilities within LOGPROB_TOL at every generated and
  prompt position, for every top-k token vLLM reports.

Without the routing-bias patch (0002) vLLM routes with a zero bias and both
checks fail; without the CPU sigmoid patch (0003) the engine does not start.
"""

from __future__ import annotations

from typing import Any

import pytest

from scripts.tiny_laguna import TinyModels

LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def hf_model(tiny_models: TinyModels) -> Any:
    import torch
    from transformers import LagunaForCausalLM

    model = LagunaForCausalLM.from_pretrained(str(tiny_models.target), dtype=torch.float32)
    return model.eval()


def _hf_greedy(model: Any, prompt_ids: list[int], n: int) -> list[int]:
    """Free-running greedy decode, recomputing the whole sequence each step.

    No cache on purpose: the reference is transformers' plain full forward
    (EOS is an ordinary token here, as vLLM runs with ignore_eos).
    """
    import torch

    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids]), use_cache=False).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def _hf_logprobs(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_checkpoint_has_nonzero_routing_bias(tiny_models: TinyModels) -> None:
    """The premise of the parity test: a bias the router must not drop."""
    from safetensors import safe_open

    with safe_open(str(tiny_models.target / "model.safetensors"), "pt") as f:
        keys: list[str] = list(f.keys())
        names = [k for k in keys if k.endswith("mlp.experts.e_score_correction_bias")]
        assert names, "tiny checkpoint has no routing correction bias"
        for name in names:
            assert float(f.get_tensor(name).abs().min()) > 0.0, name


def test_greedy_tokens_match_transformers(hf_model: Any, baseline_run: Any, e2e: Any) -> None:
    assert len(baseline_run.completions) >= len(e2e.parity_prompts)
    for prompt, comp in zip(e2e.parity_prompts, baseline_run.completions):
        assert len(comp.token_ids) == e2e.max_new_tokens >= 64
        ref = _hf_greedy(hf_model, comp.prompt_ids, e2e.max_new_tokens)
        first_diff = next((i for i, (a, b) in enumerate(zip(ref, comp.token_ids)) if a != b), None)
        assert first_diff is None, (
            f"{prompt!r}: vLLM diverges from transformers at new token {first_diff}: "
            f"vllm={comp.token_ids[first_diff : first_diff + 5]} hf={ref[first_diff : first_diff + 5]}"
        )
    e2e.measured["greedy tokens identical to transformers"] = (
        f"{len(e2e.parity_prompts)} prompts x {e2e.max_new_tokens} new tokens"
    )


def test_teacher_forced_logprobs_match_transformers(hf_model: Any, baseline_run: Any, e2e: Any) -> None:
    worst = 0.0
    where = ""
    compared = 0
    for prompt, comp in zip(e2e.parity_prompts, baseline_run.completions):
        ids = comp.prompt_ids + comp.token_ids
        ref = _hf_logprobs(hf_model, ids)
        n = len(comp.prompt_ids)
        assert len(comp.logprobs) == len(comp.token_ids)
        assert len(comp.prompt_logprobs) == n - 1
        # prompt_logprobs[i] scores token i+1 from position i; logprobs[j] scores
        # new token j from position n-1+j.
        positions = [(i, d) for i, d in enumerate(comp.prompt_logprobs)]
        positions += [(n - 1 + j, d) for j, d in enumerate(comp.logprobs)]
        for pos, entries in positions:
            for token, lp in entries.items():
                diff = abs(float(ref[pos, token]) - lp)
                compared += 1
                if diff > worst:
                    worst, where = diff, f"{prompt!r} position {pos} token {token}"
    e2e.measured["max |logprob(vLLM) - logprob(transformers)|"] = (
        f"{worst:.3g} over {compared} (position, token) pairs (tolerance {LOGPROB_TOL:g})"
    )
    assert compared > 0
    assert worst <= LOGPROB_TOL, f"max logprob difference {worst:.4g} at {where}"
