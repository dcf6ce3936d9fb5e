"""Long-lived child processes, each in a process group of its own, with a time limit, stopped as
a group.

A vLLM engine, a ``vllm serve`` server, a matrix leg or a device check's leg is never one
process: vLLM starts an engine core, workers (spawned interpreters on CPU past TP 1), compile
workers. Killing only the direct child (``subprocess.run(timeout=...)``, ``Process.terminate``)
leaves those grandchildren running, still holding cores and memory after the CPU slot
(:mod:`scripts.cpu_slots`) that was meant to keep engines apart has gone to the next engine. So
every such child starts in a session of its own (``start_new_session=True``, or ``os.setsid()``
first thing in a fork: its process group id is its pid, and everything it starts inherits the
group), and is stopped as a whole group: SIGTERM to the group, a grace period, SIGKILL to the
group, and then waiting until no process of the group is left, so that whatever the caller
releases next (a CPU slot, a port, a temporary folder) is really free.

A child in its own session is out of the terminal's foreground group, so Ctrl-C no longer
reaches it: :func:`run` and :func:`supervise` stop the group when the wait is interrupted
(KeyboardInterrupt or any other exception), and a command that waits for children in worker
threads (the matrix) wraps its work in :func:`stopping_on_signals`, which stops every group this
process started when SIGTERM or SIGINT arrives. A parent killed with SIGKILL cannot stop
anything: its groups keep running.

Short tool calls (git, pip, tar, a ``python -c`` probe) stay plain :mod:`subprocess` calls: they
start no process tree worth a group and end by themselves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import IO, Any

GRACE_S = 10.0
"""Between SIGTERM and SIGKILL: vLLM's engine core and workers shut down on SIGTERM within a
few seconds; a process that ignores it (or hangs in a collective) is killed after this."""
KILL_WAIT_S = 10.0
"""How long to wait for the group to be gone after SIGKILL (a process in uninterruptible sleep
takes a moment); past it the group is reported and left."""
POLL_S = 0.05
TIMED_OUT = 124
"""The return code of a child stopped at its time limit (as coreutils ``timeout`` has it);
:attr:`Finished.timed_out` tells it apart from a child that exited 124 itself."""

Steps = Sequence[tuple[signal.Signals, float]]
"""Signals sent to a group before SIGKILL, each with how long to wait for the group to go."""

TERM_THEN_KILL: Steps = ((signal.SIGTERM, GRACE_S),)
"""The default stop: SIGTERM, :data:`GRACE_S` for the group to go, then SIGKILL."""

_lock = threading.RLock()  # re-entrant: a signal handler on the main thread may take it again
_groups: set[int] = set()
_closing = threading.Event()


class Stopping(RuntimeError):
    """Raised instead of starting a child once :func:`stopping_on_signals` got a signal."""


@dataclass(frozen=True)
class Finished:
    """How a group child ended."""

    returncode: int
    """The child's exit status (negative: the signal that ended it), or :data:`TIMED_OUT`."""
    timed_out: bool
    seconds: float
    """From the start to the group being gone."""
    pgid: int
    stop_s: float = 0.0
    """From the moment the group was told to stop (time limit reached) to no process of it left."""
    stdout: str = ""
    stderr: str = ""


def steps_for(grace_s: float) -> Steps:
    return ((signal.SIGTERM, grace_s),)


def register(pgid: int) -> None:
    """Count ``pgid`` among this process's groups (:func:`stop_all` stops them); :class:`Stopping`
    once a signal asked this process to stop."""
    with _lock:
        if pgid in _groups:
            return
        if _closing.is_set():
            raise Stopping("stopping: no new child process")
        _groups.add(pgid)


def _unregister(pgid: int) -> None:
    with _lock:
        _groups.discard(pgid)


