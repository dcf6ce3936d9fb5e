"""Pristine vLLM on a stand-in CPU runtime serves the tiny Laguna: greedy tokens against transformers.

Not in ``nox -s tests cpu_tests``; ``nox -s stand_in`` (CI) runs its cases through
``tests/stand_in`` in the pristine runtime of pins.toml's release. By hand, with the pristine
stand-in runtime's python, e.g.::

    python -m scripts.cpu_runtime ensure --pristine
    $(python -m scripts.cpu_runtime where --pristine) \\
        -m scripts.measure.stand_in_proof --models build/tiny-laguna --tokens 16

Each case is one offline ``vllm.LLM`` engine in a fresh interpreter, under a CPU slot lease, with
the workaround switches of ``scripts/measure/series_attention/xpu_laguna_cpu_workarounds.py`` it
names; the transformers reference is a plain greedy decode (no cache) of the same checkpoint. The
cases show each pristine failure without its workaround and the parity with both:

* ``target``: no workaround -- tokens differ from transformers (bug B, zero routing bias);
* ``target+B``: equal to transformers;
* ``dflash+B``: DFlash without workaround A -- the engine fails (bug A, IndexError);
* ``dflash+A+B``: equal to transformers (and so to ``target+B``);
* ``served:target+B``, ``served:dflash+A+B``: the same engines behind the OpenAI server
  (``vllm.entrypoints.openai.api_server`` on loopback, :mod:`scripts.measure.server`), one streamed
  greedy completion per prompt (the prompt sent as token ids), equal to transformers.

Every engine runs at most :data:`MAX_NUM_SEQS` sequences at once (the prompt count).

Prints one JSON line per case and a verdict; exit 1 when an expectation does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts import REPO_ROOT

APPLIED_LINE = "XPU Laguna CPU workaround applied"  # xpu_laguna_cpu_workarounds.APPLIED_LINE
PLUGIN_DIR = REPO_ROOT / "scripts" / "measure" / "series_attention"
PROMPTS = ("The quick brown fox", "def fibonacci(n):", "Laguna is a model that")
A, B = "XPU_LAGUNA_CPU_FIX_DFLASH_QKV", "XPU_LAGUNA_CPU_FIX_LAGUNA_BIAS"
CASES: dict[str, tuple[bool, tuple[str, ...], str | None]] = {
    # name: (dflash, switches, expectation)
    "target": (False, (), "differs"),
    "target+B": (False, (B,), "equal"),
    "dflash+B": (True, (B,), "fails"),
    "dflash+A+B": (True, (A, B), "equal"),
    # timing only (any release, e.g. the whole 0.32.0 runtime with the series): no switch, no expectation
    "plain": (False, (), None),
    "plain-dflash": (True, (), None),
}
SERVED = "served:"
"""Prefix of a case served through the OpenAI server instead of run offline (same switches, same
expectation)."""
DEFAULT_CASES = "target,target+B,dflash+B,dflash+A+B,served:target+B,served:dflash+A+B"
MAX_MODEL_LEN = 512
KV_CACHE_BYTES = 64 << 20
MAX_NUM_SEQS = len(PROMPTS)
"""Sequences an engine runs at once: the prompt count. The prompts share every step, as with vLLM's
default, but the kernels' grids are sized for 3 requests, not vLLM's default maximum (measured in
docs/cpu-runs.md: one at a time shrinks the grids further but triples the steps)."""
SERVE_READY_S = 600.0


def case_spec(name: str) -> tuple[bool, tuple[str, ...], str | None, bool]:
    """``(dflash, switches, expectation, served)`` of a case name (``served:`` + an offline case)."""
    served = name.startswith(SERVED)
    base = name[len(SERVED) :] if served else name
    if base not in CASES:
        raise SystemExit(f"unknown case {name!r}; known: {', '.join(CASES)} (each also as {SERVED}NAME)")
    return (*CASES[base], served)


@dataclass(frozen=True)
class Engine:
    """What every engine of a run is given: the tiny pair in ``models`` (``target/``, ``draft/``),
    greedy ``tokens`` per prompt, TP ``tp``, at most ``max_num_seqs`` sequences at once (None:
    vLLM's default); ``profile``: the offline engine core in its interpreter and the Triton
    interpreter's launches timed; ``in_process``: that engine core in its interpreter, no launch
    timed."""

    models: Path
    tokens: int
    tp: int = 1
    max_num_seqs: int | None = MAX_NUM_SEQS
    profile: bool = False
    in_process: bool = False

    def speculative_config(self, dflash: bool) -> dict[str, Any] | None:
        return (
            {"method": "dflash", "model": str(self.models / "draft"), "num_speculative_tokens": 7} if dflash else None
        )

    def serve_args(self, dflash: bool) -> list[str]:
        """The offline engine's settings as ``vllm serve`` options."""
        args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN)]
        args += ["--kv-cache-memory-bytes", str(KV_CACHE_BYTES)]
        args += ["--max-num-seqs", str(self.max_num_seqs)] if self.max_num_seqs else []
        args += ["--tensor-parallel-size", str(self.tp)]
        spec = self.speculative_config(dflash)
        return args + (["--speculative-config", json.dumps(spec)] if spec else [])

    def options(self) -> list[str]:
        """This engine as the options of this module's command line."""
        out = ["--models", str(self.models), "--tokens", str(self.tokens), "--tp", str(self.tp)]
        out += ["--max-num-seqs", str(self.max_num_seqs or 0)]
        return out + [*(["--profile"] if self.profile else []), *(["--in-process"] if self.in_process else [])]


