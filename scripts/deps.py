"""The tooling's requirements: ``[dependency-groups]`` of the repository's pyproject.toml (PEP 735).

Each requirement is declared once, there. noxfile.py installs the groups through
``nox.project.dependency_groups``; what runs outside a nox session's install (the CPU runtime's
tools, :mod:`scripts.cpu_venv`) resolves them here. Standard library only.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from scripts import REPO_ROOT
from scripts.errors import ToolError

PYPROJECT = REPO_ROOT / "pyproject.toml"


def _normalized(name: str) -> str:
    """PEP 735 group names compare like package names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_groups(pyproject: Path = PYPROJECT) -> dict[str, list[object]]:
    """The ``[dependency-groups]`` table, keyed by normalized group name."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ToolError(f"{pyproject}: cannot read the dependency groups ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ToolError(f"{pyproject}: not valid TOML: {exc}") from None
    table = data.get("dependency-groups")
    if not isinstance(table, dict):
        raise ToolError(f"{pyproject}: no [dependency-groups] table")
    groups: dict[str, list[object]] = {}
    for name, items in table.items():
        key = _normalized(name)
        if key in groups:
            raise ToolError(f"{pyproject}: dependency group {name!r} is declared twice (names are normalized)")
        if not isinstance(items, list):
            raise ToolError(f"{pyproject}: dependency group {name!r} must be a list")
        groups[key] = items
    return groups


def dependency_group(name: str, pyproject: Path = PYPROJECT) -> tuple[str, ...]:
    """The requirements of group ``name`` with every ``{include-group = ...}`` resolved in place,
    in order, each once."""
    groups = dependency_groups(pyproject)
    out: list[str] = []

    def visit(group: str, chain: tuple[str, ...]) -> None:
        key = _normalized(group)
        if key in chain:
            raise ToolError(f"{pyproject.name}: dependency group {group!r} includes itself ({' -> '.join(chain)})")
        if key not in groups:
            raise ToolError(f"{pyproject.name}: no dependency group {group!r} (there are: {', '.join(sorted(groups))})")
        for item in groups[key]:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, dict) and set(item) == {"include-group"} and isinstance(item["include-group"], str):
                visit(item["include-group"], (*chain, key))
            else:
                raise ToolError(f"{pyproject.name}: dependency group {group!r} has an invalid item {item!r}")

    visit(name, ())
    return tuple(dict.fromkeys(out))


__all__ = ["PYPROJECT", "dependency_group", "dependency_groups"]
