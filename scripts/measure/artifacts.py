"""Write a run directory: raw rows, manifest, analysis documents, plot, record with sha256."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from scripts.digest import sha256_file
from scripts.errors import ToolError
from scripts.measure.analyze import analyze
from scripts.measure.gates import Gates
from scripts.measure.manifest import MANIFEST_FILE, Manifest, load_manifest, write_manifest
from scripts.measure.record import RecordMeta, build_record
from scripts.measure.schema import (
    LEG_ORDER,
    TEACHER,
    Row,
    dump_json,
    dump_rows,
    load_rows,
)

# The run directory's artifacts, by name (the record's "artifacts" and "sha256" keys)
RECORD_FILE = "record.json"
PLOT_FILE = "crossover.png"
MANIFEST = "manifest"
RECIPE_ARTIFACT = "recipe"
RECIPE_ENV_ARTIFACT = "recipe_env"
"""``crossover --recipe``: the run's copies of the recipe's YAML and env file."""
ANALYSIS_FILES = {
    "full_analysis": None,
    "all_vs_teacher": "all_vs_teacher",
    "cross_leg": "cross_leg",
}


def server_log_artifact(leg: str) -> str:
    return f"{leg.lower()}_server_log"


def rows_artifact(leg: str) -> str:
    return f"{leg.lower()}_bench"


def analysis_documents(analysis: dict[str, Any]) -> dict[str, Any]:
    """The JSON documents written next to the rows, by artifact name."""
    return {name: analysis if key is None else analysis[key] for name, key in ANALYSIS_FILES.items()}


def load_run(root: Path, artifacts: dict[str, str]) -> tuple[dict[str, list[Row]], list[Row] | None, Manifest]:
    """A run's raw rows per leg, the teacher's and its manifest, each file read through
    :mod:`scripts.typed_data` (one line naming the file, the line of a rows file, and the field)."""
    manifest_rel = artifacts.get(MANIFEST)
    if manifest_rel is None:
        raise ToolError("record lists no manifest artifact")
    manifest = load_manifest(root / manifest_rel)
    legs = {}
    for leg in LEG_ORDER:
        rel = artifacts.get(rows_artifact(leg))
        if rel is None:
            raise ToolError(f"record lists no rows for leg {leg}")
        legs[leg] = load_rows(root / rel)
    teacher_rel = artifacts.get(rows_artifact("teacher"))
    teacher = load_rows(root / teacher_rel) if teacher_rel is not None else None
    return legs, teacher, manifest


def write_rows(out: Path, legs: Mapping[str, Sequence[Row]], teacher: Sequence[Row] | None) -> dict[str, str]:
    """Raw rows as JSON Lines; returns artifact name -> path relative to ``out``."""
    artifacts = {}
    for leg in LEG_ORDER:
        rel = f"rows-{leg}.jsonl"
        dump_rows(list(legs[leg]), out / rel)
        artifacts[rows_artifact(leg)] = rel
    if teacher is not None:
        rel = f"rows-{TEACHER}.jsonl"
        dump_rows(list(teacher), out / rel)
        artifacts[rows_artifact(TEACHER)] = rel
    return artifacts


def finish_run(
    out: Path,
    manifest: Manifest,
    raw_artifacts: dict[str, str],
    meta: RecordMeta,
    gates: Gates,
    plot: Callable[[dict[str, Any], Path, Mapping[str, Any] | None], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Analyze the rows already written under ``out`` and write manifest, analysis documents,
    the plot (when given) and ``record.json``. Returns ``(analysis, record)``."""
    artifacts = dict(raw_artifacts)
    artifacts[MANIFEST] = MANIFEST_FILE
    write_manifest(manifest, out / MANIFEST_FILE)
    legs, teacher, written = load_run(out, artifacts)
    analysis = analyze(legs, teacher, written.config, gates)
    for name, document in analysis_documents(analysis).items():
        rel = f"{name.replace('_', '-')}.json"
        dump_json(document, out / rel)
        artifacts[name] = rel
    if plot is not None:
        plot(analysis, out / PLOT_FILE, meta.treatment)
        artifacts["plot"] = PLOT_FILE
    hashes = {name: sha256_file(out / rel) for name, rel in sorted(artifacts.items())}
    meta = replace(meta, artifacts=dict(sorted(artifacts.items())), sha256=hashes)
    record = build_record(analysis, meta)
    dump_json_ordered(record, out / RECORD_FILE)
    return analysis, record


def dump_json_ordered(data: object, path: Path) -> None:
    """Records keep the reference layout's key order (not sorted)."""
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
