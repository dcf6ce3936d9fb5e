"""Progress output: every step says what it does and how long it took."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


def info(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def detail(message: str) -> None:
    print(f"    {message}", file=sys.stderr, flush=True)


@contextmanager
def step(message: str) -> Iterator[None]:
    """Print ``message``, run the block, then print its duration (also on failure)."""
    info(message)
    start = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        took = time.monotonic() - start
        detail(f"{'done' if ok else 'failed'} in {took:.1f}s")
