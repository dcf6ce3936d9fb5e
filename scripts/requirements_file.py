"""A pip requirements file read the way pip reads it: requirement lines through ``packaging``, option
lines in every form pip accepts (``--extra-index-url URL``, ``--extra-index-url=URL``, ``-i URL``,
``-iURL``, ``--find-links``/``-f``, ``-r``/``-c`` includes), comments and line continuations.

Anything pip would read differently from what this reader can say is refused in one line naming the
file, the line number and the line (:class:`~scripts.errors.ToolError`)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scripts.errors import ToolError

if TYPE_CHECKING:  # packaging is imported where it is used (this module imports without it)
    from packaging.requirements import Requirement

_COMMENT = re.compile(r"(^|\s+)#.*$")  # pip's COMMENT_RE

# option -> (key it fills, takes a value); pip's requirements-file options (pip/_internal/req/req_file.py)
_OPTIONS: dict[str, tuple[str, bool]] = {
    "-i": ("index_url", True),
    "--index-url": ("index_url", True),
    "--extra-index-url": ("extra_index_urls", True),
    "--no-index": ("no_index", False),
    "-f": ("find_links", True),
    "--find-links": ("find_links", True),
    "-r": ("requirement_files", True),
    "--requirement": ("requirement_files", True),
    "-c": ("constraint_files", True),
    "--constraint": ("constraint_files", True),
    "-e": ("editables", True),
    "--editable": ("editables", True),
    "--trusted-host": ("trusted_hosts", True),
    "--pre": ("flags", False),
    "--prefer-binary": ("flags", False),
    "--require-hashes": ("flags", False),
    "--no-binary": ("flags", True),
    "--only-binary": ("flags", True),
    "--use-feature": ("flags", True),
}
# options pip accepts after a requirement on its line
_PER_REQUIREMENT = ("--hash", "--config-settings", "--global-option", "--install-option")


@dataclass(frozen=True)
class Line:
    """One requirement: where it is written and what packaging makes of it."""

    number: int  # 1-based number of the (first) physical line
    text: str  # the logical line, comment and continuations removed
    requirement: Requirement

    @property
    def name(self) -> str:
        from packaging.utils import canonicalize_name

        return canonicalize_name(self.requirement.name)


@dataclass
class RequirementsFile:
    path: str
    requirements: list[Line] = field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    requirement_files: list[str] = field(default_factory=list)  # -r: noted, not followed
    constraint_files: list[str] = field(default_factory=list)  # -c: noted, not followed
    editables: list[str] = field(default_factory=list)
    trusted_hosts: list[str] = field(default_factory=list)
    no_index: bool = False
    flags: list[str] = field(default_factory=list)

    def named(self, name: str) -> list[Line]:
        """The requirement lines of project ``name`` (compared canonically: ``vllm-xpu-kernels`` is
        ``vllm_xpu_kernels``)."""
        from packaging.utils import canonicalize_name

        wanted = canonicalize_name(name)
        return [line for line in self.requirements if line.name == wanted]

    @property
    def indexes(self) -> list[str]:
        """Every index this file names: ``--index-url`` first, then the extra ones, in file order."""
        return ([self.index_url] if self.index_url else []) + self.extra_index_urls


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, line) with continuations joined and comments removed, as pip
    does (a trailing backslash joins the next line; a comment line never continues)."""
    out: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not parts:
            start = number
        if raw.endswith("\\") and not _COMMENT.match(raw):
            parts.append(raw[:-1])
            continue
        if parts and _COMMENT.match(raw):
            raw = ""  # pip: a comment ends the continued line
        parts.append(raw)
        line = _COMMENT.sub("", "".join(parts)).strip()
        parts = []
        if line:
            out.append((start, line))
    if parts:
        line = _COMMENT.sub("", "".join(parts)).strip()
        if line:
            out.append((start, line))
    return out


def _fail(path: str, number: int, line: str, why: str) -> ToolError:
    return ToolError(f"{path}:{number}: {why}: {line!r}")


def _options(parsed: RequirementsFile, number: int, line: str) -> None:
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise _fail(parsed.path, number, line, f"cannot split the options ({exc})") from None
    position = 0
    while position < len(tokens):
        token = tokens[position]
        position += 1
        if token.startswith("--"):
            name, has_value, value = token.partition("=")
        elif token.startswith("-") and len(token) >= 2:
            name, value = token[:2], token[2:]
            has_value = "=" if value else ""
        else:
            raise _fail(parsed.path, number, line, f"{token!r} is neither an option nor on a requirement line")
        if name not in _OPTIONS:
            raise _fail(parsed.path, number, line, f"option {name} is not one this reader knows")
        key, takes_value = _OPTIONS[name]
        if takes_value and not has_value:
            if position >= len(tokens):
                raise _fail(parsed.path, number, line, f"option {name} lacks its value")
            value = tokens[position]
            position += 1
        elif not takes_value and has_value:
            raise _fail(parsed.path, number, line, f"option {name} takes no value")
        if key == "index_url":
            parsed.index_url = value
        elif key == "no_index":
            parsed.no_index = True
        elif key == "flags":
            parsed.flags.append(f"{name}={value}" if takes_value else name)
        else:
            getattr(parsed, key).append(value)


def _requirement(parsed: RequirementsFile, number: int, line: str) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    # pip splits the requirement from its per-requirement options at the first word starting with "-"
    words = line.split(" ")
    cut = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
    text, options = " ".join(words[:cut]).strip(), words[cut:]
    for option in options:
        if option and not option.startswith(_PER_REQUIREMENT):
            raise _fail(parsed.path, number, line, f"option {option.split('=')[0]} cannot follow a requirement")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        why = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise _fail(parsed.path, number, line, f"not a requirement packaging can read ({why})") from None
    parsed.requirements.append(Line(number, text, requirement))


def read_requirements(text: str, path: str = "requirements.txt") -> RequirementsFile:
    """Read a requirements file's text; ``path`` names it in errors."""
    parsed = RequirementsFile(path)
    for number, line in logical_lines(text):
        if line.startswith("-"):
            _options(parsed, number, line)
        else:
            _requirement(parsed, number, line)
    return parsed


__all__ = ["Line", "RequirementsFile", "logical_lines", "read_requirements"]
