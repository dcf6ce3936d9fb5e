"""The ranks of ``op_invariance_check``'s all-reduce check: one process per rank (spawned; each in a
process group of its own), a free TCP port for their rendezvous, and the stop of every rank's group.

Each rank reduces ``rows`` random BF16 rows with the backend's own ``dist.all_reduce`` and with an
all-gather plus BF16 adds in rank order, then compares every row of the many-row call with the same
row reduced alone (row-invariance) and the results of all ranks (agreement); rank 0 writes the
counts as JSON.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def all_reduce_worker(
    rank: int, world: int, port: int, device: str, rows: int, width: int, trials: int, out: str
) -> None:
    os.setsid()  # a group of its own: the parent stops the rank with whatever it started
    import torch
    import torch.distributed as dist

    backend = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl"}[device]
    dev = torch.device("cpu") if device == "cpu" else torch.device(device, rank)
    if device != "cpu":
        getattr(torch, device).set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")

    def reduce_default(x: Any) -> Any:
        y = x.clone()
        dist.all_reduce(y)
        return y

    def reduce_rank_order(x: Any) -> Any:
        gathered = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(gathered, x.contiguous())
        parts = gathered.view(world, *x.shape)
        total = parts[0].clone()
        for r in range(1, world):
            total.add_(parts[r])  # BF16 adds in rank order 0, 1, ..., world-1
        return total

    result: dict[str, list[int]] = {}
    for name, fn in (("dist.all_reduce", reduce_default), ("gather+rank-sum", reduce_rank_order)):
        compared = equal = agree = 0
        for trial in range(trials):
            gen = torch.Generator().manual_seed(1000 * trial + rank)
            x = torch.randn(rows, width, generator=gen).to(torch.bfloat16).to(dev)
            full = fn(x)
            for i in range(rows):
                one = fn(x[i : i + 1].clone())
                equal += bool(torch.equal(full[i], one[0]))
                compared += 1
            copies = [torch.empty_like(full) for _ in range(world)]
            dist.all_gather(copies, full)
            agree += all(bool(torch.equal(copies[0], c)) for c in copies)
        result[name] = [compared, equal, agree, trials]
    if rank == 0:
        Path(out).write_text(json.dumps(result), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


def stop_ranks(processes: list[Any]) -> None:
    """Each rank is a process group of its own (``os.setsid()`` first thing): stop them as groups
    (:mod:`scripts.procs`), and a rank stopped before its ``setsid`` directly."""
    from scripts import procs

    procs.stop_groups([p.pid for p in processes], steps=procs.steps_for(5.0))
    for p in processes:
        if p.is_alive():
            p.kill()
        p.join(5)
