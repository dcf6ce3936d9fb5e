"""Gate thresholds from ``gates.toml`` (strict) and the pure gate decisions."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scripts.typed_data import ShapeError, build, read_toml

GATES_PATH = Path(__file__).resolve().parent / "gates.toml"


@dataclass(frozen=True)
class Gates:
    min_row_win_fraction: float
    min_headline_delta_pct: float
    min_median_paired_delta_pct: float
    practical_floor_pct: float
    floor_decimals: int
    require_complete: bool
    legacy_num_speculative_tokens: int
    min_engine_step_ms: float = 0.0
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


@dataclass(frozen=True)
class _PairTable:
    min_row_win_fraction: float
    min_headline_delta_pct: float
    min_median_paired_delta_pct: float


@dataclass(frozen=True)
class _RecordTable:
    practical_floor_pct: float
    floor_decimals: int


@dataclass(frozen=True)
class _QualityTable:
    require_complete: bool
    min_engine_step_ms: float


@dataclass(frozen=True)
class _LegacyTable:
    num_speculative_tokens: int


@dataclass(frozen=True)
class GatesFile:
    """The layout of ``gates.toml``: one table per concern."""

    pair: _PairTable
    record: _RecordTable
    quality: _QualityTable
    legacy: _LegacyTable


def load_gates(path: Path = GATES_PATH) -> Gates:
    where = str(path)
    tables = build(GatesFile, read_toml(path, "gates file"), where)
    values: dict[str, Any] = {}
    for name, table in asdict(tables).items():
        values.update({_FILE_KEYS.get(f"{name}.{key}", key): value for key, value in table.items()})
    gates = Gates(**values)
    try:
        gates.check(where)
    except ShapeError as exc:  # name the key as the file spells it
        spelled = {field_name: key for key, field_name in _FILE_KEYS.items()}
        spelled.update({key: f"{name}.{key}" for name, table in asdict(tables).items() for key in table})
        raise ShapeError(where, spelled[exc.path], exc.problem) from None
    return gates


_FILE_KEYS = {"legacy.num_speculative_tokens": "legacy_num_speculative_tokens"}
"""Keys of ``gates.toml`` whose :class:`Gates` field has another name."""
