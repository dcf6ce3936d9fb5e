"""Pristine vLLM 0.34.0 on its stand-in CPU runtime serves the tiny Laguna: greedy tokens equal to transformers.

Run by ``nox -s stand_in`` INSIDE the pristine stand-in runtime's python (pins.toml's release,
``cpu_runtime ensure --pristine``: a folder of its own, never synced with the series' tree); anywhere
else every test here is skipped. ``nox -s tests`` does not collect this folder (``--ignore=tests/stand_in``), and
``nox -s cpu_tests`` runs ``tests/e2e`` only.

Each case is one engine of :mod:`scripts.measure.stand_in_proof` (a fresh interpreter with the
engine core in it at TP 1, or a ``vllm serve`` on loopback, under a CPU slot lease, the 3 prompts
batched with ``max_num_seqs=3``, 16 greedy tokens each) with the workaround
switches it names (``scripts/measure/series_attention/xpu_laguna_cpu_workarounds.py``):

* offline and through the OpenAI server, the target with the bias fix (B) and DFlash with both
  fixes (A, B): greedy tokens equal to transformers' plain greedy decode;
* the negative controls: the target without B differs; DFlash without A fails with the
  ``IndexError`` of bug A;
* TP 2 (multiprocessing executor) with B: equal.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest
from proof_log import RESULTS

from scripts.cpu_stand_in import STAND_IN, this_runtime
from scripts.layout import Layout

RELEASE = "0.34.0"
TOKENS = 16
TIMEOUT_S = 600.0
RUNTIME = this_runtime()

pytestmark = pytest.mark.skipif(
    RUNTIME.get("mode") != STAND_IN or RUNTIME.get("release") != RELEASE,
    reason=f"not the stand-in CPU runtime of vLLM {RELEASE} (run by `nox -s stand_in`): {RUNTIME.get('line')}",
)


@pytest.fixture(scope="module")
def models() -> Path:
    folder = Layout().tiny_models
    if not (folder / "target" / "config.json").is_file() or not (folder / "draft" / "config.json").is_file():
        pytest.fail(f"no tiny Laguna pair in {folder} (`python -m scripts.cpu_runtime ensure --pristine` makes it)")
    return folder


def proof(case: str, models: Path, tp: int = 1) -> dict[str, Any]:
    """One case run and judged against transformers (``got``: equal, differs or fails)."""
    from scripts.measure.stand_in_proof import Engine, judge, run_case

    # offline at TP 1: the engine core in the case's interpreter (13-16 s less per engine, the same
    # kernels); the served cases and TP 2 keep vLLM's processes
    engine = Engine(models, TOKENS, tp, in_process=tp == 1 and not case.startswith("served:"))
    result = run_case(case, engine, TIMEOUT_S)
    judge([result], models, TOKENS)
    kept = {k: v for k, v in result.items() if k != "rows"}
    RESULTS.append({"case": f"{case} (TP {tp})" if tp > 1 else case, **{k: v for k, v in kept.items() if k != "case"}})
    return kept


def test_runtime_is_pristine() -> None:
    """The runtime's vllm is the release's own tree: no tree synced into it."""
    from scripts.cpu_runtime import SYNC_MARKER

    package = Path(sysconfig.get_paths()["purelib"]) / "vllm"
    assert not (package / SYNC_MARKER).exists(), f"{package} has a synced tree ({SYNC_MARKER}): not pristine"
    assert RUNTIME["release"] == RELEASE and "own Python tree" in str(RUNTIME["line"])


@pytest.mark.parametrize(
    ("case", "switches"),
    [
        ("target+B", ["XPU_LAGUNA_CPU_FIX_LAGUNA_BIAS"]),
        ("dflash+A+B", ["XPU_LAGUNA_CPU_FIX_DFLASH_QKV", "XPU_LAGUNA_CPU_FIX_LAGUNA_BIAS"]),
        ("served:target+B", ["XPU_LAGUNA_CPU_FIX_LAGUNA_BIAS"]),
        ("served:dflash+A+B", ["XPU_LAGUNA_CPU_FIX_DFLASH_QKV", "XPU_LAGUNA_CPU_FIX_LAGUNA_BIAS"]),
    ],
)
def test_equal_to_transformers(case: str, switches: list[str], models: Path) -> None:
    result = proof(case, models)
    assert result["got"] == "equal", result
    assert result["workarounds_applied"] == switches, result


def test_target_without_the_bias_fix_differs(models: Path) -> None:
    """Bug B's negative control: routing with a zero bias, tokens differ from transformers."""
    result = proof("target", models)
    assert result["ok"] and result["workarounds_applied"] == [], result
    assert result["got"] == "differs", result


def test_dflash_without_the_qkv_fix_fails(models: Path) -> None:
    """Bug A's negative control: the drafter's emptied qkv weight, IndexError at the fused-KV transpose."""
    result = proof("dflash+B", models)
    assert result["got"] == "fails", result
    assert result["error"].startswith("IndexError: Dimension out of range"), result


def test_tp2_equal_to_transformers(models: Path) -> None:
    result = proof("target+B", models, tp=2)
    assert result["got"] == "equal", result
