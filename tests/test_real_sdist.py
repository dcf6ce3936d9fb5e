"""Integration on the REAL pinned vLLM sdist: apply, build the XPU wheel, verify its provenance,
export fixpoint, no-op apply. Uses the default download cache (downloads the sdist through pip's
configured index when it is missing) and a temporary build directory; the repository's inputs
(pins.toml, patches/, overlay/, overlay.toml) are snapshotted first so concurrent edits by
others cannot make the run inconsistent.

Needs the build requirements (torch CPU, cmake, ninja, setuptools<81, setuptools-scm,
setuptools-rust, wheel, jinja2) in the running interpreter: ``nox -s tests`` installs them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import synthetic
from scripts import REPO_ROOT
from scripts.build import build
from scripts.digest import sha256_file
from scripts.export import export
from scripts.pins import load_pins
from scripts.provenance import RECORD_PATH, verify
from scripts.source import cache_root, fetch_sdist
from scripts.worktree import Layout, apply, load_inputs
from synthetic import tool_error

pytestmark = pytest.mark.real

BUILD_MODULES = ("torch", "cmake", "ninja", "setuptools", "setuptools_scm", "setuptools_rust", "wheel", "jinja2")


@dataclass
class Built:
    layout: Layout
    wheel: Path
    timings: dict[str, float]
    head: str


@pytest.fixture(scope="module")
def vxl_real(tmp_path_factory: pytest.TempPathFactory) -> Built:
    missing = [m for m in BUILD_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(
            f"the build requirements are not installed in this interpreter: {', '.join(missing)} "
            "(run the tests through `nox -s tests`, or `python -m scripts build-deps --pinned` first)"
        )
    mp = pytest.MonkeyPatch()
    for key in ("VXL_CACHE_DIR", "VXL_BUILD_DIR"):
        mp.delenv(key, raising=False)  # the real default cache; the build dir is explicit below
    base = tmp_path_factory.mktemp("real")
    root = base / "repo"
    root.mkdir()
    shutil.copy2(REPO_ROOT / "pins.toml", root / "pins.toml")
    shutil.copytree(REPO_ROOT / "patches", root / "patches")
    if (REPO_ROOT / "overlay").exists():
        shutil.copytree(REPO_ROOT / "overlay", root / "overlay", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if (REPO_ROOT / "overlay.toml").exists():
        shutil.copy2(REPO_ROOT / "overlay.toml", root / "overlay.toml")
    layout = Layout(root, build_dir=base / "build")
    timings: dict[str, float] = {}
    try:
        start = time.monotonic()
        state = apply(layout)
        timings["apply"] = time.monotonic() - start
        start = time.monotonic()
        wheel = build(layout, dist=base / "dist")
        timings["build"] = time.monotonic() - start
    finally:
        mp.undo()
    print(f"\nreal sdist: apply {timings['apply']:.1f}s, build {timings['build']:.1f}s -> {wheel.name}")
    return Built(layout, wheel, timings, state.head)


def test_real_sdist_is_cached_with_the_pinned_sha_and_commit() -> None:
    pins = load_pins()
    path = fetch_sdist(pins.vllm)  # downloads through pip's configured index when missing
    assert path.is_relative_to(cache_root())
    assert (
        sha256_file(path)
        == pins.vllm.sdist_sha256
        == "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"
    )
    with tarfile.open(path, "r:gz") as tar:
        text = tar.extractfile(f"vllm-{pins.vllm.version}/vllm/_version.py").read().decode()  # type: ignore[union-attr]
    assert re.search(r"__commit_id__ = commit_id = 'g62d4bc3c7", text), text


def test_xpu_runtime_pins_match_the_sdist_requirements() -> None:
    """[xpu_runtime] is read from the pinned sdist's requirements/xpu.txt."""
    pins = load_pins()
    with tarfile.open(fetch_sdist(pins.vllm), "r:gz") as tar:
        text = tar.extractfile(f"vllm-{pins.vllm.version}/requirements/xpu.txt").read().decode()  # type: ignore[union-attr]
    from scripts.rebase.pins_update import parse_xpu_requirements

    compact = text.replace(" ", "")
    assert f"torch=={pins.xpu_runtime.torch}" in compact, text
    assert pins.xpu_runtime.vllm_xpu_kernels in text, text
    # what the README's install instructions read from pins.toml is what the sdist pins, every key
    read = parse_xpu_requirements(text)
    assert read == {k: getattr(pins.xpu_runtime, k) for k in read}, read
    assert set(read) >= {"torch", "torch_index_url", "vllm_xpu_kernels", "vllm_xpu_kernels_url", "triton"}


def test_real_apply_makes_the_documented_commits(vxl_real: Built) -> None:
    tree = vxl_real.layout.worktree
    inputs = load_inputs(vxl_real.layout)
    subjects = synthetic.git(tree, "log", "--reverse", "--format=%s").splitlines()
    assert subjects[0] == "upstream vLLM 0.34.0 (62d4bc3c7) pristine"
    assert subjects[1:-1] == [p.subject for p in inputs.patches]
    assert subjects[-1] == "overlay: lay the series' new files"
    assert len(inputs.patches) >= 1 and len(inputs.overlay) >= 1
    assert "check_series_contract(self)" in (tree / "vllm" / "config" / "vllm.py").read_text()  # a patch
    assert (tree / "vllm" / "xpu_laguna" / "options.py").is_file()  # the overlay: the series' options
    assert "VLLM_XPU_LAGUNA_" not in (tree / "vllm" / "envs.py").read_text()  # it declares no variable
    assert "g62d4bc3c7" in (tree / "vllm" / "_version.py").read_text()
    assert synthetic.git(tree, "status", "--porcelain", "--untracked-files=all") == ""


