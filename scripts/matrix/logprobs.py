"""The equivalence matrix's logprob-level gate and its long-context prompt.

Every leg requests the logprobs of the sampled token and of the top-k tokens at each generated
position. :func:`compare_logprobs` compares a leg with the teacher bitwise: each value as
``float.hex`` (no tolerance), the top-k as (token, value) pairs in rank order. A position is
bitwise equal when the tokens, the sampled token's logprob and the top-k list are all identical.

:func:`gate` turns a comparison into verdicts: on CPU a leg with the exact verify path on must
be bitwise equal at every position; the diagnostic leg (exact path off) must not be (the
negative control). On a device the counts are reported only (whether the device's GEMM, MoE and
elementwise kernels are row-invariant is what the device checks measure).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

# One position: [sampled token, its logprob as float.hex, [[token, float.hex], ... top-k by rank]]
Position = list[Any]


def collect_logprobs(logprobs: Any, top_k: int) -> list[Position]:
    """Per generated position of a vLLM ``CompletionOutput.logprobs``: the sampled token and its
    logprob, and the top-k (rank 1..k) in rank order, every float as ``float.hex``.

    vLLM builds each position's dict with the sampled token first, then the top-k.
    """
    out: list[Position] = []
    for entry in logprobs or []:
        items = list(entry.items())
        sampled_token, sampled = items[0]
        top = sorted(
            (lp.rank, tok, float(lp.logprob).hex())
            for tok, lp in items
            if lp.rank is not None and 1 <= lp.rank <= top_k
        )
        out.append([sampled_token, float(sampled.logprob).hex(), [[tok, value] for _, tok, value in top]])
    return out


@dataclass
class LogprobComparison:
    positions: int = 0
    tokens_equal: int = 0
    logprobs_bitwise_equal: int = 0
    first_difference: dict[str, Any] | None = None

    @property
    def all_equal(self) -> bool:
        return self.positions > 0 and self.logprobs_bitwise_equal == self.positions

    def summary(self) -> str:
        return f"{self.logprobs_bitwise_equal}/{self.positions} bitwise, tokens {self.tokens_equal}/{self.positions}"


def compare_logprobs(teacher: list[list[Position]], leg: list[list[Position]]) -> LogprobComparison:
    """Compare per prompt and position; positions are the teacher's generated tokens."""
    result = LogprobComparison()
    for prompt, (want_rows, got_rows) in enumerate(zip(teacher, leg, strict=True)):
        for pos, want in enumerate(want_rows):
            result.positions += 1
            got = got_rows[pos] if pos < len(got_rows) else None
            same_token = got is not None and got[0] == want[0]
            result.tokens_equal += same_token
            if same_token and got == want:
                result.logprobs_bitwise_equal += 1
            elif result.first_difference is None:
                result.first_difference = {
                    "prompt": prompt,
                    "position": pos,
                    "teacher": want,
                    "leg": got,
                    "what": "token" if not same_token else _what_differs(want, got),
                }
    return result


def _what_differs(want: Position, got: Position | None) -> str:
    if got is None:
        return "missing"
    if want[1] != got[1]:
        return "sampled-token logprob"
    return "top-k"


def gate(comparison: LogprobComparison, *, expect_equal: bool, require_bitwise: bool) -> tuple[str, list[str]]:
    """(verdict, problems) for one leg. ``require_bitwise``: CPU (the row-invariant stand-in)."""
    if not require_bitwise:
        return "reported (device: not gated)", []
    if expect_equal:
        if comparison.all_equal:
            return "bitwise equal at every position", []
        first = comparison.first_difference or {}
        return "NOT bitwise equal", [
            (
                f"logprobs: {comparison.summary()}; first difference prompt {first.get('prompt')} "
                f"position {first.get('position')} ({first.get('what')})"
            )
        ]
    if comparison.all_equal:
        return "negative control FAILED", [
            (
                "logprobs: the diagnostic leg is bitwise equal to the teacher at every position: "
                "the logprob gate cannot tell exact from non-exact verify"
            )
        ]
    differing = comparison.positions - comparison.logprobs_bitwise_equal
    return f"negative control holds (differs at {differing} positions)", []


ROLLOVER_SPAN = 128
"""Prompt 0 ends one token short of a multiple of this many tokens, so its second generated token
starts a new KV block for every power-of-two block size up to it (CPU's default 128, the XPU
records' 64)."""


FILLER = " a"
"""Appended to prompt 0 one at a time: one token each in the tiny tokenizer and in common BPE
vocabularies (checked by counting, not assumed)."""


def crossing_prompt(tokenizer_dir: str, text: str) -> tuple[str, int]:
    """``text`` with :data:`FILLER` appended until its token count (the target's tokenizer, as the
    engine counts it) is ``-1`` modulo :data:`ROLLOVER_SPAN`: any output of two or more tokens then
    crosses a KV block boundary. (text, token count); a ``ValueError`` when no count up to two
    spans longer lands there."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)

    def count(candidate: str) -> int:
        return len(tok(candidate)["input_ids"])

    need = (ROLLOVER_SPAN - 1 - count(text)) % ROLLOVER_SPAN
    for extra in range(need, need + 2 * ROLLOVER_SPAN):
        candidate = text + FILLER * extra
        tokens = count(candidate)
        if tokens % ROLLOVER_SPAN == ROLLOVER_SPAN - 1:
            return candidate, tokens
    raise ValueError(f"{tokenizer_dir}: no filler count makes the long prompt end one token short of a block")


def long_prompt(tokenizer_dir: str, min_tokens: int, words: tuple[str, ...], nonce: str, seed: int) -> tuple[str, int]:
    """The shortest prompt of random ``words`` with at least ``min_tokens`` tokens (counted with
    the target's tokenizer); (text, token count)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(seed)
    head = f"run {nonce} long-context"
    pool: list[str] = []

    def count(n: int) -> int:
        return len(tok(" ".join([head, *pool[:n]]))["input_ids"])

    while count(len(pool)) < min_tokens:  # grow, then bisect the shortest long-enough prefix
        pool += [rng.choice(words) for _ in range(max(64, len(pool)))]
    lo, hi = 0, len(pool)
    while lo < hi:
        mid = (lo + hi) // 2
        if count(mid) >= min_tokens:
            hi = mid
        else:
            lo = mid + 1
    return " ".join([head, *pool[:lo]]), count(lo)
