"""Gate thresholds from ``gates.toml`` (strict) and the pure gate decisions."""

from __future__ import annotations

import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any

from scripts.typed_data import ShapeError, build, read_toml

GATES_PATH = Path(__file__).resolve().parent / "gates.toml"
_IN_FILE = "gates_toml_key"
"""Field metadata: where ``gates.toml`` keeps the field, ``TABLE.KEY``."""


def _in_file(key: str, default: Any = MISSING) -> Any:
    """A :class:`Gates` field kept in ``gates.toml`` at ``key`` (``TABLE.KEY``), where it is
    required; ``default``: the value for records written before the gate existed."""
    return field(default=default, metadata={_IN_FILE: key})


@dataclass(frozen=True)
class Gates:
    """The thresholds: flat in a record's ``gates``, one table per concern in ``gates.toml``."""

    min_row_win_fraction: float = _in_file("pair.min_row_win_fraction")
    min_headline_delta_pct: float = _in_file("pair.min_headline_delta_pct")
    min_median_paired_delta_pct: float = _in_file("pair.min_median_paired_delta_pct")
    practical_floor_pct: float = _in_file("record.practical_floor_pct")
    floor_decimals: int = _in_file("record.floor_decimals")
    require_complete: bool = _in_file("quality.require_complete")
    legacy_num_speculative_tokens: int = _in_file("legacy.num_speculative_tokens")
    min_engine_step_ms: float = _in_file("quality.min_engine_step_ms", default=0.0)
    """Burst gate (scripts/measure/timing.py); 0 = off, which is how records written before the
    gate existed were judged."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Any, where: str = "gates", path: str = "") -> Gates:
        """Gates from an object (a record's ``gates``): every field present and typed."""
        gates = build(Gates, data, where, path)
        gates.check(where, path)
        return gates

    def check(self, where: str, path: str = "") -> None:
        prefix = f"{path}." if path else ""
        if not 0.0 <= self.min_row_win_fraction <= 1.0:
            raise ShapeError(where, prefix + "min_row_win_fraction", "must be in [0, 1]")
        if self.practical_floor_pct < 0:
            raise ShapeError(where, prefix + "practical_floor_pct", "must be >= 0")
        if self.min_engine_step_ms < 0:
            raise ShapeError(where, prefix + "min_engine_step_ms", "must be >= 0")
        if self.legacy_num_speculative_tokens < 1:
            raise ShapeError(where, prefix + "legacy_num_speculative_tokens", "must be >= 1")

    def pair_passes(
        self, wins: int, rows: int, headline_delta_pct: float | None, median_paired_delta_pct: float
    ) -> bool:
        if rows <= 0 or wins / rows < self.min_row_win_fraction:
            return False
        if headline_delta_pct is not None and not headline_delta_pct > self.min_headline_delta_pct:
            return False
        return median_paired_delta_pct > self.min_median_paired_delta_pct

    def practical_floor(self, prior_tok_s: float) -> float:
        return round(prior_tok_s * (1 + self.practical_floor_pct / 100), self.floor_decimals)


def _file_keys() -> dict[str, tuple[str, str]]:
    """:class:`Gates` field -> (table, key) in ``gates.toml``."""
    keys: dict[str, tuple[str, str]] = {}
    for spec in fields(Gates):
        table, key = spec.metadata[_IN_FILE].split(".")
        keys[spec.name] = (table, key)
    return keys


def _file_shape() -> type:
    """The layout of ``gates.toml``, from the fields' keys: one dataclass per table, every key
    required."""
    hints = typing.get_type_hints(Gates)
    tables: dict[str, list[tuple[str, Any]]] = {}
    for name, (table, key) in _file_keys().items():
        tables.setdefault(table, []).append((key, hints[name]))
    shapes = [(table, make_dataclass(f"GatesFile_{table}", keys, frozen=True)) for table, keys in tables.items()]
    return make_dataclass("GatesFile", shapes, frozen=True)


def load_gates(path: Path = GATES_PATH) -> Gates:
    where = str(path)
    tables = asdict(build(_file_shape(), read_toml(path, "gates file"), where))
    keys = _file_keys()
    gates = Gates(**{name: tables[table][key] for name, (table, key) in keys.items()})
    try:
        gates.check(where)
    except ShapeError as exc:  # name the key as the file spells it
        raise ShapeError(where, ".".join(keys[exc.path]), exc.problem) from None
    return gates
