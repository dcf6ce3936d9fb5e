"""Running the legs: each a fresh engine in its own process (``python -m scripts.matrix leg``;
on CPU a fork of an interpreter that imported vLLM once, :mod:`scripts.matrix.preloaded`).

On CPU several legs run at once, each on its own cores: every leg first takes a CPU slot
(:mod:`scripts.cpu_slots`, machine-wide, so two matrices or a matrix and a test server never
share a core) and binds its ranks to the slot's cores (a TP 2 leg's two ranks share them).
``--jobs`` caps how many legs run at once (default: the slot count); with more than one, each
leg's output goes to a log file next to the report (its tail is printed when the leg fails).
On a device the legs run one after another and share the terminal, as vLLM's device engines
want the whole machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scripts.cpu_slots import cpu_lease_if, slot_count
from scripts.matrix.legs import NOT_RUN_NO_GRAPHS, Leg
from scripts.matrix.preloaded import leg_start, run_preloaded

LOG_TAIL_LINES = 40


def leg_environment(leg: Leg, default_tp: int, device: str, base: dict[str, str]) -> dict[str, str]:
    """The leg process's environment. On CPU the engine runs in-process (the backend override
    applies); past TP 1 the ranks are worker processes of vLLM's mp executor, so the series'
    attention (and for a graph leg the graph emulation) is installed in each of them through
    the hooks a CPU server uses (:func:`scripts.measure.emulation.server_hooks_env`)."""
    env = {**base, **leg.env(default_tp)}
    if device != "cpu":
        return env
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if leg.tp_size(default_tp) > 1:
        from scripts.measure.emulation import server_hooks_env

        hooks = server_hooks_env(series_attention=True, emulate_graphs=leg.graph)
        if base.get("PYTHONPATH"):
            hooks["PYTHONPATH"] = os.pathsep.join((hooks["PYTHONPATH"], base["PYTHONPATH"]))
        env.update(hooks)
    return env


def leg_jobs(args: argparse.Namespace, device: str) -> int:
    """How many legs run at once: 1 on a device; on CPU ``--jobs`` or the CPU slot count."""
    if device != "cpu":
        return 1
    return args.jobs or slot_count()


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _tail(path: Path) -> str:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(f"    | {line}" for line in lines)


def _run_fresh(cfg: Path, out: Path, env: dict[str, str], log: Path | None) -> int:
    """The leg as ``python -m scripts.matrix leg`` in a fresh interpreter; its exit code."""
    command = [sys.executable, "-m", "scripts.matrix", "leg", str(cfg), str(out)]
    if log is None:
        return subprocess.run(command, env=env, check=False).returncode
    with log.open("wb") as sink:
        return subprocess.run(command, env=env, stdout=sink, stderr=subprocess.STDOUT, check=False).returncode


def _run_one(
    number: int, total: int, leg: Leg, config: dict[str, Any], args: argparse.Namespace, device: str, log: Path | None
) -> dict[str, Any]:
    tp = int(config["tp"])
    with (
        tempfile.TemporaryDirectory(prefix="vxl-leg-") as tmp,
        cpu_lease_if(device == "cpu", f"matrix leg {leg.name}") as lease,
    ):
        cfg, out = Path(tmp) / "config.json", Path(tmp) / "out.json"
        cfg.write_text(json.dumps(config))
        env = leg_environment(leg, args.tp, device, dict(os.environ))
        if lease is not None:
            env.update(lease.env(tp))
        toggles = " ".join(f"{k}={v}" for k, v in leg.env(args.tp).items())
        where = f", cores {lease.bind(tp)}" if lease is not None else ""
        _say(
            f"==> [{number}/{total}] {leg.name}: fresh engine, TP {tp}{where}, "
            f"{len(config['prompts'])} prompts, {toggles}"
        )
        if log is not None:
            _say(f"    {leg.name}: output in {log}")
        t0 = time.monotonic()
        start = leg_start(args.leg_start, device)
        if start == "preloaded":
            returncode = run_preloaded(["leg", str(cfg), str(out)], env, log)
        else:
            returncode = _run_fresh(cfg, out, env, log)
        _say(f"    {leg.name} took {time.monotonic() - t0:.1f}s (exit {returncode})")
        if returncode != 0 and log is not None:
            _say(f"    {leg.name}: last lines of {log}:\n{_tail(log)}")
        if returncode != 0 or not out.exists():
            return {"status": f"error: leg process exited {returncode}"}
        result: dict[str, Any] = json.loads(out.read_text())
        result["leg_start"] = start
        if lease is not None:
            result["cpu_bind"] = lease.bind(tp)
        return result


def run_legs(
    legs: tuple[Leg, ...], configs: dict[str, dict[str, Any]], args: argparse.Namespace, device: str, report: Path
) -> dict[str, dict[str, Any]]:
    """Every leg of ``configs`` (the others are reported as not run); their outputs by name."""
    outputs: dict[str, dict[str, Any]] = {}
    for number, leg in enumerate(legs, 1):
        if leg.name not in configs:
            outputs[leg.name] = {"status": NOT_RUN_NO_GRAPHS}
            _say(f"==> [{number}/{len(legs)}] {leg.name}: {NOT_RUN_NO_GRAPHS}")
    jobs = leg_jobs(args, device)
    logs = report.parent / f"{report.stem}.legs"
    if jobs > 1:
        logs.mkdir(parents=True, exist_ok=True)
        _say(f"==> {len(configs)} legs, up to {jobs} at once; per-leg output in {logs}")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            leg.name: pool.submit(
                _run_one,
                number,
                len(legs),
                leg,
                configs[leg.name],
                args,
                device,
                logs / f"{leg.name}.log" if jobs > 1 else None,
            )
            for number, leg in enumerate(legs, 1)
            if leg.name in configs
        }
        for name, future in futures.items():
            outputs[name] = future.result()
    return {leg.name: outputs[leg.name] for leg in legs}
