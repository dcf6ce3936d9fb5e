"""Machine-wide CPU slots for vLLM CPU engines: how many run at once, and which cores each gets.

A vLLM CPU engine holds about 1-2 GB and runs its model on OpenMP threads. Two engines started
side by side by two commands (a matrix leg, a test server, a crossover leg) would share cores and,
past a few, run the machine out of memory. Every engine the tooling starts on CPU first takes a
slot here, and a lease gives the engine two things (:meth:`Lease.env`):

* ``VLLM_CPU_OMP_THREADS_BIND``: vLLM 0.34.0 reads it only in the multiprocessing executor, which
  binds each worker it starts (TP > 1) to its core list;
* ``OMP_NUM_THREADS``, the slot's core count: the thread count of every process the engine runs
  its model in without such a worker (TP 1: the uniprocess executor, in the engine core or, with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, in the caller). Without it each of those uses one thread
  per core of the machine, and two engines on two cores spin-wait for each other's threads: the
  matrix's TP 1 legs ran 6.5x slower side by side than alone (docs/cpu-runs.md). A process that
  already imported torch (an in-process engine, a fork of the matrix's preloaded interpreter)
  takes the count through :func:`use_threads`.

* a slot is one core set: the usable cores (``os.sched_getaffinity``) split into
  :func:`slot_count` equal, disjoint sets. An engine takes one slot, whatever its TP size: its
  ranks share the slot's cores (``0|0`` for TP 2 on a one-core slot). The ranks of a tiny model
  mostly wait for each other in collectives, so two engines on two cores finish sooner than one
  engine with a core per rank followed by the next;
* the slot count is the number of usable cores, at most one slot per :data:`GIB_PER_SLOT` of
  the machine's memory; ``VXL_CPU_SLOTS`` overrides it (``1`` runs every engine alone, on all
  cores);
* slots are ``flock`` files in the download cache (``VXL_CACHE_DIR``), so they hold across
  checkouts and commands; the kernel drops a lock when its holder exits, however it exits. A
  request for a slot waits (saying so once) until one is free.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from scripts.errors import ToolError
from scripts.log import info

SLOTS_ENV = "VXL_CPU_SLOTS"
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
THREADS_ENV = "OMP_NUM_THREADS"
GIB_PER_SLOT = 4
"""Memory per slot: a tiny-model CPU engine peaks near 2 GB (TP 2: two workers), twice that
leaves room for the test process and the page cache."""
POLL_S = 0.25


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        return float(GIB_PER_SLOT)


def slot_count() -> int:
    """``VXL_CPU_SLOTS``, or one slot per usable core, at most one per :data:`GIB_PER_SLOT`."""
    raw = os.environ.get(SLOTS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ToolError(f"{SLOTS_ENV}={raw!r}: expected a whole number >= 1")
        return min(int(raw), len(usable_cores()))
    return max(1, min(len(usable_cores()), int(_memory_gib() // GIB_PER_SLOT)))


def slot_cores(slot: int, slots: int, cores: list[int]) -> list[int]:
    """The cores of ``slot``: the ``slot``-th of ``slots`` equal, disjoint runs of ``cores``."""
    per = len(cores) // slots
    return cores[slot * per : (slot + 1) * per]


def omp_bind(tp: int, core_sets: list[list[int]]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``tp`` ranks: rank r on ``core_sets[r * len // tp]``
    (vLLM parses one id list per rank, ``|``-separated; ranks may share a core set). A lease has
    one core set; the rule also says how ``tp`` ranks spread over several (rank r on ``r * n // tp``)."""
    return "|".join(",".join(map(str, core_sets[r * len(core_sets) // tp])) for r in range(tp))


@dataclass(frozen=True)
class Lease:
    slot: int
    cores: tuple[int, ...]
    waited_s: float

    def bind(self, tp: int = 1) -> str:
        """``VLLM_CPU_OMP_THREADS_BIND`` for an engine of ``tp`` ranks, all on this slot's cores."""
        return omp_bind(tp, [list(self.cores)])

    def env(self, tp: int = 1) -> dict[str, str]:
        """What the engine's environment needs: its ranks bound to this lease's cores, and as many
        threads per process as the lease has cores."""
        return {OMP_BIND_ENV: self.bind(tp), THREADS_ENV: str(len(self.cores))}


def use_threads(env: Mapping[str, str]) -> None:
    """Give this process the thread count ``env`` names (:data:`THREADS_ENV`) when torch is
    already imported: torch reads the variable only when it starts its thread pool."""
    torch = sys.modules.get("torch")
    if torch is not None and THREADS_ENV in env:
        torch.set_num_threads(int(env[THREADS_ENV]))


def slots_dir() -> Path:
    from scripts.source import cache_root

    return cache_root() / "cpu-slots"


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _note(fd: int, label: str) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{label} (pid {os.getpid()})\n".encode())


@contextmanager
def cpu_lease(label: str, *, timeout_s: float = 3600.0) -> Iterator[Lease]:
    """Hold one CPU slot for one engine while the block runs."""
    slots = slot_count()
    folder = slots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    said = False
    while True:
        for slot in range(slots):
            fd = _try_lock(folder / f"slot-{slot}.lock")
            if fd is not None:
                break
        else:
            if time.monotonic() - start > timeout_s:
                raise ToolError(f"{label}: no free CPU slot of {slots} after {timeout_s:.0f}s")
            if not said:
                info(f"{label}: waiting for a free CPU slot of {slots} ({folder})")
                said = True
            time.sleep(POLL_S)
            continue
        break
    try:
        _note(fd, label)
        yield Lease(slot, tuple(slot_cores(slot, slots, usable_cores())), time.monotonic() - start)
    finally:
        os.close(fd)  # releases the slot


@contextmanager
def cpu_lease_if(on_cpu: bool, label: str) -> Iterator[Lease | None]:
    """:func:`cpu_lease` on CPU; elsewhere None (a device engine needs no CPU slot)."""
    if not on_cpu:
        yield None
        return
    with cpu_lease(label) as lease:
        yield lease


@contextmanager
def leased_environ(label: str, tp: int = 1) -> Iterator[Lease]:
    """:func:`cpu_lease` for an engine started in this process (``vllm.LLM``): while the block
    runs, ``os.environ`` holds the lease's :meth:`Lease.env` (vLLM's workers read it when they
    start) and this process runs torch on the lease's thread count (:func:`use_threads`); then
    the old values are back in ``os.environ``. The thread count stays: vLLM's CPU worker forbids
    changing it once an engine has run, and every lease of one machine has the same size."""
    with cpu_lease(label) as lease:
        env = lease.env(tp)
        old = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        use_threads(env)
        try:
            yield lease
        finally:
            for key, value in old.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
