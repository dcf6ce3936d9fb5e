# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Fake DFlash drafter folders for the drafter-identity tests: a config.json
and a small hand-written safetensors file (no real weights), laid out as a
plain copy or as a hub cache snapshot (``models--owner--name/snapshots/<rev>``
whose files are symlinks into ``blobs/``, the blob named by the file's sha256
for LFS files and its git blob id otherwise, as huggingface_hub writes it).

:data:`CASES` is the one table that the contract and the doctor are both run
through (tests/xpu_laguna/test_contract.py); each case names its folder,
which pins are known, and the identity expected, written out by hand.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from collections.abc import Callable
from pathlib import Path

MATCHED_REPO = "poolside/Laguna-S-2.1-DFlash-INT4"
MATCHED_REV = "5e07c246915c86dc6920fead03d019989224f2ba"
BF16_REPO = "poolside/Laguna-S-2.1-DFlash"  # neither is on record: test values
BF16_REV = "0123456789abcdef0123456789abcdef01234567"
MATCHED_SEED, BF16_SEED, OTHER_SEED = 1, 2, 3
TENSORS = (
    ("fc.weight", 12 * 1024),
    ("layers.0.mlp.down_proj.weight", 20 * 1024),
    ("norm.weight", 256),
)
"""Names and byte sizes: two larger than two samples, one smaller."""