def test_real_noop_apply_keeps_the_tree(vxl_real: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VXL_CACHE_DIR", raising=False)
    start = time.monotonic()
    state = apply(vxl_real.layout, offline=True)
    took = time.monotonic() - start
    print(f"\nreal no-op apply: {took:.2f}s")  # a figure, not a gate (speed lives in `nox -s bench`)
    assert state.head == vxl_real.head


def test_real_export_is_a_fixpoint(vxl_real: Built) -> None:
    before = {p.name: p.read_bytes() for p in (vxl_real.layout.patches).iterdir()}
    assert export(vxl_real.layout, check=True) is False
    assert export(vxl_real.layout) is False
    assert {p.name: p.read_bytes() for p in (vxl_real.layout.patches).iterdir()} == before


def test_real_wheel_name_and_contents(vxl_real: Built) -> None:
    inputs = load_inputs(vxl_real.layout)
    match = re.fullmatch(r"vllm-0\.34\.0\+xpu\.([0-9a-f]{12})-cp38-abi3-[A-Za-z0-9_]+\.whl", vxl_real.wheel.name)
    assert match, vxl_real.wheel.name
    assert match.group(1) == inputs.label and "cpu" not in match.group(1)
    with zipfile.ZipFile(vxl_real.wheel) as zf:
        names = set(zf.namelist())
        record = json.loads(zf.read(RECORD_PATH))
        metadata = zf.read(f"vllm-0.34.0+xpu.{inputs.label}.dist-info/METADATA").decode()
        for item in inputs.overlay:
            if item.relpath.startswith("vllm/"):
                assert hashlib.sha256(zf.read(item.relpath)).hexdigest() == item.sha256
    assert f"Version: 0.34.0+xpu.{inputs.label}\n" in metadata
    # the XPU build of vLLM 0.34.0 compiles nothing: setup.py adds its two small CMake extensions
    # (spinloop, fs_io_C) only `if not _is_xpu()`; the kernels come from vllm_xpu_kernels
    extensions = sorted(n for n in names if n.endswith(".so"))
    assert extensions == [], extensions
    # the provenance record: pins, every patch with its sha256, overlay hashes, tool revision
    assert record["version"] == f"0.34.0+xpu.{inputs.label}"
    assert record["pins"]["vllm"]["sdist_sha256"] == inputs.pins.vllm.sdist_sha256
    assert [(p["name"], p["sha256"]) for p in record["patches"]] == [
        (p.name, hashlib.sha256(p.path.read_bytes()).hexdigest()) for p in inputs.patches
    ]
    assert {o["path"] for o in record["overlay"]} == {o.relpath for o in inputs.overlay}
    assert re.fullmatch(r"[0-9a-f]{40}", record["tool"]["revision"])
    assert record["worktree_head"] == vxl_real.head


def test_real_verify_passes_and_a_tampered_copy_fails(vxl_real: Built, tmp_path: Path) -> None:
    verify(str(vxl_real.wheel), vxl_real.layout)
    inputs = load_inputs(vxl_real.layout)
    shipped = [o.relpath for o in inputs.overlay if o.relpath.startswith("vllm/")]
    assert shipped, "no overlay file ships in the wheel"
    tampered = tmp_path / vxl_real.wheel.name
    with zipfile.ZipFile(vxl_real.wheel) as src, zipfile.ZipFile(tampered, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == shipped[0]:
                data += b"\n# tampered\n"
            dst.writestr(info, data)
    message = tool_error(verify, str(tampered), vxl_real.layout)
    assert f"overlay file {shipped[0]} differs" in message


def test_real_total_time(vxl_real: Built) -> None:
    total = vxl_real.timings["apply"] + vxl_real.timings["build"]
    assert total < 180, f"apply + build took {total:.0f}s: {vxl_real.timings}"


def test_real_verify_installed(vxl_real: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip installs the wheel (no deps) into a target dir; verify checks that installed copy."""
    import subprocess
    import sys

    target = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(vxl_real.wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    monkeypatch.setenv("PYTHONPATH", str(target))
    verify("installed", vxl_real.layout, python=sys.executable)
    inputs = load_inputs(vxl_real.layout)
    shipped = next(o.relpath for o in inputs.overlay if o.relpath.startswith("vllm/"))
    with open(target / shipped, "a") as fh:
        fh.write("# edited after install\n")
    assert f"overlay file {shipped} differs" in tool_error(verify, "installed", vxl_real.layout, python=sys.executable)


def test_real_series_lints_clean(vxl_real: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    """Headers, paths, overlay manifest and strict application on a scratch tree, offline."""
    from scripts.lint import lint

    monkeypatch.delenv("VXL_CACHE_DIR", raising=False)
    lint(vxl_real.layout, offline=True)
