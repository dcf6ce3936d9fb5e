"""The upstream hand-off (docs/upstream/*.patch) must keep applying to the release it targets.

Each patch is checked with ``git apply --check`` against the files it touches, extracted from the
real sdist named in docs/upstream/base.toml (downloaded through pip's configured index when it is
not in the cache, sha256-verified, its commit checked). Cheap: one cached 47 MB sdist, a handful
of files extracted, no build and no runtime.

Negative controls: a patch with one changed context line must fail the same check, and the
reverse check must fail on the pristine tree (it would pass once upstream carries the fix: then
the patch is merged and the series patch can be retired).
"""

from __future__ import annotations

import tarfile
import tomllib
from pathlib import Path, PurePosixPath

import pytest
from unidiff import PatchSet

from scripts.git import run_git
from scripts.layout import Layout
from scripts.pins import VllmPin, load_pins
from scripts.rebase.target import sdist_commit
from scripts.source import fetch_sdist

pytestmark = pytest.mark.real

HANDOFF = Layout().upstream_handoff
PATCHES = sorted(HANDOFF.glob("*.patch"))


def _base_pin() -> VllmPin:
    data = tomllib.loads((HANDOFF / "base.toml").read_text())
    git_url = load_pins(Layout().pins).vllm.git_url
    return VllmPin(version=data["version"], sdist_sha256=data["sdist_sha256"], commit=data["commit"], git_url=git_url)


def _touched(patch: Path) -> list[str]:
    """Every path the patch reads or creates (without the a/ b/ prefixes)."""
    paths: set[str] = set()
    for item in PatchSet(patch.read_text(encoding="utf-8")):
        for name in (item.source_file, item.target_file):
            if name != "/dev/null":
                paths.add(str(PurePosixPath(*PurePosixPath(name).parts[1:])))
    return sorted(paths)


@pytest.fixture(scope="module")
def vxl_pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the hand-off patches touch, as the pristine release ships them."""
    pin = _base_pin()
    archive = fetch_sdist(pin)
    found = sdist_commit(archive)
    assert found.startswith(pin.commit), f"{archive.name} names commit {found}, base.toml says {pin.commit}"
    wanted = {path for patch in PATCHES for path in _touched(patch)}
    dest = tmp_path_factory.mktemp("pristine")
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            rel = "/".join(PurePosixPath(member.name).parts[1:])
            if member.isfile() and rel in wanted:
                fh = tar.extractfile(member)
                assert fh is not None
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(fh.read())
    return dest


def _check(tree: Path, patch: Path, *extra: str) -> tuple[int, str]:
    proc = run_git(tree, "apply", "--check", *extra, str(patch), check=False)
    return proc.returncode, (proc.stderr or proc.stdout).strip()


def test_handoff_has_one_patch_per_fix() -> None:
    assert [p.name[:5] for p in PATCHES] == ["0002-", "0006-", "0008-", "0013-"], [p.name for p in PATCHES]


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name[:4] for p in PATCHES])
def test_patch_is_an_upstream_ready_mail(patch: Path) -> None:
    text = patch.read_text(encoding="utf-8")
    head, _, _ = text.partition("\n---\n")
    assert text.startswith("From ") and "\nSubject: [PATCH] " in head, "not a `git format-patch` mail"
    assert head.rstrip().endswith("\nSigned-off-by: <your name>"), (
        "Signed-off-by placeholder missing (never a fake person)"
    )
    created = [f.path for f in PatchSet(text) if f.is_added_file]
    assert any(path.startswith("tests/") and PurePosixPath(path).name.startswith("test_") for path in created), (
        f"{patch.name} adds no upstream test (new files: {created})"
    )


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name[:4] for p in PATCHES])
def test_patch_applies_to_the_pristine_release(vxl_pristine: Path, patch: Path) -> None:
    code, err = _check(vxl_pristine, patch)
    assert code == 0, f"{patch.name} no longer applies to vLLM {_base_pin().version}: {err}"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name[:4] for p in PATCHES])
def test_fix_is_not_in_the_release_yet(vxl_pristine: Path, patch: Path) -> None:
    # Passing reverse check == the release already carries the change: retire the patch then.
    code, _ = _check(vxl_pristine, patch, "--reverse")
    assert code != 0, f"vLLM {_base_pin().version} already contains {patch.name}"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name[:4] for p in PATCHES])
def test_negative_control_a_stale_patch_fails_the_check(vxl_pristine: Path, patch: Path, tmp_path: Path) -> None:
    lines = patch.read_text(encoding="utf-8").splitlines(keepends=True)
    first_hunk = next(i for i, line in enumerate(lines) if line.startswith("@@ "))
    context = next(i for i in range(first_hunk + 1, len(lines)) if lines[i].startswith(" ") and lines[i].strip())
    lines[context] = lines[context].rstrip("\n") + "  # changed upstream\n"
    stale = tmp_path / patch.name
    stale.write_text("".join(lines), encoding="utf-8")
    code, err = _check(vxl_pristine, stale)
    assert code != 0 and "patch does not apply" in err, err
