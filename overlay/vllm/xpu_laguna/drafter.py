# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Which DFlash drafter a directory or hub reference holds, told by content.

The INT4-matched DFlash drafter of Laguna-S-2.1-INT4 and the BF16 target's
drafter have the same architecture, shapes and config (all BF16, no
quantization config): neither a name nor a config field tells them apart,
and a wrong one costs acceptance (the BF16 drafter accepted 0 of 8,449
proposals against the INT4 target in the reference lab), never exactness.
:func:`identify` answers ``matched``, ``bf16`` or ``unknown`` from what the
series pins (``pins.toml`` ``[models.draft]`` and the optional
``[models.draft_bf16]``, carried into the wheel by its provenance record):

* a content fingerprint of the weights (:func:`fingerprint`), when the pins
  record one;
* the revision of a hub cache snapshot: the directory, symlinks resolved,
  is ``.../snapshots/<40-hex revision>``, and every file in it is either
  its own or a symlink into that repo's ``blobs/`` (a file linked elsewhere
  is not vouched for by the snapshot's name);
* for a hub repo id (not a local directory), the revision asked for.

Names play no part. The configuration contract and the serving doctor both
call :func:`identify`; ``python -m vllm.xpu_laguna.drafter DIR`` prints a
directory's identity and the ``fingerprint = "..."`` line to record in
``pins.toml``. Standard library only (the doctor runs without the engine).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

MATCHED, BF16, UNKNOWN = "matched", "bf16", "unknown"
FINGERPRINT_SCHEME = b"xpu-laguna-drafter-fingerprint-v1"
"""Versions :func:`fingerprint`; a change of the scheme changes every value."""
SAMPLE_BYTES = 4096
"""Bytes hashed at the start and at the end of every tensor."""
MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
_REVISION = re.compile(r"[0-9a-f]{40}")


@dataclasses.dataclass(frozen=True)
class Pinned:
    """One drafter as the pins name it (empty strings: not recorded)."""

    repo: str = ""
    revision: str = ""
    fingerprint: str = ""


@dataclasses.dataclass(frozen=True)
class KnownDrafters:
    matched: Pinned
    bf16: Pinned
    source: str
    """Where the pins came from, for messages."""

    @classmethod
    def from_pins(
        cls, pins: Mapping[str, Any] | None, source: str = "the pins"
    ) -> KnownDrafters:
        """From the ``pins`` of a provenance record (``Pins.as_dict()`` of the
        series' tooling: ``draft`` and the optional ``draft_bf16`` tables)."""

        def pinned(table: Any) -> Pinned:
            table = table if isinstance(table, Mapping) else {}
            return Pinned(
                **{
                    f.name: str(table.get(f.name) or "")
                    for f in dataclasses.fields(Pinned)
                }
            )

        pins = pins or {}
        return cls(pinned(pins.get("draft")), pinned(pins.get("draft_bf16")), source)

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> KnownDrafters:
        """From a provenance record (none: every drafter is ``unknown``)."""
        if record is None:
            return cls.from_pins(None, "no provenance record")
        return cls.from_pins(record.get("pins"), "this build's pins")


def known_drafters() -> KnownDrafters:
    """The drafters this installation's provenance record pins."""
    from vllm.xpu_laguna import provenance

    return KnownDrafters.from_record(provenance.load())


@dataclasses.dataclass(frozen=True)
class Identity:
    kind: str
    """:data:`MATCHED`, :data:`BF16` or :data:`UNKNOWN`."""
    evidence: str
    """What decided it, in words."""


# ------------------------------------------------------------- evidence


def _tensor_ranges(header: Any, data_size: int) -> list[tuple[int, int]] | None:
    if not isinstance(header, dict):
        return None
    ranges = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            return None
        ranges.append((offsets[0], offsets[1]))
    return sorted(ranges)


def _safetensors_digest(path: Path) -> bytes | None:
    """sha256 over the file size, the whole header, and the first and last
    :data:`SAMPLE_BYTES` of every tensor (all of a tensor up to twice that);
    None when the file is not a readable safetensors file."""
    try:
        with open(path, "rb") as fh:
            return _sampled_digest(fh, os.fstat(fh.fileno()).st_size)
    except OSError:
        return None


def _sampled_digest(fh: BinaryIO, size: int) -> bytes | None:
    raw = fh.read(8)
    if len(raw) < 8:
        return None
    (length,) = struct.unpack("<Q", raw)
    if length > min(size - 8, MAX_HEADER_BYTES):
        return None
    header_bytes = fh.read(length)
    try:
        header = json.loads(header_bytes)
    except ValueError:
        return None
    start = 8 + length
    ranges = _tensor_ranges(header, size - start)
    if ranges is None:
        return None
    digest = hashlib.sha256(struct.pack("<Q", size) + header_bytes)
    for begin, end in ranges:
        if end - begin <= 2 * SAMPLE_BYTES:
            spans = [(begin, end)]
        else:
            spans = [(begin, begin + SAMPLE_BYTES), (end - SAMPLE_BYTES, end)]
        for lo, hi in spans:
            fh.seek(start + lo)
            digest.update(fh.read(hi - lo))
    return digest.digest()


