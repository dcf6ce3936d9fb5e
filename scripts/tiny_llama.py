"""A tiny random Llama (``LlamaForCausalLM``): a model the XPU Laguna series is NOT made for.

The end-to-end test that the series leaves other models alone (issue 29 item 3,
``tests/e2e/test_series_scope_e2e.py``) serves it with the recipe's series toggles set. Made
locally, no model hub: a random-init ``transformers`` Llama (float32, fixed seed, two layers, four
query heads over two KV heads of 32 dims, so it splits at TP 2 and its head size suits the CPU
attention backend's FP8 KV cache) saved with safetensors, with the tiny Laguna's tokenizer files
copied next to it (its vocabulary is the tokenizer's). Its output is random text; only that tokens
come out matters.

``ensure_model(out, tokenizer_dir)`` generates it once under a lock next to ``out`` and reuses it
while its stamp (this file, the seed and the tokenizer files) is current. Heavy imports happen
inside ``generate`` only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from scripts.errors import ToolError
from scripts.lock import folder_lock
from scripts.tiny_laguna import STAMP
from scripts.tp_fit import model_problems

__all__ = ["ARCHITECTURE", "TOKENIZER_FILES", "ensure_model", "generate", "generator_digest"]

ARCHITECTURE = "LlamaForCausalLM"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE = 128
MAX_POSITIONS = 1024
TPS = (1, 2)  # the sizes it must split at (checked after writing)


class TinyLlamaError(ToolError):
    """Expected failure with a one-line message."""


def generator_digest(tokenizer_dir: Path, seed: int = 0) -> str:
    """sha256 of this generator's source, the seed and the tokenizer files it copies."""
    digest = hashlib.sha256(f"seed={seed}\n".encode())
    digest.update(Path(__file__).read_bytes())
    for name in TOKENIZER_FILES:
        digest.update((Path(tokenizer_dir) / name).read_bytes())
    return digest.hexdigest()


def _current(out: Path, digest: str) -> bool:
    if not (out / "config.json").is_file():
        return False
    try:
        stamp = json.loads((out / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("generator") == digest


def ensure_model(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """The model folder ``out``: reused when current, else generated (under a lock next to it)."""
    out = Path(out)
    with folder_lock(out):
        if not _current(out, generator_digest(tokenizer_dir, seed)):
            generate(out, tokenizer_dir, seed)
    return out


def generate(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write the tiny Llama to ``out`` with the tokenizer files of ``tokenizer_dir``."""
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    out, tokenizer_dir = Path(out), Path(tokenizer_dir)
    missing = [name for name in TOKENIZER_FILES if not (tokenizer_dir / name).is_file()]
    if missing:
        raise TinyLlamaError(f"{tokenizer_dir}: no {', '.join(missing)} (a tiny Laguna target's tokenizer)")
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.token_to_id("<|bos|>"),
        eos_token_id=tokenizer.token_to_id("<|eos|>"),
        pad_token_id=tokenizer.token_to_id("<|pad|>"),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)
    problems = [p for tp in TPS for p in model_problems(out, tp)]
    if problems:
        raise TinyLlamaError(f"the tiny Llama does not split as built for: {'; '.join(problems)}")
    stamp = {"generator": generator_digest(tokenizer_dir, seed)}
    (out / STAMP).write_text(json.dumps(stamp) + "\n", encoding="utf-8")
    return out
