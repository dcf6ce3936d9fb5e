"""Shared fixtures of the tooling tests. Fixture names start with ``vxl_`` so other test
modules' fixtures cannot clash; helpers live in tests/synthetic.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
for path in (str(REPO), str(Path(__file__).resolve().parent)):
    if path not in sys.path:
        sys.path.insert(0, path)

import synthetic  # noqa: E402
from scripts import index_http  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real: integration test on the real pinned vLLM sdist (downloads it when not cached, builds a wheel)"
    )


@pytest.fixture
def vxl_index() -> Iterator[synthetic.SimpleIndex]:
    """A PEP 503 index on 127.0.0.1 (free port), stopped after the test."""
    with synthetic.running_index() as index:
        yield index


def _isolated_project(
    monkeypatch: pytest.MonkeyPatch, index: synthetic.SimpleIndex, tmp: Path, seed: bool
) -> synthetic.SyntheticProject:
    # pip's configuration is exactly the loopback index: no config files, no extra indexes
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setattr(index_http, "RETRY_BACKOFF_S", 0.0)  # transient failures retried without waiting
    monkeypatch.setenv("VXL_CACHE_DIR", str(tmp / "cache"))
    monkeypatch.setenv("VXL_BUILD_DIR", str(tmp / "build"))
    for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(key, raising=False)
    return synthetic.new_project(tmp, index, seed=seed)


@pytest.fixture
def vxl_project(tmp_path: Path, vxl_index, monkeypatch) -> synthetic.SyntheticProject:  # type: ignore[no-untyped-def]
    """A synthetic repository root (pins, 2 patches, 2 overlay files) whose sdist is already cached."""
    return _isolated_project(monkeypatch, vxl_index, tmp_path, seed=True)


@pytest.fixture
def vxl_cold_project(tmp_path: Path, vxl_index, monkeypatch) -> synthetic.SyntheticProject:  # type: ignore[no-untyped-def]
    """Like vxl_project, but with an empty download cache: the sdist comes from the loopback index."""
    return _isolated_project(monkeypatch, vxl_index, tmp_path, seed=False)
