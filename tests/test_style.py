"""The overlay half of ``nox -s style``: vLLM's own ruff settings, from the pristine tree."""

from __future__ import annotations

import pytest

import synthetic
from scripts.style import check_overlay

VLLM_RUFF = '[project]\nname = "vllm"\nrequires-python = ">=3.10"\n\n[tool.ruff.lint]\nselect = ["E", "F", "I"]\n'
CLEAN = '"""A toy overlay module."""\n\nVALUE = 42\n'


def _project(tmp_path, index, overlay: dict[str, str], pyproject: str | None = VLLM_RUFF):
    files = synthetic.upstream_files()  # its own pyproject.toml has no [tool.ruff]
    if pyproject is not None:
        files["pyproject.toml"] = pyproject
    return synthetic.new_project(tmp_path, index, files=files, overlay=overlay)


@pytest.fixture
def vxl_style_env(tmp_path, vxl_index, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", vxl_index.url)
    monkeypatch.setenv("VXL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VXL_BUILD_DIR", str(tmp_path / "build"))
    return tmp_path, vxl_index


def test_clean_overlay_passes(vxl_style_env) -> None:
    project = _project(*vxl_style_env, overlay={"vllm/toy_overlay.py": CLEAN})
    assert check_overlay(project.layout()) == 1


@pytest.mark.parametrize(
    "source, finding",
    [
        (CLEAN + "X = '" + "x" * 90 + "'\n", "overlay/vllm/toy_overlay.py:4:89: E501"),  # vLLM's 88, not ours
        (CLEAN.replace("VALUE", "import os\n\nVALUE"), "overlay/vllm/toy_overlay.py:3:8: F401"),
        (CLEAN.replace("VALUE = 42", "VALUE  =  42"), "Would reformat: overlay/vllm/toy_overlay.py"),
    ],
    ids=["line-length-88", "unused-import", "format"],
)
def test_overlay_findings_are_named_by_overlay_path(source: str, finding: str, vxl_style_env) -> None:
    project = _project(*vxl_style_env, overlay={"vllm/toy_overlay.py": source})
    message = synthetic.tool_error(check_overlay, project.layout())
    assert "not ruff-clean with vLLM" in message and finding in message, message


def test_vllm_resolves_as_first_party_as_upstream(vxl_style_env) -> None:
    """Import order is judged inside the pristine tree: ``vllm`` is first-party there (a copy of
    overlay/ alone would sort it with the third-party imports and fail)."""
    source = '"""Toy."""\n\nimport os\n\nimport vllm.envs as envs\n\nVALUE = (os, envs)\n'
    project = _project(*vxl_style_env, overlay={"vllm/toy_overlay.py": source})
    assert check_overlay(project.layout()) == 1
    # negative control: the same imports in one block are an I001 finding
    bad = source.replace("import os\n\nimport vllm", "import os\nimport vllm")
    project.write_overlay({"vllm/toy_overlay.py": bad})
    assert "I001" in synthetic.tool_error(check_overlay, project.layout())


def test_pristine_tree_without_ruff_settings_is_an_error(vxl_style_env) -> None:
    project = _project(*vxl_style_env, overlay={"vllm/toy_overlay.py": CLEAN}, pyproject=None)
    assert "no [tool.ruff] settings" in synthetic.tool_error(check_overlay, project.layout())
