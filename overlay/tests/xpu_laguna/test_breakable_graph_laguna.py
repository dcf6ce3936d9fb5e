# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Breakable graph capture through a real tiny Laguna forward on CPU.

Two stand-ins for device graphs: one that only logs capture and replay
(counts and order), and one that records kernels without running them at
capture and re-runs them on replay (numerics; breakable_graph_standins.py).

The observations come from ``breakable_graph_driver.py``, run once in its
own process (the fake tensor-parallel size must not leak into other tests);
the series' options (breakable graphs on) are in each config it builds.
Every attention and collective call site of vLLM's Laguna model is
reached; device graphs are a stand-in that logs capture and replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from laguna_model_testlib import run_driver

DRIVER = Path(__file__).with_name("breakable_graph_driver.py")
LAYERS = (1, 2, 3)
TP_SIZES = (1, 2, 4)
# All-MoE variants (FusedMoE with shared expert: one all-reduce per layer).
# The CPU MoE kernel rejects the tiny expert width split in two (TP 2).
MOE_TP_SIZES = (1, 4)
# DFlash drafter depths (dense full-attention layers, as the tiny drafter).
DRAFTER_LAYERS = (1, 2)


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_driver(
        DRIVER,
        tmp_path_factory.mktemp("breakable-graph"),
        "--layers",
        *map(str, LAYERS),
        "--tp",
        *map(str, TP_SIZES),
        "--moe-tp",
        *map(str, MOE_TP_SIZES),
        "--drafter-layers",
        *map(str, DRAFTER_LAYERS),
    )


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert "crash" not in result, result["crash"]
    return result


def _refused(result: dict[str, Any], error: str, *texts: str) -> None:
    """The driver's record of a refused call: ``error`` raised, with each of
    ``texts`` in its message."""
    assert result["error"] == error, result
    for text in texts:
        assert text in result["message"], (text, result["message"])


def _expected_kinds(layers: int, tp: int) -> list[str]:
    """graph, then per layer: attention (+ o_proj and MLP all-reduce at TP>1),
    each break followed by a graph segment; the embedding all-reduce first."""
    kinds = ["graph"]
    if tp > 1:
        kinds += ["collective", "graph"]
    for _ in range(layers):
        kinds += ["attention", "graph"]
        if tp > 1:
            kinds += ["collective", "graph", "collective", "graph"]
    return kinds


COUNT_CASES = [(layers, tp, "dense") for layers in LAYERS for tp in TP_SIZES] + [
    (layers, tp, "moe") for layers in LAYERS for tp in MOE_TP_SIZES
]


@pytest.mark.parametrize(("layers", "tp", "mlp"), COUNT_CASES)
def test_counts_match_topology(observed, layers: int, tp: int, mlp: str) -> None:
    r = _ok(observed[f"counts/L{layers}/tp{tp}/{mlp}"])
    assert r["num_attention_modules"] == layers
    assert r["num_moe_layers"] == (layers if mlp == "moe" else 0)
    collective = 2 * layers + 1 if tp > 1 else 0
    assert r["counts"] == {
        "graph": layers + collective + 1,
        "attention": layers,
        "collective": collective,
    }
    assert r["breaks"] == layers + collective
    assert r["graphs"] == r["breaks"] + 1
    assert r["expected"] == {
        "attention": layers,
        "collective": collective,
        "graphs": layers + collective + 1,
        "ceiling": 2 * (2 * (layers + collective) + 1),
    }
    assert r["kinds"] == _expected_kinds(layers, tp)
    # One audited line for the one captured shape.
    assert len(r["audit"]) == 1
    line = r["audit"][0]
    assert f"graphs={r['graphs']} breaks={r['breaks']}" in line
    assert f"collective={collective}" in line and "materialised=yes" in line


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("layers", DRAFTER_LAYERS)
def test_drafter_counts_match_topology(observed, layers: int, tp: int) -> None:
    """The DFlash drafter, called as the proposer calls it (it embeds the
    query tokens itself), breaks at the embedding all-reduce and twice per
    layer at TP > 1: 2L + 1 collectives, as the wrapper expects."""
    r = _ok(observed[f"drafter/L{layers}/tp{tp}"])
    assert r["model"] == "XpuLagunaDFlashForCausalLM"  # the class vLLM resolves
    assert r["num_attention_modules"] == layers
    collective = 2 * layers + 1 if tp > 1 else 0
    counts = {
        "graph": layers + collective + 1,
        "attention": layers,
        "collective": collective,
    }
    assert r["counts"] == counts
    assert r["expected"] == {
        "attention": layers,
        "collective": collective,
        "graphs": counts["graph"],
    }
    assert r["kinds"] == _expected_kinds(layers, tp)
    acc = r["accounting"]
    assert acc["label"] == "drafter" and acc["graphs"] == counts["graph"]
    assert acc["captures"][0]["breaks_by_kind"] == {
        "attention": layers,
        "collective": collective,
    }
    if tp == 1:  # no collectives: nothing for either control to miss
        assert r["without_embedding"]["error"] is None
        assert r["precomputed_embeds"]["error"] is None
        return
    # Controls: a count without the embedding all-reduce (2L) is refused...
    wrong = r["without_embedding"]
    _refused(
        wrong,
        "TopologyMismatchError",
        f"collective={collective}) differs",
        f"expected graphs={counts['graph'] - 1} ",
    )
    assert wrong["capture_slot_clear"] is True
    # ...and so is a drafter that skips it (precomputed embeddings).
    _refused(
        r["precomputed_embeds"],
        "TopologyMismatchError",
        f"collective={2 * layers}) differs",
    )


