"""Machine-wide CPU slots for CPU engines (scripts/cpu_slots.py): counts, core sets, bindings,
waiting in line, and the lock dropped however its holder exits."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts import cpu_slots
from scripts.errors import ToolError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _own_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VXL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_slots, "usable_cores", lambda: [0, 1, 2, 3])
    monkeypatch.setenv(cpu_slots.SLOTS_ENV, "2")


def test_bindings_spread_ranks_over_the_leased_core_sets() -> None:
    assert cpu_slots.omp_bind(1, [[0]]) == "0"
    assert cpu_slots.omp_bind(2, [[0], [1]]) == "0|1"
    assert cpu_slots.omp_bind(4, [[0], [1]]) == "0|0|1|1"
    assert cpu_slots.omp_bind(2, [[2, 3]]) == "2,3|2,3"  # more ranks than slots: they share
    assert [cpu_slots.slot_cores(s, 2, [0, 1, 2, 3]) for s in (0, 1)] == [[0, 1], [2, 3]]


def test_slot_count_from_the_environment_and_its_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu_slots.slot_count() == 2
    monkeypatch.setenv(cpu_slots.SLOTS_ENV, "9")
    assert cpu_slots.slot_count() == 4  # never more slots than cores
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(cpu_slots.SLOTS_ENV, bad)
        with pytest.raises(ToolError, match=cpu_slots.SLOTS_ENV):
            cpu_slots.slot_count()
    monkeypatch.delenv(cpu_slots.SLOTS_ENV)
    monkeypatch.setattr(cpu_slots, "_memory_gib", lambda: 2 * cpu_slots.GIB_PER_SLOT + 1)
    assert cpu_slots.slot_count() == 2  # memory bounds it below the 4 cores


def test_two_leases_get_disjoint_cores_and_a_third_waits() -> None:
    with cpu_slots.cpu_lease("a") as a, cpu_slots.cpu_lease("b") as b:
        assert {a.bind(), b.bind()} == {"0,1", "2,3"}
        # the ranks' binding, and one thread per core of the slot in every process of the engine
        assert a.env() == {cpu_slots.OMP_BIND_ENV: a.bind(), cpu_slots.THREADS_ENV: "2"}
        assert b.bind(2) == "2,3|2,3"  # a TP 2 engine's ranks share the slot's cores
        with pytest.raises(ToolError, match="no free CPU slot of 2"):
            with cpu_slots.cpu_lease("c", timeout_s=0.5):
                pass
    with cpu_slots.cpu_lease("after") as again:  # released: free again
        assert again.slot == 0


def _hold(ready: multiprocessing.synchronize.Event, cache: str, seconds: float) -> None:
    os.environ["VXL_CACHE_DIR"] = cache
    os.environ[cpu_slots.SLOTS_ENV] = "2"
    with cpu_slots.cpu_lease("holder"), cpu_slots.cpu_lease("holder too"):
        ready.set()
        time.sleep(seconds)


def test_a_lease_held_by_another_process_blocks_until_it_ends(tmp_path: Path) -> None:
    ready = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=_hold, args=(ready, str(tmp_path / "cache"), 1.5))
    holder.start()
    assert ready.wait(20)
    start = time.monotonic()
    with cpu_slots.cpu_lease("waiter") as lease:
        waited = time.monotonic() - start
    holder.join(10)
    assert waited > 0.5 and lease.waited_s > 0.5


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    code = (
        "import os, time; from scripts import cpu_slots\n"
        "with cpu_slots.cpu_lease('doomed'), cpu_slots.cpu_lease('doomed too'):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    env = {**os.environ, "VXL_CACHE_DIR": str(tmp_path / "cache"), cpu_slots.SLOTS_ENV: "2"}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    proc.kill()
    proc.wait(10)
    with cpu_slots.cpu_lease("after", timeout_s=5) as a, cpu_slots.cpu_lease("after too", timeout_s=5) as b:
        assert (a.slot, b.slot) == (0, 1)


class _Torch:
    """What :func:`cpu_slots.use_threads` asks of torch."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def set_num_threads(self, n: int) -> None:
        self.threads.append(n)


def test_leased_environ_binds_this_process_while_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_slots.OMP_BIND_ENV, "auto")
    monkeypatch.delenv(cpu_slots.THREADS_ENV, raising=False)
    torch = _Torch()
    monkeypatch.setitem(sys.modules, "torch", torch)  # an in-process engine's torch is imported already
    with cpu_slots.leased_environ("in-process", tp=2) as lease:
        assert os.environ[cpu_slots.OMP_BIND_ENV] == lease.bind(2) == "0,1|0,1"
        assert os.environ[cpu_slots.THREADS_ENV] == "2" and torch.threads == [2]
    assert os.environ[cpu_slots.OMP_BIND_ENV] == "auto" and cpu_slots.THREADS_ENV not in os.environ


def test_use_threads_reaches_an_imported_torch_only(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = _Torch()
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    cpu_slots.use_threads({cpu_slots.THREADS_ENV: "3"})  # no torch yet: it reads the variable itself
    assert "torch" not in sys.modules
    monkeypatch.setitem(sys.modules, "torch", torch)
    cpu_slots.use_threads({})  # no count named: nothing to do
    cpu_slots.use_threads({cpu_slots.THREADS_ENV: "3"})
    assert torch.threads == [3]
