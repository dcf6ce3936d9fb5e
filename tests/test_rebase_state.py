"""The rebase state file: typed, lossless round trip, the first tool's files read, others refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import synthetic
from scripts.errors import ToolError
from scripts.rebase.state import STATE_SCHEMA, PatchEntry, RebaseState, load_state, save_state

# written by the first rebase tool (scripts/rebase.py, one module, dict state) when the synthetic
# series stopped at a conflict: tests/test_rebase.py's conflict case, captured unchanged
OLD = Path(__file__).parent / "fixtures" / "rebase-state-v1-conflict.json"


def _old() -> dict:
    return json.loads(OLD.read_text())


def test_state_written_by_the_first_tool_is_read_typed_and_written_back_unchanged(tmp_path: Path) -> None:
    state = load_state(OLD)
    assert state.schema == STATE_SCHEMA and state.stage == "replay" and state.current == 0
    assert state.from_.version == "9.9.9" and state.onto.version == "10.0.0"
    assert [p.status for p in state.patches] == ["conflict", "pending"]
    first = state.patches[0]
    assert isinstance(first, PatchEntry) and first.conflict is not None
    assert first.conflict["files"][0]["file"] == "vllm/envs.py"
    assert state.patches[1].head_before is None and state.patches[1].commit_new is None
    assert state.restore.branch == "main"
    out = tmp_path / "state.json"
    save_state(out, state)
    assert json.loads(out.read_text()) == _old()  # nothing lost, nothing added


def test_fields_set_later_appear_in_the_json_only_once_set() -> None:
    state = RebaseState.from_json(_old(), "old")
    assert "commit_new" not in state.to_json()["patches"][1]
    state.patches[1].commit_new = ["a" * 40]
    state.patches[1].effect = {"ok": True}
    entry = state.to_json()["patches"][1]
    assert entry["commit_new"] == ["a" * 40] and entry["effect"] == {"ok": True}
    assert RebaseState.from_json(state.to_json(), "again").patches[1].commit_new == ["a" * 40]


def _mutated(change) -> dict:
    data = copy.deepcopy(_old())
    change(data)
    return data


REFUSED = {
    "other-schema": (lambda d: d.update(schema="vxl-rebase-state/2"), "unknown state schema"),
    "no-schema": (lambda d: d.pop("schema"), "unknown state schema"),
    "missing-field": (lambda d: d.pop("restore"), "rebase-state.json: restore: missing required field"),
    "missing-patch-field": (
        lambda d: d["patches"][0].pop("commit_old"),
        "rebase-state.json: patches[0].commit_old: missing required field",
    ),
    "unknown-field": (lambda d: d.update(extra=1), "rebase-state.json: extra: unknown field (allowed: schema, stage, "),
    "wrong-type": (lambda d: d.update(current="0"), "rebase-state.json: current: expected an integer, got string '0'"),
    "wrong-nested-type": (
        lambda d: d["from"].update(pristine=7),
        "rebase-state.json: from.pristine: expected a string, got integer 7",
    ),
    "bool-for-int": (lambda d: d.update(current=True), "current: expected an integer, got boolean True"),
    "wrong-list-item": (lambda d: d["patches"][0]["files"].append(3), "patches[0].files[1]: expected a string"),
    "bad-stage": (lambda d: d.update(stage="done"), "unknown stage"),
    "current-out-of-range": (lambda d: d.update(current=5), "out of range"),
    "not-an-object": (lambda d: d["patches"].__setitem__(0, "x"), "patches[0]: expected an object, got string 'x'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_other_state_files_are_refused_in_one_line(case: str, tmp_path: Path) -> None:
    change, expect = REFUSED[case]
    path = tmp_path / "rebase-state.json"
    path.write_text(json.dumps(_mutated(change)))
    with pytest.raises(ToolError) as info:
        load_state(path)
    message = str(info.value)
    assert synthetic.one_line(message) and expect in message, message
    # negative control: the unmutated file is read
    path.write_text(OLD.read_text())
    assert load_state(path).patches


def test_unreadable_and_absent_state(tmp_path: Path) -> None:
    path = tmp_path / "rebase-state.json"
    with pytest.raises(ToolError, match="no rebase in progress"):
        load_state(path)
    path.write_text("{not json")
    with pytest.raises(ToolError, match="unreadable rebase state"):
        load_state(path)
