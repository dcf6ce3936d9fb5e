"""Requirements are declared once, in pyproject.toml ``[dependency-groups]``: the noxfile's sessions
and the CPU runtime get their lists from there, and include-group resolves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from scripts import REPO_ROOT, cpu_venv
from scripts.deps import PYPROJECT, dependency_group, dependency_groups
from scripts.errors import ToolError
from synthetic import tool_error

NOXFILE = REPO_ROOT / "noxfile.py"
_SPECIFIED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^]]*\])?\s*(==|>=|<=|~=|!=|<|>)")


def _canonical(requirements) -> list[str]:
    """Requirement strings as packaging writes them (nox's resolver returns that form)."""
    from packaging.requirements import Requirement

    return [str(Requirement(r)) for r in requirements]


def _declared() -> list[str]:
    """Every requirement string written in pyproject.toml's groups (not resolved)."""
    return [item for items in dependency_groups().values() for item in items if isinstance(item, str)]


def test_each_requirement_is_declared_once() -> None:
    from packaging.requirements import Requirement

    names = [Requirement(r).name.lower() for r in _declared()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert {"tool", "style", "test", "cpu-runtime"} <= set(dependency_groups())


def test_our_resolver_agrees_with_nox_for_every_group() -> None:
    import nox.project

    pyproject = nox.project.load_toml(PYPROJECT)
    for group in dependency_groups():
        ours = _canonical(dependency_group(group))
        assert ours == list(dict.fromkeys(nox.project.dependency_groups(pyproject, group))), group


def _install_calls(tree: ast.Module) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "install"
    ]


def _string_literals(tree: ast.Module) -> list[str]:
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_noxfile_installs_only_dependency_groups() -> None:
    tree = ast.parse(NOXFILE.read_text(encoding="utf-8"))
    calls = _install_calls(tree)
    assert len(calls) >= 8
    for call in calls:
        # session.install(*deps("group", ...)): no requirement written in the noxfile
        assert len(call.args) == 1 and isinstance(call.args[0], ast.Starred), ast.unparse(call)
        inner = call.args[0].value
        assert isinstance(inner, ast.Call) and ast.unparse(inner.func) == "deps", ast.unparse(call)
        for group in inner.args:
            if isinstance(group, ast.Constant):
                assert dependency_group(group.value), group.value  # a group pyproject.toml has
    assert "nox.project.dependency_groups(PYPROJECT" in ast.unparse(tree)
    # the whole noxfile has no requirement string literal
    literals = _string_literals(tree)
    assert not [s for s in literals if _SPECIFIED.match(s)], [s for s in literals if _SPECIFIED.match(s)]
    assert not (set(literals) - _MODULE_NAMES) & set(_declared())


_MODULE_NAMES = {"pytest"}  # `python -m pytest`: a module the session runs, not a requirement


def test_no_requirement_is_written_twice_in_the_tooling() -> None:
    """No pinned requirement of pyproject.toml appears as a string literal in the noxfile or scripts/
    (docstrings may name one in prose)."""
    pinned = {r for r in _declared() if _SPECIFIED.match(r)}
    assert "ruff==0.14.0" in pinned and "unidiff>=0.7.5" in pinned
    found = []
    for path in [NOXFILE, *sorted((REPO_ROOT / "scripts").rglob("*.py"))]:
        literals = _string_literals(ast.parse(path.read_text(encoding="utf-8")))
        found += [f"{path.relative_to(REPO_ROOT)}: {s}" for s in literals if s in pinned]
    assert not found, found


def test_cpu_runtime_gets_its_tools_from_the_group() -> None:
    import nox.project

    group = nox.project.dependency_groups(nox.project.load_toml(PYPROJECT), "cpu-runtime")
    assert _canonical(cpu_venv.runtime_tools()) == list(group)
    assert {"pytest>=8", "uv", "unidiff>=0.7.5"} <= set(cpu_venv.runtime_tools())
    source = Path(cpu_venv.__file__).read_text(encoding="utf-8")
    assert not [s for s in _string_literals(ast.parse(source)) if s in _declared()]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_group_including_another_resolves(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "[dependency-groups]\n"
        'base = ["a>=1", "b"]\n'
        'Mid_Group = [{include-group = "base"}, "c==2"]\n'
        'top = ["d", {include-group = "mid-group"}, {include-group = "BASE"}, "b"]\n',
    )
    assert dependency_group("top", path) == ("d", "a>=1", "b", "c==2")  # nested, normalized names, each once
    assert dependency_group("mid.group", path) == ("a>=1", "b", "c==2")
    # the real file: test includes tool, and the runtime's group includes the test runner
    assert set(dependency_group("tool")) < set(dependency_group("test"))
    assert set(dependency_group("pytest")) < set(dependency_group("cpu-runtime"))


@pytest.mark.parametrize(
    ("text", "group", "expected"),
    [
        ('a = [{include-group = "b"}]\nb = [{include-group = "a"}]\n', "a", "includes itself (a -> b)"),
        ('a = [{include-group = "missing"}]\n', "a", "no dependency group 'missing'"),
        ('a = ["x"]\n', "absent", "no dependency group 'absent' (there are: a)"),
        ('a = [{include = "b"}]\n', "a", "has an invalid item"),
        ('a = ["x"]\nA = ["y"]\n', "a", "declared twice"),
    ],
)
def test_invalid_groups_are_one_line_errors(tmp_path: Path, text: str, group: str, expected: str) -> None:
    path = _write(tmp_path, "[dependency-groups]\n" + text)
    assert expected in tool_error(dependency_group, group, path)


def test_a_missing_table_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"no \[dependency-groups\] table"):
        dependency_group("tool", _write(tmp_path, "[tool.other]\nx = 1\n"))
