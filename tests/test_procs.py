"""Children in their own process group, with a time limit, stopped as a group (scripts/procs.py):
a timed-out child's grandchildren (one of them ignoring SIGTERM) are gone when the call returns,
a normal child's exit code and output pass through, a grandchild left behind by a child that
exited is stopped too, an interrupted wait stops the group, and a command stopped by SIGTERM
stops its own groups (the nested case: a test's time limit on a matrix run whose legs are groups
of their own). No vLLM; the figures printed are the seconds from the stop to the group gone."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from scripts import REPO_ROOT, procs

CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    # one grandchild that only SIGKILL ends, one that SIGTERM ends
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300"])
    plain = subprocess.Popen(["sleep", "300"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump({"child": os.getpid(), "pgid": os.getpgid(0), "grandchildren": [stubborn.pid, plain.pid]}, f)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    if sys.argv[2] == "hang":
        time.sleep(300)
    sys.exit(int(sys.argv[2]))
    """
)


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def wait_for(path: Path, seconds: float = 20) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    data: dict[str, object] = json.loads(path.read_text())
    return data


def assert_gone(pids: dict[str, object]) -> None:
    pgid = int(str(pids["pgid"]))
    assert procs.group_members(pgid) == []
    everyone = [int(str(pids["child"])), *(int(p) for p in pids["grandchildren"])]  # type: ignore[attr-defined]
    assert not [p for p in everyone if alive(p)]
    # and no process at all with that group id, once init has reaped the orphans' zombies
    deadline = time.monotonic() + 5
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"group {pgid} still has processes: {procs.group_members(pgid)}"
        time.sleep(0.05)


def test_a_timed_out_child_is_stopped_with_its_whole_group(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"
    began = time.monotonic()
    done = procs.run([sys.executable, "-c", CHILD, str(pids_file), "hang"], timeout_s=2.0, grace_s=1.0)
    wall = time.monotonic() - began
    pids = wait_for(pids_file)
    assert done.timed_out and done.returncode == procs.TIMED_OUT
    assert done.pgid == pids["child"] == pids["pgid"]  # its own group, its pid the group id
    assert_gone(pids)
    # SIGTERM ends the child and one grandchild; the stubborn one waits for SIGKILL after the grace
    assert 1.0 <= done.stop_s < 1.0 + 3.0
    print(f"\nprocs.run: timeout 2.0 s, grace 1.0 s: group gone {done.stop_s:.2f} s after the stop, wall {wall:.2f} s")


def test_a_group_that_heeds_sigterm_goes_without_the_grace(tmp_path: Path) -> None:
    code = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    done = procs.run([sys.executable, "-c", code], timeout_s=1.0, grace_s=30.0)
    assert done.timed_out and procs.group_members(done.pgid) == []
    assert done.stop_s < 5.0
    print(f"\nprocs.run: SIGTERM-heeding group gone {done.stop_s:.2f} s after the stop (grace 30 s unused)")


def test_a_normal_exit_code_and_output_pass_through() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)"
    done = procs.run([sys.executable, "-c", code], timeout_s=60, capture=True)
    assert (done.returncode, done.timed_out, done.stdout, done.stderr) == (7, False, "out\n", "err\n")
    assert procs.run([sys.executable, "-c", "pass"], timeout_s=60).returncode == 0
    killed = procs.run([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], timeout_s=60)
    assert killed.returncode == -9 and not killed.timed_out


def test_grandchildren_left_by_a_child_that_exited_are_stopped(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"
    done = procs.run([sys.executable, "-c", CHILD, str(pids_file), "5"], timeout_s=60, grace_s=1.0, capture=True)
    assert done.returncode == 5 and not done.timed_out  # the child's own code, unchanged
    assert_gone(wait_for(pids_file))


def test_an_interrupted_wait_stops_the_group(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"
    main = threading.main_thread().ident
    assert main is not None

    def interrupt() -> None:
        wait_for(pids_file)
        signal.pthread_kill(main, signal.SIGINT)

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            procs.run([sys.executable, "-c", CHILD, str(pids_file), "hang"], timeout_s=120, grace_s=1.0)
    finally:
        signal.signal(signal.SIGINT, old)
    assert_gone(wait_for(pids_file))


NESTED = textwrap.dedent(
    """
    import sys, threading, time
    from scripts import procs

    def leg():
        procs.run([sys.executable, "-c", sys.argv[1], sys.argv[2], "hang"], timeout_s=300, grace_s=1.0)

    with procs.stopping_on_signals():
        threading.Thread(target=leg).start()  # waited for in a worker thread, as the matrix's legs
        time.sleep(300)
    """
)


def test_a_command_stopped_by_sigterm_stops_its_own_groups(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"
    argv = [sys.executable, "-c", NESTED, CHILD, str(pids_file)]
    done = procs.run(argv, timeout_s=5.0, cwd=REPO_ROOT, grace_s=20.0, capture=True)
    inner = wait_for(pids_file)
    assert done.timed_out and done.stop_s < 15, done.stderr  # it ended on SIGTERM, within the grace
    assert inner["pgid"] != done.pgid
    assert_gone(inner)
