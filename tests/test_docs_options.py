"""The docs give the series' options as vLLM config, never as environment variables.

docs/serving.md's "Options" section is the one table of the options (each key of the overlay's
``XpuLagunaOptions`` with its default) and the one table old variable -> option (the overlay's
``ENV_REPLACED_BY``); no other page of README.md and docs/ tells a user to set a variable of the
series. docs/rebase/ (dated port logs and the dry runs' records) and docs/upstream/ (mails to
upstream) are frozen records and keep the names they had.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scripts import REPO_ROOT
from scripts.series_options import DEFAULTS, ENV_PREFIX, ENV_REPLACED_BY, OPTIONS_KEY

SERVING = REPO_ROOT / "docs" / "serving.md"
SECTION = "## Options"
OPTIONS_HEADER = "| key | type | default | what it does |"
MIGRATION_HEADER = "| variable (no longer read) | option |"
FROZEN = ("docs/rebase/", "docs/upstream/")
"""Dated records: they keep the variable names of their day."""


def section(text: str, title: str = SECTION) -> str:
    """The text of the ``## `` section ``title`` (up to the next ``## `` heading)."""
    if f"\n{title}\n" not in text:
        raise AssertionError(f"no {title!r} section")
    body = text.split(f"\n{title}\n", 1)[1]
    return re.split(r"^## ", body, maxsplit=1, flags=re.M)[0]


def table(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table under ``header`` (backticks kept)."""
    if header not in text:
        raise AssertionError(f"no table {header!r}")
    rows = []
    for line in text.split(header, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def documented_defaults(text: str) -> dict[str, str]:
    return {row[0].strip("`"): row[2] for row in table(section(text), OPTIONS_HEADER)}


def documented_migration(text: str) -> dict[str, str]:
    return {row[0].strip("`"): row[1].strip("`") for row in table(section(text), MIGRATION_HEADER)}


def stray_variables(pages: dict[str, str]) -> list[str]:
    """``page:line`` of each mention of a series variable outside serving.md's Options section and
    the frozen records."""
    found = []
    for name, text in pages.items():
        if name.startswith(FROZEN):
            continue
        allowed = section(text) if name == "docs/serving.md" else ""
        outside = text.replace(allowed, "") if allowed else text
        for number, line in enumerate(outside.splitlines(), 1):
            if ENV_PREFIX in line:
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    return found


def _pages() -> dict[str, str]:
    paths = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    return {p.relative_to(REPO_ROOT).as_posix(): p.read_text(encoding="utf-8") for p in paths}


def test_the_options_table_names_every_option_with_its_default() -> None:
    documented = documented_defaults(SERVING.read_text(encoding="utf-8"))
    assert documented == {key: f"`{json.dumps(value)}`" for key, value in DEFAULTS.items()}
    assert len(documented) == 13


def test_the_migration_table_is_the_overlays() -> None:
    assert documented_migration(SERVING.read_text(encoding="utf-8")) == ENV_REPLACED_BY


def test_the_section_says_how_to_pass_them() -> None:
    text = section(SERVING.read_text(encoding="utf-8"))
    for form in (
        f'--additional-config \'{{"{OPTIONS_KEY}": {{',  # vllm serve
        f'additional_config={{"{OPTIONS_KEY}": {{',  # LLM / EngineArgs
        f"additional-config:\n  {OPTIONS_KEY}:\n",  # the --config YAML
    ):
        assert form in text, form


def test_no_page_tells_a_user_to_set_a_series_variable() -> None:
    assert not stray_variables(_pages()), "\n".join(stray_variables(_pages()))


def test_negative_controls(tmp_path: Path) -> None:
    text = SERVING.read_text(encoding="utf-8")
    # a variable named outside the Options section, on serving.md or another page, is caught
    outside = text.replace("## Every setting\n", f"## Every setting\n\nset {ENV_PREFIX}BREAKABLE_GRAPH=1\n")
    assert len(stray_variables({"docs/serving.md": outside})) == 1
    assert stray_variables({"docs/x.md": f"`{ENV_PREFIX}EXACT_VERIFY=0`"}) == [
        f"docs/x.md:1: `{ENV_PREFIX}EXACT_VERIFY=0`"
    ]
    assert stray_variables({"docs/rebase/x.md": f"`{ENV_PREFIX}EXACT_VERIFY=0`"}) == []
    # an option missing from the table, or a wrong default, is a difference
    row = next(line for line in text.splitlines() if line.startswith("| `verify_width` |"))
    missing = documented_defaults(text.replace(row + "\n", ""))
    assert "verify_width" not in missing and set(missing) != set(DEFAULTS)
    assert documented_defaults(text.replace(row, row.replace("`8`", "`16`")))["verify_width"] == "`16`"
    # a page without the section is refused in one line
    with pytest.raises(AssertionError, match="no '## Options' section"):
        section("# x\n")
