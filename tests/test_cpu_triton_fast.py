"""The stand-in CPU runtime's Triton backend, tooling side (no torch, no Triton): what its ``.pth``
installs at start-up, the hook that applies the interpreter fixes when Triton imports its
interpreter, and the interpreter bench's command line. The fast path itself is compared with the
stock interpreter inside the runtime (tests/e2e/test_triton_interpreter_replay.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripts import cpu_triton
from tests.tool_run import assert_help_names, assert_usage_error, run_module

FIXES = "import sys, xpu_laguna_triton_cpu.interpreter_hook as h; print(sorted(f.__module__ for f in h._FIXES))"


def _python(code: str, tmp_path: Path, **env: str) -> list[str]:
    """``code`` in a fresh interpreter that sees the backend package (and ``tmp_path``)."""
    paths = os.pathsep.join([str(cpu_triton.HERE), str(tmp_path)])
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VXL_TRITON", "TRITON_"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": paths, **env},
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    return done.stdout.splitlines()


def test_the_pth_installs_the_fixes_without_importing_triton(tmp_path: Path) -> None:
    state = "print('triton' in sys.modules, __import__('os').environ['TRITON_INTERPRET'])"
    check = f"{cpu_triton.PTH_TEXT.strip()}\n{FIXES}\n{state}"
    fast, masks, record = (f"xpu_laguna_triton_cpu.{m}" for m in ("fast_launch", "masks", "record"))
    assert _python(check, tmp_path) == [str(sorted([fast, masks])), "False 1"]
    assert _python(check, tmp_path, VXL_TRITON_STOCK_INTERPRETER="1") == [str([masks]), "False 1"]
    assert _python(check, tmp_path, VXL_TRITON_RECORD=str(tmp_path)) == [str(sorted([fast, masks, record])), "False 1"]


def test_the_hook_fixes_the_interpreter_module_once_it_is_executed(tmp_path: Path) -> None:
    """A stand-in ``triton.runtime.interpreter``: a fix sees the executed module; registered after
    the import, it runs at once; the negative control: a module of another name is left alone."""
    package = tmp_path / "triton" / "runtime"
    package.mkdir(parents=True)
    (tmp_path / "triton" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "interpreter.py").write_text("VALUE = 1\n")
    (package / "jit.py").write_text("VALUE = 1\n")
    code = """
from xpu_laguna_triton_cpu.interpreter_hook import after_import
seen = []
after_import(lambda m: seen.append((m.__name__, m.VALUE)))
import triton.runtime.jit
print(seen)
import triton.runtime.interpreter
print(seen)
after_import(lambda m: seen.append(('again', m.VALUE)))
print(seen)
"""
    assert _python(code, tmp_path) == [
        "[]",
        "[('triton.runtime.interpreter', 1)]",
        "[('triton.runtime.interpreter', 1), ('again', 1)]",
    ]


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_module("scripts.bench.triton_interpreter", *argv, timeout=120)


def test_the_bench_explains_itself_and_refuses_bad_input(tmp_path: Path) -> None:
    assert_help_names(_bench("--help"), "--rounds", "--kernel", "VXL_TRITON_RECORD")
    assert_usage_error(_bench(str(tmp_path), "--rounds", "0"), "--rounds must be at least 1", alone=False)
    missing = _bench(str(tmp_path / "absent"))
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith("error: ") and "no such folder" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_the_fast_path_repeats_the_pinned_tritons_code() -> None:
    """The fast path copies Triton's launch code of one release and stands aside under any other:
    that release is the CPU runtime's pinned Triton, so a Triton bump in pins.toml fails here until
    the fast path is checked against the new interpreter (and TRITON_RELEASE moved with it)."""
    import ast

    from scripts.layout import Layout
    from scripts.pins import load_pins

    source = (cpu_triton.HERE / cpu_triton.PACKAGE / "fast_launch.py").read_text(encoding="utf-8")
    assigned = {
        node.targets[0].id: node.value.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    assert assigned["TRITON_RELEASE"] == load_pins(Layout().pins).cpu_runtime.triton
