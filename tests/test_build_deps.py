"""The wheel is built with the patched tree's own [build-system].requires (scripts/build_deps.py),
installed through pip's configuration and checked again by pip (--check-build-dependencies): a stale
torch is refused, an override is the one reviewed way around it."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from scripts import build_deps
from scripts.build import pip_wheel_command
from scripts.build_deps import Override, build_requirements, ensure_build_requirements, unmet
from scripts.errors import ToolError

FIXTURES = Path(__file__).parent / "fixtures"


def _pyproject(*requires: str) -> str:
    listed = ", ".join(f'"{r}"' for r in requires)
    return f'[build-system]\nrequires = [{listed}]\nbuild-backend = "setuptools.build_meta"\n'


@pytest.mark.parametrize(("version", "torch"), [("0.32.0", "==2.13.0"), ("0.34.0", "==2.14.0")])
def test_real_build_requires(version: str, torch: str) -> None:
    text = (FIXTURES / f"vllm-{version}" / "pyproject.toml").read_text(encoding="utf-8")
    found = {str(item.requirement.name): item for item in build_requirements(text, "pyproject.toml", overrides={})}
    assert str(found["torch"].requirement.specifier) == torch
    assert found["torch"].declared == f"torch {torch[:2]} {torch[2:]}"  # as vLLM writes it
    assert {"cmake", "ninja", "setuptools", "setuptools-scm", "setuptools-rust", "wheel", "jinja2"} <= set(found)


def test_a_stale_torch_is_unmet_and_a_local_build_of_the_release_is_not() -> None:
    reqs = build_requirements(_pyproject("torch == 2.13.0", "cmake>=3.26.1", "ninja"), "t", overrides={})
    installed = {"torch": "2.13.0+cpu", "cmake": "3.31.0"}

    def version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    assert unmet(reqs, version) == ["ninja (not installed)"]
    installed.update(torch="2.12.0", ninja="1.13.0")
    assert unmet(reqs, version) == ["torch==2.13.0 (torch 2.12.0 installed)"]


def test_ensure_installs_exactly_what_is_unmet_and_refuses_what_stays_unmet(tmp_path: Path) -> None:
    have = metadata.version("pytest")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(_pyproject(f"pytest=={have}", "packaging >= 1", "pytest-does-not-exist-here"))
    asked: list[tuple[str, ...]] = []
    with pytest.raises(ToolError) as info:
        ensure_build_requirements(pyproject, install=lambda *args: asked.append(args))
    assert asked == [("pytest-does-not-exist-here",)]
    assert "\n" not in str(info.value) and "pytest-does-not-exist-here (not installed)" in str(info.value)
    # a stale pin (the installed pytest is not 1.0) is refused after the install attempt
    pyproject.write_text(_pyproject("pytest==1.0"))
    asked.clear()
    message = str(
        pytest.raises(ToolError, ensure_build_requirements, pyproject, install=lambda *a: asked.append(a)).value
    )
    assert asked == [("pytest==1.0",)]
    assert f"does not satisfy [build-system].requires: pytest==1.0 (pytest {have} installed)" in message
    # everything met: nothing installed
    pyproject.write_text(_pyproject(f"pytest=={have}"))
    asked.clear()
    ensure_build_requirements(pyproject, install=lambda *a: asked.append(a))
    assert asked == []


def test_an_override_is_installed_and_written_into_the_builds_copy(tmp_path: Path, monkeypatch) -> None:
    have = metadata.version("pytest")
    monkeypatch.setattr(build_deps, "BUILD_OVERRIDES", {"pytest": Override(f"pytest=={have}", "reviewed: a test")})
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(_pyproject("pytest == 1.0", "packaging"))
    ensure_build_requirements(pyproject, install=lambda *a: pytest.fail(f"nothing to install: {a}"))
    assert f'"pytest=={have}"' in pyproject.read_text() and "1.0" not in pyproject.read_text()
    with pytest.raises(ToolError, match="does not name"):
        build_requirements(_pyproject("pytest"), "t", overrides={"pytest": Override("torch", "wrong")})


def test_the_shipped_override_list_is_reviewed() -> None:
    """Each override names its reason; torch is the only one (the XPU build compiles nothing against it)."""
    for name, override in build_deps.BUILD_OVERRIDES.items():
        assert override.reason.strip() and name in override.requirement.lower()
    assert set(build_deps.BUILD_OVERRIDES) == {"torch"}


def test_the_xpu_build_takes_any_installed_torch_and_installs_the_cpu_pin_when_none_is() -> None:
    """0.34.0's [build-system] asks torch == 2.14.0 (the CUDA build on this index, GBs); the XPU wheel
    is built as upstream builds it, with whatever torch is installed (an XPU machine's torch for XPU),
    and where none is, with the CPU runtime's pinned torch; every other requirement stays as declared."""
    from scripts.layout import Layout
    from scripts.pins import load_pins

    text = (FIXTURES / "vllm-0.34.0" / "pyproject.toml").read_text(encoding="utf-8")
    reqs = build_requirements(text, "pyproject.toml")
    found = {str(item.requirement.name): item for item in reqs}
    torch = found["torch"]
    assert torch.declared == "torch == 2.14.0" and str(torch.requirement) == "torch"
    installed = {name: "99" for name in found} | {"setuptools": "80.0.0", "cmake": "3.31.0"}
    for build in ("2.15.0+xpu", "2.13.0+cpu", "2.14.0"):  # an XPU machine's, this machine's, the declared one
        installed["torch"] = build
        assert unmet(reqs, installed.__getitem__) == [], build
    assert build_deps.install_spec(torch) == f"torch=={load_pins(Layout().pins).cpu_runtime.torch}"
    assert build_deps.install_spec(found["cmake"]) == "cmake>=3.26.1"  # no override: as declared
    # the other requirements still hold the build: a too new setuptools is unmet
    installed["setuptools"] = "81.0.0"
    assert unmet(reqs, installed.__getitem__) == ["setuptools<81.0.0,>=77.0.3 (setuptools 81.0.0 installed)"]
    # control: without the override the declared torch is unmet by the CPU build
    plain = build_requirements(text, "pyproject.toml", overrides={})
    installed.update(setuptools="80.0.0", torch="2.13.0+cpu")
    assert unmet(plain, installed.__getitem__) == ["torch==2.14.0 (torch 2.13.0+cpu installed)"]


def test_pip_itself_refuses_a_stale_build_dependency(tmp_path: Path) -> None:
    """--check-build-dependencies is on: pip stops before building when the interpreter's version of a
    [build-system] requirement is not the tree's (setuptools here, standing in for torch)."""
    command = pip_wheel_command(tmp_path / "out", "-q")
    assert "--check-build-dependencies" in command and "--no-build-isolation" in command
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("from setuptools import setup\nsetup(name='toy', version='1')\n")
    (tree / "pyproject.toml").write_text(_pyproject("setuptools==0.0.1"))
    proc = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "Some build dependencies for" in proc.stdout + proc.stderr
    assert "setuptools==0.0.1" in proc.stdout + proc.stderr
    assert sys.executable == command[0]


PINNED = '[build-system]\nrequires = ["setuptools"]\n\n[project.entry-points."g"]\na = "m:a"\n'


def test_patched_text_applies_the_series_hunk_strictly() -> None:
    from scripts.build_deps import patched_text

    diff = (
        "diff --git a/pyproject.toml b/pyproject.toml\n--- a/pyproject.toml\n+++ b/pyproject.toml\n"
        "@@ -4,2 +4,3 @@\n"
        ' [project.entry-points."g"]\n'
        ' a = "m:a"\n'
        '+b = "m:b"\n'
    )
    assert patched_text(PINNED, diff, "pyproject.toml") == PINNED + 'b = "m:b"\n'
    with pytest.raises(ToolError, match="hunk at line 4 does not apply"):
        patched_text(PINNED.replace('a = "m:a"', 'a = "m:other"'), diff, "pyproject.toml")