def group_members(pgid: int) -> list[int]:
    """The live processes of group ``pgid`` (zombies, already dead and only waiting to be
    reaped, do not count: an orphan's zombie may wait for a slow init)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    try:
        names = os.listdir("/proc")
    except FileNotFoundError:
        return [pgid]  # no /proc: the group exists, whatever state its processes are in
    found = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def _wait_gone(pgids: list[int], wait_s: float, reap: Callable[[], object] | None) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        if reap is not None:
            reap()
        left = [g for g in pgids if group_members(g)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def stop_groups(
    pgids: Iterable[int],
    *,
    steps: Steps = TERM_THEN_KILL,
    kill_wait_s: float = KILL_WAIT_S,
    reap: Callable[[], object] | None = None,
) -> float:
    """Stop every process of the groups ``pgids``: each of ``steps`` (default SIGTERM, then
    :data:`GRACE_S`) to every group still alive, then SIGKILL, each time waiting until the groups
    are gone. ``reap`` (e.g. ``Popen.poll``) is called while waiting, so that a leader that is
    our own child does not stay a zombie. The seconds it took."""
    start = time.monotonic()
    groups = list(pgids)
    pending = _wait_gone(groups, 0, reap)
    for sig, wait_s in (*steps, (signal.SIGKILL, kill_wait_s)):
        if not pending:
            break
        for pgid in pending:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        pending = _wait_gone(pending, wait_s, reap)
    for pgid in pending:
        print(f"warning: process group {pgid} still has {group_members(pgid)} after SIGKILL", file=sys.stderr)
    for pgid in groups:
        _unregister(pgid)
    return time.monotonic() - start


def stop_group(
    pgid: int,
    *,
    steps: Steps = TERM_THEN_KILL,
    kill_wait_s: float = KILL_WAIT_S,
    reap: Callable[[], object] | None = None,
) -> float:
    """:func:`stop_groups` for one group; the seconds it took."""
    return stop_groups([pgid], steps=steps, kill_wait_s=kill_wait_s, reap=reap)


def stop_all() -> None:
    """Stop every group this process started and has not stopped yet."""
    with _lock:
        pgids = sorted(_groups)
    if pgids:
        stop_groups(pgids)


def supervise(
    pgid: int,
    wait: Callable[[float], bool],
    *,
    timeout_s: float,
    grace_s: float = GRACE_S,
    reap: Callable[[], object] | None = None,
) -> tuple[bool, float]:
    """Wait up to ``timeout_s`` for a group's leader (``wait(seconds)``: True once it ended). On
    the time limit, or when the wait is interrupted (KeyboardInterrupt, any exception: then it
    is raised again), the group is stopped; after a normal end, whatever the leader left behind
    in its group is stopped too. Returns (timed out, seconds from the stop to the group gone)
    only when no process of the group is left."""
    try:
        register(pgid)  # already running: refused (a signal is stopping us) means stopped here
        ended = wait(timeout_s)
    except BaseException:
        stop_group(pgid, steps=steps_for(grace_s), reap=reap)
        raise
    stop_s = stop_group(pgid, steps=steps_for(grace_s), reap=reap)
    return not ended, stop_s


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> subprocess.Popen[bytes]:
    """``argv`` in a session of its own (its pid is its group id), stdin from /dev/null; the
    caller stops it with :func:`stop_group` (or uses :func:`run`)."""
    with _lock:
        if _closing.is_set():
            raise Stopping("stopping: no new child process")
        proc = subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        _groups.add(proc.pid)
    return proc


def _popen_wait(proc: subprocess.Popen[bytes]) -> Callable[[float], bool]:
    def wait(seconds: float) -> bool:
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    return wait


def run(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    capture: bool = False,
    grace_s: float = GRACE_S,
) -> Finished:
    """``argv`` in its own process group, at most ``timeout_s`` seconds; returns once no process
    of its group is left. ``capture``: its output comes back as text in :attr:`Finished.stdout`
    and ``.stderr`` (through temporary files, not pipes: a grandchild holding a pipe open would
    keep a reader waiting after the child itself exited)."""
    with ExitStack() as files:
        if capture:
            stdout = files.enter_context(tempfile.TemporaryFile())
            stderr = files.enter_context(tempfile.TemporaryFile())
        began = time.monotonic()
        proc = start(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr)
        timed_out, stop_s = supervise(proc.pid, _popen_wait(proc), timeout_s=timeout_s, grace_s=grace_s, reap=proc.poll)
        code = proc.wait()
        texts = [_read(f) for f in (stdout, stderr)] if capture else ["", ""]
    return Finished(
        returncode=TIMED_OUT if timed_out else code,
        timed_out=timed_out,
        seconds=time.monotonic() - began,
        pgid=proc.pid,
        stop_s=stop_s if timed_out else 0.0,
        stdout=texts[0],
        stderr=texts[1],
    )


def _read(file: Any) -> str:
    file.seek(0)
    return str(file.read().decode("utf-8", errors="replace"))


def _on_signal(signum: int, frame: object) -> None:
    _closing.set()
    stop_all()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT stop every group this process started (and let
    no new one start), then end the block: SystemExit(143) or KeyboardInterrupt. For commands
    whose children are waited for in worker threads, where the exception in the main thread
    does not reach the waits, and for commands that are themselves a group child (a timed-out
    test stops them with SIGTERM, which would otherwise end them without stopping their own
    children). Only on the main thread (elsewhere a signal handler cannot be set): nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        _closing.clear()
