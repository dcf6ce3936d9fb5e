"""The provenance record and ``verify`` on a wheel file or an installed vllm (fake but real zips
and site directories built from the synthetic series)."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

import pytest

import synthetic
from scripts import REPO_ROOT
from scripts.provenance import RECORD_PATH, SCHEMA, make_record, verify, version_for
from scripts.worktree import load_inputs
from synthetic import tool_error

TOY = "vllm/toy_overlay.py"


def _record(project: synthetic.SyntheticProject) -> dict:
    return make_record(load_inputs(project.layout()), worktree_head="0" * 40)


def _wheel(
    project: synthetic.SyntheticProject,
    path: Path,
    record: dict | None = None,
    files: dict[str, bytes] | None = None,
    version: str | None = None,
) -> Path:
    """A wheel-shaped zip: the record, the shipped overlay files, and METADATA."""
    inputs = load_inputs(project.layout())
    record = record if record is not None else _record(project)
    version = version or version_for(inputs)
    if files is None:
        files = {o.relpath: o.read() for o in inputs.overlay if o.relpath.startswith("vllm/")}
        files["vllm/__init__.py"] = b"# toy\n"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(RECORD_PATH, json.dumps(record, indent=2, sort_keys=True))
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"vllm-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return path


def test_record_names_pins_patches_overlay_and_tool(vxl_project) -> None:
    project = vxl_project
    inputs = load_inputs(project.layout())
    record = _record(project)
    assert record["schema"] == SCHEMA
    assert re.fullmatch(r"[0-9a-f]{12}", record["label"]) and record["label"] == inputs.input_hash[:12]
    assert record["version"] == f"9.9.9+xpu.{record['label']}"
    assert record["pins"]["vllm"] == {
        "version": "9.9.9",
        "sdist_sha256": project.sha,
        "commit": "abc1234",
        "git_url": "file:///nonexistent/vllm.git",
    }
    names = project.series_names()
    assert [p["name"] for p in record["patches"]] == names
    for item in record["patches"]:
        assert item["sha256"] == hashlib.sha256((project.patches / item["name"]).read_bytes()).hexdigest()
    assert record["patches"][0]["subject"] == "envs: declare the toy XPU toggle"
    assert {o["path"]: o["sha256"] for o in record["overlay"]} == {
        rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in synthetic.OVERLAY_FILES.items()
    }
    assert set(record["tool"]) == {"revision", "dirty"}
    assert record["worktree_head"] == "0" * 40


def test_label_identifies_the_series(vxl_project) -> None:
    project = vxl_project
    first = load_inputs(project.layout()).label
    assert load_inputs(project.layout()).label == first
    project.write_overlay({TOY: "VALUE = 1\n"})
    second = load_inputs(project.layout()).label
    assert second != first
    changes = synthetic.default_changes(project.files)
    changes[1].subject = "init: import the overlay module, reworded"
    project.set_patches(changes)
    assert load_inputs(project.layout()).label not in (first, second)


def test_verify_accepts_a_matching_wheel(vxl_project, tmp_path: Path, capfd) -> None:
    wheel = _wheel(vxl_project, tmp_path / "vllm.whl")
    verify(str(wheel), vxl_project.layout())
    assert "OK: vllm.whl is vLLM 9.9.9+xpu." in capfd.readouterr().err


def test_tampered_patch_sha_is_rejected(vxl_project, tmp_path: Path) -> None:
    record = _record(vxl_project)
    name = record["patches"][1]["name"]
    record["patches"][1]["sha256"] = "e" * 64
    message = tool_error(verify, str(_wheel(vxl_project, tmp_path / "t.whl", record=record)), vxl_project.layout())
    assert f"patch {name}: sha256 eeeeeeeeeeee in the build" in message


def test_missing_patch_in_record_is_rejected(vxl_project, tmp_path: Path) -> None:
    record = _record(vxl_project)
    dropped = record["patches"].pop(0)["name"]
    message = tool_error(verify, str(_wheel(vxl_project, tmp_path / "t.whl", record=record)), vxl_project.layout())
    assert f"patch {dropped}: sha256 None in the build" in message


def test_patch_order_is_checked(vxl_project, tmp_path: Path) -> None:
    record = _record(vxl_project)
    record["patches"].reverse()
    message = tool_error(verify, str(_wheel(vxl_project, tmp_path / "t.whl", record=record)), vxl_project.layout())
    assert "patch order differs from patches/series" in message


def test_altered_overlay_file_is_rejected(vxl_project, tmp_path: Path) -> None:
    files = {TOY: b"VALUE = 666\n"}
    wheel = _wheel(vxl_project, tmp_path / "t.whl", files=files)
    message = tool_error(verify, str(wheel), vxl_project.layout())
    assert f"overlay file {TOY} differs from overlay/{TOY}" in message


def test_missing_overlay_file_is_rejected(vxl_project, tmp_path: Path) -> None:
    wheel = _wheel(vxl_project, tmp_path / "t.whl", files={"vllm/__init__.py": b""})
    assert f"overlay file {TOY} is missing" in tool_error(verify, str(wheel), vxl_project.layout())


def test_wrong_version_is_rejected(vxl_project, tmp_path: Path) -> None:
    wheel = _wheel(vxl_project, tmp_path / "t.whl", version="9.9.9+xpu.000000000000")
    message = tool_error(verify, str(wheel), vxl_project.layout())
    assert "version is 9.9.9+xpu.000000000000, the repository builds 9.9.9+xpu." in message


@pytest.mark.parametrize(
    "key,value,expect",
    [
        ("schema", "something-else", "schema is 'something-else'"),
        ("label", "ffffffffffff", "label differs"),
        ("input_hash", "f" * 64, "input_hash differs"),
    ],
)
def test_altered_record_fields_are_rejected(key: str, value: str, expect: str, vxl_project, tmp_path: Path) -> None:
    record = _record(vxl_project)
    record[key] = value
    assert expect in tool_error(
        verify, str(_wheel(vxl_project, tmp_path / "t.whl", record=record)), vxl_project.layout()
    )


def test_altered_pins_are_rejected(vxl_project, tmp_path: Path) -> None:
    record = _record(vxl_project)
    record["pins"]["xpu_runtime"]["torch"] = "2.11.0"
    message = tool_error(verify, str(_wheel(vxl_project, tmp_path / "t.whl", record=record)), vxl_project.layout())
    assert "pins differs" in message


def test_wheel_from_an_older_series_is_rejected(vxl_project, tmp_path: Path) -> None:
    project = vxl_project
    wheel = _wheel(project, tmp_path / "old.whl")
    changes = synthetic.default_changes(project.files)
    changes[0].body = changes[0].body.replace("A paragraph", "Another paragraph")
    project.set_patches(changes)
    message = tool_error(verify, str(wheel), project.layout())
    assert "does not match the repository" in message and "mismatch(es)" in message


def test_counts_every_mismatch(vxl_project, tmp_path: Path, capfd) -> None:
    record = _record(vxl_project)
    record["patches"][0]["sha256"] = "1" * 64
    wheel = _wheel(vxl_project, tmp_path / "t.whl", record=record, files={TOY: b"x"}, version="9.9.9+xpu.x")
    message = tool_error(verify, str(wheel), vxl_project.layout())
    assert "3 mismatch(es)" in message
    err = capfd.readouterr().err
    assert "version is" in err and "patch 0001-" in err and "overlay file" in err


def test_unreadable_targets_are_one_line_errors(vxl_project, tmp_path: Path) -> None:
    assert "no such wheel file" in tool_error(verify, str(tmp_path / "missing.whl"), vxl_project.layout())
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip")
    assert "not a readable wheel" in tool_error(verify, str(junk), vxl_project.layout())
    bare = tmp_path / "bare.whl"
    with zipfile.ZipFile(bare, "w") as zf:
        zf.writestr("vllm/__init__.py", "")
    assert "not built by this series" in tool_error(verify, str(bare), vxl_project.layout())


def _site(project: synthetic.SyntheticProject, site: Path, files: dict[str, bytes] | None = None) -> Path:
    """An installed vllm: package files plus dist-info, as pip would lay out the wheel."""
    wheel = _wheel(project, site.parent / "for-site.whl", files=files)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def test_verify_installed_through_another_interpreter(vxl_project, tmp_path: Path, monkeypatch) -> None:
    site = _site(vxl_project, tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", str(site))
    verify("installed", vxl_project.layout(), python=sys.executable)
    (site / TOY).write_text("VALUE = 0\n")
    assert f"overlay file {TOY} differs" in tool_error(verify, "installed", vxl_project.layout(), python=sys.executable)


def test_verify_installed_in_this_interpreter(vxl_project, tmp_path: Path, monkeypatch) -> None:
    site = _site(vxl_project, tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    verify("installed", vxl_project.layout())
    (site / "vllm" / "xpu_laguna_provenance.json").unlink()
    assert "not built by this series" in tool_error(verify, "installed", vxl_project.layout())


def test_verify_installed_without_vllm_is_an_error(vxl_project, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    message = tool_error(verify, "installed", vxl_project.layout(), python=sys.executable)
    # this interpreter may have some other vllm installed: then it is one not built by the series
    assert "no installed vllm" in message or "not built by this series" in message


# --------------------------------------------------------------------------- a real (toy) wheel build

TOY_SETUP = """import os
from setuptools import setup