def fingerprint(directory: Path) -> str | None:
    """A content fingerprint of the drafter's weights: sha256 of
    :data:`FINGERPRINT_SCHEME` and the sorted digests of its ``*.safetensors``
    files (:func:`_safetensors_digest`; file names and config.json take no
    part). None without readable safetensors files.

    Cost: the headers plus at most ``2 * SAMPLE_BYTES`` a tensor (about
    0.6 MiB for a 69-tensor drafter), never the GBs of weights. Safe enough:
    two trainings differ in nearly every value of every trained tensor, so
    in its sampled bytes too; a collision needs files that agree in size,
    header and each tensor's head and tail, which neither a download, a copy
    nor a truncation produces. It is not a defence against forged files (a
    false match costs acceptance, never exactness)."""
    files = sorted(p for p in Path(directory).glob("*.safetensors") if p.is_file())
    digests = []
    for path in files:
        digest = _safetensors_digest(path)
        if digest is None:
            return None
        digests.append(digest)
    if not digests:
        return None
    return hashlib.sha256(FINGERPRINT_SCHEME + b"".join(sorted(digests))).hexdigest()


def snapshot_revision(directory: Path) -> str | None:
    """The revision a hub cache snapshot vouches for: the directory, symlinks
    resolved, is ``<repo>/snapshots/<revision>``, and each of its files is
    its own or a symlink into ``<repo>/blobs/`` (the cache names a blob by
    the file's digest: sha256 for LFS files, the git blob id otherwise)."""
    real = Path(directory).resolve()
    if real.parent.name != "snapshots" or not _REVISION.fullmatch(real.name):
        return None
    blobs = (real.parent.parent / "blobs").resolve()
    try:
        foreign = [
            e for e in real.iterdir() if e.is_symlink() and e.resolve().parent != blobs
        ]
    except OSError:
        return None
    return None if foreign else real.name


# ------------------------------------------------------------- identity


def _unknown(told: str, known: KnownDrafters) -> Identity:
    if not (known.matched.revision or known.matched.fingerprint):
        return Identity(
            UNKNOWN, f"{told}; no pinned drafter to compare ({known.source})"
        )
    return Identity(UNKNOWN, f"{told}; not a drafter {known.source} name")


def identify_directory(directory: Path, known: KnownDrafters) -> Identity:
    """A local drafter directory: its content fingerprint first, then the
    hub snapshot it is (a fingerprint that contradicts the snapshot's pinned
    revision makes it ``unknown``)."""
    pinned_fingerprints = known.matched.fingerprint or known.bf16.fingerprint
    found = fingerprint(directory) if pinned_fingerprints else None
    if found:
        for kind, pin in ((BF16, known.bf16), (MATCHED, known.matched)):
            if found == pin.fingerprint:
                return Identity(kind, f"content fingerprint {found[:12]}")
    revision = snapshot_revision(directory)
    if revision is not None and revision == known.bf16.revision:
        return Identity(BF16, f"hub snapshot {revision[:12]}")
    if revision is not None and revision == known.matched.revision:
        if known.matched.fingerprint and found != known.matched.fingerprint:
            return Identity(
                UNKNOWN,
                f"hub snapshot {revision[:12]} whose files are not the pinned "
                f"content (fingerprint {str(found)[:12]})",
            )
        return Identity(MATCHED, f"hub snapshot {revision[:12]}")
    told = f"hub snapshot {revision[:12]}" if revision else "not a hub snapshot"
    if pinned_fingerprints:
        told += f", fingerprint {str(found)[:12]}"
    return _unknown(told, known)


def identify_repo(revision: str | None, known: KnownDrafters) -> Identity:
    """A hub repo id, by the revision asked for (a branch such as the
    default ``main`` moves, so it identifies nothing)."""
    if revision and revision == known.bf16.revision:
        return Identity(BF16, f"revision {revision[:12]}")
    if revision and revision == known.matched.revision:
        return Identity(MATCHED, f"revision {revision[:12]}")
    asked = f"revision {revision}" if revision else "no revision (the default branch)"
    return _unknown(asked, known)


def identify(
    reference: str | os.PathLike[str], revision: str | None, known: KnownDrafters
) -> Identity:
    """A drafter as vLLM is given it: a local directory, or a hub repo id
    with the revision asked for."""
    path = Path(reference)
    if path.is_dir():
        return identify_directory(path, known)
    return identify_repo(revision, known)


def pinned_drafter(known: KnownDrafters) -> str:
    """The matched drafter as the pins name it, for messages."""
    pin = known.matched
    if not pin.repo:
        return "the INT4-matched DFlash drafter"
    return f"{pin.repo} at revision {pin.revision[:12]}"


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print("usage: python -m vllm.xpu_laguna.drafter DIR", file=sys.stderr)
        sys.exit(2)
    directory = Path(sys.argv[1])
    identity = identify_directory(directory, known_drafters())
    print(f"{identity.kind}: {identity.evidence}")
    print(f'fingerprint = "{fingerprint(directory) or ""}"')
