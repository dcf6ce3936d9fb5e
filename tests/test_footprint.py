"""``scripts.footprint``: upstream files and lines the series edits, counted from the patches'
diffs; files a patch creates counted apart; the rebase report carries it."""

from __future__ import annotations

from pathlib import Path

from scripts.footprint import footprint
from scripts.series import Patch

EDIT = """\
diff --git a/vllm/envs.py b/vllm/envs.py
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/vllm/envs.py
+++ b/vllm/envs.py
@@ -1,4 +1,5 @@
 a = 1
-b = 2
+b = 3
+c = 4
 d = 5
 e = 6
diff --git a/vllm/new_module.py b/vllm/new_module.py
new file mode 100644
index 0000000000000000000000000000000000000000..3333333333333333333333333333333333333333
--- /dev/null
+++ b/vllm/new_module.py
@@ -0,0 +1,2 @@
+x = 1
+y = 2
"""

SECOND = """\
diff --git a/vllm/config/vllm.py b/vllm/config/vllm.py
index 4444444444444444444444444444444444444444..5555555555555555555555555555555555555555 100644
--- a/vllm/config/vllm.py
+++ b/vllm/config/vllm.py
@@ -10,3 +10,2 @@
 keep = True
-drop = True
 last = True
diff --git a/vllm/envs.py b/vllm/envs.py
index 2222222222222222222222222222222222222222..6666666666666666666666666666666666666666 100644
--- a/vllm/envs.py
+++ b/vllm/envs.py
@@ -5,2 +5,3 @@
 e = 6
+f = 7
 g = 8
"""


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
