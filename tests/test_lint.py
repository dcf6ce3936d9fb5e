"""``lint``: series and files agree, patch headers, safe paths, overlay manifest, strict
application on a scratch tree (never the user's work tree)."""

from __future__ import annotations

import pytest

import synthetic
from scripts.lint import lint, lint_static
from scripts.series import REQUIRED_FIELDS, parse_fields
from scripts.worktree import Layout, apply
from synthetic import ENVS, Change, tool_error


def test_clean_series_lints_clean(vxl_project, capfd) -> None:
    project = vxl_project
    assert lint_static(project.layout()) == []
    lint(project.layout())
    err = capfd.readouterr().err
    assert "lint: clean (2 patch(es), 2 overlay file(s))" in err
    # the default series adds one line to envs.py and two to __init__.py
    assert "footprint: 2 patch(es) edit 2 upstream file(s), 3 upstream line(s) (+3/-0)" in err
    assert not project.tree.exists(), "lint must not make or touch build/worktree"


def test_lint_leaves_the_work_tree_alone(vxl_project) -> None:
    project = vxl_project
    state = apply(project.layout())
    (project.tree / ENVS).write_text("my edit\n")
    lint(project.layout())
    assert (project.tree / ENVS).read_text() == "my edit\n"
    assert project.head() == state.head


def test_unlisted_patch_file_is_a_problem(vxl_project) -> None:
    project = vxl_project
    names = project.series_names()
    project.write_series(names[:1])
    problems = lint_static(project.layout())
    assert problems == [f"patches/{names[1]} is not listed in patches/series"]
    message = tool_error(lint, project.layout(), static_only=True)
    assert message == f"lint found 1 problem(s); first: {problems[0]}"


def test_patch_numbers_out_of_order_are_a_problem(vxl_project) -> None:
    project = vxl_project
    project.write_series(list(reversed(project.series_names())))
    assert "patches/series: patch numbers are not strictly increasing in series order" in lint_static(project.layout())


def test_duplicate_patch_numbers_are_a_problem(vxl_project) -> None:
    project = vxl_project
    second = project.patch_file(2)
    renamed = second.with_name(second.name.replace("0002-", "0001-"))
    second.rename(renamed)
    project.write_series([project.series_names()[0], renamed.name])
    assert any("not strictly increasing" in p for p in lint_static(project.layout()))


@pytest.mark.parametrize("missing", [*REQUIRED_FIELDS, "Effect-Check"])
def test_missing_header_field_is_a_problem(missing: str, vxl_project) -> None:
    project = vxl_project
    header = "".join(line + "\n" for line in synthetic.HEADER.splitlines() if not line.startswith(missing + ":"))
    assert header != synthetic.HEADER
    project.add_patch(
        Change(
            "utils: a change", {"vllm/utils.py": "def helper():\n    return 9\n"}, body="What and why.\n\n" + header
        ),
        project.patched_files(),
        3,
    )
    problems = lint_static(project.layout())
    assert problems == [f"0003-utils-a-change.patch: header field '{missing}:' is missing or empty"]


def test_empty_header_field_is_a_problem(vxl_project) -> None:
    project = vxl_project
    header = synthetic.HEADER.replace("Drop-When: never; it is a test.", "Drop-When:")
    project.add_patch(
        Change("utils: a change", {"vllm/utils.py": "x = 1\n"}, body="What.\n\n" + header), project.patched_files(), 3
    )
    assert any("'Drop-When:' is missing or empty" in p for p in lint_static(project.layout()))


def test_header_continuation_lines_are_read() -> None:
    fields = parse_fields(
        "Para.\n\nWhy: first line\n second line\nUpstream-Status: pending\nDrop-When: x\n\nNot: a field\n"
    )
    assert fields == {"Why": "first line second line", "Upstream-Status": "pending", "Drop-When": "x"}


def test_abbreviated_index_is_a_problem(vxl_project) -> None:
    project = vxl_project
    patch = project.edit_patch(
        1, lambda text: synthetic.replace_first(text, synthetic.INDEX_LINE, lambda m: f"index {m[1][:9]}..{m[2][:9]}")
    )
    assert f"{patch.name}: abbreviated 'index' line (export with --full-index)" in lint_static(project.layout())


def test_patch_editing_an_overlay_file_is_a_problem(vxl_project) -> None:
    project = vxl_project
    project.add_patch(Change("touch the overlay", {"vllm/toy_overlay.py": "VALUE = 0\n"}), project.patched_files(), 3)
    assert "0003-touch-the-overlay.patch: edits vllm/toy_overlay.py, which is an overlay file" in lint_static(
        project.layout()
    )


