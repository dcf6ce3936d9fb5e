"""The matrix's preloaded leg start (scripts/matrix/preloaded.py): a fork of the preloaded
interpreter gets the leg's environment, the PYTHONPATH entries a fresh interpreter would have on
sys.path, its own log and its own exit code; the interpreter is owned (started and stopped through
public calls, nothing kept at module level). The forks here come from interpreters that import a
small stdlib module or nothing, not vLLM (the default), so these tests need no vLLM and no 11 s
import. (That the
legs' numerics are those of a fresh interpreter is what the e2e matrix tests show: every leg there
starts preloaded and is gated bitwise against its teacher, and the diagnostic legs, set up only
through their environment, must differ.)"""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import REPO_ROOT
from scripts.matrix import preloaded
from scripts.matrix.preloaded import PreloadedInterpreter, leg_start

PROBE = textwrap.dedent(
    """
    import json, os, sys

    def main(argv):
        print("to stdout")
        print("to stderr", file=sys.stderr)
        seen = {
            "toggle": os.environ.get("VXL_PROBE_TOGGLE"),
            "path": sys.path,
            "pid": os.getpid(),
            "parent": os.getppid(),
            "preloaded": sorted(m for m in ("colorsys", "wave") if m in sys.modules),
            "threads": getattr(sys.modules.get("torch"), "threads", "no torch"),
        }
        with open(argv[0], "w") as f:
            json.dump(seen, f)
        if argv[1] == "crash":
            os.abort()
        return int(argv[1])
    """
)


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    folder = tmp_path / "probe_dir"
    folder.mkdir()
    (folder / "matrix_probe.py").write_text(PROBE)
    return folder


@pytest.fixture
def interpreter() -> Iterator[PreloadedInterpreter]:
    with PreloadedInterpreter(preload=()) as owned:
        yield owned


def _leg(owned: PreloadedInterpreter, out: Path, probe: Path, code: str = "0") -> int:
    """A probe leg forked from ``owned``; its exit code (what it saw is in ``out``)."""
    env = {"PYTHONPATH": str(probe)}
    return owned.run([str(out), code], env, out.with_suffix(".log"), entry="matrix_probe:main", timeout_s=60).returncode


def test_auto_is_preloaded_on_cpu_only() -> None:
    assert [leg_start("auto", d) for d in ("cpu", "xpu", "cuda")] == ["preloaded", "fresh", "fresh"]
    assert leg_start("fresh", "cpu") == "fresh" and leg_start("preloaded", "cpu") == "preloaded"


def test_preloaded_on_a_device_is_refused() -> None:
    with pytest.raises(ValueError, match="for CPU runs; on xpu every leg starts fresh"):
        leg_start("preloaded", "xpu")


def test_fork_gets_the_leg_environment_path_log_and_exit_code(
    tmp_path: Path, probe: Path, interpreter: PreloadedInterpreter
) -> None:
    log, out = tmp_path / "leg.log", tmp_path / "out.json"
    env = {"VXL_PROBE_TOGGLE": "1", "PYTHONPATH": str(probe)}
    done = interpreter.run([str(out), "3"], env, log, entry="matrix_probe:main", timeout_s=60)
    assert done.returncode == 3 and not done.timed_out and done.pgid == json.loads(out.read_text())["pid"]
    seen = json.loads(out.read_text())
    assert seen["toggle"] == "1"
    assert str(probe) in seen["path"] and seen["path"].index(str(probe)) == 1  # where PYTHONPATH goes
    text = log.read_text()
    assert "to stdout" in text and "to stderr" in text and "a fork of the preloaded interpreter" in text
    # the next fork starts from the preloaded interpreter again: the first fork's environment is not there
    code = interpreter.run(
        [str(out), "0"], {"PYTHONPATH": str(probe)}, log, entry="matrix_probe:main", timeout_s=60
    ).returncode
    again = json.loads(out.read_text())
    assert code == 0 and again["toggle"] is None and again["pid"] != seen["pid"]
    assert seen["parent"] == again["parent"] == interpreter.pid  # both forks of the one interpreter


FAKE_TORCH = "threads = None\n\ndef set_num_threads(n):\n    global threads\n    threads = n\n"


