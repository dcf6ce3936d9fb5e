"""Legs on CPU start from a preloaded interpreter instead of a fresh one.

Importing vLLM (torch, inductor, transformers) takes about 11 s of one core on the CI machine
(``python -X importtime -c "import vllm.entrypoints.llm"`` in the CPU runtime), more than the
engine start-up of a tiny model and a third of a short leg. The driver therefore starts one
interpreter per run that imports vLLM once (:data:`PRELOAD`), a :class:`PreloadedInterpreter` it
owns, and every leg is a fork of it (``--leg-start preloaded``, the default on CPU). What a leg
still gets fresh is everything that makes it a leg: its own process, its own engine (created after
the fork), its own environment (set before any vLLM code reads it: :mod:`vllm.envs` reads the
environment on each access until an engine enables its cache), its own CPU slot binding and its
own log.

What is shared with the other legs is only what importing creates, the same in every leg: the
module objects and import-time settings. Nothing of an engine exists in the preloaded
interpreter. The ranks of a TP > 1 leg are still fresh interpreters: vLLM's CPU platform spawns
its workers.

The interpreter is started and stopped through public calls only (a ``spawn`` process of
:mod:`multiprocessing`, the legs ``fork`` processes of it); nothing of it is kept at module level,
and the stdlib's own forkserver (one per process) is not used.

On a device (``--leg-start fresh``, always there) each leg is ``python -m scripts.matrix leg`` in
a fresh interpreter, as a device driver wants a process that never forked after importing it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from scripts import procs
from scripts.cpu_slots import use_threads

PRELOAD = ("vllm.entrypoints.llm",)
"""What the preloaded interpreter imports once (and with it torch, inductor and transformers)."""

LEG_STARTS = ("auto", "preloaded", "fresh")

LEG_ENTRY = "scripts.matrix.cli:main"
"""What a fork runs: the ``main`` of ``python -m scripts.matrix`` (with ``leg CONFIG OUTPUT``)."""

STOP_WAIT_S = 10.0
"""How long :meth:`PreloadedInterpreter.stop` waits for the interpreter to exit before killing it."""


def leg_start(choice: str, device: str) -> str:
    """``preloaded`` or ``fresh`` for ``--leg-start`` on ``device`` (auto: preloaded on CPU only);
    ValueError for ``preloaded`` on a device."""
    if choice == "auto":
        return "preloaded" if device == "cpu" else "fresh"
    if choice == "preloaded" and device != "cpu":
        raise ValueError(f"--leg-start preloaded is for CPU runs; on {device} every leg starts fresh")
    return choice


class PreloadedInterpreter:
    """An interpreter the driver owns that imports ``preload`` once and forks the legs.

    A :mod:`multiprocessing` ``spawn`` process (a fresh interpreter, as the stdlib's forkserver is)
    that answers the driver over a pipe: asked to start a leg, it forks one (``fork`` context) and
    answers its pid; asked for a leg's exit code, it answers it once the leg has ended.
    :meth:`start` starts it (once; call it early, so that its imports overlap with the driver's own
    work), :meth:`stop` ends it and a later :meth:`start` starts a fresh one; as a context manager
    it does both. Another preload list is another instance. The threads that run legs at once
    share one instance."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD) -> None:
        self.preload = preload
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._stop: weakref.finalize | None = None  # type: ignore[type-arg]

    def __enter__(self) -> PreloadedInterpreter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """The interpreter's pid while it runs (None before :meth:`start` and after :meth:`stop`)."""
        process = self._process
        return process.pid if process is not None else None

    def start(self) -> PreloadedInterpreter:
        with self._lock:
            if self._process is None:
                ctx = multiprocessing.get_context("spawn")
                ours, theirs = ctx.Pipe()
                process = ctx.Process(target=_serve, args=(theirs, self.preload), name="matrix-preloaded")
                process.start()
                theirs.close()
                self._conn, self._process = ours, process
                # also when the owner is dropped, or when the driver exits without stop(): before
                # multiprocessing's own exit handler, which would wait for the interpreter (its
                # atexit hook was registered when this module imported multiprocessing.connection)
                stop = weakref.finalize(self, _shut_down, ours, process)
                stop.atexit = False
                atexit.register(stop)
                self._stop = stop
        return self

    def stop(self) -> None:
        """Ask the interpreter to exit and wait for it (:data:`STOP_WAIT_S`, then it is killed)."""
        with self._lock:
            stop, self._stop, self._conn, self._process = self._stop, None, None, None
        if stop is not None:
            atexit.unregister(stop)
            stop()

    def _ask(self, *request: object) -> Any:
        self.start()
        with self._lock:
            if self._conn is None:
                raise RuntimeError("the preloaded interpreter was stopped")
            try:
                self._conn.send(request)
                answer = self._conn.recv()
            except (EOFError, OSError):
                raise RuntimeError(f"the preloaded interpreter (pid {self.pid}) is gone") from None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def run(
        self,
        argv: list[str],
        env: dict[str, str],
        log: Path | None,
        entry: str = LEG_ENTRY,
        *,
        timeout_s: float,
        grace_s: float = procs.GRACE_S,
    ) -> procs.Finished:
        """``entry(argv)`` (``"module:function"``, returning an exit code) as a fork of this
        interpreter, with ``env`` as its environment and its output in ``log`` (None: the driver's
        stdout and stderr), at most ``timeout_s`` seconds. The fork is a process group of its own
        (its engine's processes with it), stopped as a group on the time limit or when the wait is
        interrupted (:func:`scripts.procs.supervise`); this returns once no process of it is left.
        Its exit code is negative for the signal that ended it."""
        began = time.monotonic()
        pid: int = self._ask("start", entry, argv, env, None if log is None else str(log))
        codes: list[int] = []

        def wait(seconds: float) -> bool:
            deadline = time.monotonic() + seconds
            while not codes:
                code = self._ask("exitcode", pid)
                if code is not None:
                    codes.append(code)
                elif time.monotonic() >= deadline:
                    return False
                else:
                    time.sleep(min(procs.POLL_S, max(0.0, deadline - time.monotonic())))
            return True

        try:
            timed_out, stop_s = procs.supervise(pid, wait, timeout_s=timeout_s, grace_s=grace_s)
        finally:
            if not codes:  # stopped before its os.setsid(): not yet its own group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait(math.inf)
        return procs.Finished(
            returncode=procs.TIMED_OUT if timed_out else codes[0],
            timed_out=timed_out,
            seconds=time.monotonic() - began,
            pgid=pid,  # the fork calls os.setsid() first thing: its pid is its group id
            stop_s=stop_s if timed_out else 0.0,
        )


def _shut_down(conn: Connection, process: BaseProcess) -> None:
    with contextlib.suppress(OSError):
        conn.send(("stop",))
    conn.close()
    process.join(STOP_WAIT_S)
    if process.exitcode is None:
        process.kill()
        process.join()


def _serve(conn: Connection, preload: tuple[str, ...]) -> None:
    """The preloaded interpreter: import ``preload``, then answer the driver until it says stop
    (or is gone). Ctrl-C is for the driver, which stops the legs, not for this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001, S110 - each leg then imports it itself and says so
            pass
    fork = multiprocessing.get_context("fork")
    legs: dict[int, BaseProcess] = {}
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request[0] == "stop":
            return
        try:
            if request[0] == "start":
                _, entry, argv, env, log = request
                leg = fork.Process(target=_fork_main, args=(conn, entry, argv, env, log, preload), name="matrix-leg")
                leg.start()
                assert leg.pid is not None
                legs[leg.pid] = leg
                answer: object = leg.pid
            else:  # ("exitcode", pid): None while the leg runs
                answer = legs[request[1]].exitcode
        except Exception as exc:  # noqa: BLE001 - raised again in the driver
            answer = exc
        conn.send(answer)


def _fork_main(
    conn: Connection, entry: str, argv: list[str], env: dict[str, str], log: str | None, preload: tuple[str, ...]
) -> None:
    """In the fork: a process group of its own (so that the driver can stop the leg with every
    process its engine starts), then what a fresh interpreter started with ``env`` would have
    had, then the entry."""
    os.setsid()
    conn.close()  # the interpreter's pipe to the driver is not the leg's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if log is not None:
        sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        os.close(sink)
    os.environ.update(env)
    use_threads(env)  # torch is imported already: the lease's thread count must reach it here
    # the entries a fresh interpreter would have put on sys.path from PYTHONPATH (the TP > 1 legs'
    # hooks: the series-attention plugin is found through sys.path)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = extra
    missing = [m for m in preload if m not in sys.modules]
    print(
        f"leg process {os.getpid()}: a fork of the preloaded interpreter"
        + (f" (preload failed, the leg imports {', '.join(missing)} itself)" if missing else ""),
        file=sys.stderr,
        flush=True,
    )
    module, _, function = entry.partition(":")
    try:
        code = getattr(importlib.import_module(module), function)(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)
