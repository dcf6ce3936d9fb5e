"""Token-sequence comparison shared by the matrix and the measurement harness."""

from __future__ import annotations

from collections.abc import Sequence


def first_difference(a: Sequence[int], b: Sequence[int]) -> tuple[int, int | None, int | None] | None:
    """(position, a_token, b_token) of the first difference, or None when equal; past the end of the
    shorter sequence its token is None."""
    for pos in range(max(len(a), len(b))):
        x = a[pos] if pos < len(a) else None
        y = b[pos] if pos < len(b) else None
        if x != y:
            return pos, x, y
    return None
