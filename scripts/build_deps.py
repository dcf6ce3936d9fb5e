"""What the wheel is built with: the patched tree's own ``pyproject.toml`` ``[build-system].requires``,
installed into the building interpreter through pip's configuration (:func:`scripts.wheels.install`)
and checked again by pip itself (``pip wheel --no-build-isolation --check-build-dependencies``), so
the wheel never builds against a torch (or setuptools, cmake, ...) the tree does not ask for.

A requirement this machine cannot satisfy is replaced only through :data:`BUILD_OVERRIDES`, the one
reviewed list, each entry with its reason; the build writes the replacement into its own copy of the
tree (build/wheel-src), so pip's check holds the build to the reviewed requirement, not to nothing.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from scripts.errors import ToolError
from scripts.layout import Layout
from scripts.log import detail, info

if TYPE_CHECKING:  # packaging and the pins are imported where they are used
    from packaging.requirements import Requirement

    from scripts.pins import Pins


@dataclass(frozen=True)
class Override:
    """A reviewed replacement of one of the tree's build requirements."""

    requirement: str  # what is checked instead (a PEP 508 string; pip checks it again at build time)
    reason: str  # why, in one line: shown on every build that uses it
    install_version: Callable[[Pins], str] | None = None  # the pinned version installed when it is unmet


BUILD_OVERRIDES: dict[str, Override] = {
    "torch": Override(
        "torch",
        "the XPU wheel is built as upstream builds it (docker/Dockerfile.xpu: requirements/xpu.txt's XPU torch, "
        "no build isolation, not [build-system]'s torch): setup.py adds no extension for VLLM_TARGET_DEVICE=xpu "
        "and imports torch only to read torch.version, so any torch builds the same wheel",
        install_version=lambda pins: pins.cpu_runtime.torch,
    ),
}
"""Canonical project name -> its reviewed replacement. vLLM 0.34.0's ``[build-system]`` asks
``torch == 2.14.0``: on an index without XPU or CPU builds that is the CUDA build with its nvidia
packages (about 3.5 GB) for a wheel that compiles nothing against torch. Upstream's XPU image does
not use it either (``uv pip install -r requirements/xpu.txt`` then ``setup.py bdist_wheel`` in that
environment). So any installed torch satisfies the build (an XPU machine's torch for XPU included);
where none is installed, the CPU runtime's pinned torch goes in (``[cpu_runtime].torch`` of
pins.toml, the machine's local CPU build here). The wheel's bytes do not depend on which torch is
installed: built with torch 2.14.0 (CUDA) and with 2.13.0+cpu the wheel is byte-identical
(docs/sessions.md, "The XPU wheel's build requirements")."""


@dataclass(frozen=True)
class BuildRequirement:
    declared: str  # as the tree's pyproject.toml writes it
    requirement: Requirement  # what is installed and checked (the override's, if any)
    override: Override | None = None


def read_build_requires(text: str, where: str) -> list[str]:
    """``[build-system].requires`` of a pyproject.toml's text; ``where`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ToolError(f"{where}: not TOML ({exc})") from None
    requires = data.get("build-system", {}).get("requires")
    if not isinstance(requires, list) or not requires or not all(isinstance(r, str) for r in requires):
        raise ToolError(f"{where}: no [build-system].requires list of requirement strings")
    return requires


def build_requirements(text: str, where: str, overrides: dict[str, Override] | None = None) -> list[BuildRequirement]:
    """The tree's build requirements parsed with packaging, each override applied."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    overrides = BUILD_OVERRIDES if overrides is None else overrides
    out = []
    for declared in read_build_requires(text, where):
        try:
            requirement = Requirement(declared)
        except InvalidRequirement as exc:
            raise ToolError(f"{where}: [build-system].requires {declared!r} is not a requirement ({exc})") from None
        override = overrides.get(canonicalize_name(requirement.name))
        if override is not None:
            replacement = Requirement(override.requirement)
            if canonicalize_name(replacement.name) != canonicalize_name(requirement.name):
                raise ToolError(f"build override {override.requirement!r} does not name {requirement.name}")
            requirement = replacement
        out.append(BuildRequirement(declared, requirement, override))
    return out


def unmet(requirements: Iterable[BuildRequirement], version: Callable[[str], str] = metadata.version) -> list[str]:
    """Each requirement the building interpreter does not satisfy, as pip's build-dependency check
    judges it (marker for this machine, installed version in the specifier, pre-releases allowed)."""
    problems = []
    for item in requirements:
        req = item.requirement
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(installed, prereleases=True):
            problems.append(f"{req} ({req.name} {installed} installed)")
    return problems


def rewrite_requires(text: str, requirements: Iterable[BuildRequirement], where: str) -> str:
    """The pyproject.toml text with each overridden requirement's string replaced by its override."""
    for item in requirements:
        if item.override is None:
            continue
        literals = [f'"{item.declared}"', f"'{item.declared}'"]
        count = sum(text.count(literal) for literal in literals)
        if count != 1:
            raise ToolError(f"{where}: cannot replace {item.declared!r} (written {count} times)")
        for literal in literals:
            text = text.replace(literal, f'"{item.override.requirement}"')
    return text


