"""What every ``verify-record`` check shares: failures, the report, float tolerance, and a
:class:`Checker` that reads record fields and records which ones a check used."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from scripts.errors import ToolError

REL_TOL = 1e-12
ABS_TOL = 1e-12


@dataclass(frozen=True)
class Failure:
    fields: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{', '.join(self.fields)}: {self.message}"


@dataclass
class Report:
    mode: str
    failures: list[Failure] = field(default_factory=list)
    checked: set[str] = field(default_factory=set)
    """Fields a check read (re-derived, used as an input, or bounded)."""
    derived: set[str] = field(default_factory=set)
    """Fields in an exact relation (re-computed from other fields or from raw rows, or an
    input of such a computation): altering one of them alone is reported."""
    numeric: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def unchecked(self) -> list[str]:
        return [path for path in self.numeric if path not in self.checked]


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def numeric_leaves(data: object, prefix: str = "") -> Iterator[str]:
    """Paths of every number in a record, including the numbers inside 'k/n' strings."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from numeric_leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from numeric_leaves(value, f"{prefix}[{index}]")
    elif is_number(data) or isinstance(data, str) and re.fullmatch(r"\d+/\d+", data):
        yield prefix


class Missing(Exception):
    """A field a check needs is absent or unusable (already reported)."""


class Checker:
    def __init__(self, record: dict[str, Any], report: Report) -> None:
        self.record = record
        self.report = report

    def fail(self, fields: tuple[str, ...] | str, message: str) -> None:
        fields = (fields,) if isinstance(fields, str) else fields
        self.report.failures.append(Failure(fields, message))

    def get(self, path: str) -> Any:
        node: Any = self.record
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
            if part.startswith("["):
                index = int(part[1:-1])
                if not isinstance(node, list) or index >= len(node):
                    self.fail(path, "missing")
                    raise Missing(path)
                node = node[index]
            else:
                if not isinstance(node, dict) or part not in node:
                    self.fail(path, "missing")
                    raise Missing(path)
                node = node[part]
        return node

    def number(self, path: str, *, integer: bool = False, optional: bool = False) -> Any:
        value = self.get(path)
        if value is None and optional:
            return None
        if not is_number(value) or (integer and not isinstance(value, int)):
            self.fail(path, f"expected {'an integer' if integer else 'a number'}, got {value!r}")
            raise Missing(path)
        if not math.isfinite(value):
            self.fail(path, f"not finite: {value!r}")
            raise Missing(path)
        return value

    def derived(self, path: str, expected: float, formula: str, inputs: tuple[str, ...]) -> None:
        """``path`` must equal ``expected`` (computed from ``inputs`` as ``formula``)."""
        self.report.checked.update((path, *inputs))
        self.report.derived.update((path, *inputs))
        try:
            actual = self.number(path)
        except Missing:
            return
        exact = isinstance(actual, int) and isinstance(expected, int)
        if (actual != expected) if exact else not close(actual, expected):
            self.fail((path, *inputs), f"{actual!r} != {formula} = {expected!r}")

    def constraint(self, ok: bool, fields: tuple[str, ...], message: str) -> None:
        self.report.checked.update(fields)
        if not ok:
            self.fail(fields, message)

    def run(self, name: str, check: Callable[[], None]) -> None:
        """Run one check; a malformed record fails the field ``name`` instead of raising."""
        try:
            check()
        except Missing:
            pass
        except (KeyError, TypeError, ValueError, ZeroDivisionError, ToolError) as exc:
            self.fail(name, f"malformed ({exc})")