def _events_by_kind(events: list[list[Any]]) -> list[str]:
    return [e[0] for e in events]


@pytest.mark.parametrize("layers", (1, 3))
@pytest.mark.parametrize("tp", (1, 2))
def test_first_capture_materialises_each_segment(observed, layers, tp) -> None:
    """Each closed segment is replayed right after capture_end, before the
    eager break that consumes it, and the last one before returning."""
    r = _ok(observed[f"counts/L{layers}/tp{tp}/dense"])
    ev = r["capture_events"]
    eager = {"collective": "all_reduce", "attention": "attention"}
    expected: list[str] = []
    for kind in r["kinds"]:
        if kind == "graph":
            expected += ["begin", "end", "replay"]
        else:
            expected.append(eager[kind])
    assert _events_by_kind(ev) == expected
    # Replayed graph is the one just closed.
    for i, e in enumerate(ev):
        if e[0] == "replay":
            assert ev[i - 1] == ["end", e[1]]
    assert ev[-1][0] == "replay"


@pytest.mark.parametrize("layers", (1, 3))
@pytest.mark.parametrize("tp", (1, 2, 4))
def test_replay_order_and_inplace_buffers(observed, layers, tp) -> None:
    """Replay runs graphs and eager breaks in capture order, on the same
    graphs, and every collective reduces into the buffer of its capture."""
    r = _ok(observed[f"counts/L{layers}/tp{tp}/dense"])
    cap = [e for e in r["capture_events"] if e[0] != "begin" and e[0] != "end"]
    assert r["replay_events"] == cap
    assert r["replay_returns_captured_output"] is True
    buffers = [e[1] for e in r["replay_events"] if e[0] == "all_reduce"]
    assert len(buffers) == (2 * layers + 1 if tp > 1 else 0)
    assert len(set(buffers)) == len(buffers)  # one owned buffer per call site
    # ... and that buffer is the slot the wrapper allocated before the capture,
    # in break order (no allocation inside the captured forward)
    assert buffers == r["collective_slots"]
    assert len(r["collective_slots"]) == (2 * layers + 1 if tp > 1 else 0)
    attn = [e[1] for e in r["replay_events"] if e[0] == "attention"]
    assert attn == [f"model.layers.{i}.self_attn.attn" for i in range(layers)]


@pytest.mark.parametrize("tp", TP_SIZES)
def test_capture_and_replay_match_eager_bitwise(observed, tp: int) -> None:
    """Real attention (CPU kernels, per-layer metadata, KV cache), graphs
    that record and do not run during capture (breakable_graph_standins):
    the first capture's output equals the eager forward only because every
    segment is materialised, and a replay after new inputs were copied into
    the same buffers equals the eager forward on those inputs."""
    r = _ok(observed[f"numerics/L3/tp{tp}"])
    assert r["graphs"] == (3 + 7 + 1 if tp > 1 else 3 + 1)
    assert r["replays_at_capture"] == [1] * r["graphs"]
    assert r["capture_has_nan"] is False
    assert r["capture_equals_eager"] is True, r["capture_max_abs_diff"]
    assert r["inputs_change_output"] is True
    assert r["replay_is_captured_output"] is True
    assert r["replay_changed_output"] is True
    assert r["replay_equals_eager"] is True, r["replay_max_abs_diff"]


