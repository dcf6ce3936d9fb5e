"""The planted structure of the tiny Laguna pair (``scripts.tiny_laguna``): a token cycle the
random target mostly follows and a drafter that predicts it ``k`` steps ahead at mask ``k``.

Hidden layout (64 dims, coordinate blocks: every RMSNorm weight is per coordinate, so a block
stays a block through every norm):

* ``TOK`` (0..31): token identity. Ordinary tokens lie on ``cycles`` orbits of an orthogonal
  map ``R`` (16 planes, rotation angles 2*pi*m/CYCLE_LEN): the token at index ``j`` of cycle
  ``c`` has the unit vector ``R^j u_c``. The successor of a token is the next one on its orbit
  (``successor``), so ``R`` maps a token's vector to its successor's.
* ``KEY`` (32..35): the same vector in every ordinary token (the drafter's key for the bonus
  token); nothing else has it.
* ``MASK`` (36..39): the mask token's embedding (only it has these).
* ``CTX`` (40..63): where the drafter's ``fc`` writes the target's hidden states.

Target: the embedding is the structure above times ``EMBED_SCALE``; lm_head row ``z`` reads
``TOK`` as ``u`` of ``z``'s predecessor, so a final hidden state near ``u_y`` scores
``u_z . u_successor(y)``: greedy follows the cycle unless the random layers (attention over the
context, MoE, gates: all random) push another token over it.

Drafter (one non-causal layer; the query block is [bonus token t, mask x 7] at positions
p..p+7): query heads 0..6 ("depth heads") share KV head 0, whose key is non-zero only for the
bonus token (KEY block) and whose value is the token's ``TOK`` vector. Depth head ``h``'s
mask query is built from the RoPE frequencies so its score for the bonus token at relative
distance ``h`` is ``DEPTH_SCORE`` and at every other distance 1..7 at most ``OFF_SCORE``; every
other key of KV head 0 is exactly zero (score 0). So mask ``k`` reads ``u_t`` through head
``k`` only, and head ``k``'s o_proj block is ``R^(k-1)``: the shared lm_head then scores
``successor^k(t)`` highest at mask ``k``. Heads 7..15 and the MLP are random.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HIDDEN = 64
TOK = (0, 32)
KEY = (32, 36)
MASK = (36, 40)
CTX = (40, 64)
CYCLE_LEN = 29  # 319 ordinary tokens (320 minus the mask) = 11 cycles of 29
PLANE_FREQS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 11)  # m of each plane's angle 2*pi*m/29
SEED_TRIALS = 64  # random cycle seeds tried; the best separated set is kept

# drafter depth heads: scores of the bonus token's key
DEPTH_SCORE = 16.0  # at the head's own distance: beats ~e^16 zero-score keys (any context here)
OFF_SCORE = -1.0  # at every other distance 1..7
HEAD_DIM = 32
ROT_DIM = 16  # rope partial_rotary_factor 0.5 of the global layers (theta 500000), the drafter's
ROPE_THETA = 500000.0
BOOSTED = (0, 1, 8, 9, 16)  # head dims the depth heads use: rope pairs 0 and 1, one plain dim


@dataclass(frozen=True)
class Cycles:
    """Cycle structure over ordinary tokens (every id but the mask)."""

    order: tuple[int, ...]  # order[c * CYCLE_LEN + j] = token at index j of cycle c
    units: torch.Tensor  # [vocab, 32] unit TOK vector per token id (zero for the mask)
    rotation: torch.Tensor  # [32, 32] R

    def successor(self, vocab: int) -> tuple[int, ...]:
        """successor[y]: the next token on y's cycle (the mask maps to itself)."""
        nxt = list(range(vocab))
        for start in range(0, len(self.order), CYCLE_LEN):
            ring = self.order[start : start + CYCLE_LEN]
            for j, tok in enumerate(ring):
                nxt[tok] = ring[(j + 1) % CYCLE_LEN]
        return tuple(nxt)


def rotation_power(power: int) -> torch.Tensor:
    """R^power on the TOK block: plane p (dims 2p, 2p+1) turned by power * 2*pi*m_p/CYCLE_LEN."""
    import torch

    rot = torch.zeros(TOK[1] - TOK[0], TOK[1] - TOK[0])
    for p, m in enumerate(PLANE_FREQS):
        a = 2 * math.pi * m * power / CYCLE_LEN
        c, s = math.cos(a), math.sin(a)
        rot[2 * p : 2 * p + 2, 2 * p : 2 * p + 2] = torch.tensor([[c, -s], [s, c]])
    return rot


def _orbit_units(phases: torch.Tensor) -> torch.Tensor:
    """[cycles * CYCLE_LEN, 32] unit vectors R^j u_c, u_c with equal weight on every plane."""
    import torch

    freqs = torch.tensor(PLANE_FREQS, dtype=torch.float64)
    j = torch.arange(CYCLE_LEN, dtype=torch.float64)
    angle = phases[:, None, :] + 2 * math.pi * freqs[None, None, :] * j[None, :, None] / CYCLE_LEN
    pairs = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1)  # cycles, L, planes, 2
    return (pairs.reshape(-1, 2 * len(PLANE_FREQS)) / math.sqrt(len(PLANE_FREQS))).float()


