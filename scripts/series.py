"""The patch series: ``patches/series`` plus one git-format patch per change."""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from scripts.errors import ToolError
from scripts.typed_data import read_text

HEADER_FIELDS = ("Why", "Upstream-Status", "Drop-When", "Effect-Check")
REQUIRED_FIELDS = ("Why", "Upstream-Status", "Drop-When")
_NAME = re.compile(r"^[0-9]{4}-[A-Za-z0-9._-]+\.patch$")
_FIELD = re.compile(r"^([A-Z][A-Za-z-]*):\s?(.*)$")


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    author: str
    date: str
    subject: str
    body: str
    fields: dict[str, str] = field(default_factory=dict)
    raw: bytes = b""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def files(self) -> list[str]:
        return sorted({f.path for f in parse_diff(self)})


def read_series(patches_dir: Path) -> list[str]:
    """Names listed in ``patches/series`` (comments and blank lines skipped), validated."""
    series = patches_dir / "series"
    if not series.exists():
        raise ToolError(f"{series}: missing series file")
    names: list[str] = []
    for number, line in enumerate(read_text(series, "series file").splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if not _NAME.match(entry) or "/" in entry:
            raise ToolError(f"{series}:{number}: malformed entry {entry!r} (expected NNNN-name.patch)")
        if entry in names:
            raise ToolError(f"{series}:{number}: {entry} is listed twice")
        names.append(entry)
    return names


def parse_fields(body: str) -> dict[str, str]:
    """Header fields (``Key: value`` with one-space continuation lines) from a commit message body."""
    out: dict[str, str] = {}
    current: str | None = None
    for line in body.splitlines():
        match = _FIELD.match(line)
        if match and match.group(1) in HEADER_FIELDS:
            current = match.group(1)
            out[current] = match.group(2).strip()
        elif current and line.startswith(" ") and line.strip():
            out[current] = (out[current] + " " + line.strip()).strip()
        else:
            current = None
    return out


def load_patch(path: Path) -> Patch:
    raw = path.read_bytes()
    text = raw.decode("utf-8", "replace")
    if not text.startswith("From ") or "\ndiff --git " not in text:
        raise ToolError(f"{path.name}: not a git format-patch file (no 'From ' line or no diff)")
    head, sep, _ = text.partition("\n---\n")
    if not sep:
        head = text.split("\ndiff --git ", 1)[0]
    message = email.parser.Parser(policy=email.policy.compat32).parsestr(head.split("\n", 1)[1])
    subject = " ".join((message.get("Subject") or "").split())
    if not subject:
        raise ToolError(f"{path.name}: missing Subject")
    body = message.get_payload()
    if not isinstance(body, str):
        raise ToolError(f"{path.name}: unexpected multipart patch")
    return Patch(
        name=path.name,
        path=path,
        author=message.get("From") or "",
        date=message.get("Date") or "",
        subject=subject,
        body=body,
        fields=parse_fields(body),
        raw=raw,
    )


def load_series(patches_dir: Path) -> list[Patch]:
    patches = []
    for name in read_series(patches_dir):
        path = patches_dir / name
        if not path.exists():
            raise ToolError(f"{patches_dir / 'series'}: lists {name}, which does not exist")
        if not path.is_file():
            raise ToolError(f"{patches_dir / 'series'}: lists {name}, which is not a file")
        patches.append(load_patch(path))
    return patches


def parse_diff(patch: Patch) -> PatchSet:
    try:
        return PatchSet(patch.raw.decode("utf-8"))
    except (UnidiffParseError, UnicodeDecodeError) as exc:
        raise ToolError(f"{patch.name}: malformed diff ({exc})") from None


def safe_relpath(path: str, where: str) -> str:
    """Reject absolute paths, ``..``, backslashes and git internals; return the normalised path."""
    pure = PurePosixPath(path)
    if (
        not path
        or pure.is_absolute()
        or "\\" in path
        or ".." in pure.parts
        or pure.parts[0] in (".git",)
        or any(part in ("", ".") for part in path.split("/"))
    ):
        raise ToolError(f"{where}: unsafe path {path!r}")
    return str(pure)
