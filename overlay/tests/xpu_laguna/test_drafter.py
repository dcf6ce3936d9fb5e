# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The drafter identity (vllm/xpu_laguna/drafter.py) on fake drafter folders
(drafter_testlib: a config.json and a hand-written safetensors file): the
fingerprint's scheme, recomputed here independently, what it sees and what it
reads; hub snapshots and their blobs; the repo id form. The contract and the
doctor are run through one table in test_contract.py."""

import hashlib
import io
import json
import struct

import pytest
from drafter_testlib import (
    BF16_REV,
    BF16_SEED,
    MATCHED_REPO,
    MATCHED_REV,
    MATCHED_SEED,
    hub_snapshot,
    plain_drafter,
    record,
    safetensors_bytes,
    tensor_bytes,
)

from vllm.xpu_laguna import drafter


def _expected_fingerprint(*files: bytes) -> str:
    """The scheme written out: per file sha256(size, header, each tensor's
    first and last 4096 bytes in data order, or all of a tensor of at most
    8192); the sorted file digests under the scheme tag."""
    digests = []
    for data in files:
        (n,) = struct.unpack("<Q", data[:8])
        header, body = data[8 : 8 + n], data[8 + n :]
        h = hashlib.sha256(len(data).to_bytes(8, "little") + header)
        spans = sorted(v["data_offsets"] for v in json.loads(header).values())
        for lo, hi in spans:
            tensor = body[lo:hi]
            h.update(tensor if len(tensor) <= 8192 else tensor[:4096] + tensor[-4096:])
        digests.append(h.digest())
    tag = b"xpu-laguna-drafter-fingerprint-v1"
    return hashlib.sha256(tag + b"".join(sorted(digests))).hexdigest()


def test_fingerprint_follows_the_scheme(tmp_path):
    folder = plain_drafter(tmp_path / "d", {}, MATCHED_SEED)
    data = (folder / "model.safetensors").read_bytes()
    assert drafter.fingerprint(folder) == _expected_fingerprint(data)
    # two shards: order and names take no part
    other = safetensors_bytes(tensor_bytes(BF16_SEED))
    (folder / "model-2.safetensors").write_bytes(other)
    assert drafter.fingerprint(folder) == _expected_fingerprint(other, data)


def test_fingerprint_sees_content_not_names(tmp_path):
    folder = plain_drafter(tmp_path / "d", {"a": 1}, MATCHED_SEED)
    before = drafter.fingerprint(folder)
    (folder / "config.json").write_text(json.dumps({"a": 2}))
    (folder / "model.safetensors").rename(folder / "renamed.safetensors")
    assert drafter.fingerprint(folder) == before
    weights = folder / "renamed.safetensors"
    data = bytearray(weights.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    first_large = 8 + n  # fc.weight, 12 KiB: bytes 4096..8191 are not sampled
    data[first_large + 5000] ^= 1
    weights.write_bytes(bytes(data))
    assert drafter.fingerprint(folder) == before  # the sampling's limit
    data[first_large + 10] ^= 1
    weights.write_bytes(bytes(data))
    assert drafter.fingerprint(folder) != before


def test_fingerprint_reads_samples_not_weights(tmp_path, monkeypatch):
    """A 64 MiB tensor (a sparse file): the header and 2 x 4096 bytes a
    tensor are read, never the tensor."""
    size = 64 * 1024 * 1024
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [size // 2], "data_offsets": [0, size]}}
    ).encode()
    folder = tmp_path / "big"
    folder.mkdir()
    path = folder / "model.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + size)
    read = []

    class Counting(io.FileIO):
        def read(self, n=-1):
            data = super().read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(drafter, "open", Counting, raising=False)
    assert drafter.fingerprint(folder)
    assert sum(read) == 8 + len(header) + 2 * 4096


@pytest.mark.parametrize(
    "data",
    [
        b"",
        struct.pack("<Q", 1 << 40) + b"{}",
        struct.pack("<Q", 2) + b"{x",
        struct.pack("<Q", 2) + b"[]",
        struct.pack("<Q", 46) + b'{"w": {"data_offsets": [0, 99], "dtype": "BF16"}}',
    ],
    ids=["empty", "header-too-long", "not-json", "not-an-object", "past-the-end"],
)
def test_a_malformed_weight_file_has_no_fingerprint(tmp_path, data):
    (tmp_path / "model.safetensors").write_bytes(data)
    assert drafter.fingerprint(tmp_path) is None
    assert drafter.fingerprint(tmp_path / "missing") is None


def test_a_snapshot_vouches_only_for_files_in_its_blobs(tmp_path):
    snap = hub_snapshot(tmp_path / "hub", MATCHED_REPO, MATCHED_REV, {}, MATCHED_SEED)
    assert drafter.snapshot_revision(snap) == MATCHED_REV
    # the blob of an LFS file is named by the file's sha256
    weights = snap / "model.safetensors"
    assert weights.resolve().name == hashlib.sha256(weights.read_bytes()).hexdigest()
    # a file linked to another repo's blob is not this snapshot's
    other = hub_snapshot(tmp_path / "hub", "poolside/x", BF16_REV, {}, BF16_SEED)
    weights.unlink()
    weights.symlink_to((other / "model.safetensors").resolve())
    assert drafter.snapshot_revision(snap) is None
    # a snapshot folder of another name, and a plain folder, name no revision
    short = snap.parent / MATCHED_REV[:12]
    short.mkdir()
    assert drafter.snapshot_revision(short) is None
    assert drafter.snapshot_revision(plain_drafter(tmp_path / "p", {}, 1)) is None


@pytest.mark.parametrize(
    "revision, kind",
    [
        (MATCHED_REV, "matched"),
        (BF16_REV, "bf16"),
        (None, "unknown"),
        ("main", "unknown"),
    ],
)
def test_a_repo_id_is_told_by_its_revision(tmp_path, revision, kind):
    known = drafter.KnownDrafters.from_record(record("revisions", tmp_path))
    assert drafter.identify(MATCHED_REPO, revision, known).kind == kind


def test_without_pins_every_drafter_is_unknown(tmp_path):
    snap = hub_snapshot(tmp_path / "hub", MATCHED_REPO, MATCHED_REV, {}, MATCHED_SEED)
    known = drafter.KnownDrafters.from_record(None)
    assert drafter.identify(snap, None, known) == drafter.Identity(
        "unknown",
        "hub snapshot 5e07c246915c; no pinned drafter to compare (no provenance "
        "record)",
    )
    assert drafter.identify(MATCHED_REPO, MATCHED_REV, known).kind == "unknown"


def test_a_pinned_revision_whose_files_are_not_the_pinned_content(tmp_path):
    """The fingerprint, when pinned, outranks the snapshot's name."""
    snap = hub_snapshot(tmp_path / "hub", MATCHED_REPO, MATCHED_REV, {}, 3)
    known = drafter.KnownDrafters.from_record(record("fingerprints", tmp_path))
    identity = drafter.identify(snap, None, known)
    assert identity.kind == "unknown"
    assert identity.evidence.startswith(
        "hub snapshot 5e07c246915c whose files are not the pinned content"
    )