def test_a_fork_takes_the_legs_thread_count_into_the_preloaded_torch(
    tmp_path: Path, probe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch is imported before the fork, so the leg's OMP_NUM_THREADS (its CPU slot's, from
    scripts/cpu_slots.py) must be handed to it in the fork; the control: a leg that names no
    count leaves the preloaded torch as it was."""
    fake = tmp_path / "fake_torch"
    fake.mkdir()
    (fake / "torch.py").write_text(FAKE_TORCH)
    monkeypatch.syspath_prepend(str(fake))  # the spawned interpreter starts with this sys.path
    with PreloadedInterpreter(preload=("torch",)) as owned:
        env = {"PYTHONPATH": str(probe), "OMP_NUM_THREADS": "3"}
        done = owned.run([str(tmp_path / "a.json"), "0"], env, None, entry="matrix_probe:main", timeout_s=60)
        assert done.returncode == 0
        assert json.loads((tmp_path / "a.json").read_text())["threads"] == 3
        assert _leg(owned, tmp_path / "b.json", probe) == 0
        assert json.loads((tmp_path / "b.json").read_text())["threads"] is None


def test_a_crashed_fork_is_a_nonzero_exit(tmp_path: Path, probe: Path, interpreter: PreloadedInterpreter) -> None:
    out = tmp_path / "out.json"
    done = interpreter.run(
        [str(out), "crash"], {"PYTHONPATH": str(probe)}, tmp_path / "leg.log", entry="matrix_probe:main", timeout_s=60
    )
    assert done.returncode != 0 and not done.timed_out and out.exists()
    assert _leg(interpreter, tmp_path / "after.json", probe) == 0  # the interpreter is unharmed


def _gone(pid: int) -> bool:
    """``pid`` (a child of this process) has exited and been reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_another_preload_is_another_interpreter_stopped_and_restarted_in_public(tmp_path: Path, probe: Path) -> None:
    """Each preload list is its own interpreter; stop() ends it (nothing of it left running or
    waiting to be reaped) and start() starts a fresh one; a leg sees the imports of the
    interpreter it was forked from, and only those (the control: the other list's module)."""
    first = PreloadedInterpreter(preload=("colorsys",)).start()
    assert _leg(first, tmp_path / "a.json", probe) == 0
    seen = json.loads((tmp_path / "a.json").read_text())
    old = first.pid
    assert old is not None and seen["parent"] == old and seen["preloaded"] == ["colorsys"]
    first.stop()
    assert first.pid is None and _gone(old) and old not in [p.pid for p in multiprocessing.active_children()]
    first.stop()  # a second stop is a no-op
    with PreloadedInterpreter(preload=("wave",)) as second:
        assert _leg(second, tmp_path / "b.json", probe) == 0
        seen = json.loads((tmp_path / "b.json").read_text())
        assert seen["parent"] == second.pid != old and seen["preloaded"] == ["wave"]
    first.start()  # restarted: a fresh interpreter importing its own list again
    try:
        assert _leg(first, tmp_path / "c.json", probe) == 0
        seen = json.loads((tmp_path / "c.json").read_text())
        assert seen["parent"] == first.pid not in (old, None) and seen["preloaded"] == ["colorsys"]
    finally:
        first.stop()


def test_a_leg_after_stop_starts_the_interpreter_again(tmp_path: Path, probe: Path) -> None:
    owned = PreloadedInterpreter(preload=())
    try:
        assert owned.pid is None
        assert _leg(owned, tmp_path / "a.json", probe) == 0  # run() starts it when not started
        assert json.loads((tmp_path / "a.json").read_text())["parent"] == owned.pid
    finally:
        owned.stop()


def test_the_module_keeps_no_state() -> None:
    """Nothing but constants, functions, classes and imported modules at module level (the
    interpreter lives in the instance that owns it), and no stdlib forkserver is asked for."""
    kept = {
        name: value
        for name, value in vars(preloaded).items()
        if not name.startswith("__")
        and not inspect.ismodule(value)
        and not inspect.isfunction(value)
        and not inspect.isclass(value)
        and not isinstance(value, (str, int, float, tuple, frozenset))
        and name not in ("annotations", "Any", "Callable")
    }
    assert kept == {}
    source = inspect.getsource(preloaded)
    assert "forkserver._" not in source and "global " not in source


DRIVER_WITHOUT_STOP = textwrap.dedent(
    """
    import sys, tempfile

    if __name__ == "__main__":
        # a weakref finalizer made before multiprocessing is imported: weakref's exit hook then
        # runs after multiprocessing's, which waits for every process that is not a daemon
        keep = tempfile.TemporaryDirectory()
        from scripts.matrix.preloaded import PreloadedInterpreter

        owned = PreloadedInterpreter(preload=()).start()
        done = owned.run([sys.argv[1], "0"], {"PYTHONPATH": sys.argv[2]}, None, "matrix_probe:main", timeout_s=60)
        print(owned.pid, done.returncode)
        # no stop(): the driver just exits
    """
)


def test_a_driver_that_never_stops_it_exits_and_leaves_nothing(tmp_path: Path, probe: Path) -> None:
    """multiprocessing waits at exit for a process that is not a daemon (the interpreter cannot
    be one: its legs start processes); the owner's exit hook stops it first."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER_WITHOUT_STOP)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out.json"), str(probe)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    pid, code = map(int, done.stdout.splitlines()[-1].split())  # the leg printed to our stdout before
    assert code == 0 and json.loads((tmp_path / "out.json").read_text())["parent"] == pid
    assert not Path(f"/proc/{pid}").exists()  # gone, and reaped by the driver before it exited
