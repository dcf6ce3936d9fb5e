"""``--emulate-graphs``: the sitecustomize hook that installs the emulated breakable graphs in
every vLLM process of a CPU server, and only there. Runs against a stand-in ``vllm`` package and a
stand-in test-side package (the hook's contract: call ``install_cpu_emulation`` once the breakable-graph
package, or one of its modules, or the CPU runner module is imported); the live run against the real
server is in the README."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.measure.crossover import parser
from scripts.measure.emulation import MARK_ENV, SITE_DIR, emulated_graphs_env

PROBE = """
import sys
started_with_vllm = any(m.split(".")[0] == "vllm" for m in sys.modules)
import {module}
import xpu_laguna_standins.emulated_graphs as emulation
print(started_with_vllm, emulation.CALLS)
"""


def _fake_vllm(root: Path) -> Path:
    pkg = root / "vllm"
    (pkg / "compilation").mkdir(parents=True)
    (pkg / "v1" / "worker").mkdir(parents=True)
    for init in (pkg, pkg / "compilation", pkg / "v1", pkg / "v1" / "worker"):
        (init / "__init__.py").write_text("")
    (pkg / "compilation" / "xpu_breakable_graph").mkdir()
    (pkg / "compilation" / "xpu_breakable_graph" / "__init__.py").write_text("")
    (pkg / "compilation" / "xpu_breakable_graph" / "config.py").write_text("")
    (pkg / "v1" / "worker" / "cpu_worker.py").write_text("")
    (pkg / "other.py").write_text("")
    # the CPU runtime's test-side stand-ins (laid next to vllm/ by cpu_runtime sync)
    standins = root / "xpu_laguna_standins"
    standins.mkdir()
    (standins / "__init__.py").write_text("")
    (standins / "emulated_graphs.py").write_text(
        "CALLS = 0\n\ndef install_cpu_emulation():\n    global CALLS\n    CALLS += 1\n"
    )
    return root


def _run(tmp_path: Path, module: str, **env: str) -> str:
    root = _fake_vllm(tmp_path)
    clean = {k: v for k, v in os.environ.items() if k not in (MARK_ENV, "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH")}
    full = {**clean, **env, "PYTHONPATH": f"{env.get('PYTHONPATH', '')}{os.pathsep}{root}"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)], env=full, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    "module",
    [
        "vllm.compilation.xpu_breakable_graph",
        "vllm.compilation.xpu_breakable_graph.config",  # what the config's checks import
        "vllm.v1.worker.cpu_worker",  # what a CPU worker process imports before it loads the model
    ],
)
def test_hook_installs_once_when_vllm_loads_the_wrapper_or_the_cpu_worker(tmp_path: Path, module: str) -> None:
    out = _run(tmp_path, module, VLLM_XPU_LAGUNA_BREAKABLE_GRAPH="1", **emulated_graphs_env())
    assert out == "False 1"  # nothing of vLLM imported at start-up; installed once


def test_hook_installs_once_for_both_modules(tmp_path: Path) -> None:
    module = "vllm.compilation.xpu_breakable_graph, vllm.v1.worker.cpu_worker"
    out = _run(tmp_path, module, VLLM_XPU_LAGUNA_BREAKABLE_GRAPH="1", **emulated_graphs_env())
    assert out == "False 1"


def test_hook_does_nothing_for_other_modules(tmp_path: Path) -> None:
    out = _run(tmp_path, "vllm.other", VLLM_XPU_LAGUNA_BREAKABLE_GRAPH="1", **emulated_graphs_env())
    assert out == "False 0"


@pytest.mark.parametrize(
    "env",
    [
        {"VLLM_XPU_LAGUNA_BREAKABLE_GRAPH": "0"},  # a leg without graphs (control legs, teacher)
        {"VLLM_XPU_LAGUNA_BREAKABLE_GRAPH": "1", MARK_ENV: "0"},  # not asked for
    ],
)
def test_hook_stays_off_without_toggle_and_marker(tmp_path: Path, env: dict[str, str]) -> None:
    full = {**env, "PYTHONPATH": str(SITE_DIR)}
    assert _run(tmp_path, "vllm.compilation.xpu_breakable_graph", **full) == "False 0"


def test_crossover_option_puts_the_hook_on_the_path() -> None:
    args = parser().parse_args(["--treatment", "A=1", "--model", "m", "--emulate-graphs"])
    assert args.emulate_graphs is True
    assert (SITE_DIR / "sitecustomize.py").is_file()
    assert emulated_graphs_env() == {"PYTHONPATH": str(SITE_DIR), MARK_ENV: "1"}
    assert "--emulate-graphs" in parser().format_help()