def test_known_drafters_read_the_records_pins(tmp_path):
    known = drafter.KnownDrafters.from_record(record("fingerprints", tmp_path))
    assert known.matched.revision == MATCHED_REV
    assert known.bf16.revision == BF16_REV
    assert len(known.matched.fingerprint) == len(known.bf16.fingerprint) == 64
    assert known.source == "this build's pins"
    only_draft = drafter.KnownDrafters.from_pins({"draft": {"revision": MATCHED_REV}})
    assert only_draft.bf16 == drafter.Pinned()


def test_the_cli_prints_the_identity_and_the_pins_line(tmp_path, monkeypatch, capsys):
    import runpy
    import sys

    from vllm.xpu_laguna import provenance as xpu_laguna_provenance

    folder = plain_drafter(tmp_path / "d", {}, MATCHED_SEED)
    monkeypatch.setattr(xpu_laguna_provenance, "load", lambda: None)
    monkeypatch.setattr(sys, "argv", ["x", str(folder)])
    monkeypatch.delitem(sys.modules, "vllm.xpu_laguna.drafter")  # run it afresh
    runpy.run_module("vllm.xpu_laguna.drafter", run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    data = (folder / "model.safetensors").read_bytes()
    assert out == [
        "unknown: not a hub snapshot; no pinned drafter to compare (no provenance "
        "record)",
        f'fingerprint = "{_expected_fingerprint(data)}"',
    ]
