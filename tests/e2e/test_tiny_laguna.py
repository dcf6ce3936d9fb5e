"""The tiny-model generator: deterministic, and the properties the e2e tests rely on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from scripts.tiny_laguna import TinyModels, generate


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_same_seed_same_bytes(tmp_path: Path, tiny_models: TinyModels) -> None:
    again = generate(tmp_path / "again", seed=0)
    assert _digests(again.target) == _digests(tiny_models.target)
    assert _digests(again.draft) == _digests(tiny_models.draft)


def test_target_and_draft_configs(tiny_models: TinyModels) -> None:
    from transformers import AutoTokenizer

    cfg = json.loads((tiny_models.target / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(tiny_models.target))
    assert cfg["vocab_size"] % 64 == 0 and len(tok) == cfg["vocab_size"] == tiny_models.vocab_size
    assert {"sliding_attention", "full_attention"} <= set(cfg["layer_types"])
    assert cfg["gating"] is True and cfg["dtype"] == "float32"
    assert tok.encode(" lagoon", add_special_tokens=False) == [tiny_models.repeat_token_id]

    draft = json.loads((tiny_models.draft / "config.json").read_text())
    assert draft["architectures"] == ["DFlashLagunaForCausalLM"]
    assert draft["draft_vocab_size"] == cfg["vocab_size"]
    assert len(set(draft["layer_types"])) == 1
    assert max(draft["dflash_config"]["target_layer_ids"]) < cfg["num_hidden_layers"]
    assert draft["dflash_config"]["mask_token_id"] == tiny_models.mask_token_id