def install_spec(item: BuildRequirement) -> str:
    """What is installed for an unmet requirement: the requirement itself, or for an override that
    names a pinned version, that project at the version pins.toml gives (``install_version``)."""
    version = item.override.install_version if item.override is not None else None
    if version is None:
        return str(item.requirement)
    from scripts.pins import load_pins

    return f"{item.requirement.name}=={version(load_pins(Layout().pins))}"


def satisfy(requirements: list[BuildRequirement], where: str, install: Callable[..., None] | None = None) -> None:
    """Install the unmet ``requirements`` into this interpreter (pip's configuration), then refuse in
    one line if any is still unmet."""
    missing = unmet(requirements)
    if missing:
        if install is None:
            from scripts.wheels import install
        detail(f"build requirements to install: {', '.join(missing)}")
        install(*[install_spec(item) for item in requirements if unmet([item])])
        missing = unmet(requirements)
    if missing:
        raise ToolError(
            f"{where}: the building interpreter does not satisfy [build-system].requires: {'; '.join(missing)}"
        )


def ensure_build_requirements(pyproject: Path, install: Callable[..., None] | None = None) -> list[BuildRequirement]:
    """Make this interpreter satisfy ``pyproject``'s ``[build-system].requires`` (overrides applied and
    written into ``pyproject``, which must be the build's own copy): install what is missing or of the
    wrong version, then refuse in one line if anything is still unmet."""
    where = str(pyproject)
    text = pyproject.read_text(encoding="utf-8")
    requirements = build_requirements(text, where)
    for item in requirements:
        if item.override is not None:
            info(
                f"build requirement {item.declared!r} replaced by {item.override.requirement!r}: {item.override.reason}"
            )
    if any(item.override is not None for item in requirements):
        pyproject.write_text(rewrite_requires(text, requirements, where), encoding="utf-8")
    satisfy(requirements, where, install)
    return requirements


def pinned_pyproject_text(layout: Layout) -> tuple[str, str]:
    """The pinned sdist's pyproject.toml (text, where), for installing the build requirements before
    a work tree exists (the tests session). The series may edit the file (its plugin's entry point)
    but not its ``[build-system]`` table: the patched text is built in memory and compared."""
    import tarfile

    from scripts.pins import load_pins
    from scripts.series import load_series
    from scripts.source import fetch_sdist

    pins = load_pins(layout.pins)
    if (layout.overlay / "pyproject.toml").exists():
        raise ToolError("the overlay replaces pyproject.toml: run apply, then build")
    archive = fetch_sdist(pins.vllm)
    name = f"vllm-{pins.vllm.version}/pyproject.toml"
    with tarfile.open(archive) as tar:
        member = tar.extractfile(name)
        if member is None:
            raise ToolError(f"{archive.name} has no {name}")
        text = member.read().decode("utf-8")
    for patch in load_series(layout.patches):
        if "pyproject.toml" not in patch.files:
            continue
        patched = patched_text(text, patch.raw.decode("utf-8"), "pyproject.toml")
        if _build_system(patched) != _build_system(text):
            raise ToolError(f"{patch.name} changes pyproject.toml [build-system]: run apply, then build")
        text = patched
    return text, f"{archive.name}:{name} (+ the series)"


def _build_system(text: str) -> object:
    return tomllib.loads(text).get("build-system")


def patched_text(text: str, diff: str, path: str) -> str:
    """``text`` with the hunks ``diff`` holds for ``path`` applied strictly (every context and removed
    line must match; a mismatch is one ToolError line)."""
    from unidiff import PatchSet

    source = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for pfile in PatchSet(diff):
        if pfile.path != path:
            continue
        for hunk in pfile:
            start = max(hunk.source_start - 1, 0)
            out.extend(source[pos:start])
            pos = start
            for line in hunk:
                if line.is_added:
                    out.append(line.value)
                    continue
                if pos >= len(source) or source[pos] != line.value:
                    raise ToolError(f"{path}: the series' hunk at line {hunk.source_start} does not apply")
                if line.is_context:
                    out.append(source[pos])
                pos += 1
    return "".join(out + source[pos:])


def tree_pyproject_text(tree: Path) -> tuple[str, str]:
    """The work tree's committed pyproject.toml (text, where)."""
    from scripts.git import git

    return git(tree, "show", "HEAD:pyproject.toml"), f"{tree}:pyproject.toml"


def install_build_requirements(pinned: bool = False) -> None:
    """``python -m scripts build-deps``: install the work tree's (``--pinned``: the pinned sdist's)
    build requirements into this interpreter, overrides applied."""
    layout = Layout()
    if pinned:
        text, where = pinned_pyproject_text(layout)
    elif (layout.worktree / ".git").exists():
        text, where = tree_pyproject_text(layout.worktree)
    else:
        raise ToolError(f"no work tree at {layout.worktree}; run apply first (or build-deps --pinned)")
    requirements = build_requirements(text, where)
    satisfy(requirements, where)
    info(f"build requirements of {where} satisfied: {', '.join(str(i.requirement) for i in requirements)}")


__all__ = [
    "BUILD_OVERRIDES",
    "Override",
    "build_requirements",
    "ensure_build_requirements",
    "install_build_requirements",
    "satisfy",
    "unmet",
]
