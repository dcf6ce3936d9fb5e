"""A small synthetic crossover whose every number is worked out by hand in the tests.

Window 4, 3 rows per leg, 5 output tokens per row. Row ``i`` of a leg has token times
``[0.5, 0.5 + s/3, 0.5 + 2s/3, 0.5 + s, 0.5 + s + 0.1]`` (so tokens 1..4 span ``s`` seconds,
legacy tok/s = 4/s, conventional = 3/s, decode time = s + 0.1). Spans per leg:

    A1, A2: 0.3, 0.6, 0.2   -> legacy 40/3, 20/3, 20
    B1:     0.15, 0.3, 0.16 -> legacy 80/3, 40/3, 25
    B2:     0.15, 0.3, 0.3  -> legacy 80/3, 40/3, 40/3

Every row drafts 10 cycles of 3 tokens; A legs accept 9 per row, B legs 12. Row 0 is a long
prompt, row 2 a rollover prompt (8 prompt tokens, rollover at 10). A2 row 2 differs from the
teacher at output position 3; B2 row 1 reports 16 cached tokens.
"""

from __future__ import annotations

from scripts.measure.schema import AnalysisConfig, Row, SpecCounters, sha256_text

SPANS = {
    "A1": (0.3, 0.6, 0.2),
    "B1": (0.15, 0.3, 0.16),
    "B2": (0.15, 0.3, 0.3),
    "A2": (0.3, 0.6, 0.2),
}
KINDS = ("long", "normal", "rollover")
ACCEPTED = {"A1": 9, "A2": 9, "B1": 12, "B2": 12}
CONFIG = AnalysisConfig(
    window=4,
    num_speculative_tokens=3,
    rollover_at=10,
    legs={"A1": "A1_off", "B1": "B1_on", "B2": "B2_on", "A2": "A2_off"},
)


def times(span: float) -> list[float]:
    return [0.5, 0.5 + span / 3, 0.5 + 2 * span / 3, 0.5 + span, 0.5 + span + 0.1]


def teacher_tokens(index: int) -> list[int]:
    return [10 * index + k for k in range(5)]


def make_row(leg: str, index: int, span: float, defects: bool = True) -> Row:
    tokens = teacher_tokens(index)
    if defects and leg == "A2" and index == 2:
        tokens = tokens[:3] + [999] + tokens[4:]
    before = SpecCounters(10 * index, 30 * index, ACCEPTED.get(leg, 0) * index)
    after = SpecCounters(10 * (index + 1), 30 * (index + 1), ACCEPTED.get(leg, 0) * (index + 1))
    return Row(
        leg=leg,
        index=index,
        prompt_id=f"p{index}",
        kind=KINDS[index],
        prompt_sha256=sha256_text(f"prompt {index}"),
        prompt_tokens=8 if index == 2 else 40,
        max_tokens=5,
        token_times_s=times(span),
        token_ids=tokens,
        finish_reason="length",
        cached_tokens=16 if (defects and leg == "B2" and index == 1) else 0,
        spec_before=before,
        spec_after=after,
        sent_unix=1_700_000_000.0 + index,
        requests_before=index,
    )


def legs() -> dict[str, list[Row]]:
    return {leg: [make_row(leg, i, s) for i, s in enumerate(spans)] for leg, spans in SPANS.items()}


def clean_legs() -> dict[str, list[Row]]:
    """No defects and B2 timed like B1: both pairs pass, every quality count is complete."""
    spans = {**SPANS, "B2": SPANS["B1"]}
    return {
        leg: [make_row(leg, i, s, defects=False) for i, s in enumerate(leg_spans)] for leg, leg_spans in spans.items()
    }


def teacher() -> list[Row]:
    rows = []
    for i in range(3):
        row = make_row("teacher", i, 0.5)
        row.spec_before = row.spec_after = None
        rows.append(row)
    return rows
