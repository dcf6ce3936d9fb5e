"""``scripts.device.graph_check``: the parts that run without a device (its options, the
leg plan, the result table and the no-device refusal; bad command lines:
tests/test_tool_usage_errors.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts.device import graph_check as gc
from tests.tool_run import assert_help_names, run_module


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_module("scripts.device.graph_check", *argv, timeout=60)


def test_help() -> None:
    assert_help_names(_run("--help"), "--metadata", "--spec")


def _options(line: str) -> dict[str, object]:
    """The JSON of ``--additional-config '...'`` in a dry-run line."""
    start = line.index("--additional-config '") + len("--additional-config '")
    return json.loads(line[start : line.index("'", start)])


def test_dry_run_plan() -> None:
    proc = _run("--dry-run", "--device", "xpu", "--width", "4")
    assert proc.returncode == 0
    legs = [ln.split()[0] for ln in proc.stdout.splitlines()[1:]]
    assert legs == ["off-md0", "on-md0", "off-md1", "on-md1"]
    on = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("on-md1"))
    assert _options(on) == {"xpu_laguna": {"breakable_graph": True, "prebuilt_metadata": True, "verify_width": 4}}
    assert "VLLM_XPU_ENABLE_XPU_GRAPH" not in proc.stdout  # gone in vLLM 0.32.0 (graphs on by default)
    assert "VLLM_XPU_LAGUNA_" not in proc.stdout  # the options travel in the engine's config
    off = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("off-md0"))
    assert _options(off) == {"xpu_laguna": {"breakable_graph": False, "prebuilt_metadata": False, "verify_width": 4}}


def test_series_options_go_under_the_legs_own() -> None:
    given = json.dumps({"exact_verify": True, "breakable_graph": True, "verify_width": 8, "row_invariant_moe": "off"})
    proc = _run("--dry-run", "--device", "xpu", "--width", "4", "--metadata", "off", "--series-options", given)
    assert proc.returncode == 0, proc.stderr
    off = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("off-md0"))
    assert _options(off)["xpu_laguna"] == {
        "exact_verify": True,
        "row_invariant_moe": "off",
        "breakable_graph": False,  # the leg's own switch wins
        "prebuilt_metadata": False,
        "verify_width": 4,
    }
    bad = _run("--dry-run", "--series-options", '{"verify_width": 40}')
    assert bad.returncode == 2 and "verify_width']: must be 1..16, not 40" in bad.stderr


def test_table_marks_token_mismatch_and_speedup() -> None:
    def result(graphs: bool, tokens: list[list[int]], step_ms: float) -> gc.LegResult:
        return gc.LegResult(
            leg=gc.Leg(graphs=graphs, metadata=False),
            tokens=tokens,
            step_ms=[step_ms] * 10,
        )

    table = gc.render_table([result(False, [[1, 2, 3]], 30.0), result(True, [[1, 2, 4]], 10.0)])
    rows = table.splitlines()
    assert rows[2].split()[3] == "yes"  # the reference itself
    assert rows[3].split()[3] == "NO"
    assert rows[3].split()[8] == "3.00x"


def test_table_shows_graph_counts_of_target_and_drafter() -> None:
    acc = {
        "target": {"graphs": 146, "breaks": 145, "replays": 300, "captures": [{}]},
        "drafter": {"graphs": 4, "breaks": 3, "replays": 301, "captures": [{}]},
    }
    leg = gc.LegResult(leg=gc.Leg(graphs=True, metadata=False), tokens=[[1]], step_ms=[1.0], graphs=acc)
    row = gc.render_table([leg]).splitlines()[2]
    assert row.endswith("T 146/145/300 D 4/3/301")
    assert gc.graph_counts({}) == "-"


def test_long_prompt_is_past_4k_tokens_by_default_and_sizes_the_model_len() -> None:
    args = gc.build_parser().parse_args([])

    def encode(text: str) -> list[int]:
        return [len(word) for word in text.split()]

    prompts = gc.prompts_for(args, encode)
    assert len(prompts) == 1 + args.prompts
    assert len(prompts[0]["prompt_token_ids"]) == args.long_prompt_tokens > 4096
    assert gc.max_model_len(args) >= 4096 + args.tokens
    assert args.min_cycles >= 200
    args = gc.build_parser().parse_args(["--long-prompt-tokens", "0"])
    assert len(gc.prompts_for(args, encode)) == args.prompts
    assert gc.max_model_len(args) == 512


def test_no_device_is_reported_as_not_run(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        pytest.skip("a device is present: this checks the refusal without one")
    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    proc = _run("--models", str(tmp_path), "--tokens", "2")
    assert proc.returncode == gc.NO_DEVICE_EXIT
    assert "graph check not run" in proc.stderr
