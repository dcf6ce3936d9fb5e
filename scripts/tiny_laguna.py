"""Generate a tiny random Laguna target and a matching DFlash drafter.

Everything is made locally from a fixed seed (no model hub): the target is a
random-init ``transformers`` ``LagunaForCausalLM`` saved with its own
``save_pretrained`` (so it has the real checkpoint's tensor names), the
tokenizer is a byte-level BPE trained here with ``tokenizers``, and the drafter
is written with the parameter names vLLM's ``laguna_dflash.py`` loads.

Design of the weights (so tests see every verify row, not only the rejection path):

* float32, four layers: three sliding-window layers and one global layer,
  more query heads on the sliding layers (as in Laguna-S), softplus gating on,
  a dense first layer and sigmoid-routed MoE layers with a shared expert and a
  NON-ZERO random routing correction bias (large enough to change which
  experts are selected when it is dropped). Every layer is random.
* A planted token cycle (``scripts.tiny_laguna_structure``): the embedding and
  lm_head make greedy output follow a fixed successor permutation (11 cycles of
  29 tokens) unless the random layers push another token over it; the drafter
  (one layer, shared embedding and lm_head) is built so that mask ``k`` of the
  DFlash query block proposes the ``k``-th successor of the bonus token. Drafts
  are then accepted as deep as the target keeps to the cycle: every depth
  1..7 is accepted regularly, and every depth is rejected regularly too.

Variants (``VARIANTS``): the default pair runs at TP 1 and 2; ``tp4`` has twice the target's
query heads, (8, 8, 8, 4), so it also runs at TP 4 (same KV heads, replicated there), and
``EMBED_SCALE`` 10 (it keeps the default's acceptance); ``int4`` has routed experts twice as wide
(64), the float source of the INT4 checkpoint (:mod:`scripts.tiny_laguna_int4`); every other size
and the drafter are the default's. :func:`variant_for_tp` picks the first variant that
runs at a TP size, :func:`variant_dir` where it lives under a ``--tiny`` folder.

CLI: ``python -m scripts.tiny_laguna --out DIR [--seed N] [--variant V]`` writes ``DIR/target``,
``DIR/draft`` and ``DIR/generator.json`` (the generator's digest: ``cpu_runtime ensure``
regenerates stale models). Measured acceptance and weaknesses: docs/tiny-laguna.md. Heavy
imports happen inside ``generate`` only, so importing this module stays cheap.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scripts import tiny_laguna_structure as st
from scripts.errors import ToolError
from scripts.lock import folder_lock
from scripts.tp_fit import model_problems

if TYPE_CHECKING:
    import torch

__all__ = [
    "MASK_TOKEN",
    "STAMP",
    "VARIANTS",
    "TinyModels",
    "Variant",
    "generate",
    "generator_digest",
    "main",
    "variant_dir",
    "variant_for_tp",
]

MASK_TOKEN = "<|mask|>"
STAMP = "generator.json"  # written next to target/ and draft/: which generator made them
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
HEADS_PER_LAYER = (4, 4, 4, 2)  # the default pair's (TP 1, 2)
TP4_HEADS_PER_LAYER = (8, 8, 8, 4)  # the tp4 variant's: 2, 2, 2, 1 per rank at TP 4
SLIDING_WINDOW = 32
MAX_POSITIONS = 8192  # room for the matrix's long-context prompt (> 4096 tokens)
NUM_EXPERTS = 8
EXPERTS_PER_TOKEN = 2
MOE_INTERMEDIATE = 32
SHARED_INTERMEDIATE = 32
DENSE_INTERMEDIATE = 128
ROUTED_SCALING = 1.5
BIAS_SCALE = 0.2  # std of the routing correction bias

# Drafter: one full-attention layer reading the target's layers 0 and 2; query heads 0..6 are
# the depth heads of the planted cycle (scripts.tiny_laguna_structure), 7..15 are random.
DRAFT_TARGET_LAYER_IDS = (0, 2)
DRAFT_HEADS = 16
DRAFT_DEPTH_HEADS = 7  # one per drafted token of DFlash M8

# Strength of the planted cycle against the random layers (measured: see docs/tiny-laguna.md).
EMBED_SCALE = 9.0  # norm of an ordinary token's TOK vector in the embedding
TP4_EMBED_SCALE = 10.0  # the tp4 variant's (its random layers push harder; docs/tiny-laguna.md)
KEY_SHARE = 0.5  # norm of the shared KEY vector relative to the TOK vector
LM_HEAD_SCALE = 2.5  # lm_head rows: LM_HEAD_SCALE * predecessor's TOK vector ...
LM_HEAD_NOISE = 0.1  # ... plus this much random row (std per entry, outside the MASK block)
MASK_EMBED_NORM = 1.0
DRAFT_RANDOM_OUT = 0.3  # o_proj scale of the drafter's random heads (7..15)

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
class Variant:
    """One tiny pair: its target's query heads per layer and the TP sizes it is built for (the
    generator refuses a variant that vLLM could not split at one of them,
    :func:`scripts.tp_fit.config_problems`). Every other size is shared by all variants."""

    name: str
    heads_per_layer: tuple[int, ...]
    tps: tuple[int, ...]
    embed_scale: float = EMBED_SCALE
    moe_intermediate: int = MOE_INTERMEDIATE


DEFAULT_VARIANT = Variant("default", HEADS_PER_LAYER, tps=(1, 2))
INT4_MOE_INTERMEDIATE = 64
"""The ``int4`` variant's routed-expert size: at TP 2 each rank's ``down_proj`` input is 32 wide,
one INT4 group (:mod:`scripts.tiny_laguna_int4`)."""
VARIANTS = (
    DEFAULT_VARIANT,
    Variant("tp4", TP4_HEADS_PER_LAYER, tps=(1, 2, 4), embed_scale=TP4_EMBED_SCALE),
    Variant("int4", HEADS_PER_LAYER, tps=(1, 2), moe_intermediate=INT4_MOE_INTERMEDIATE),
)


def variant_named(name: str) -> Variant:
    for variant in VARIANTS:
        if variant.name == name:
            return variant
    raise TinyLagunaError(f"no tiny variant {name!r}; known: {', '.join(v.name for v in VARIANTS)}")


def variant_for_tp(tp: int) -> Variant:
    """The first variant (the default first) built for TP ``tp``."""
    for variant in VARIANTS:
        if tp in variant.tps:
            return variant
    built = ", ".join(f"{v.name}: TP {'/'.join(map(str, v.tps))}" for v in VARIANTS)
    raise TinyLagunaError(f"no tiny Laguna variant runs at TP {tp} ({built})")


def variant_dir(tiny: Path, variant: Variant) -> Path:
    """Where ``variant`` lives under a ``--tiny`` folder: the default in it, the others in a
    sub-folder named after them (next to the default's target/ and draft/)."""
    return Path(tiny) if variant == DEFAULT_VARIANT else Path(tiny) / variant.name


@dataclass(frozen=True)
class TinyModels:
    """Paths of a generated tiny model pair."""

    target: Path
    draft: Path
    mask_token_id: int
    vocab_size: int
    successor: tuple[int, ...]  # successor[y]: the token the planted cycle puts after y
    variant: str = DEFAULT_VARIANT.name


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
    # Repeat the corpus so frequent words merge.
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


def check_depth_heads() -> None:
    """The drafter's depth heads all read KV head 0 (one GQA group holds them)."""
    if DRAFT_HEADS // NUM_KV_HEADS < DRAFT_DEPTH_HEADS:
        raise TinyLagunaError("the depth heads must share KV head 0 (DRAFT_HEADS / NUM_KV_HEADS >= 7)")


def check_tp_fit(models: TinyModels, variant: Variant) -> None:
    """Target and drafter, as written, split at every TP size the variant is built for."""
    problems = [p for tp in variant.tps for d in (models.target, models.draft) for p in model_problems(d, tp)]
    if problems:
        raise TinyLagunaError(f"tiny variant {variant.name} does not split as built for: {'; '.join(problems)}")


def _block(span: tuple[int, int]) -> slice:
    return slice(*span)


def _build_target(
    out: Path,
    variant: Variant,
    vocab: int,
    cycles: st.Cycles,
    mask_id: int,
    mask_dir: torch.Tensor,
    special: dict[str, int],
    seed: int,
) -> None:
    import torch
    from transformers import LagunaConfig, LagunaForCausalLM

    n = len(LAYER_TYPES)
    config = LagunaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=DENSE_INTERMEDIATE,
        num_hidden_layers=n,
        num_attention_heads=max(variant.heads_per_layer),
        num_attention_heads_per_layer=list(variant.heads_per_layer),
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
        moe_intermediate_size=variant.moe_intermediate,
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
        # The planted cycle (scripts.tiny_laguna_structure): embedding and lm_head only.
        tok, key, mask = _block(st.TOK), _block(st.KEY), _block(st.MASK)
        ordinary = [t for t in range(vocab) if t != mask_id]
        shared_key = torch.ones(key.stop - key.start) / (key.stop - key.start) ** 0.5
        emb = model.model.embed_tokens.weight
        emb.zero_()
        emb[ordinary, tok] = variant.embed_scale * cycles.units[ordinary]
        emb[ordinary, key] = variant.embed_scale * KEY_SHARE * shared_key
        emb[mask_id] = MASK_EMBED_NORM * mask_dir
        head = model.lm_head.weight
        head.copy_(LM_HEAD_NOISE * torch.randn(head.shape, generator=gen))
        head[:, mask] = 0.0  # the drafter's mask residual must not bias any token
        predecessor = {nxt: y for y, nxt in enumerate(cycles.successor(vocab)) if y != mask_id}
        rows = [predecessor[z] for z in ordinary]
        head[ordinary, tok] += LM_HEAD_SCALE * cycles.units[rows]
        biases = [p for n_, p in model.named_parameters() if n_.endswith("e_score_correction_bias")]
        if not biases or any(bool((b == 0).all()) for b in biases):
            raise TinyLagunaError("routing correction bias is missing or zero")
    model.save_pretrained(str(out), safe_serialization=True)


def _draft_tensors(gen: torch.Generator, mask_dir: torch.Tensor) -> dict[str, torch.Tensor]:
    """The drafter's weights under vLLM's internal names (laguna_dflash loads them verbatim,
    with "model." prepended); embed_tokens and lm_head are the target's."""
    import torch

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    hd, kvh = HEAD_DIM, NUM_KV_HEADS
    q_size, kv_size = DRAFT_HEADS * hd, kvh * hd
    tok, key, mask, ctx = (_block(b) for b in (st.TOK, st.KEY, st.MASK, st.CTX))
    qkv = rnd(q_size + 2 * kv_size, HIDDEN)
    # random query heads stay off the boosted q_norm dims (their scores stay O(1))
    for head in range(DRAFT_DEPTH_HEADS, DRAFT_HEADS):
        qkv[[head * hd + d for d in st.BOOSTED]] = 0.0
    depth_key = st.depth_key()
    shared_key = torch.ones(key.stop - key.start) / (key.stop - key.start) ** 0.5
    k0, v0 = q_size, q_size + kv_size  # rows of KV head 0's key and value
    qkv[k0 : k0 + hd] = 0.0
    qkv[k0 : k0 + hd, key] = torch.outer(depth_key / depth_key.norm(), shared_key)
    qkv[v0 : v0 + hd] = 0.0
    qkv[v0 : v0 + hd, tok] = torch.eye(tok.stop - tok.start)
    o_proj = rnd(HIDDEN, q_size, scale=DRAFT_RANDOM_OUT)
    for h in range(1, DRAFT_DEPTH_HEADS + 1):
        rows = slice((h - 1) * hd, h * hd)
        query = st.depth_query(h)
        qkv[rows] = 0.0
        qkv[rows, mask] = torch.outer(query / query.norm(), mask_dir[mask])
        o_proj[:, rows] = 0.0
        o_proj[tok, rows] = st.rotation_power(h - 1)
    q_norm = torch.ones(hd)
    q_norm[list(st.BOOSTED)] = st.q_norm_boost()
    fc = torch.zeros(HIDDEN, HIDDEN * len(DRAFT_TARGET_LAYER_IDS))
    fc[ctx] = rnd(ctx.stop - ctx.start, fc.shape[1])
    p = "layers.0."

    def ones() -> torch.Tensor:
        return torch.ones(HIDDEN)

    tensors = {
        p + "self_attn.qkv_proj.weight": qkv,
        p + "self_attn.o_proj.weight": o_proj,
        p + "self_attn.g_proj.weight": rnd(DRAFT_HEADS, HIDDEN),
        p + "self_attn.q_norm.weight": q_norm,
        p + "self_attn.k_norm.weight": torch.ones(hd),
        p + "mlp.gate_proj.weight": rnd(DENSE_INTERMEDIATE, HIDDEN, scale=0.2),
        p + "mlp.up_proj.weight": rnd(DENSE_INTERMEDIATE, HIDDEN, scale=0.2),
        p + "mlp.down_proj.weight": rnd(HIDDEN, DENSE_INTERMEDIATE, scale=0.2),
        p + "input_layernorm.weight": ones(),
        p + "post_attention_layernorm.weight": ones(),
        "fc.weight": fc,
        "hidden_norm.weight": ones(),
        "norm.weight": ones(),
    }
    for i in range(len(DRAFT_TARGET_LAYER_IDS)):
        tensors[f"aux_hidden_norms.{i}.weight"] = ones()
    return tensors


def _build_draft(out: Path, target_dir: Path, vocab: int, mask_id: int, mask_dir: torch.Tensor, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    with open(target_dir / "config.json", encoding="utf-8") as f:
        tcfg = json.load(f)
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
    tensors = _draft_tensors(torch.Generator().manual_seed(seed + 2), mask_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(torch.float32).contiguous() for k, v in sorted(tensors.items())},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with open(out / "config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def generator_digest(seed: int = 0, variant: str = DEFAULT_VARIANT.name) -> str:
    """sha256 of this generator's sources, the seed and the variant: models with another digest
    are stale."""
    import hashlib

    digest = hashlib.sha256(f"seed={seed}\n".encode())
    if variant != DEFAULT_VARIANT.name:
        digest.update(f"variant={variant}\n".encode())
    for source in (Path(__file__), Path(st.__file__)):
        digest.update(source.read_bytes())
    return digest.hexdigest()


def models_current(out_dir: Path, seed: int = 0, variant: str = DEFAULT_VARIANT.name) -> bool:
    """Both models in ``out_dir``, made by this generator as it is now with ``seed`` and
    ``variant`` (its stamp; none: stale)."""
    out_dir = Path(out_dir)
    if not ((out_dir / "target" / "config.json").is_file() and (out_dir / "draft" / "config.json").is_file()):
        return False
    try:
        stamp = json.loads((out_dir / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("generator") == generator_digest(seed, variant)


def ensure_models(out_dir: Path, seed: int = 0, variant: str = DEFAULT_VARIANT.name) -> tuple[Path, Path]:
    """Target and drafter folders of ``variant`` in ``out_dir``: reused when current
    (:func:`models_current`; the generator is deterministic), else generated. Under a lock next
    to ``out_dir``: runs at once that need the same pair generate it once."""
    out_dir = Path(out_dir)
    with folder_lock(out_dir):
        if not models_current(out_dir, seed, variant):
            generate(out_dir, seed=seed, variant=variant)
    return out_dir / "target", out_dir / "draft"


def generate(out_dir: Path, seed: int = 0, variant: str = DEFAULT_VARIANT.name) -> TinyModels:
    """Write ``out_dir/target`` and ``out_dir/draft`` of ``variant`` (``VARIANTS``); return their
    paths."""
    import torch

    shape = variant_named(variant)
    check_depth_heads()
    if (HIDDEN, HEAD_DIM) != (st.HIDDEN, st.HEAD_DIM) or _rope_parameters()["full_attention"] != {
        "rope_type": "default",
        "rope_theta": st.ROPE_THETA,
        "partial_rotary_factor": st.ROT_DIM / st.HEAD_DIM,
    }:
        raise TinyLagunaError("the planted structure assumes another hidden size, head size or rope")
    out_dir = Path(out_dir)
    target = out_dir / "target"
    draft = out_dir / "draft"
    target.mkdir(parents=True, exist_ok=True)

    tok = _train_tokenizer(seed)
    vocab = tok.get_vocab_size()
    special = {t: tok.token_to_id(t) for t in _SPECIAL_TOKENS}
    mask_id = special[MASK_TOKEN]
    gen = torch.Generator().manual_seed(seed + 3)
    try:
        cycles = st.make_cycles(vocab, mask_id, gen)
    except ValueError as exc:
        raise TinyLagunaError(str(exc)) from None
    mask_dir = torch.zeros(HIDDEN)
    mask_block = _block(st.MASK)
    direction = torch.randn(mask_block.stop - mask_block.start, generator=gen)
    mask_dir[mask_block] = direction / direction.norm()

    _save_tokenizer(tok, target)
    _build_target(target, shape, vocab, cycles, mask_id, mask_dir, special, seed)
    _build_draft(draft, target, vocab, mask_id, mask_dir, seed)
    _save_tokenizer(tok, draft)
    models = TinyModels(
        target=target,
        draft=draft,
        mask_token_id=mask_id,
        vocab_size=vocab,
        successor=cycles.successor(vocab),
        variant=shape.name,
    )
    check_tp_fit(models, shape)
    stamp = {"generator": generator_digest(seed, shape.name)}
    (out_dir / STAMP).write_text(json.dumps(stamp) + "\n", encoding="utf-8")
    return models


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser

    parser = ToolParser(
        prog="python -m scripts.tiny_laguna",
        description="Generate a tiny random Laguna target and DFlash drafter.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (gets target/ and draft/)")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument(
        "--variant",
        default=DEFAULT_VARIANT.name,
        choices=[v.name for v in VARIANTS],
        help="which pair: "
        + "; ".join(f"{v.name}: target heads {v.heads_per_layer}, TP {'/'.join(map(str, v.tps))}" for v in VARIANTS)
        + " (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        models = generate(args.out, seed=args.seed, variant=args.variant)
    except (ToolError, OSError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"target: {models.target}\ndraft: {models.draft}\n"
        f"vocab: {models.vocab_size} mask_token_id: {models.mask_token_id} "
        f"cycles: {(models.vocab_size - 1) // st.CYCLE_LEN} of {st.CYCLE_LEN} tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