def test_eager_mode_has_no_breaks(observed) -> None:
    r = _ok(observed["counts/L2/tp2/dense"])
    assert _events_by_kind(r["eager_events"]) == ["attention", "attention"]


def test_ceiling_refuses_capture(observed) -> None:
    r = _ok(observed["ceiling"])
    # TP 1 expectation for 3 layers: 3 breaks, 7 segments, ceiling 14; the
    # TP 2 forward reaches the 14th segment at its 7th break.
    _refused(r, "CaptureCeilingError", "ceiling of 14 segments", "graphs=7 breaks=7")
    assert r["capture_slot_clear"] is True
    _refused(
        r["mismatch"],
        "TopologyMismatchError",
        "attention=3 collective=7",
        "attention=4 collective=9",
    )


def test_identity_guard(observed) -> None:
    r = _ok(observed["guard"])
    assert r["metadata_reference"]["error"] is None
    assert r["same_buffers"]["error"] is None
    for case, text in {
        "moved_input": "kwargs['input_ids']",
        "strided_view": "kwargs['positions']",
        "slot_mapping_moved": "slot_mapping",
        # same pointer, other stride: only the debug structural check sees it
        "same_pointer_other_stride_debug": "kwargs['positions']",
    }.items():
        _refused(r[case], "StaticInputMismatchError", text)
    # Attention metadata is read by the eager attention only: not guarded
    # (DFlash rebuilds it from new tensors every step).
    for case in (
        "metadata_moved",
        "metadata_new_layout",
        "metadata_first_layout_again",
        "metadata_new_layout_moved",
        "metadata_offset",
    ):
        assert r[case]["error"] is None, (case, r[case])
    # Same pointer, other stride: the default guard lets it through.
    assert r["same_pointer_other_stride"]["error"] is None


def test_out_of_place_break_is_caught(observed) -> None:
    r = _ok(observed["out_of_place"])
    assert r["decorator_active"] is True
    assert r["breaks"] == 2 + 5  # attention + collectives, all via decorator
    # The embedding all-reduce is the first break.
    _refused(r["replay"], "OutOfPlaceBreakError", "eager break 1 ", "write in place")


def _graph_fields(width: int) -> dict[str, Any]:
    return {
        "mode": 0,
        "cudagraph_mode": "PIECEWISE",
        "sizes": [width],
        "max": width,
        "use_breakable_cudagraph": True,  # upstream's path on in this config
        "env": None,  # and nothing written to the environment
    }


UNCONFIGURED = {
    "mode": None,
    "cudagraph_mode": None,
    "sizes": None,
    "max": None,
    "use_breakable_cudagraph": False,
    "env": None,
}


def test_configuration(observed) -> None:
    r = _ok(observed["config"])
    # the option in an engine config built on CPU: refused at the build
    assert r["cpu_platform_config"]["error"] is not None
    assert "needs an XPU or CUDA device" in r["cpu_platform_config"]["message"]
    assert "xpu_laguna.breakable_graph" in r["cpu_platform_config"]["message"]
    _refused(r["cpu"], "BreakableGraphConfigError", "needs an XPU or CUDA device")
    # a CUDA platform is not the series': the config stays upstream's
    assert r["cuda"] == {"error": None, "result": False}
    assert r["cuda_result"] == UNCONFIGURED
    assert r["xpu"] == {"error": None, "result": True}
    assert r["xpu_again"] == {"error": None, "result": True}
    assert r["xpu_result"] == _graph_fields(8)
    for case, text in {
        "full_mode": "needs cudagraph_mode PIECEWISE, not FULL",
        "sizes": "captures exactly the verify width [8]",
        "eager": "enforce_eager",
        "upstream_off": "VLLM_USE_BREAKABLE_CUDAGRAPH=0",
        "xpu_graph_off": "has no XPU graphs (need >= 2.11)",
        "width_changed": "verify width [4], not [8]",
    }.items():
        _refused(
            r[case], "BreakableGraphConfigError", "xpu_laguna.breakable_graph: ", text
        )
    assert r["xpu_graph_on"]["error"] is None


def test_two_configs_get_their_own_graphs(observed) -> None:
    """Configs built later in the same process are configured from their
    own options: a width of 4 captures [4]; breakable graphs off (the series
    still asked for: exact verify) leaves the config as upstream resolves
    it."""
    r = _ok(observed["config"])
    assert r["width_4"] == {"error": None, "result": True}
    assert r["width_4_result"] == _graph_fields(4)
    assert r["off"] == {"error": None, "result": False}
    assert r["off_result"] == UNCONFIGURED
