"""Raw-artifact level of ``verify-record``: hashes, then a fresh analysis compared leaf by leaf."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scripts.digest import sha256_file
from scripts.errors import ToolError
from scripts.measure.analyze import analyze
from scripts.measure.artifacts import analysis_documents, load_run
from scripts.measure.checks import Failure, Report, close, is_number
from scripts.measure.gates import Gates
from scripts.measure.record import build_record, meta_from_record

DERIVED_SECTIONS = (
    "metric",
    "metric_conventional",
    "starts",
    "starts_conventional",
    "record",
    "pairs",
    "quality",
    "legs",
    "config",
    "gates",
    "audits",
)


def _leaves(data: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        out: list[tuple[str, Any]] = []
        for key, value in data.items():
            out.extend(_leaves(value, f"{prefix}.{key}"))
        return out
    return [(prefix, data)]


def _lookup(record: dict[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = record
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _same(a: Any, b: Any) -> bool:
    if is_number(a) and is_number(b):
        return close(float(a), float(b)) and isinstance(a, int) == isinstance(b, int) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def raw_checks(record: dict[str, Any], root: Path, report: Report) -> None:
    def fail(fields: tuple[str, ...], message: str) -> None:
        report.failures.append(Failure(fields, message))

    artifacts = record.get("artifacts") or {}
    hashes = record.get("sha256") or {}
    intact = True
    for name, rel in artifacts.items():
        file_path = root / str(rel)
        if not file_path.is_file():
            fail((f"artifacts.{name}",), f"raw artifact {file_path} is missing")
            intact = False
        elif sha256_file(file_path) != hashes.get(name):
            fail((f"sha256.{name}",), f"{file_path} hashes to {sha256_file(file_path)}")
            intact = False
    if not intact:
        return
    try:
        legs, teacher, manifest = load_run(root, artifacts)
        gates = Gates.from_json(record["gates"], "record", "gates")
        analysis = analyze(legs, teacher, manifest.config, gates)
    except (ToolError, KeyError, ValueError, OSError) as exc:
        fail(("artifacts",), f"cannot re-analyze the raw rows: {exc}")
        return
    for name, document in analysis_documents(analysis).items():
        rel = artifacts.get(name)
        if rel is None:
            continue
        fresh = json.dumps(document, indent=2, sort_keys=True) + "\n"
        if (root / rel).read_text(encoding="utf-8") != fresh:
            fail((f"sha256.{name}",), f"{rel} differs from a fresh analysis of the raw rows")
    rebuilt = build_record(analysis, meta_from_record(record))
    sections = list(DERIVED_SECTIONS) + [k for k in rebuilt if k.endswith("_submission_summary")]
    for section in sections:
        for path, expected in _leaves(rebuilt[section], section):
            found, actual = _lookup(record, path)
            report.checked.add(path)
            report.derived.add(path)
            if not found:
                fail((path,), f"missing; the raw rows give {expected!r}")
            elif not _same(actual, expected):
                fail((path,), f"{actual!r} != {expected!r} re-derived from the raw rows")
    for path in report.numeric:
        if path.startswith(tuple(sections)):
            report.checked.add(path)
            report.derived.add(path)
