"""The cases tests/stand_in ran (each result without its token rows), for the terminal summary."""

from __future__ import annotations

from typing import Any

RESULTS: list[dict[str, Any]] = []
