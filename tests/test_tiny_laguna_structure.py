"""The planted structure of the tiny Laguna pair (scripts.tiny_laguna_structure): pure math, torch only.

The end-to-end proof (vLLM accepting drafts at every depth) is tests/e2e/test_laguna_spec_decode.py;
these check the construction's premises with an independent re-computation of the depth scores."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from scripts import tiny_laguna_structure as st  # noqa: E402

VOCAB, MASK = 320, 3


def _cycles() -> st.Cycles:
    return st.make_cycles(VOCAB, MASK, torch.Generator().manual_seed(3))


@pytest.mark.parametrize("h", range(1, 8))
def test_depth_head_scores_peak_at_its_own_distance(h: int) -> None:
    scores = st.depth_scores(h)
    assert scores[h - 1] == pytest.approx(st.DEPTH_SCORE, abs=1e-4)  # RMSNorm eps
    others = [s for d, s in enumerate(scores, 1) if d != h]
    assert max(others) <= st.OFF_SCORE + 1e-4, scores
    # the bonus token must outweigh every zero-score key of a long context (8192 positions)
    assert math.exp(st.DEPTH_SCORE) > 1000 * 8192


def test_depth_scores_negative_control(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query turned the wrong way (phase +theta*h: its peak moves to distance -h, behind the
    bonus token) scores low at distance h: the check can fail."""
    real = st.depth_query

    def flipped(h: int) -> Any:
        q = real(h)
        q[st.ROT_DIM // 2], q[1 + st.ROT_DIM // 2] = -q[st.ROT_DIM // 2], -q[1 + st.ROT_DIM // 2]
        return q

    monkeypatch.setattr(st, "depth_query", flipped)
    scores = st.depth_scores(3)
    assert scores[2] < st.DEPTH_SCORE - 10, scores


def test_cycles_cover_every_ordinary_token() -> None:
    cycles = _cycles()
    succ = cycles.successor(VOCAB)
    assert sorted(succ) == list(range(VOCAB)) and succ[MASK] == MASK
    assert sorted(cycles.order) == [t for t in range(VOCAB) if t != MASK]
    assert float(cycles.units[MASK].abs().max()) == 0.0
    norms = cycles.units[list(cycles.order)].norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 7])
def test_rotation_power_moves_k_successors_ahead(k: int) -> None:
    """R^k u_y = u_(succ^k y): what the depth head k's o_proj block relies on."""
    cycles = _cycles()
    succ = cycles.successor(VOCAB)
    ahead = list(range(VOCAB))
    for _ in range(k):
        ahead = [succ[t] for t in ahead]
    ordinary = list(cycles.order)
    moved = cycles.units[ordinary] @ st.rotation_power(k).T
    assert torch.allclose(moved, cycles.units[[ahead[t] for t in ordinary]], atol=1e-5)
    # and the best-scoring token after the lm_head's predecessor lookup is succ^k
    predecessor = {n: t for t, n in enumerate(succ)}
    head = cycles.units[[predecessor[z] for z in ordinary]]  # rows: lm_head TOK part of token z
    best = (cycles.units[ordinary] @ st.rotation_power(k - 1).T @ head.T).argmax(dim=1)
    assert [ordinary[i] for i in best.tolist()] == [ahead[t] for t in ordinary]


def test_tokens_are_separated() -> None:
    # logit margin of the planted cycle: 1 - max cosine between two tokens (measured: max cosine 0.48)
    assert st.max_cross_similarity(_cycles()) < 0.6


def test_cycle_length_must_divide_the_ordinary_tokens() -> None:
    with pytest.raises(ValueError, match="do not split into cycles of 29"):
        st.make_cycles(VOCAB + 1, MASK, torch.Generator().manual_seed(3))
