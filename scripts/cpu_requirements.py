"""Requirements and installed versions of a CPU runtime (shared by :mod:`scripts.cpu_runtime` and
:mod:`scripts.cpu_stand_in`; plain Python + packaging)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping

from scripts.errors import ToolError

DROPPED_REQUIREMENTS = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})


# ---------------------------------------------------------------- requirements


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def filter_requirements(
    lines: Iterable[str],
    environment: Mapping[str, str] | None = None,
    drop: Iterable[str] = DROPPED_REQUIREMENTS,
) -> list[str]:
    """Requirements that apply here, without markers, minus the ``drop`` names.

    Markers are evaluated for ``environment`` (default: this interpreter) with
    no extra selected, so extra-only requirements are left out. Exact
    duplicates are removed; order is kept.
    """
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement

    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    if environment:
        env.update(environment)
    env.setdefault("extra", "")
    dropped = {_canonical(n) for n in drop}
    out: list[str] = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise ToolError(f"invalid requirement {line!r}: {exc}") from None
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if _canonical(req.name) in dropped:
            continue
        req.marker = None
        text = str(req)
        if text not in out:
            out.append(text)
    return out


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _same_release(installed: str | None, pinned: str) -> bool:
    """``2.11.0+cpu`` counts as ``2.11.0``: only the public version matters."""
    if installed is None:
        return False
    from packaging.version import Version

    return Version(installed).public == Version(pinned).public
