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

import functools
import importlib
import multiprocessing
import os
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path

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


@functools.cache
def _context() -> ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    assert isinstance(ctx, ForkServerContext)
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def warm_up() -> None:
    """Start the forkserver now, so that its imports overlap with the driver's own work (tiny
    models, prompts); the first leg's fork waits for them."""
    from multiprocessing import forkserver

    _context()
    forkserver.ensure_running()


LEG_ENTRY = "scripts.matrix.cli:main"
"""What a fork runs: the ``main`` of ``python -m scripts.matrix`` (with ``leg CONFIG OUTPUT``)."""


def run_preloaded(argv: list[str], env: dict[str, str], log: Path | None, entry: str = LEG_ENTRY) -> int:
    """``entry(argv)`` (``"module:function"``, returning an exit code) as a fork of the preloaded
    interpreter, with ``env`` as its environment and its output in ``log`` (None: the driver's
    stdout and stderr); its exit code (negative: the signal that ended it)."""
    process = _context().Process(
        target=_fork_main, args=(entry, argv, env, None if log is None else str(log)), name="matrix-leg"
    )
    process.start()
    process.join()
    return process.exitcode if process.exitcode is not None else 1


def _fork_main(entry: str, argv: list[str], env: dict[str, str], log: str | None) -> None:
    """In the fork: what a fresh interpreter started with ``env`` would have had, then the entry."""
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
    missing = [m for m in PRELOAD if m not in sys.modules]
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
