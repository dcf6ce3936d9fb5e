"""Running the legs: each a fresh engine in its own process (``python -m scripts.matrix leg``;
on CPU a fork of an interpreter that imported vLLM once, :mod:`scripts.matrix.preloaded`).

On CPU several legs run at once, each on its own cores: every leg first takes a CPU slot
(:mod:`scripts.cpu_slots`, machine-wide, so two matrices or a matrix and a test server never
share a core) and binds its ranks to the slot's cores (a TP 2 leg's two ranks share them).
``--jobs`` caps how many legs run at once (default: the slot count); with more than one, each
leg's output goes to a log file next to the report (its tail is printed when the leg fails).
On a device the legs run one after another and share the terminal, as vLLM's device engines
want the whole machine.

Every leg has a time limit (``--leg-timeout``; by default scaled to the tokens a leg generates).
A leg is a process group of its own, stopped as a whole group at its limit (:mod:`scripts.procs`:
the engine's core and worker processes with it), and its CPU slot is released only once no
process of that group is left, so the next leg never shares its cores with a hung one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts import procs
from scripts.cpu_slots import cpu_lease_if, slot_count
from scripts.matrix.legs import NOT_RUN_NO_GRAPHS, Leg
from scripts.matrix.preloaded import LEG_ENTRY, PRELOAD, PreloadedInterpreter, leg_start

LOG_TAIL_LINES = 40
LEG_TIMEOUT_BASE_S = 600.0
"""Per leg, before any token: importing vLLM, loading the models, warm-up and (on a device)
graph capture; a tiny-model CPU leg needs 10-40 s of it, a real model on a device minutes."""
LEG_TIMEOUT_PER_TOKEN_S = 1.0
"""Per token a leg generates: CPU legs of the tiny pair take 0.02-0.25 s per token
(docs/cpu-runs.md); the margin covers a slow machine and interpreted Triton."""


def default_leg_timeout(prompts: int, max_tokens: int, long_prompt_tokens: int) -> float:
    """Seconds a leg may take: :data:`LEG_TIMEOUT_BASE_S` plus :data:`LEG_TIMEOUT_PER_TOKEN_S`
    for each token it generates (every prompt's ``max_tokens``; the long-context prompt's
    ``max(8, max_tokens // 4)``)."""
    tokens = prompts * max_tokens + (max(8, max_tokens // 4) if long_prompt_tokens > 0 else 0)
    return LEG_TIMEOUT_BASE_S + LEG_TIMEOUT_PER_TOKEN_S * tokens


def leg_timeout(args: argparse.Namespace) -> float:
    """``--leg-timeout``, or :func:`default_leg_timeout` for this run's prompts and tokens."""
    if args.leg_timeout is not None:
        return float(args.leg_timeout)
    return default_leg_timeout(args.prompts, args.max_tokens, args.long_prompt_tokens)


@dataclass(frozen=True)
class LegProcess:
    """What a leg's process runs: ``python -m MODULE leg CONFIG OUTPUT`` (fresh) or ``ENTRY`` in
    a fork of an interpreter that imported ``preload`` (preloaded). The defaults are the matrix's
    own leg; tests put a stand-in leg here that needs no vLLM."""

    module: str = "scripts.matrix"
    entry: str = LEG_ENTRY
    preload: tuple[str, ...] = PRELOAD
    grace_s: float = procs.GRACE_S


MATRIX_LEG = LegProcess()


def leg_environment(leg: Leg, default_tp: int, device: str, base: dict[str, str]) -> dict[str, str]:
    """The leg process's environment (the series' options are not in it: they go to the engine's
    ``additional_config``, ``config["options"]`` of the leg). On CPU the engine runs in-process
    (the backend override applies); past TP 1 the ranks are worker processes of vLLM's mp
    executor, so the series' attention is installed in each of them through the hook a CPU server
    uses (:func:`scripts.measure.emulation.series_attention_env`). The graph emulation and the XCCL
    ring stand-in a leg turns on need nothing here: both are asked in the engine's config, which
    every worker gets (``scripts/cpu_standins``)."""
    env = dict(base)
    if device != "cpu":
        return env
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if leg.tp_size(default_tp) > 1:
        from scripts.measure.emulation import series_attention_env

        hooks = series_attention_env()
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


def _run_fresh(
    cfg: Path, out: Path, env: dict[str, str], log: Path | None, timeout_s: float, how: LegProcess
) -> procs.Finished:
    """The leg as ``python -m scripts.matrix leg`` in a fresh interpreter, its own process group."""
    command = [sys.executable, "-m", how.module, "leg", str(cfg), str(out)]
    if log is None:
        return procs.run(command, env=env, timeout_s=timeout_s, grace_s=how.grace_s)
    with log.open("wb") as sink:
        return procs.run(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout_s=timeout_s, grace_s=how.grace_s
        )


def _run_one(
    number: int,
    total: int,
    leg: Leg,
    config: dict[str, Any],
    args: argparse.Namespace,
    device: str,
    log: Path | None,
    how: LegProcess,
    interpreter: PreloadedInterpreter | None,
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
        options = json.dumps(config["options"], separators=(",", ":"))
        where = f", cores {lease.bind(tp)}" if lease is not None else ""
        _say(
            f"==> [{number}/{total}] {leg.name}: fresh engine, TP {tp}{where}, "
            f"{len(config['prompts'])} prompts, options {options}"
        )
        if log is not None:
            _say(f"    {leg.name}: output in {log}")
        start = leg_start(args.leg_start, device)
        limit = leg_timeout(args)
        if start == "preloaded":
            assert interpreter is not None  # run_legs starts one for preloaded legs
            argv = ["leg", str(cfg), str(out)]
            done = interpreter.run(argv, env, log, how.entry, timeout_s=limit, grace_s=how.grace_s)
        else:
            done = _run_fresh(cfg, out, env, log, limit, how)
        returncode = done.returncode
        if done.timed_out:
            _say(f"    {leg.name}: timed out after {limit:.0f}s; its process group stopped in {done.stop_s:.1f}s")
        else:
            _say(f"    {leg.name} took {done.seconds:.1f}s (exit {returncode})")
        if returncode != 0 and log is not None:
            _say(f"    {leg.name}: last lines of {log}:\n{_tail(log)}")
        if done.timed_out:
            return {"status": f"error: leg timed out after {limit:.0f} s"}
        if returncode != 0 or not out.exists():
            return {"status": f"error: leg process exited {returncode}"}
        result: dict[str, Any] = json.loads(out.read_text())
        result["leg_start"] = start
        result["wall_seconds"] = done.seconds
        if lease is not None:
            result["cpu_bind"] = lease.bind(tp)
        return result


def run_legs(
    legs: tuple[Leg, ...],
    configs: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    device: str,
    report: Path,
    how: LegProcess = MATRIX_LEG,
    interpreter: PreloadedInterpreter | None = None,
) -> dict[str, dict[str, Any]]:
    """Every leg of ``configs`` (the others are reported as not run); their outputs by name. When
    the wait is interrupted, the legs not started yet are dropped (the running ones are stopped
    by :func:`scripts.procs.stopping_on_signals`, or by their own wait). Preloaded legs fork
    ``interpreter`` (the caller's, started early and stopped by it; None: one importing
    ``how.preload`` for these legs, stopped when they are done)."""
    if interpreter is None and leg_start(args.leg_start, device) == "preloaded":
        with PreloadedInterpreter(how.preload) as own:
            return run_legs(legs, configs, args, device, report, how, own)
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
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
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
                how,
                interpreter,
            )
            for number, leg in enumerate(legs, 1)
            if leg.name in configs
        }
        for name, future in futures.items():
            outputs[name] = future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return {leg.name: outputs[leg.name] for leg in legs}
