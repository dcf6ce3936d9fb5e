"""The series-attention plugin of CPU server legs (``scripts/measure/series_attention``), against a
stand-in ``vllm`` package: found as a ``vllm.general_plugins`` entry point through ``PYTHONPATH``
alone; registers FlashAttention under ``CPU_ATTN`` once, only with the marker and only on the CPU
platform; prints the overlay's counters when they change. The live proof against a real server is
``tests/e2e/test_served_series_attention.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.measure.crossover import parser
from scripts.measure.emulation import PLUGIN_DIR, series_attention_env
from scripts.measure.series_attention.xpu_laguna_cpu_attention import (
    COUNTERS_LINE,
    FLASH_ATTN,
    MARK_ENV,
    REGISTERED_LINE,
)

FAKE_MODULES = {
    "platforms/__init__.py": (
        "import os\n"
        "class _P:\n"
        "    def is_cpu(self):\n"
        "        return os.environ.get('FAKE_PLATFORM', 'cpu') == 'cpu'\n"
        "current_platform = _P()\n"
    ),
    "v1/attention/selector.py": (
        "class _Cache:\n    clears = 0\n    def cache_clear(self):\n        _Cache.clears += 1\n"
        "_cached_get_attn_backend = _Cache()\n"
    ),
    "v1/attention/backends/registry.py": (
        "import enum\nCALLS = []\n"
        "class AttentionBackendEnum(enum.Enum):\n    CPU_ATTN = 'CPU_ATTN'\n"
        "def register_backend(backend, class_path=None):\n    CALLS.append((backend.name, class_path))\n"
    ),
    "xpu_laguna/attention/exact.py": (
        "class _C:\n    widths = {}\n"
        "    def snapshot(self):\n"
        "        return {'exact_calls_by_width': dict(self.widths), 'prebuilt_calls': sum(self.widths.values())}\n"
        "counters = _C()\n"
    ),
}

PROBE = """
import json, sys, time
import xpu_laguna_cpu_attention as plugin
plugin.register()
plugin.register()  # vLLM may load general plugins more than once
from vllm.v1.attention.backends import registry
from vllm.v1.attention import selector
from vllm.xpu_laguna.attention import exact
exact.counters.widths = {"8": 3}
time.sleep(4 * plugin.REPORT_PERIOD_S)
print(json.dumps({"calls": registry.CALLS, "clears": selector._cached_get_attn_backend.clears}))
"""


def _fake_vllm(root: Path) -> Path:
    for rel, text in FAKE_MODULES.items():
        path = root / "vllm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [p for p in (root / "vllm").rglob("*") if p.is_dir()] + [root / "vllm"]:
        (folder / "__init__.py").touch(exist_ok=True)
    return root


def _run(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (MARK_ENV, "PYTHONPATH")}
    path = os.pathsep.join([env.pop("PYTHONPATH", str(PLUGIN_DIR)), str(_fake_vllm(tmp_path))])
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


def test_the_folder_on_pythonpath_is_a_general_plugin(tmp_path: Path) -> None:
    code = (
        "from importlib.metadata import entry_points\n"
        "print([e.value for e in entry_points(group='vllm.general_plugins')])\n"
    )
    assert "xpu_laguna_cpu_attention:register" in _run(tmp_path, code).stdout
    without = _run(tmp_path, code, PYTHONPATH=str(tmp_path))
    assert "xpu_laguna_cpu_attention:register" not in without.stdout


def test_registers_once_on_cpu_and_prints_the_counters(tmp_path: Path) -> None:
    done = _run(tmp_path, PROBE, **{MARK_ENV: "1"})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"calls": [["CPU_ATTN", FLASH_ATTN]], "clears": 1}
    lines = done.stderr.splitlines()
    assert sum(REGISTERED_LINE in line for line in lines) == 1
    counted = [line for line in lines if COUNTERS_LINE in line]
    assert len(counted) == 1, counted  # printed when they change, not every tick
    assert '{"exact_calls_by_width": {"8": 3}, "prebuilt_calls": 3} (pid ' in counted[0]


@pytest.mark.parametrize("env", [{MARK_ENV: "0"}, {MARK_ENV: "1", "FAKE_PLATFORM": "xpu"}])
def test_does_nothing_without_the_marker_or_off_cpu(tmp_path: Path, env: dict[str, str]) -> None:
    done = _run(tmp_path, PROBE, **env)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"calls": [], "clears": 0}
    assert REGISTERED_LINE not in done.stderr and COUNTERS_LINE not in done.stderr


def test_the_hook_is_its_folder_and_marker() -> None:
    assert series_attention_env() == {"PYTHONPATH": str(PLUGIN_DIR), MARK_ENV: "1"}


def test_crossover_uses_the_series_attention_unless_told_not_to() -> None:
    args = parser().parse_args(["--treatment", "A=1", "--model", "m"])
    assert args.upstream_cpu_attention is False
    args = parser().parse_args(["--treatment", "A=1", "--model", "m", "--upstream-cpu-attention"])
    assert args.upstream_cpu_attention is True
    assert "--upstream-cpu-attention" in parser().format_help()
