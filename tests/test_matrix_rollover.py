"""The matrix's long prompt ends one token short of a KV block boundary, so that its output crosses
one in every run (``scripts.matrix.logprobs.crossing_prompt``; the fast matrix gates on it).

A stand-in ``transformers.AutoTokenizer`` counts tokens the way the test says (no model needed)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from scripts.matrix.legs import PromptSpec, make_prompts, rollover_prompt
from scripts.matrix.logprobs import FILLER, ROLLOVER_SPAN, crossing_prompt


def _tokenizer(tokens_per_filler: int) -> Any:
    """One BOS, one token per word, ``tokens_per_filler`` per ``FILLER``."""

    class Tokenizer:
        def __call__(self, text: str) -> dict[str, list[int]]:
            fillers = 0
            while text.endswith(FILLER):
                text, fillers = text[: -len(FILLER)], fillers + 1
            return {"input_ids": [0] * (1 + len(text.split()) + tokens_per_filler * fillers)}

    return Tokenizer()


@pytest.fixture
def tokenizer(monkeypatch: pytest.MonkeyPatch):
    def use(tokens_per_filler: int) -> None:
        auto = types.SimpleNamespace(from_pretrained=lambda _: _tokenizer(tokens_per_filler))
        monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=auto))

    return use


@pytest.mark.parametrize("words", [1, 126, 127, 128, 300])
def test_the_prompt_ends_one_token_short_of_a_block(tokenizer, words: int) -> None:
    tokenizer(1)
    text, tokens = crossing_prompt("target", " ".join(["w"] * words))
    assert tokens % ROLLOVER_SPAN == ROLLOVER_SPAN - 1
    assert tokens == len(_tokenizer(1)(text)["input_ids"])
    assert tokens - (1 + words) < ROLLOVER_SPAN  # grown by less than one span
    # every power-of-two block up to the span: the second generated token starts a new block
    for block in (16, 32, 64, 128):
        assert tokens // block != (tokens + 2 - 1) // block


def test_a_filler_that_never_lands_there_is_one_error(tokenizer) -> None:
    # negative control: two tokens per filler from an even count never reach an odd residue
    tokenizer(2)
    with pytest.raises(ValueError, match="no filler count"):
        crossing_prompt("target", " ".join(["w"] * 9))  # 10 tokens with the BOS


def test_the_drivers_long_prompt_keeps_its_role_and_budget(tokenizer) -> None:
    tokenizer(1)
    spec = make_prompts(3, 64, seed=7)[0]
    grown = rollover_prompt("target", spec)
    assert grown.text.startswith(spec.text) and (grown.max_tokens, grown.role) == (64, "long")
    assert PromptSpec(spec.text, 64, "long") == spec  # the original is left as it was
