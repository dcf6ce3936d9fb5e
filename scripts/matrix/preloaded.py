"""Legs on CPU start from a preloaded interpreter instead of a fresh one.

Importing vLLM (torch, inductor, transformers) takes about 11 s of one core on the CI machine
(``python -X importtime -c "import vllm.entrypoints.llm"`` in the CPU runtime), more than the
engine start-up of a tiny model and a third of a short leg. The driver therefore starts one
:mod:`multiprocessing` *forkserver* per run that imports vLLM once (:data:`PRELOAD`), and every leg
is a fork of it (``--leg-start preloaded``, the default on CPU). What a leg still gets fresh is
everything that makes it a leg: its own process, its own engine (created after the fork), its
own environment (set before any vLLM code reads it: :mod:`vllm.envs` reads the environment on
each access until an engine enables its cache), its own CPU slot binding and its own log.

What is shared with the other legs is only what importing creates, the same in every leg: the
module objects and import-time settings. Nothing of an engine exists in the forkserver. The
ranks of a TP > 1 leg are still fresh interpreters: vLLM's CPU platform spawns its workers.

On a device (``--leg-start fresh``, always there) each leg is ``python -m scripts.matrix leg`` in
a fresh interpreter, as a device driver wants a process that never forked after importing it.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import time
from multiprocessing.context import ForkServerContext
from pathlib import Path

from scripts import procs

PRELOAD = ("vllm.entrypoints.llm",)
"""What the forkserver imports once (and with it torch, inductor and transformers)."""

LEG_STARTS = ("auto", "preloaded", "fresh")


def leg_start(choice: str, device: str) -> str:
    """``preloaded`` or ``fresh`` for ``--leg-start`` on ``device`` (auto: preloaded on CPU only);
    ValueError for ``preloaded`` on a device."""
    if choice == "auto":
        return "preloaded" if device == "cpu" else "fresh"
    if choice == "preloaded" and device != "cpu":
        raise ValueError(f"--leg-start preloaded is for CPU runs; on {device} every leg starts fresh")
    return choice


_preloaded: tuple[str, ...] | None = None
"""What the running forkserver was told to import (None: not set yet)."""


def _context(preload: tuple[str, ...] = PRELOAD) -> ForkServerContext:
    """The forkserver context, its server importing ``preload`` (the process has one forkserver:
    asking for another preload than the running server's stops it, the next fork starts one that
    imports the new list; tests fork legs from a server that imports no vLLM)."""
    global _preloaded
    ctx = multiprocessing.get_context("forkserver")
    assert isinstance(ctx, ForkServerContext)
    if _preloaded != preload:
        if _preloaded is not None:
            from multiprocessing import forkserver

            forkserver._forkserver._stop()  # type: ignore[attr-defined]
        ctx.set_forkserver_preload(list(preload))
        _preloaded = preload
    return ctx


def warm_up(preload: tuple[str, ...] = PRELOAD) -> None:
    """Start the forkserver now, so that its imports overlap with the driver's own work (tiny
    models, prompts); the first leg's fork waits for them."""
    from multiprocessing import forkserver

    _context(preload)
    forkserver.ensure_running()


LEG_ENTRY = "scripts.matrix.cli:main"
"""What a fork runs: the ``main`` of ``python -m scripts.matrix`` (with ``leg CONFIG OUTPUT``)."""


def run_preloaded(
    argv: list[str],
    env: dict[str, str],
    log: Path | None,
    entry: str = LEG_ENTRY,
    *,
    timeout_s: float,
    preload: tuple[str, ...] = PRELOAD,
    grace_s: float = procs.GRACE_S,
) -> procs.Finished:
    """``entry(argv)`` (``"module:function"``, returning an exit code) as a fork of the preloaded
    interpreter, with ``env`` as its environment and its output in ``log`` (None: the driver's
    stdout and stderr), at most ``timeout_s`` seconds. The fork is a process group of its own
    (its engine's processes with it), stopped as a group on the time limit or when the wait is
    interrupted (:func:`scripts.procs.supervise`); this returns once no process of it is left.
    Its exit code is negative for the signal that ended it."""
    process = _context(preload).Process(
        target=_fork_main, args=(entry, argv, env, None if log is None else str(log), preload), name="matrix-leg"
    )
    began = time.monotonic()
    process.start()
    assert process.pid is not None
    pgid = process.pid  # the fork calls os.setsid() first thing: its pid is its group id

    def wait(seconds: float) -> bool:
        process.join(seconds)
        return process.exitcode is not None

    try:
        timed_out, stop_s = procs.supervise(pgid, wait, timeout_s=timeout_s, grace_s=grace_s)
    finally:
        if process.exitcode is None:  # stopped before its os.setsid(): not yet its own group
            process.kill()
        process.join()
    code = process.exitcode if process.exitcode is not None else 1
    return procs.Finished(
        returncode=procs.TIMED_OUT if timed_out else code,
        timed_out=timed_out,
        seconds=time.monotonic() - began,
        pgid=pgid,
        stop_s=stop_s if timed_out else 0.0,
    )


def _fork_main(entry: str, argv: list[str], env: dict[str, str], log: str | None, preload: tuple[str, ...]) -> None:
    """In the fork: a process group of its own (so that the driver can stop the leg with every
    process its engine starts), then what a fresh interpreter started with ``env`` would have
    had, then the entry."""
    os.setsid()
    if log is not None:
        sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        os.close(sink)
    os.environ.update(env)
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
