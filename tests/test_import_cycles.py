"""No import cycles, counting imports inside functions too (they hide cycles): among scripts/
modules, and among the modules the overlay adds (overlay/vllm/..., and overlay/tests/xpu_laguna/,
whose modules import each other by their bare names). A ``vllm.`` import counts only when it
names a file that overlay/ holds; every other vllm module is upstream's and is left out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OVERLAY_TESTS = Path("tests") / "xpu_laguna"  # under overlay/: run with this folder on sys.path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, name: str, is_package: bool) -> list[str]:
    """The module names one import statement may load (absolute; relative ones resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    # "from pkg import mod" imports the submodule when there is one
    return [f"{base}.{alias.name}" if base else alias.name for alias in node.names] + ([base] if base else [])


def graph_of(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports (anywhere in its body); imports of
    modules not in ``modules`` are left out."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(node, name, is_package):
                if target in modules and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def import_graph(root: Path, package: str = "scripts") -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in its body)."""
    return graph_of({module_name(p, root): p for p in sorted((root / package).rglob("*.py"))})


def overlay_graph(overlay: Path) -> dict[str, set[str]]:
    """The overlay's own modules: ``vllm.*`` by their path under overlay/, the test folder's by
    their bare names."""
    modules = {module_name(p, overlay): p for p in sorted((overlay / "vllm").rglob("*.py"))}
    modules |= {p.stem: p for p in sorted((overlay / OVERLAY_TESTS).glob("*.py"))}
    return graph_of(modules)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_scripts_has_no_import_cycles() -> None:
    found = cycles(import_graph(ROOT))
    assert found == [], f"import cycles: {found}"


def test_the_overlay_has_no_import_cycles() -> None:
    graph = overlay_graph(ROOT / "overlay")
    # the walk reaches the overlay: its modules and an edge known to exist
    assert "vllm.xpu_laguna.attention.kernels" in graph["vllm.xpu_laguna.attention.exact"]
    found = cycles(graph)
    assert found == [], f"import cycles: {found}"


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    """Negative control: the kind of cycle rederive <-> verify_record had is detected."""
    pkg = tmp_path / "scripts"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from scripts.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from scripts import a\n    return a\nx = 1\n")
    (pkg / "c.py").write_text("import scripts.a\n")
    assert cycles(import_graph(tmp_path)) == [["scripts.a", "scripts.b"]]


def test_a_cycle_through_a_relative_import_is_found(tmp_path: Path) -> None:
    """Negative control: ``from . import`` and ``from ..x import`` edges are resolved."""
    pkg = tmp_path / "scripts" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "scripts" / "__init__.py").write_text("")
    (tmp_path / "scripts" / "top.py").write_text("from .sub import a\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from ..top import a\n    return a\n")
    assert cycles(import_graph(tmp_path)) == [["scripts.sub.a", "scripts.sub.b", "scripts.top"]]


def test_an_overlay_cycle_is_found_and_upstream_imports_are_left_out(tmp_path: Path) -> None:
    """Negative control: a 2-module cycle among overlay/vllm files and one among the overlay's
    test modules are reported; the upstream modules they import (absent from overlay/) are not
    nodes, so a cycle that would run through upstream is not claimed."""
    compilation = tmp_path / "vllm" / "compilation"
    compilation.mkdir(parents=True)
    (compilation / "a.py").write_text("from vllm.config import VllmConfig\nfrom vllm.compilation import b\n")
    (compilation / "b.py").write_text("def f():\n    import vllm.compilation.a\n")
    (compilation / "c.py").write_text("import vllm.config\nfrom vllm.compilation.a import x\n")
    tests = tmp_path / OVERLAY_TESTS
    tests.mkdir(parents=True)
    (tests / "driver.py").write_text("def main():\n    from standins import Graph\n")
    (tests / "standins.py").write_text("import driver\nfrom vllm.compilation import c\n")
    graph = overlay_graph(tmp_path)
    assert "vllm.config" not in graph and graph["vllm.compilation.c"] == {"vllm.compilation.a"}
    assert sorted(cycles(graph)) == [["driver", "standins"], ["vllm.compilation.a", "vllm.compilation.b"]]
