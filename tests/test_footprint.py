"""``scripts.footprint``: upstream files and lines the series edits, counted from the patches'
diffs; files a patch creates counted apart; the rebase report carries it."""

from __future__ import annotations

from pathlib import Path

from scripts.footprint import footprint
from scripts.series import Patch


def _modified(path: str, hunk: str) -> str:
    """A git diff of an existing file (``path``) with one hunk."""
    index = f"index {'1' * 40}..{'2' * 40} 100644"
    return f"diff --git a/{path} b/{path}\n{index}\n--- a/{path}\n+++ b/{path}\n{hunk}"


NEW_FILE = """\
diff --git a/vllm/new_module.py b/vllm/new_module.py
new file mode 100644
index 0000000000000000000000000000000000000000..3333333333333333333333333333333333333333
--- /dev/null
+++ b/vllm/new_module.py
@@ -0,0 +1,2 @@
+x = 1
+y = 2
"""
EDIT = _modified("vllm/envs.py", "@@ -1,4 +1,5 @@\n a = 1\n-b = 2\n+b = 3\n+c = 4\n d = 5\n e = 6\n") + NEW_FILE
SECOND = _modified("vllm/config/vllm.py", "@@ -10,3 +10,2 @@\n keep = True\n-drop = True\n last = True\n") + _modified(
    "vllm/envs.py", "@@ -5,2 +5,3 @@\n e = 6\n+f = 7\n g = 8\n"
)


def _patch(name: str, diff: str) -> Patch:
    return Patch(name, Path(name), "a", "d", "s", "", raw=diff.encode())


def test_edits_count_added_and_removed_lines_of_upstream_files_only() -> None:
    got = footprint([_patch("0001-a.patch", EDIT), _patch("0002-b.patch", SECOND)])
    first, second = got.patches
    assert (first.files, first.added, first.removed, first.new_files) == (
        ("vllm/envs.py",),
        2,
        1,
        ("vllm/new_module.py",),
    )
    assert (second.files, second.added, second.removed, second.edited) == (
        ("vllm/config/vllm.py", "vllm/envs.py"),
        1,
        1,
        2,
    )
    assert got.files == ("vllm/config/vllm.py", "vllm/envs.py")  # envs.py once, the new file not at all
    assert got.edited == 5
    assert got.headline() == "footprint: 2 patch(es) edit 2 upstream file(s), 5 upstream line(s) (+3/-2)"
    assert got.rows()[0].endswith("3 line(s) in vllm/envs.py, creates vllm/new_module.py")
    assert got.to_json()["edited_upstream_lines"] == 5
    assert got.to_json()["per_patch"][1]["files"] == ["vllm/config/vllm.py", "vllm/envs.py"]


def test_an_empty_series_has_no_footprint() -> None:
    got = footprint([])
    assert (got.files, got.edited, got.rows()) == ((), 0, [])
