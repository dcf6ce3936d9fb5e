"""Generate a tiny random Laguna target and a matching DFlash drafter.

Everything is made locally from a fixed seed (no model hub): the target is a
random-init ``transformers`` ``LagunaForCausalLM`` saved with its own
``save_pretrained`` (so it has the real checkpoint's tensor names), the
tokenizer is a byte-level BPE trained here with ``tokenizers``, and the drafter
is written with the parameter names vLLM's ``laguna_dflash.py`` loads.

Design of the weights (so tests see more than the rejection path):

* float32, four layers: three sliding-window layers and one global layer,
  more query heads on the sliding layers (as in Laguna-S), softplus gating on,
  a dense first layer and sigmoid-routed MoE layers with a shared expert and a
  NON-ZERO random routing correction bias (large enough to change which
  experts are selected when it is dropped).
* The embedding of one ordinary word token (``REPEAT_WORD``) and of the mask
  token point along a shared unit direction ``d``, and the lm_head row of the
  repeat token is aligned with ``d``. Once the repeat token appears the target
  keeps emitting it (an absorbing state); before that, output is random. The
  drafter shares the target's embeddings and lm_head and uses the mask token,
  so in the absorbing state it proposes the repeat token at every position and
  the proposals are accepted: a non-zero acceptance rate.

CLI: ``python -m scripts.tiny_laguna --out DIR [--seed N]`` writes ``DIR/target``
and ``DIR/draft``. Heavy imports (torch, transformers) happen inside
``generate`` only, so importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scripts.errors import ToolError

if TYPE_CHECKING:
    import torch

__all__ = ["MASK_TOKEN", "REPEAT_WORD", "TinyModels", "generate", "main"]

REPEAT_WORD = " lagoon"
MASK_TOKEN = "<|mask|>"
VOCAB_MULTIPLE = 64
BPE_VOCAB = 300  # trained size before padding (padded up to a multiple of 64)

# Architecture of the tiny target.
HIDDEN = 64
HEAD_DIM = 32
NUM_KV_HEADS = 2
LAYER_TYPES = (
    "sliding_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention",
)
HEADS_PER_LAYER = (4, 4, 4, 2)
SLIDING_WINDOW = 32
MAX_POSITIONS = 8192  # room for the matrix's long-context prompt (> 4096 tokens)
NUM_EXPERTS = 8
EXPERTS_PER_TOKEN = 2
MOE_INTERMEDIATE = 32
SHARED_INTERMEDIATE = 32
DENSE_INTERMEDIATE = 128
ROUTED_SCALING = 1.5
BIAS_SCALE = 0.2  # std of the routing correction bias

# Drafter: one full-attention layer reading the target's layers 0 and 2.
DRAFT_TARGET_LAYER_IDS = (0, 2)
DRAFT_HEADS = 4

# Strength of the shared direction (see module docstring).
REPEAT_EMBED_NORM = 32.0
REPEAT_LM_HEAD_NORM = 1.0

_CORPUS = (
    "The lagoon is calm in the morning and the boats wait by the shore.",
    "A small model learns to repeat the word lagoon lagoon lagoon.",
    "Speculative decoding drafts several tokens and the target verifies them.",
    "Experts are routed with a sigmoid score plus a correction bias.",
    "Sliding window attention looks back a fixed number of tokens.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and symbols + - * / = ( ) [ ] { }.",
    "The quick brown fox jumps over the lazy dog near the lagoon.",
    "Tests compare greedy tokens and log probabilities with a reference.",
)

_SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>", MASK_TOKEN)


@dataclass(frozen=True)
class TinyModels:
    """Paths of a generated tiny model pair."""

    target: Path
    draft: Path
    repeat_token_id: int
    mask_token_id: int
    vocab_size: int


class TinyLagunaError(ToolError):
    """Expected failure with a one-line message."""


def _train_tokenizer(seed: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    del seed  # BPE training is deterministic for a fixed corpus
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so frequent words (the repeat word among them) merge.
    tok.train_from_iterator(list(_CORPUS) * 4, trainer=trainer)
    size = tok.get_vocab_size()
    padded = -(-size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    tok.add_special_tokens([f"<|unused_{i}|>" for i in range(padded - size)])
    if tok.get_vocab_size() != padded:
        raise TinyLagunaError(f"tokenizer vocab {tok.get_vocab_size()} is not padded to {padded}")
    return tok


def _save_tokenizer(tok: Any, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        mask_token=MASK_TOKEN,
    )
    fast.save_pretrained(str(out))


def _rope_parameters() -> dict[str, dict[str, Any]]:
    return {
        "full_attention": {
            "rope_type": "default",
            "rope_theta": 500000.0,
            "partial_rotary_factor": 0.5,
        },
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 1.0,
        },
    }


def _unit_direction(gen: torch.Generator) -> torch.Tensor:
    import torch

    d = torch.randn(HIDDEN, generator=gen, dtype=torch.float32)
    return d / d.norm()


def _build_target(
    out: Path,
    vocab: int,
    repeat_id: int,
    mask_id: int,
    special: dict[str, int],
    seed: int,
) -> torch.Tensor:
    """Save the target; return the shared direction used for the drafter."""
    import torch
    from transformers import LagunaConfig, LagunaForCausalLM

    n = len(LAYER_TYPES)
    config = LagunaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=DENSE_INTERMEDIATE,
        num_hidden_layers=n,
        num_attention_heads=max(HEADS_PER_LAYER),
        num_attention_heads_per_layer=list(HEADS_PER_LAYER),
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        layer_types=list(LAYER_TYPES),
        mlp_layer_types=["dense"] + ["sparse"] * (n - 1),
        sliding_window=SLIDING_WINDOW,
        rope_parameters=_rope_parameters(),
        gating=True,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=EXPERTS_PER_TOKEN,
        moe_intermediate_size=MOE_INTERMEDIATE,
        shared_expert_intermediate_size=SHARED_INTERMEDIATE,
        moe_routed_scaling_factor=ROUTED_SCALING,
        tie_word_embeddings=False,
        bos_token_id=special["<|bos|>"],
        eos_token_id=special["<|eos|>"],
        pad_token_id=special["<|pad|>"],
    )
    torch.manual_seed(seed)
    model = LagunaForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        # Re-draw every parameter from our own generator: the result then does
        # not depend on transformers' init order or defaults.
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(BIAS_SCALE * torch.randn(p.shape, generator=gen))
            elif name.endswith("gate.weight"):
                # Router: spread logits so sigmoid scores are not all 0.5.
                p.copy_(torch.randn(p.shape, generator=gen) / HIDDEN**0.5)
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)
        d = _unit_direction(gen)
        emb = model.model.embed_tokens.weight
        emb[repeat_id] = REPEAT_EMBED_NORM * d
        emb[mask_id] = REPEAT_EMBED_NORM * d
        model.lm_head.weight[repeat_id] = REPEAT_LM_HEAD_NORM * d
        biases = [p for n_, p in model.named_parameters() if n_.endswith("e_score_correction_bias")]
        if not biases or any(bool((b == 0).all()) for b in biases):
            raise TinyLagunaError("routing correction bias is missing or zero")
    model.save_pretrained(str(out), safe_serialization=True)
    return d


def _build_draft(out: Path, target_dir: Path, vocab: int, mask_id: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    with open(target_dir / "config.json", encoding="utf-8") as f:
        tcfg = json.load(f)
    q = DRAFT_HEADS * HEAD_DIM
    kv = NUM_KV_HEADS * HEAD_DIM
    config = {
        "architectures": ["DFlashLagunaForCausalLM"],
        "model_type": "laguna",
        "dtype": "float32",
        "torch_dtype": "float32",
        "vocab_size": vocab,
        "draft_vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": DENSE_INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": DRAFT_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": tcfg["rms_norm_eps"],
        "max_position_embeddings": tcfg["max_position_embeddings"],
        "layer_types": ["full_attention"],
        "mlp_only_layers": [0],
        "num_experts": 0,
        "gating": True,
        "rope_parameters": _rope_parameters(),
        "tie_word_embeddings": False,
        "bos_token_id": tcfg.get("bos_token_id"),
        "eos_token_id": tcfg.get("eos_token_id"),
        "pad_token_id": tcfg.get("pad_token_id"),
        "dflash_config": {
            "target_layer_ids": list(DRAFT_TARGET_LAYER_IDS),
            "mask_token_id": mask_id,
        },
    }
    gen = torch.Generator().manual_seed(seed + 2)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    def norm(n: int) -> torch.Tensor:
        return torch.ones(n)

    # vLLM-internal parameter names (laguna_dflash loads them verbatim, with
    # "model." prepended); embed_tokens and lm_head are shared with the target.
    # The drafter's own layers are small so the query embedding (the shared
    # direction for the repeat and mask tokens) dominates its residual stream.
    p = "layers.0."
    tensors = {
        p + "self_attn.qkv_proj.weight": rnd(q + 2 * kv, HIDDEN, scale=0.2),
        p + "self_attn.o_proj.weight": rnd(HIDDEN, q, scale=0.2),
        p + "self_attn.g_proj.weight": rnd(DRAFT_HEADS, HIDDEN),
        p + "self_attn.q_norm.weight": norm(HEAD_DIM),
        p + "self_attn.k_norm.weight": norm(HEAD_DIM),
        p + "mlp.gate_proj.weight": rnd(DENSE_INTERMEDIATE, HIDDEN, scale=0.2),
        p + "mlp.up_proj.weight": rnd(DENSE_INTERMEDIATE, HIDDEN, scale=0.2),
        p + "mlp.down_proj.weight": rnd(HIDDEN, DENSE_INTERMEDIATE, scale=0.2),
        p + "input_layernorm.weight": norm(HIDDEN),
        p + "post_attention_layernorm.weight": norm(HIDDEN),
        "fc.weight": rnd(HIDDEN, HIDDEN * len(DRAFT_TARGET_LAYER_IDS)),
        "hidden_norm.weight": norm(HIDDEN),
        "norm.weight": norm(HIDDEN),
    }
    for i in range(len(DRAFT_TARGET_LAYER_IDS)):
        tensors[f"aux_hidden_norms.{i}.weight"] = norm(HIDDEN)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(torch.float32).contiguous() for k, v in sorted(tensors.items())},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with open(out / "config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def generate(out_dir: Path, seed: int = 0) -> TinyModels:
    """Write ``out_dir/target`` and ``out_dir/draft``; return their paths."""
    out_dir = Path(out_dir)
    target = out_dir / "target"
    draft = out_dir / "draft"
    target.mkdir(parents=True, exist_ok=True)

    tok = _train_tokenizer(seed)
    vocab = tok.get_vocab_size()
    special = {t: tok.token_to_id(t) for t in _SPECIAL_TOKENS}
    repeat_ids = tok.encode(REPEAT_WORD).ids
    if len(repeat_ids) != 1:
        raise TinyLagunaError(f"repeat word {REPEAT_WORD!r} is not a single token: {repeat_ids}")
    repeat_id = repeat_ids[0]
    mask_id = special[MASK_TOKEN]

    _save_tokenizer(tok, target)
    _build_target(target, vocab, repeat_id, mask_id, special, seed)
    _build_draft(draft, target, vocab, mask_id, seed)
    _save_tokenizer(tok, draft)
    return TinyModels(
        target=target,
        draft=draft,
        repeat_token_id=repeat_id,
        mask_token_id=mask_id,
        vocab_size=vocab,
    )


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="python -m scripts.tiny_laguna",
        description="Generate a tiny random Laguna target and DFlash drafter.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (gets target/ and draft/)")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    try:
        models = generate(args.out, seed=args.seed)
    except (ToolError, OSError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"target: {models.target}\ndraft: {models.draft}\n"
        f"vocab: {models.vocab_size} repeat_token_id: {models.repeat_token_id} "
        f"mask_token_id: {models.mask_token_id}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
