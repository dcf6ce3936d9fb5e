"""Each patch-test file alone (scripts/patch_tests.py): a file that passes only after another file
ran in the same process is named; the control is the same two files in one pytest process, where
both pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts import patch_tests
from scripts.errors import ToolError

SHARED = "STATE = {}\n"
FIRST = "import shared\n\n\ndef test_first_leaves_state():\n    shared.STATE['ready'] = True\n"
SECOND = "import shared\n\n\ndef test_second_needs_it():\n    assert shared.STATE.get('ready')\n"
ALONE = "def test_alone():\n    assert 1 + 1 == 2\n"


@pytest.fixture
def tree_tests(tmp_path: Path) -> Path:
    folder = tmp_path / "tests" / "xpu_laguna"
    folder.mkdir(parents=True)
    (folder / "shared.py").write_text(SHARED)
    (folder / "test_a_first.py").write_text(FIRST)
    (folder / "test_b_second.py").write_text(SECOND)
    (folder / "test_c_alone.py").write_text(ALONE)
    return folder


def test_a_file_that_needs_another_file_first_fails_alone(tree_tests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the control: one pytest process, files in order, everything passes
    together = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tree_tests)],
        cwd=tree_tests,
        capture_output=True,
        text=True,
        check=False,
    )
    assert together.returncode == 0, together.stdout
    code = patch_tests.main(["--python", sys.executable, "--tests", str(tree_tests), "--jobs", "2"])
    err = capsys.readouterr().err
    assert code == 1
    assert "error: 1 of 3 patch-test file(s) fail when run alone: test_b_second.py" in err
    assert "test_b_second.py fails alone; the last lines of its output:" in err and "assert None" in err
    (tree_tests / "test_b_second.py").write_text(ALONE.replace("test_alone", "test_second_alone"))
    assert patch_tests.main(["--python", sys.executable, "--tests", str(tree_tests), "--jobs", "1"]) == 0


def test_no_test_files_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="no test_\\*.py files"):
        patch_tests.patch_test_files(tmp_path)


def test_an_interpreter_that_is_not_there_is_one_line(tree_tests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert patch_tests.main(["--python", "no/such/python", "--tests", str(tree_tests)]) == 1
    assert capsys.readouterr().err.strip().endswith("error: --python no/such/python: no such interpreter")
