# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Provenance of this vLLM build: the upstream, patches and overlay it was made from.

The XPU Laguna series writes ``xpu_laguna_provenance.json`` at the top of the
``vllm`` package (where every wheel of the series has kept it) when it builds a
wheel (pins, each patch's name and sha256, overlay file hashes, the tool
revision). ``python -m vllm.xpu_laguna.provenance`` prints it; the series'
``verify`` command checks it.
"""

import json
from pathlib import Path
from typing import Any

PROVENANCE_FILE = "xpu_laguna_provenance.json"
# the installed ``vllm`` package, which holds the record and the overlay files
VLLM_PACKAGE_DIR = Path(__file__).resolve().parent.parent
# Format of the record, as the series' tooling writes it (scripts/provenance.py
# states the same value; the tooling's tests check that the two agree).
SCHEMA = "vllm-xpu-laguna-provenance-v1"


def load() -> dict[str, Any] | None:
    """The provenance record of this installation, or None for a build without one."""
    path = VLLM_PACKAGE_DIR / PROVENANCE_FILE
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def summary(record: dict[str, Any]) -> str:
    pins = record.get("pins", {}).get("vllm", {})
    lines = [
        f"vLLM {pins.get('version')} ({pins.get('commit')}) + XPU Laguna series "
        f"{record.get('label')}",
        f"tool revision {record.get('tool', {}).get('revision')}",
    ]
    lines += [
        f"  patch {p['name']} sha256 {p['sha256'][:16]}"
        for p in record.get("patches", [])
    ]
    lines += [
        f"  overlay {o['path']} sha256 {o['sha256'][:16]}"
        for o in record.get("overlay", [])
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    record = load()
    if record is None:
        print("this vLLM carries no XPU Laguna provenance record", file=sys.stderr)
        sys.exit(1)
    if "--json" in sys.argv[1:]:
        print(json.dumps(record, indent=2, sort_keys=True))
    else:
        print(summary(record))
