"""The test-side workarounds of pristine vLLM 0.34.0 on CPU (``xpu_laguna_cpu_workarounds``, a general
plugin in ``scripts/measure/series_attention``), against a stand-in ``vllm`` package that has each bug:
each acts only behind its own switch and only on the CPU platform. The live proof on pristine 0.34.0
(the failure without each, parity with transformers with both) is ``scripts.measure.stand_in_proof``
(docs/cpu-runs.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts.measure.emulation import PLUGIN_DIR
from scripts.measure.series_attention.xpu_laguna_cpu_workarounds import APPLIED_LINE, DFLASH_QKV_ENV, LAGUNA_BIAS_ENV
from tests.fake_vllm import run_probe, write_fake_vllm

FAKE = {
    # upstream's bug B: the loader ignores the routing bias (a `_bias` suffix it does not map)
    "model_executor/models/laguna.py": (
        "class _T:\n    def __init__(self, v): self.v = v\n    def to(self, dtype): return self\n"
        "    def copy_(self, other): self.v = other.v\n"
        "class _P:\n    def __init__(self): self.data = _T(0.0); self.dtype = 'float32'\n"
        "class _Mlp:\n    def __init__(self): self.p = _P()\n"
        "    def named_parameters(self): return [('experts.routed_experts.e_score_correction_bias', self.p)]\n"
        "class _Layer:\n    def __init__(self): self.mlp = _Mlp()\n"
        "class LagunaModel:\n    def __init__(self): self.layers = [_Layer(), _Layer()]\n"
        "    def load_weights(self, weights):\n"
        "        return {n for n, _ in weights if not n.endswith('_bias')}\n"
    ),
    # upstream's bug A: the CPU linear method empties qkv_proj.weight unless the layer opts out
    "model_executor/models/laguna_dflash.py": (
        "class QKVParallelLinear:\n    pass\n"
        "class DFlashLagunaModel:\n    def __init__(self): self.qkv = QKVParallelLinear()\n"
        "    def modules(self): return [self, self.qkv]\n"
    ),
}

PROBE = """
import json
import xpu_laguna_cpu_workarounds as plugin
plugin.register()
plugin.register()
from vllm.model_executor.models import laguna, laguna_dflash
m = laguna.LagunaModel()
T = type(m.layers[0].mlp.p.data)
loaded = m.load_weights([("layers.0.mlp.experts.e_score_correction_bias", T(0.5)),
                         ("layers.1.mlp.experts.e_score_correction_bias", T(-0.25)), ("layers.0.w", T(1.0))])
d = laguna_dflash.DFlashLagunaModel()
print(json.dumps({"bias": [layer.mlp.p.data.v for layer in m.layers], "loaded": sorted(loaded),
                  "skip_gemm": getattr(d.qkv, "_cpu_skip_gemm_dispatch", False)}))
"""


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = [PLUGIN_DIR, write_fake_vllm(tmp_path, FAKE)]
    return run_probe(PROBE, path, drop=(DFLASH_QKV_ENV, LAGUNA_BIAS_ENV), **env)


def test_without_switches_the_pristine_bugs_stay(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert json.loads(done.stdout) == {"bias": [0.0, 0.0], "loaded": ["layers.0.w"], "skip_gemm": False}
    assert APPLIED_LINE not in done.stderr


def test_each_switch_fixes_its_bug_alone(tmp_path: Path) -> None:
    bias = _run(tmp_path, **{LAGUNA_BIAS_ENV: "1"})
    got = json.loads(bias.stdout)
    assert got["bias"] == [0.5, -0.25] and got["skip_gemm"] is False
    assert "layers.1.mlp.experts.e_score_correction_bias" in got["loaded"]
    assert bias.stderr.count(f"{APPLIED_LINE}: {LAGUNA_BIAS_ENV}") == 1
    qkv = json.loads(_run(tmp_path, **{DFLASH_QKV_ENV: "1"}).stdout)
    assert qkv["skip_gemm"] is True and qkv["bias"] == [0.0, 0.0]


@pytest.mark.parametrize("platform", ["xpu"])
def test_nothing_off_cpu(tmp_path: Path, platform: str) -> None:
    done = _run(tmp_path, **{DFLASH_QKV_ENV: "1", LAGUNA_BIAS_ENV: "1", "FAKE_PLATFORM": platform})
    assert json.loads(done.stdout)["skip_gemm"] is False and APPLIED_LINE not in done.stderr


def test_the_plugin_folder_names_both_entry_points() -> None:
    entry = next(PLUGIN_DIR.glob("*.dist-info")) / "entry_points.txt"
    assert "xpu_laguna_cpu_workarounds = xpu_laguna_cpu_workarounds:register" in entry.read_text()