def tensor_bytes(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {name: rng.randbytes(size) for name, size in TENSORS}


def safetensors_bytes(tensors: dict[str, bytes]) -> bytes:
    """The safetensors layout: 8-byte little-endian header length, a JSON
    header of BF16 tensors with their data offsets, the data."""
    header, offset = {}, 0
    for name, data in tensors.items():
        header[name] = {
            "dtype": "BF16",
            "shape": [len(data) // 2],
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"".join(tensors.values())


def plain_drafter(path: Path, config: dict, seed: int) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(safetensors_bytes(tensor_bytes(seed)))
    return path


def hub_snapshot(
    cache: Path, repo: str, revision: str, config: dict, seed: int
) -> Path:
    """``cache/models--owner--name/snapshots/<revision>`` with its files as
    relative symlinks into ``blobs/``."""
    root = cache / ("models--" + repo.replace("/", "--"))
    blobs, snap = root / "blobs", root / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    text = json.dumps(config).encode()
    weights = safetensors_bytes(tensor_bytes(seed))
    git_id = hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest()
    for name, blob, data in (
        ("config.json", git_id, text),
        ("model.safetensors", hashlib.sha256(weights).hexdigest(), weights),
    ):
        (blobs / blob).write_bytes(data)
        (snap / name).symlink_to(Path("../../blobs") / blob)
    return snap


# ----------------------------------------------------------------- layouts


def _matched_snapshot(root: Path, config: dict) -> Path:
    return hub_snapshot(root / "hub", MATCHED_REPO, MATCHED_REV, config, MATCHED_SEED)


def _current_symlink(root: Path, config: dict) -> Path:
    link = root / "models" / "current"
    link.parent.mkdir(parents=True)
    link.symlink_to(_matched_snapshot(root, config), target_is_directory=True)
    return link


def _renamed_copy(root: Path, config: dict) -> Path:
    return plain_drafter(root / "models" / "my-drafter", config, MATCHED_SEED)


def _bf16_named_int4(root: Path, config: dict) -> Path:
    return plain_drafter(
        root / "models" / "Laguna-S-2.1-DFlash-INT4", config, BF16_SEED
    )


def _bf16_under_int4_target_folder(root: Path, config: dict) -> Path:
    path = root / "models" / "Laguna-S-2.1-INT4" / "dflash-bf16"
    return plain_drafter(path, config, BF16_SEED)


def _int4_named_folder_linking_bf16(root: Path, config: dict) -> Path:
    """A folder named like the matched drafter whose weights are a symlink
    to the BF16 drafter's file."""
    bf16 = plain_drafter(root / "elsewhere" / "bf16", config, BF16_SEED)
    path = root / "models" / "Laguna-S-2.1-DFlash-INT4"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").symlink_to(bf16 / "model.safetensors")
    return path


def _matched_snapshot_linking_bf16(root: Path, config: dict) -> Path:
    """A snapshot of the matched revision whose weights link out of its
    blobs/ to the BF16 drafter's file."""
    snap = _matched_snapshot(root, config)
    bf16 = plain_drafter(root / "elsewhere" / "bf16", config, BF16_SEED)
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to(bf16 / "model.safetensors")
    return snap


def _bf16_snapshot(root: Path, config: dict) -> Path:
    return hub_snapshot(root / "hub", BF16_REPO, BF16_REV, config, BF16_SEED)


def _other_named_int4(root: Path, config: dict) -> Path:
    return plain_drafter(root / "models" / "Other-DFlash-INT4", config, OTHER_SEED)


# -------------------------------------------------------------------- pins


def fingerprint_of(seed: int, tmp: Path) -> str:
    """The fingerprint of the fake weights of ``seed``, as the module prints
    it (an input of the table, the expected identities are written out)."""
    from vllm.xpu_laguna.drafter import fingerprint

    path = tmp / f"fingerprint-{seed}"
    return fingerprint(path if path.is_dir() else plain_drafter(path, {}, seed))


def record(pins: str, tmp: Path) -> dict | None:
    """A provenance record's pins: ``revisions`` (what pins.toml holds
    today plus a BF16 revision), ``fingerprints`` (both drafters' weights
    recorded too), ``none`` (no record: a build without provenance)."""
    if pins == "none":
        return None
    draft = {"kind": "dflash", "repo": MATCHED_REPO, "revision": MATCHED_REV}
    bf16 = {"repo": BF16_REPO, "revision": BF16_REV}
    if pins == "fingerprints":
        draft["fingerprint"] = fingerprint_of(MATCHED_SEED, tmp)
        bf16["fingerprint"] = fingerprint_of(BF16_SEED, tmp)
    return {"pins": {"draft": draft, "draft_bf16": bf16}}


Layout = Callable[[Path, dict], Path]
CASES: list[tuple[str, Layout, str, str]] = [
    ("matched-snapshot", _matched_snapshot, "revisions", "matched"),
    ("matched-snapshot-fingerprinted", _matched_snapshot, "fingerprints", "matched"),
    ("current-symlink-to-matched-snapshot", _current_symlink, "revisions", "matched"),
    ("renamed-matched-copy", _renamed_copy, "fingerprints", "matched"),
    ("renamed-matched-copy-no-fingerprint", _renamed_copy, "revisions", "unknown"),
    ("bf16-copy-named-int4", _bf16_named_int4, "fingerprints", "bf16"),
    (
        "bf16-under-int4-target-folder",
        _bf16_under_int4_target_folder,
        "fingerprints",
        "bf16",
    ),
    (
        "int4-named-folder-linking-bf16",
        _int4_named_folder_linking_bf16,
        "fingerprints",
        "bf16",
    ),
    (
        "int4-named-folder-linking-bf16-no-fingerprint",
        _int4_named_folder_linking_bf16,
        "revisions",
        "unknown",
    ),
    (
        "matched-snapshot-linking-bf16",
        _matched_snapshot_linking_bf16,
        "fingerprints",
        "bf16",
    ),
    (
        "matched-snapshot-linking-bf16-no-fingerprint",
        _matched_snapshot_linking_bf16,
        "revisions",
        "unknown",
    ),
    ("bf16-snapshot", _bf16_snapshot, "revisions", "bf16"),
    ("other-drafter-named-int4", _other_named_int4, "fingerprints", "unknown"),
    ("matched-snapshot-no-record", _matched_snapshot, "none", "unknown"),
]