def test_patch_creating_a_file_is_a_problem(vxl_project) -> None:
    """A new file belongs in overlay/ (what ``export`` makes of a tree commit that adds one is a
    patch; lint names it); the patch that only edits an upstream file is the control."""
    project = vxl_project
    project.add_patch(Change("add a module", {"vllm/brand_new.py": "VALUE = 1\n"}), project.patched_files(), 3)
    assert lint_static(project.layout()) == [
        "0003-add-a-module.patch: creates vllm/brand_new.py (a new file belongs in overlay/vllm/brand_new.py; "
        "patches edit upstream files)"
    ]
    project.add_patch(Change("utils: a change", {"vllm/utils.py": "x = 1\n"}), project.patched_files(), 4)
    assert len(lint_static(project.layout())) == 1


def test_environment_writes_and_generated_source_in_the_wheel_are_problems(vxl_project) -> None:
    """What the series does is decided when vLLM builds an object from its config: a packaged line
    that writes os.environ (a patch's added line, an overlay file's) or runs exec/eval is named; the
    controls read the environment, compare with it, or only mention the words in a comment."""
    project = vxl_project
    project.write_overlay(
        {
            "vllm/toy_overlay.py": "import os\n\nVALUE = os.environ.get('X')\n"
            "SAME = os.environ['X'] == '1'  # os.environ['X'] = '1' would leak, so would exec()\n"
        }
    )
    read = Change("utils: read a switch", {"vllm/utils.py": "import os\nX = os.environ.get('X')\n"})
    project.add_patch(read, project.patched_files(), 3)
    assert [p for p in lint_static(project.layout()) if "`" in p] == []
    project.write_overlay({"vllm/toy_overlay.py": "exec(compile('Y = 1', 'y', 'exec'))\n"})
    leak = Change("utils: leak a switch", {"vllm/utils.py": "import os\nos.environ['VLLM_SWITCH'] = '1'\n"})
    project.add_patch(leak, project.patched_files(), 4)
    assert [p for p in lint_static(project.layout()) if "`" in p] == [
        "vllm/toy_overlay.py: `exec(compile('Y = 1', 'y', 'exec'))` runs generated source (exec/eval); "
        "build the object instead",
        "vllm/utils.py: `os.environ['VLLM_SWITCH'] = '1'` writes os.environ; decide from the config the object "
        "is built with",
    ]


def test_conflicting_patch_fails_full_lint_but_not_static(vxl_project) -> None:
    project = vxl_project
    base = project.patched_files()
    base[ENVS] = base[ENVS].replace('"VLLM_TOY_20", "20"', '"VLLM_TOY_20", "twenty"')
    project.add_patch(
        Change("envs: conflict", {ENVS: base[ENVS].replace('"VLLM_TOY_21", "21"', '"VLLM_TOY_21", "x"')}), base, 3
    )
    assert lint_static(project.layout()) == []
    message = tool_error(lint, project.layout())
    assert "0003-envs-conflict.patch" in message and "no fuzz or offset" in message
    assert not project.tree.exists()


def test_overlay_shadowing_fails_full_lint(vxl_project) -> None:
    project = vxl_project
    project.write_overlay({"vllm/utils.py": "shadow\n"})
    assert "shadows upstream file vllm/utils.py" in tool_error(lint, project.layout())


def test_overlay_manifest_drift_fails_full_lint(vxl_project) -> None:
    project = vxl_project
    project.write_overlay({"vllm/utils.py": "shadow\n"})
    (project.root / "overlay.toml").write_text(f'[replaces]\n"vllm/utils.py" = "{"2" * 40}"\n')
    assert "upstream twin changed" in tool_error(lint, project.layout())
    (project.root / "overlay.toml").write_text(
        f'[replaces]\n"vllm/utils.py" = "{synthetic.blob_id(project.files["vllm/utils.py"])}"\n'
    )
    lint(project.layout())


@pytest.mark.parametrize("entry", ["0003 bad.patch", "not-a-patch.txt"])
def test_malformed_series_fails_lint(entry: str, vxl_project) -> None:
    (vxl_project.patches / "series").write_text((vxl_project.patches / "series").read_text() + entry + "\n")
    assert "malformed entry" in tool_error(lint, vxl_project.layout(), static_only=True)


def test_unsafe_patch_path_fails_lint(vxl_project) -> None:
    project = vxl_project
    project.edit_patch(1, lambda text: synthetic.moved_path(text, ENVS, "../x"))
    assert "unsafe path" in tool_error(lint, project.layout())


def test_lint_offline_with_empty_cache_says_what_is_missing(vxl_cold_project) -> None:
    message = tool_error(lint, vxl_cold_project.layout(), offline=True)
    assert "--offline" in message and "vllm-9.9.9.tar.gz" in message


def test_repository_series_is_statically_clean() -> None:
    """The project's own patches/ and overlay/ pass the static lint."""
    assert lint_static(Layout()) == []
