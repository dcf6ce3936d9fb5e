"""The record's graph section from the wrappers' accounting lines in server logs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from scripts.measure.gates import load_gates
from scripts.measure.graphs import ACCOUNTING_MARK, accounting_from_log, graph_section
from scripts.measure.verify_record import verify

ROOT = Path(__file__).resolve().parents[1]
GRAPH_RECORD = ROOT / "tests" / "fixtures" / "records" / "record-2026-07-24-breakable-graph.json"


def _line(pid: int, label: str, graphs: int, breaks: int, replays: int) -> str:
    acc = {
        "label": label,
        "graph_class": "torch.xpu.XPUGraph",
        "graphs": graphs,
        "breaks": breaks,
        "replays": replays,
        "captures": [
            {
                "batch_descriptor": "BatchDescriptor(num_tokens=8, num_reqs=None)",
                "graphs": graphs,
                "breaks": breaks,
                "breaks_by_kind": {"attention": 48, "collective": breaks - 48},
                "replays": replays,
            }
        ],
    }
    return f"(Worker_TP{pid % 4} pid={pid}) INFO 11-30 [wrapper.py:1] {ACCOUNTING_MARK}{json.dumps(acc)}"


def _leg_log(first_pid: int, replays: int) -> str:
    lines = ["INFO starting", f"{ACCOUNTING_MARK}{{not json"]
    for pid in range(first_pid, first_pid + 4):  # TP 4: one worker per rank
        lines += [
            _line(pid, "target", 146, 145, 0),
            _line(pid, "drafter", 4, 3, 0),
            _line(pid, "target", 146, 145, replays),
            _line(pid, "drafter", 4, 3, replays + 1),
        ]
    return "\n".join(lines)


def test_wrapper_logs_the_mark_this_module_reads() -> None:
    source = (ROOT / "overlay" / "vllm" / "xpu_laguna" / "graphs" / "wrapper.py").read_text()
    assert f'ACCOUNTING_MARK = "{ACCOUNTING_MARK}"' in source


def test_last_line_per_wrapper_wins() -> None:
    acc = accounting_from_log(_leg_log(100, 2000))
    assert set(acc) == {"target", "drafter"}
    assert acc["target"]["replays"] == 2000 and acc["drafter"]["replays"] == 2001


def test_section_from_graph_legs_only() -> None:
    logs = {"A1": "INFO eager leg", "B1": _leg_log(100, 2000), "B2": _leg_log(200, 3000), "A2": ""}
    section = graph_section(logs)
    assert section is not None and section["measured"] is True
    assert (section["graphs_per_rank"], section["eager_breaks_per_rank"]) == (146, 145)
    assert section["capture_sizes"] == [8] and section["max_capture_size"] == 8
    assert section["graph_class"] == "torch.xpu.XPUGraph"
    assert section["B1_distinct_rank_captures"] == 4 and section["B2_distinct_rank_replays"] == 4
    assert "A1_distinct_rank_captures" not in section
    assert section["legs"]["B2"]["drafter"]["replays_at_least"] == 3001
    assert graph_section({"A1": "", "B1": "no graphs here"}) is None


def test_different_topologies_are_refused() -> None:
    other = _leg_log(200, 10).replace('"graphs": 146', '"graphs": 147')
    with pytest.raises(ValueError, match="different target topologies"):
        graph_section({"B1": _leg_log(100, 10), "B2": other})


def test_record_with_the_section_verifies_and_a_changed_count_does_not() -> None:
    record: dict[str, Any] = json.loads(GRAPH_RECORD.read_text())
    section = graph_section({"B1": _leg_log(100, 2000), "B2": _leg_log(200, 3000)})
    assert section is not None
    record["graph"] = section
    assert verify(copy.deepcopy(record), gates=load_gates()).failures == []
    record["graph"]["graphs_per_rank"] = 147
    failures = verify(record, gates=load_gates()).failures
    assert any("graph.graphs_per_rank" in str(f) for f in failures)


LIVE = ROOT / "tests" / "fixtures" / "graph-logs"


def test_section_from_a_live_cpu_server_with_emulated_graphs() -> None:
    """Lines kept from the server logs of a real crossover on CPU with ``--emulate-graphs``
    (ngram, tiny Laguna, TP 1; command in the README): the wrapper's own accounting, emulated."""
    logs = {leg: (LIVE / f"cpu-emulated-ngram-{leg}.log").read_text() for leg in ("A1", "B1", "B2")}
    assert "EMULATED" in logs["B1"] and not logs["A1"]  # the control leg ran no graphs
    section = graph_section(logs)
    assert section is not None and section["measured"] is True
    assert section["graph_class"] == "RecordingGraph (emulated device graph)"
    assert (section["graphs_per_rank"], section["eager_breaks_per_rank"]) == (5, 4)
    assert section["capture_sizes"] == [8]
    for leg in ("B1", "B2"):
        (capture,) = section["legs"][leg]["target"]["captures"]
        assert capture["breaks_by_kind"] == {"attention": 4, "collective": 0}
        assert section["legs"][leg]["target"]["replays_at_least"] >= 1
        assert section[f"{leg}_distinct_rank_replays"] == 1
    assert set(section["legs"]) == {"B1", "B2"}
