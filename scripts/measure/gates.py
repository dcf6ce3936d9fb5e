"""Gate thresholds from ``gates.toml`` (strict) and the pure gate decisions."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scripts.errors import ToolError

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
    def from_json(data: dict[str, Any], where: str = "gates") -> Gates:
        try:
            gates = Gates(**data)
        except TypeError as exc:
            raise ToolError(f"{where}: {exc}") from None
        gates.check(where)
        return gates

    def check(self, where: str) -> None:
        if not 0.0 <= self.min_row_win_fraction <= 1.0:
            raise ToolError(f"{where}: min_row_win_fraction must be in [0, 1]")
        if self.practical_floor_pct < 0:
            raise ToolError(f"{where}: practical_floor_pct must be >= 0")
        if self.min_engine_step_ms < 0:
            raise ToolError(f"{where}: min_engine_step_ms must be >= 0")
        if self.legacy_num_speculative_tokens < 1:
            raise ToolError(f"{where}: legacy num_speculative_tokens must be >= 1")

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


_LAYOUT = {
    "pair": ("min_row_win_fraction", "min_headline_delta_pct", "min_median_paired_delta_pct"),
    "record": ("practical_floor_pct", "floor_decimals"),
    "quality": ("require_complete", "min_engine_step_ms"),
    "legacy": ("num_speculative_tokens",),
}


def load_gates(path: Path = GATES_PATH) -> Gates:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ToolError(f"cannot read gates file {path}: {exc}") from None
    values: dict[str, Any] = {}
    for table, keys in _LAYOUT.items():
        section = data.pop(table, None)
        if not isinstance(section, dict):
            raise ToolError(f"{path}: missing table [{table}]")
        for key in keys:
            if key not in section:
                raise ToolError(f"{path}: missing [{table}] {key}")
            name = "legacy_num_speculative_tokens" if table == "legacy" else key
            values[name] = section.pop(key)
        if section:
            raise ToolError(f"{path}: unknown key(s) in [{table}]: {', '.join(sorted(section))}")
    if data:
        raise ToolError(f"{path}: unknown table(s): {', '.join(sorted(data))}")
    expected = {
        "min_row_win_fraction": (int, float),
        "min_headline_delta_pct": (int, float),
        "min_median_paired_delta_pct": (int, float),
        "practical_floor_pct": (int, float),
        "floor_decimals": (int,),
        "require_complete": (bool,),
        "min_engine_step_ms": (int, float),
        "legacy_num_speculative_tokens": (int,),
    }
    for name, types in expected.items():
        value = values[name]
        if isinstance(value, bool) != (types == (bool,)) or not isinstance(value, types):
            raise ToolError(f"{path}: {name} has the wrong type ({type(value).__name__})")
    return Gates.from_json({k: float(v) if float in expected[k] else v for k, v in values.items()}, str(path))
