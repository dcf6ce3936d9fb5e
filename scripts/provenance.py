"""The provenance record baked into the wheel, and its verification."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

from scripts import REPO_ROOT
from scripts.errors import ToolError
from scripts.git import head_commit, run_git
from scripts.log import detail, info
from scripts.worktree import Inputs, Layout, load_inputs

# The shipped reader (overlay/vllm/xpu_laguna/provenance.py, which the doctor in the wheel uses)
# states the same value: the wheel cannot import the tooling; tests/test_provenance.py checks
# that the two agree.
SCHEMA = "vllm-xpu-laguna-provenance-v1"
RECORD_PATH = "vllm/xpu_laguna_provenance.json"


def tool_revision(root: Path = REPO_ROOT) -> dict[str, Any]:
    revision = head_commit(root)
    dirty = run_git(
        root,
        "status",
        "--porcelain",
        "--",
        "scripts",
        "patches",
        "overlay",
        "pins.toml",
        "overlay.toml",
        "noxfile.py",
        "pyproject.toml",
        check=False,
    )
    return {"revision": revision or "unknown", "dirty": bool(revision and dirty.stdout.strip())}


def version_for(inputs: Inputs) -> str:
    return f"{inputs.pins.vllm.version}+xpu.{inputs.label}"


def make_record(inputs: Inputs, worktree_head: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "version": version_for(inputs),
        "label": inputs.label,
        "input_hash": inputs.input_hash,
        "pins": inputs.pins.as_dict(),
        "patches": [{"name": p.name, "sha256": p.sha256, "subject": p.subject} for p in inputs.patches],
        "overlay": [{"path": o.relpath, "sha256": o.sha256} for o in inputs.overlay],
        "worktree_head": worktree_head,
        "tool": tool_revision(),
    }


def _read_from_wheel(wheel: Path) -> tuple[dict[str, Any], dict[str, bytes], str]:
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            if RECORD_PATH not in names:
                raise ToolError(f"{wheel.name}: no {RECORD_PATH} inside: not built by this series")
            record = json.loads(zf.read(RECORD_PATH))
            files = {n: zf.read(n) for n in names if n.startswith("vllm/")}
            version = ""
            for name in names:
                if name.endswith(".dist-info/METADATA"):
                    for line in zf.read(name).decode("utf-8", "replace").splitlines():
                        if line.startswith("Version:"):
                            version = line.split(":", 1)[1].strip()
                            break
    except (zipfile.BadZipFile, OSError) as exc:
        raise ToolError(f"{wheel}: not a readable wheel ({exc})") from None
    return record, files, version


def _read_installed(python: str | None) -> tuple[dict[str, Any], Path, str]:
    if python:
        code = (
            "import importlib.util,importlib.metadata as m;s=importlib.util.find_spec('vllm');"
            "print(s.submodule_search_locations[0]);print(m.version('vllm'))"
        )
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ToolError(f"{python}: no installed vllm found")
        location, version = proc.stdout.split()
        pkg = Path(location)
    else:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise ToolError("no installed vllm found in this environment")
        pkg = Path(list(spec.submodule_search_locations)[0])
        from importlib.metadata import version as dist_version

        version = dist_version("vllm")
    path = pkg / Path(RECORD_PATH).name
    if not path.exists():
        raise ToolError(f"installed vllm at {pkg} has no {path.name}: not built by this series")
    return json.loads(path.read_text()), pkg.parent, version


def verify(target: str, layout: Layout | None = None, python: str | None = None) -> None:
    """Check a wheel file or an installed vllm against this repository; raise on any mismatch."""
    layout = layout or Layout()
    inputs = load_inputs(layout)
    expected = make_record(inputs, worktree_head="")
    if target == "installed":
        record, root, version = _read_installed(python)

        def read(rel: str) -> bytes | None:
            p = root / rel
            return p.read_bytes() if p.is_file() else None

        where = f"installed vllm ({root})"
    else:
        wheel = Path(target)
        if not wheel.is_file():
            raise ToolError(f"{wheel}: no such wheel file")
        record, files, version = _read_from_wheel(wheel)
        read = files.get
        where = wheel.name
    info(f"verify {where} against the repository (series {inputs.label})")
    problems = []
    if record.get("schema") != SCHEMA:
        problems.append(f"schema is {record.get('schema')!r}, expected {SCHEMA!r}")
    if version != expected["version"]:
        problems.append(f"version is {version}, the repository builds {expected['version']}")
    for key in ("label", "input_hash", "pins"):
        if record.get(key) != expected[key]:
            got_text, want_text = json.dumps(record.get(key))[:80], json.dumps(expected[key])[:80]
            problems.append(f"{key} differs (wheel {got_text}, repository {want_text})")
    got = {p["name"]: p["sha256"] for p in record.get("patches", [])}
    want = {p["name"]: p["sha256"] for p in expected["patches"]}
    for name in sorted(set(got) | set(want)):
        if got.get(name) != want.get(name):
            built, ours = str(got.get(name))[:12], str(want.get(name))[:12]
            problems.append(f"patch {name}: sha256 {built} in the build, {ours} in the repository")
    if [p["name"] for p in record.get("patches", [])] != [p["name"] for p in expected["patches"]] and not any(
        p.startswith("patch ") for p in problems
    ):
        problems.append("patch order differs from patches/series")
    for item in inputs.overlay:
        if not item.relpath.startswith("vllm/"):
            continue  # tests and tools are not shipped in the wheel
        data = read(item.relpath)
        if data is None:
            problems.append(f"overlay file {item.relpath} is missing from {where}")
        elif hashlib.sha256(data).hexdigest() != item.sha256:
            problems.append(f"overlay file {item.relpath} differs from overlay/{item.relpath}")
    for problem in problems:
        detail(problem)
    if problems:
        raise ToolError(f"{where} does not match the repository: {len(problems)} mismatch(es), first: {problems[0]}")
    tool = record.get("tool", {})
    info(
        f"OK: {where} is vLLM {version}, {len(want)} patch(es), tool revision {str(tool.get('revision'))[:12]}"
        f"{' (dirty)' if tool.get('dirty') else ''}"
    )