def make_cycles(vocab: int, mask_id: int, gen: torch.Generator) -> Cycles:
    import torch

    ordinary = [t for t in range(vocab) if t != mask_id]
    if len(ordinary) % CYCLE_LEN:
        raise ValueError(f"{len(ordinary)} ordinary tokens do not split into cycles of {CYCLE_LEN}")
    count = len(ordinary) // CYCLE_LEN
    perm = torch.randperm(len(ordinary), generator=gen).tolist()
    order = tuple(ordinary[i] for i in perm)
    best: tuple[float, torch.Tensor] | None = None
    for _ in range(SEED_TRIALS):
        phases = 2 * math.pi * torch.rand(count, len(PLANE_FREQS), generator=gen, dtype=torch.float64)
        units = _orbit_units(phases)
        gram = units @ units.T
        gram.fill_diagonal_(-1.0)
        worst = float(gram.max())
        if best is None or worst < best[0]:
            best = (worst, units)
    assert best is not None
    table = torch.zeros(vocab, TOK[1] - TOK[0])
    table[list(order)] = best[1]
    rot = rotation_power(1)
    # R maps every token's vector to its successor's (cycles close: R^CYCLE_LEN = 1)
    succ = Cycles(order, table, rot).successor(vocab)
    moved = table[ordinary] @ rot.T
    if not torch.allclose(moved, table[[succ[t] for t in ordinary]], atol=1e-5):
        raise AssertionError("R does not map tokens to their successors")
    return Cycles(order, table, rot)


def max_cross_similarity(cycles: Cycles) -> float:
    """Largest cosine between two different tokens' TOK vectors (1 - it is the logit margin)."""
    units = cycles.units[list(cycles.order)]
    gram = units @ units.T
    gram.fill_diagonal_(-1.0)
    return float(gram.max())


# ---------------------------------------------------------------- drafter depth heads


def rope_freqs() -> list[float]:
    return [ROPE_THETA ** (-2 * i / ROT_DIM) for i in range(ROT_DIM // 2)]


def depth_kernel() -> tuple[float, float, float]:
    """Weights (w0, w1, c) of f(d) = w0 cos(theta0 d) + w1 cos(theta1 d) + c: f(0) = DEPTH_SCORE,
    f(d) = OFF_SCORE at d = 1 and 6 (the binding distances) and below it at 2..5."""
    t0, t1 = rope_freqs()[:2]
    gap = DEPTH_SCORE - OFF_SCORE
    a11, a12 = 1 - math.cos(t0), 1 - math.cos(t1)
    a21, a22 = 1 - math.cos(6 * t0), 1 - math.cos(6 * t1)
    det = a11 * a22 - a12 * a21
    w0 = gap * (a22 - a12) / det
    w1 = gap * (a11 - a21) / det
    c = DEPTH_SCORE - w0 - w1
    for d in range(1, 7):
        f = w0 * math.cos(t0 * d) + w1 * math.cos(t1 * d) + c
        if f > OFF_SCORE + 1e-6:
            raise AssertionError(f"depth kernel: f({d}) = {f:.3f} > {OFF_SCORE}")
    return w0, w1, c


def depth_key() -> torch.Tensor:
    """KV head 0's key for the bonus token (head dims), unnormalised."""
    import torch

    w0, w1, c = depth_kernel()
    k = torch.zeros(HEAD_DIM)
    k[0], k[1], k[16] = math.sqrt(w0), math.sqrt(w1), math.sqrt(-c)
    return k


def depth_query(h: int) -> torch.Tensor:
    """Depth head ``h``'s mask query (head dims): peaks at relative distance ``h``.

    Neox rope turns pair (i, i + ROT_DIM/2) by position * theta_i; with the key real on pair i,
    a query phase of -theta_i * h puts the pair's score maximum at distance h."""
    import torch

    w0, w1, c = depth_kernel()
    t0, t1 = rope_freqs()[:2]
    half = ROT_DIM // 2
    q = torch.zeros(HEAD_DIM)
    q[0], q[half] = math.sqrt(w0) * math.cos(t0 * h), -math.sqrt(w0) * math.sin(t0 * h)
    q[1], q[1 + half] = math.sqrt(w1) * math.cos(t1 * h), -math.sqrt(w1) * math.sin(t1 * h)
    q[16] = -math.sqrt(-c)
    return q


def q_norm_boost() -> float:
    """q_norm weight on BOOSTED dims: after q/k RMSNorm (k weight 1) the depth scores equal f."""
    w0, w1, c = depth_kernel()
    return (w0 + w1 - c) / math.sqrt(HEAD_DIM)


def depth_scores(h: int) -> list[float]:
    """Score of the bonus token for depth head ``h`` at distance 1..7, as vLLM computes it
    (q/k RMSNorm, neox rope, 1/sqrt(head_dim)); a check of the construction, not of vLLM."""
    import torch

    def rope(x: torch.Tensor, pos: int) -> torch.Tensor:
        out = x.clone()
        half = ROT_DIM // 2
        for i, th in enumerate(rope_freqs()):
            c, s = math.cos(pos * th), math.sin(pos * th)
            out[i] = x[i] * c - x[i + half] * s
            out[i + half] = x[i + half] * c + x[i] * s
        return out

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean() + 1e-6) * weight

    qw = torch.ones(HEAD_DIM)
    qw[list(BOOSTED)] = q_norm_boost()
    q = rms(depth_query(h).double(), qw.double())
    k = rms(depth_key().double(), torch.ones(HEAD_DIM, dtype=torch.float64))
    base = 1000
    return [float(rope(q, base + d) @ rope(k, base) / math.sqrt(HEAD_DIM)) for d in range(1, 8)]