def _timings(ready_s: float, generate_s: float, tokens: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Start-up and generation time of an engine that produced ``rows`` (one per prompt)."""
    return {
        "startup_s": round(ready_s, 1),
        "generate_s": round(generate_s, 2),
        "ms_per_token": round(generate_s * 1000 / (tokens * len(rows)), 1),
        "rows": rows,
    }


class TritonProfile:
    """Launches and seconds per Triton kernel run by the interpreter (``InterpretedFunction.run``), and
    engine steps: needs the engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""

    def __init__(self) -> None:
        self.kernels: dict[str, list[float]] = {}
        self.steps = 0
        self.on = False
        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError:  # no Triton: nothing to profile
            return
        original = InterpretedFunction.run
        profile = self

        def run(self, *args, grid, warmup, **kwargs):  # type: ignore[no-untyped-def]
            if warmup or not profile.on:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            start = time.perf_counter()
            try:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                entry = profile.kernels.setdefault(self.fn.__name__, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - start

        InterpretedFunction.run = run

    def count_steps(self, engine: Any) -> None:
        step = engine.step

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            if self.on:
                self.steps += 1
            return step(*args, **kwargs)

        engine.step = counted

    def summary(self, generate_s: float) -> dict[str, Any]:
        total = sum(s for _, s in self.kernels.values())
        launches = sum(int(n) for n, _ in self.kernels.values())
        return {
            "engine_steps": self.steps,
            "triton_launches": launches,
            "launches_per_step": round(launches / max(self.steps, 1), 1),
            "triton_s": round(total, 2),
            "triton_share": round(total / generate_s, 2) if generate_s else None,
            "kernels": {k: [int(n), round(s * 1000 / max(n, 1), 2)] for k, (n, s) in sorted(self.kernels.items())},
        }


def engine_case(engine: Engine, dflash: bool) -> dict[str, Any]:
    """One engine in this process: greedy tokens per prompt and per-token decode time."""
    if engine.profile or engine.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    prof = TritonProfile() if engine.profile else None
    from vllm import LLM, SamplingParams

    start = time.monotonic()
    llm = LLM(
        model=str(engine.models / "target"),
        dtype="float32",
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        max_num_seqs=engine.max_num_seqs,
        seed=0,
        speculative_config=engine.speculative_config(dflash),
        tensor_parallel_size=engine.tp,
    )
    ready = time.monotonic() - start
    params = SamplingParams(temperature=0.0, max_tokens=engine.tokens, ignore_eos=True)
    # a warm-up before the timed launches; none otherwise (ms_per_token then includes the first step)
    if engine.profile:
        llm.generate(list(PROMPTS[:1]), SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    if prof is not None:
        prof.count_steps(llm.llm_engine)
        prof.on = True
    gen_start = time.monotonic()
    outputs = llm.generate(list(PROMPTS), params, use_tqdm=False)
    gen_s = time.monotonic() - gen_start
    if prof is not None:
        prof.on = False
    rows = [{"prompt_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)} for o in outputs]
    return {
        **({"profile": prof.summary(gen_s)} if prof is not None else {}),
        **_timings(ready, gen_s, engine.tokens, rows),
    }


_HF_MODELS: dict[Path, Any] = {}


def prompt_token_ids(models: Path) -> list[list[int]]:
    """:data:`PROMPTS` as the target's tokenizer encodes them (special tokens added, as vLLM does)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(models / "target"))
    return [list(tokenizer(p)["input_ids"]) for p in PROMPTS]


def hf_greedy(models: Path, prompt_ids: list[int], n: int) -> list[int]:
    """Transformers' plain greedy decode (no cache) of ``n`` tokens after ``prompt_ids``."""
    import torch
    from transformers import LagunaForCausalLM

    if models not in _HF_MODELS:
        _HF_MODELS[models] = LagunaForCausalLM.from_pretrained(str(models / "target"), dtype=torch.float32).eval()
    model = _HF_MODELS[models]
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def _root_cause(text: str) -> str:
    """The first "SomeError: ..." line of a traceback, else the first line naming an error."""
    lines = text.splitlines()  # vLLM logs (workers' tracebacks too) to stdout
    roots = [
        m.group(0)
        for ln in lines
        if (m := re.search(r"\b(?!EngineDead)\w*(?:Error|Exception): .*", ln)) and "EngineCore encountered" not in ln
    ]
    errors = roots or [ln for ln in lines if "Error" in ln or "error" in ln] or ["?"]
    return errors[0][-300:]


def case_env(switches: tuple[str, ...]) -> dict[str, str]:
    """This environment without either switch, with ``switches`` on and the plugin folder first on
    ``PYTHONPATH`` (vLLM finds the workarounds' general plugin there)."""
    env = {k: v for k, v in os.environ.items() if k not in (A, B)}
    env.update({s: "1" for s in switches})
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR), str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _failed(name: str, error: str, wall_s: float | None = None) -> dict[str, Any]:
    """The result of a case whose engine failed or never answered."""
    return {"case": name, "ok": False, **({} if wall_s is None else {"wall_s": wall_s}), "error": error}


def served_case(name: str, engine: Engine, timeout_s: float, logs: Path | None = None) -> dict[str, Any]:
    """The case's engine behind the OpenAI server on loopback, on a CPU slot: one streamed greedy
    completion per prompt, one after another (prompts sent as token ids)."""
    import tempfile

    from scripts.cpu_slots import cpu_lease
    from scripts.measure import client
    from scripts.measure.server import HOST, Server, free_port, serve_argv

    dflash, switches, _, _ = case_spec(name)
    prompts = prompt_token_ids(engine.models)
    port = free_port()
    argv = serve_argv(sys.executable, str(engine.models / "target"), port, engine.serve_args(dflash))
    folder = logs or Path(tempfile.mkdtemp(prefix="stand-in-serve-"))
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{name.replace(':', '-')}-tp{engine.tp}.log"
    rows: list[dict[str, Any]] = []
    with cpu_lease(f"stand-in proof {name}") as lease:
        start = time.monotonic()
        waited = round(lease.waited_s, 1)
        with Server(argv, {**case_env(switches), **lease.env(engine.tp)}, log_path, port, cwd=REPO_ROOT) as server:
            try:
                ready = server.wait_ready(timeout_s)
            except Exception as exc:  # noqa: BLE001 -- the server died or never answered: the case fails
                server.stop()
                text = log_path.read_text(encoding="utf-8", errors="replace")
                error = _root_cause(text) if "Error" in text else str(exc)[-300:]
                return _failed(name, error, round(time.monotonic() - start, 1))
            gen_start = time.monotonic()
            for ids in prompts:
                body = {"model": "model", "prompt": ids, "max_tokens": engine.tokens, "temperature": 0.0}
                body.update(stream=True, ignore_eos=True, return_token_ids=True)
                result = client.stream_completion(HOST, port, body, timeout_s)
                if result.error:
                    return _failed(name, result.error, round(time.monotonic() - start, 1))
                rows.append({"prompt_ids": ids, "token_ids": result.token_ids})
            gen_s = time.monotonic() - gen_start
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if logs is None:
        log_path.unlink(missing_ok=True)
        folder.rmdir()
    return {
        "case": name,
        "ok": True,
        "wall_s": round(time.monotonic() - start, 1),
        "slot_wait_s": waited,
        "workarounds_applied": sorted(set(re.findall(rf"{APPLIED_LINE}: (\w+)", text))),
        **_timings(ready, gen_s, engine.tokens, rows),
    }


def run_case(name: str, engine: Engine, timeout_s: float, logs: Path | None = None) -> dict[str, Any]:
    """The case in a fresh interpreter (its switches set before vLLM loads its plugins), on a CPU slot;
    a ``served:`` case through the OpenAI server (:func:`served_case`)."""
    from scripts.cpu_slots import cpu_lease

    dflash, switches, _, served = case_spec(name)
    if served:
        return served_case(name, engine, timeout_s, logs)
    env = case_env(switches)
    cmd = [sys.executable, "-m", "scripts.measure.stand_in_proof", *engine.options()]
    cmd += ["--engine", "dflash" if dflash else "target"]
    with cpu_lease(f"stand-in proof {name}") as lease:
        env.update(lease.env(engine.tp))
        waited = round(lease.waited_s, 1)
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return _failed(name, f"timed out after {timeout_s:.0f}s")
    wall = round(time.monotonic() - start, 1)
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{name}-tp{engine.tp}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not last:
        return _failed(name, _root_cause(proc.stdout + proc.stderr), wall)
    applied = sorted(set(re.findall(rf"{APPLIED_LINE}: (\w+)", proc.stderr)))
    return {
        "case": name,
        "ok": True,
        "wall_s": wall,
        "slot_wait_s": waited,
        "workarounds_applied": applied,
        **json.loads(last[-1]),
    }


def first_difference(ref: list[int], got: list[int]) -> int | None:
    """Index of the first token that differs (a shorter or longer output differs where it ends)."""
    found = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if found is None and len(ref) != len(got):
        return min(len(ref), len(got))
    return found


def judge(results: list[dict[str, Any]], models: Path, tokens: int) -> int:
    """Compare each ran case's tokens with transformers' greedy tokens of the same prompt ids; set
    ``first_difference_per_prompt``, ``expected`` and ``got`` on each result; the count of cases
    not as expected."""
    refs: dict[tuple[int, ...], list[int]] = {}
    failed = 0
    for r in results:
        expect = case_spec(r["case"])[2]
        if r.get("ok"):
            firsts = []
            for row in r["rows"]:
                key = tuple(row["prompt_ids"])
                if key not in refs:
                    refs[key] = hf_greedy(models, list(key), tokens)
                firsts.append(first_difference(refs[key], row["token_ids"]))
            r["first_difference_per_prompt"] = firsts
            got = "equal" if firsts and all(f is None for f in firsts) else "differs"
        else:
            got = "fails"
        r["expected"], r["got"] = expect, got
        failed += expect is not None and got != expect
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.measure.stand_in_proof", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--models", type=Path, required=True, help="folder with the tiny target/ and draft/")
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size of every engine")
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated cases to run")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per engine case")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="engine core in-process; time the Triton interpreter's launches per kernel and count engine steps",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=MAX_NUM_SEQS,
        help="sequences an engine runs at once (0: vLLM's default; default: %(default)s, the prompt count)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="offline cases: the engine core in the case's interpreter (no engine-core process)",
    )
    parser.add_argument("--logs", type=Path, default=None, help="folder for each engine's output (default: none kept)")
    parser.add_argument("--engine", choices=("target", "dflash"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    engine = Engine(args.models, args.tokens, args.tp, args.max_num_seqs or None, args.profile, args.in_process)
    if args.engine:
        print(json.dumps(engine_case(engine, args.engine == "dflash")), flush=True)
        return 0
    results = [run_case(name, engine, args.timeout, args.logs) for name in args.cases.split(",")]
    failed = judge(results, args.models, args.tokens)
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "rows"}), flush=True)
    print(
        f"{len(results) - failed}/{len(results)} cases as expected "
        f"({args.tokens} tokens x {len(PROMPTS)} prompts, TP {args.tp})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
