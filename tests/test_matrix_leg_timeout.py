"""A matrix leg past its time limit (scripts/matrix/runner.py, ``--leg-timeout``), through the
runner's own leg machinery, fresh and preloaded: a stand-in leg (no vLLM) that starts a grandchild
ignoring SIGTERM and one heeding it, then hangs. The leg is reported as an error naming the time
limit, no process of its group is left, its CPU slot was held while it ran and was released only
after its group was gone, and the slot is free right after. The slots are a temporary folder's
(``VXL_CACHE_DIR``), never the machine's."""

from __future__ import annotations

import argparse
import json
import re
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from scripts import cpu_slots, procs
from scripts.matrix import runner
from scripts.matrix.legs import LEGS
from tests.test_procs import alive

HANG = textwrap.dedent(
    """
    import fcntl, json, os, subprocess, sys, time

    def main(argv):
        stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300"])  # only SIGKILL ends it
        plain = subprocess.Popen(["sleep", "300"])
        slot = os.path.join(os.environ["VXL_CACHE_DIR"], "cpu-slots", "slot-0.lock")
        fd = os.open(slot, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
        os.close(fd)
        pids = {"child": os.getpid(), "pgid": os.getpgid(0), "grandchildren": [stubborn.pid, plain.pid],
                "argv": argv, "slot_held": held}
        path = os.environ["VXL_PROBE_PIDS"]
        with open(path + ".tmp", "w") as f:
            json.dump(pids, f)
        os.rename(path + ".tmp", path)
        time.sleep(300)
        return 0

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
    """
)
LIMIT_S = 3.0
GRACE_S = 1.0


def _left(pids_file: Path) -> list[int]:
    """The stand-in leg's processes still alive (its group's members and those it recorded)."""
    pids = json.loads(pids_file.read_text())
    everyone = {pids["child"], *pids["grandchildren"], *procs.group_members(pids["pgid"])}
    return sorted(p for p in everyone if alive(p))


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "stand_in"
    folder.mkdir()
    (folder / "matrix_hang.py").write_text(HANG)
    monkeypatch.setenv("PYTHONPATH", str(folder))
    monkeypatch.setenv("VXL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(cpu_slots.SLOTS_ENV, "1")
    pids_file = tmp_path / "pids.json"
    monkeypatch.setenv("VXL_PROBE_PIDS", str(pids_file))
    return pids_file


@pytest.mark.parametrize("start", ["fresh", "preloaded"])
def test_a_timed_out_leg_leaves_nothing_and_frees_its_slot(
    start: str, stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    left_at_release: list[list[int]] = []
    real_lease = runner.cpu_lease_if

    @contextmanager
    def watched(on_cpu: bool, label: str) -> Iterator[cpu_slots.Lease | None]:
        with real_lease(on_cpu, label) as lease:
            yield lease
            left_at_release.append(_left(stand_in))  # just before the slot is released

    monkeypatch.setattr(runner, "cpu_lease_if", watched)
    leg = LEGS[0]
    args = argparse.Namespace(
        tp=1, jobs=1, leg_start=start, leg_timeout=LIMIT_S, prompts=3, max_tokens=8, long_prompt_tokens=0
    )
    how = runner.LegProcess(module="matrix_hang", entry="matrix_hang:main", preload=(), grace_s=GRACE_S)
    configs = {leg.name: {"tp": 1, "options": leg.options(), "prompts": ["p"]}}
    began = time.monotonic()
    outputs = runner.run_legs((leg,), configs, args, "cpu", tmp_path / "report.json", how)
    wall = time.monotonic() - began

    assert outputs[leg.name] == {"status": f"error: leg timed out after {LIMIT_S:.0f} s"}
    pids = json.loads(stand_in.read_text())
    assert pids["argv"][0] == "leg" and pids["pgid"] == pids["child"]  # the leg is its group's leader
    assert pids["slot_held"]  # the leg ran under the CPU slot
    assert left_at_release == [[]]  # nothing of the leg was left when the slot was released
    assert _left(stand_in) == []
    with cpu_slots.cpu_lease("right after", timeout_s=0) as lease:  # free at once: no waiting
        assert lease.slot == 0
    said = re.search(r"timed out after \d+s; its process group stopped in ([\d.]+)s", capsys.readouterr().err)
    assert said is not None
    stop_s = float(said.group(1))
    assert GRACE_S <= stop_s < GRACE_S + 3.0  # SIGTERM, the grace, SIGKILL for the stubborn one
    print(f"\n{start} leg: limit {LIMIT_S:.0f} s, group gone {stop_s:.2f} s after the stop, run_legs {wall:.2f} s")


def test_the_default_limit_scales_with_the_tokens() -> None:
    assert runner.default_leg_timeout(13, 128, 4200) == runner.LEG_TIMEOUT_BASE_S + 13 * 128 + 32
    assert runner.default_leg_timeout(4, 64, 0) == runner.LEG_TIMEOUT_BASE_S + 256
    args = argparse.Namespace(leg_timeout=None, prompts=4, max_tokens=64, long_prompt_tokens=0)
    assert runner.leg_timeout(args) == runner.default_leg_timeout(4, 64, 0)
    args.leg_timeout = 5.0
    assert runner.leg_timeout(args) == 5.0


def test_a_limit_that_is_not_positive_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from scripts.matrix.cli import main

    assert main(["run", "--tiny", "/tmp/nowhere-tiny", "--legs", "teacher", "--leg-timeout", "0", "--check-only"]) == 2
    assert "--leg-timeout 0: must be > 0 seconds" in capsys.readouterr().err