assert os.environ["VLLM_TARGET_DEVICE"] == "xpu", "not an XPU build"
{fail}setup(name="vllm", version=os.environ["VLLM_VERSION_OVERRIDE"], packages=["vllm"],
      package_data={{"vllm": ["*.json"]}})
"""
TOY_PYPROJECT = "[build-system]\nrequires = ['setuptools']\nbuild-backend = 'setuptools.build_meta'\n"


def _buildable(project: synthetic.SyntheticProject, fail: bool = False) -> None:
    files = dict(
        project.files,
        **{
            "setup.py": TOY_SETUP.format(fail="raise SystemExit('toy build broke')\n" if fail else ""),
            "pyproject.toml": TOY_PYPROJECT,
        },
    )
    project.set_upstream(files)
    project.set_patches(synthetic.default_changes(files), base=files)


def test_build_makes_a_verifiable_wheel(vxl_project, tmp_path: Path) -> None:
    from scripts.build import build
    from scripts.worktree import apply

    project = vxl_project
    _buildable(project)
    state = apply(project.layout())
    wheel = build(project.layout(), dist=tmp_path / "dist")
    inputs = load_inputs(project.layout())
    assert wheel.parent == tmp_path / "dist"
    assert re.fullmatch(rf"vllm-9\.9\.9\+xpu\.{inputs.label}-.+\.whl", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        record = json.loads(zf.read(RECORD_PATH))
        assert zf.read(TOY) == synthetic.OVERLAY_FILES[TOY].encode()
    assert record["worktree_head"] == state.head
    assert [p["name"] for p in record["patches"]] == project.series_names()
    verify(str(wheel), project.layout())
    # a copy with one shipped overlay file altered is rejected
    tampered = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info, data + b"# x\n" if info.filename == TOY else data)
    assert f"overlay file {TOY} differs" in tool_error(verify, str(tampered), project.layout())
    # the work tree is untouched by the build
    assert synthetic.git(project.tree, "status", "--porcelain", "--untracked-files=all") == ""
    assert project.head() == state.head


def test_failed_build_is_a_one_line_error(vxl_project, tmp_path: Path) -> None:
    from scripts.build import build
    from scripts.worktree import apply

    project = vxl_project
    _buildable(project, fail=True)
    apply(project.layout())
    message = tool_error(build, project.layout(), dist=tmp_path / "dist")
    assert "pip wheel failed" in message and "wheel-build.log" in message
    assert "toy build broke" in (project.build / "wheel-build.log").read_text()
    assert list((tmp_path / "dist").glob("*.whl")) == []


def test_the_shipped_reader_checks_the_schema_the_tool_writes() -> None:
    """The doctor in the wheel compares a record's schema with the reader's SCHEMA; it must be
    the one this tool writes (the wheel cannot import the tooling, so each states it)."""
    reader = REPO_ROOT / "overlay" / "vllm" / "xpu_laguna/provenance.py"
    tree = ast.parse(reader.read_text(encoding="utf-8"))
    values = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SCHEMA" for t in node.targets)
        and isinstance(node.value, ast.Constant)
    ]
    assert values == [SCHEMA]
