"""An exclusive lock on ``build/`` for every command that writes it (apply, build, export, rebase),
and :func:`folder_lock` for a shared folder (the CPU runtime, the tiny models).

Two such commands on one checkout at once would race on ``build/worktree.new`` and the swap into
``build/worktree``; the second one waits (saying whom it waits for) or, with ``--no-wait``, stops
with one line. The lock is an ``flock`` on ``build/.lock``: the kernel drops it when the holder
exits, however it exits, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scripts.errors import ToolError
from scripts.layout import Layout
from scripts.log import info

LOCK_NAME = ".lock"


def lock_path(layout: Layout) -> Path:
    return layout.build / LOCK_NAME


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 200).decode("utf-8", "replace").strip()
    return text or "another process"


@contextmanager
def build_lock(layout: Layout, command: str, wait: bool = True) -> Iterator[None]:
    """Hold the exclusive lock on ``layout.build`` for the duration of the block."""
    layout.build.mkdir(parents=True, exist_ok=True)
    path = lock_path(layout)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            if not wait:
                raise ToolError(
                    f"{layout.build} is in use by {holder}; run again when it has finished "
                    "(without --no-wait to wait for it)"
                ) from None
            info(f"waiting for {holder} to finish with {layout.build} ...")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"`{command}` (pid {os.getpid()})\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<folder>.lock`` next to ``folder`` (waits for the holder;
    dropped by the kernel when the holder exits): one writer of a shared folder at a time."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
