"""Device check of breakable graphs: tiny Laguna with graphs off and on.

On a CUDA GPU (the same breakable code path, with CUDA graphs) or an Intel
XPU, runs the tiny random Laguna target (``scripts.tiny_laguna``) once per
leg, each leg in its own process and one engine at a time:

* ``off-md0`` graphs off (eager), prebuilt exact metadata off: the reference;
* ``on-md0``  the series' option ``breakable_graph`` on;
* with ``--metadata both`` also ``off-md1`` / ``on-md1``
  (the option ``prebuilt_metadata`` on).

Each leg's engine gets its options in its config (``additional_config["xpu_laguna"]``): the leg's
``breakable_graph``, ``prebuilt_metadata`` and ``verify_width`` (``--width``), always named, over
``--series-options`` (the day-one run passes the recipe's).

Each leg generates greedily and times every engine step (cycle). By default
the first prompt is a long one past 4K tokens (``--long-prompt-tokens``),
followed by short ones (long-then-next), with DFlash M8 drafting. The parent
prints a table (greedy tokens equal to the reference, cycles, median / p90
decode step latency, tokens per second, speed-up over the eager leg of the
same metadata setting, and the breakable-graph wrappers' own accounting:
graphs / breaks / replays of the target and of the drafter) and the audited
capture lines of the graph legs, and exits 0 only when every leg is
token-identical to the reference, every graph leg captured target and
drafter, and every leg ran at least ``--min-cycles`` cycles.

``--emulate-graphs`` runs the graph legs on CPU through the recording
stand-in graph (the test-side ``xpu_laguna_standins.emulated_graphs``): a self
test of this script, reported as emulated, never as a device result.

Without a device the legs refuse with one line (exit 3); ``--help``,
argument validation and ``--dry-run`` (the plan: legs, their options and
environments) need no torch.

    python3 -m scripts.device.graph_check --dry-run
    python3 -m scripts.device.graph_check --tokens 128 --spec dflash --metadata both
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts import procs
from scripts.series_options import OPTIONS_KEY, additional_config, checked, options_argument

__all__ = ["Leg", "LegResult", "plan_legs", "validate", "main"]

PROMPTS = (
    "The lagoon is calm in the morning and",
    "def add(a, b):\n",
    "Speculative decoding drafts several tokens and",
    "Numbers 0 1 2 3",
)
NO_DEVICE_EXIT = 3
AUDIT_MARK = "graph captured"
LONG_WORDS = (
    "amber",
    "basalt",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "granite",
    "harbor",
    "iris",
    "juniper",
    "kestrel",
    "lagoon",
    "meadow",
    "nimbus",
    "orchid",
    "prairie",
    "quartz",
    "river",
    "summit",
    "tundra",
)


def long_prompt_text(words: int) -> str:
    """Deterministic text of ``words`` words."""
    return " ".join(LONG_WORDS[(i * 7 + i // 20) % len(LONG_WORDS)] for i in range(words))


def long_prompt_ids(encode: Callable[[str], list[int]], tokens: int) -> list[int]:
    """Exactly ``tokens`` token ids: the long text's ids, repeated as needed."""
    ids = encode(long_prompt_text(max(16, tokens // 2)))
    return (ids * (tokens // max(len(ids), 1) + 1))[:tokens]


def prompts_for(args: argparse.Namespace, encode: Callable[[str], list[int]]) -> list[Any]:
    """The long prompt (token ids, when asked for) first, then the short ones."""
    short: list[Any] = list(PROMPTS[: args.prompts])
    if not args.long_prompt_tokens:
        return short
    return [{"prompt_token_ids": long_prompt_ids(encode, args.long_prompt_tokens)}, *short]


def max_model_len(args: argparse.Namespace) -> int:
    if not args.long_prompt_tokens:
        return 512
    return args.long_prompt_tokens + args.tokens + 2 * args.width + 64


class CheckError(Exception):
    """Expected failure; one-line message."""


@dataclass(frozen=True)
class Leg:
    graphs: bool
    metadata: bool

    @property
    def name(self) -> str:
        return f"{'on' if self.graphs else 'off'}-md{int(self.metadata)}"

    def options(self, width: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The series' options of this leg's engine: ``extra`` (``--series-options``) under the
        leg's own switches and the verify width, which are always named (on CPU a switch named
        true is how an engine asks for the series)."""
        own = {"breakable_graph": self.graphs, "prebuilt_metadata": self.metadata, "verify_width": width}
        return checked({**(extra or {}), **own}, f"leg {self.name}: {OPTIONS_KEY}")

    def env(self, device: str) -> dict[str, str]:
        # In-process engine core: step timings without IPC, capture log lines on this leg's own
        # output. vLLM 0.32.0 has XPU graphs on by default (no VLLM_XPU_ENABLE_XPU_GRAPH); the
        # off legs run eagerly through enforce_eager.
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass
class LegResult:
    leg: Leg
    device: str = ""
    tokens: list[list[int]] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    audit: list[str] = field(default_factory=list)
    graphs: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def cycles(self) -> int:
        return len(self.step_ms)

    @property
    def decode_tokens(self) -> int:
        return sum(max(len(t) - 1, 0) for t in self.tokens)

    def median_ms(self) -> float:
        return statistics.median(self.step_ms) if self.step_ms else float("nan")

    def p90_ms(self) -> float:
        if not self.step_ms:
            return float("nan")
        s = sorted(self.step_ms)
        return s[min(len(s) - 1, int(0.9 * len(s)))]

    def tok_per_s(self) -> float:
        total = sum(self.step_ms) / 1000.0
        return self.decode_tokens / total if total > 0 else float("nan")


def validate(args: argparse.Namespace) -> None:
    if not 1 <= args.tokens <= 4096:
        raise CheckError(f"--tokens must be 1..4096, not {args.tokens}")
    if not 1 <= args.width <= 16:
        raise CheckError(f"--width must be 1..16, not {args.width}")
    if args.spec != "none" and args.width < 2:
        raise CheckError("--spec needs --width >= 2 (width = 1 + draft tokens)")
    if not 1 <= args.prompts <= len(PROMPTS):
        raise CheckError(f"--prompts must be 1..{len(PROMPTS)}, not {args.prompts}")
    if args.models is not None and not (args.models / "target").is_dir():
        raise CheckError(f"--models {args.models}: no target/ folder inside")
    if args.spec == "dflash" and args.models is not None:
        if not (args.models / "draft").is_dir():
            raise CheckError(f"--models {args.models}: no draft/ folder inside")
    if args.leg is not None and args.leg not in {lg.name for lg in plan_legs("both")}:
        raise CheckError(f"unknown leg {args.leg!r}")
    if args.leg is not None and args.models is None:
        raise CheckError("a leg needs --models")
    if args.leg_timeout < 30:
        raise CheckError(f"--leg-timeout must be >= 30 s, not {args.leg_timeout}")
    if not 0 <= args.long_prompt_tokens <= 16384:
        raise CheckError(f"--long-prompt-tokens must be 0..16384, not {args.long_prompt_tokens}")
    if args.min_cycles < 0:
        raise CheckError(f"--min-cycles must be >= 0, not {args.min_cycles}")


def plan_legs(metadata: str) -> list[Leg]:
    mds = {"off": [False], "on": [True], "both": [False, True]}[metadata]
    return [Leg(graphs=g, metadata=m) for m in mds for g in (False, True)]


# ---------------------------------------------------------------------------
# Leg (child process): one engine
# ---------------------------------------------------------------------------


def _detect_device(wanted: str, allow_cpu: bool = False) -> str:
    import torch

    if allow_cpu:
        return "cpu"

    has = {
        "cuda": torch.cuda.is_available(),
        "xpu": hasattr(torch, "xpu") and torch.xpu.is_available(),
    }
    if wanted != "auto":
        if not has[wanted]:
            raise CheckError(f"no {wanted} device here: graph check not run")
        return wanted
    for name in ("xpu", "cuda"):
        if has[name]:
            return name
    raise CheckError("no CUDA or XPU device here: graph check not run")


def _speculative_config(args: argparse.Namespace) -> dict[str, Any] | None:
    k = args.width - 1
    if args.spec == "dflash":
        return {
            "method": "dflash",
            "model": str(args.models / "draft"),
            "num_speculative_tokens": k,
        }
    if args.spec == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    return None


def _accounting(worker: Any) -> dict[str, Any]:
    from vllm.xpu_laguna.graphs.wrapper import graph_accounting

    return graph_accounting(worker.model_runner)


def run_leg(args: argparse.Namespace, leg: Leg) -> dict[str, Any]:
    cpu = args.cpu_plumbing or args.emulate_graphs
    device = _detect_device(args.device, allow_cpu=cpu)
    if device == "cpu" and leg.graphs and not args.emulate_graphs:
        raise CheckError("graph legs need a CUDA or XPU device: not run")
    from vllm import LLM, SamplingParams

    extra: dict[str, Any] = {}
    config = additional_config(leg.options(args.width, args.series_options))
    if device == "cpu" and leg.graphs:
        from scripts.cpu_standins import standin_module

        # the recording stand-in for this engine's graphs, asked in its config
        config.update(standin_module().emulation_entry())
        # As the matrix's emulated legs: no JIT warm-up. It only moves first compiles out of the
        # first request, and its sampler warm-up launches the top-k/top-p kernel, which Triton's
        # interpreter cannot run (``tl.range`` over a program id yields Python ints there).
        extra["kernel_config"] = {"enable_jit_warmup": False}
    if device == "cuda" and leg.graphs:
        # the series' worker on CUDA (the XPU platform names its own): its runner presets the
        # series' breakable wrapper
        from scripts.device._cuda_series_worker import WORKER

        extra["worker_cls"] = WORKER
    if leg.graphs:
        w = args.width
        extra["compilation_config"] = {
            "mode": 0,
            "cudagraph_mode": "PIECEWISE",
            "cudagraph_capture_sizes": [w],
        }
    llm = LLM(
        model=str(args.models / "target"),
        dtype=args.dtype,
        seed=0,
        enforce_eager=not leg.graphs,
        max_model_len=max_model_len(args),
        max_num_seqs=1,
        kv_cache_memory_bytes=512 << 20,
        enable_prefix_caching=False,
        speculative_config=_speculative_config(args),
        additional_config=config,
        **extra,
    )
    try:
        engine = llm.llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
        llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4))
        tokens: list[list[int]] = []
        step_ms: list[float] = []
        prefill_ms: list[float] = []
        prompt_tokens: list[int] = []
        tokenizer = llm.get_tokenizer()
        for i, prompt in enumerate(prompts_for(args, tokenizer.encode)):
            rid = f"graph-check-{i}"
            engine.add_request(rid, prompt, params)
            first = True
            final: list[int] = []
            while engine.has_unfinished_requests():
                t0 = time.perf_counter()
                outs = engine.step()
                dt = (time.perf_counter() - t0) * 1000.0
                (prefill_ms if first else step_ms).append(dt)
                first = False
                for out in outs:
                    if out.request_id == rid and out.finished:
                        final = list(out.outputs[0].token_ids)
                        prompt_tokens.append(len(out.prompt_token_ids or []))
            tokens.append(final)
        graphs = engine.collective_rpc(_accounting)[0] if leg.graphs else {}
        return {
            "leg": leg.name,
            "device": device,
            "tokens": tokens,
            "step_ms": step_ms,
            "prefill_ms": prefill_ms,
            "prompt_tokens": prompt_tokens,
            "graphs": graphs,
        }
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


# ---------------------------------------------------------------------------
# Parent
# ---------------------------------------------------------------------------


def _child_argv(args: argparse.Namespace, leg: Leg) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "scripts.device.graph_check",
        "--leg",
        leg.name,
        "--models",
        str(args.models),
        "--tokens",
        str(args.tokens),
        "--prompts",
        str(args.prompts),
        "--width",
        str(args.width),
        "--spec",
        args.spec,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--long-prompt-tokens",
        str(args.long_prompt_tokens),
        "--series-options",
        json.dumps(args.series_options),
    ]
    if args.cpu_plumbing:
        argv.append("--cpu-plumbing")
    if args.emulate_graphs:
        argv.append("--emulate-graphs")
    return argv


def _run_child(args: argparse.Namespace, leg: Leg, root: Path, device: str) -> LegResult:
    res = LegResult(leg=leg)
    env = dict(os.environ, **leg.env(device))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    # its own process group: on the time limit the leg's engine processes go with it
    proc = procs.run(_child_argv(args, leg), env=env, capture=True, timeout_s=args.leg_timeout)
    if proc.timed_out:
        res.error = f"timed out after {args.leg_timeout} s"
        return res
    res.wall_s = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    res.audit = [ln.strip() for ln in log.splitlines() if AUDIT_MARK in ln]
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit {proc.returncode}"
        res.error = last.removeprefix("error: ")
        if proc.returncode == NO_DEVICE_EXIT:
            raise CheckError(res.error)
        return res
    payload = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"leg"')]
    if not payload:
        res.error = "leg printed no result"
        return res
    data = json.loads(payload[-1])
    res.device = data["device"]
    res.tokens = data["tokens"]
    res.step_ms = data["step_ms"]
    res.prefill_ms = data["prefill_ms"]
    res.prompt_tokens = data.get("prompt_tokens", [])
    res.graphs = data.get("graphs", {})
    return res


def _guess_device() -> str:
    """Cheap guess of the device for the dry-run plan, without importing torch."""
    return "xpu" if Path("/dev/dri").exists() and not Path("/dev/nvidia0").exists() else "cuda"


def graph_counts(graphs: dict[str, Any]) -> str:
    """``target g/b/r drafter g/b/r``: graphs, breaks, replays per wrapper."""
    parts = [
        f"{label[0].upper()} {acc.get('graphs')}/{acc.get('breaks')}/{acc.get('replays')}"
        for label, acc in sorted(graphs.items(), key=lambda kv: kv[0] != "target")
    ]
    return " ".join(parts) or "-"


def render_table(results: list[LegResult]) -> str:
    ref = results[0]
    eager = {r.leg.metadata: r for r in results if not r.leg.graphs}
    head = (
        f"{'leg':<8} {'graphs':<6} {'md':<3} {'tokens==ref':<11} {'steps':>5} "
        f"{'median ms':>9} {'p90 ms':>8} {'tok/s':>8} {'speed-up':>8} "
        "graphs/breaks/replays (T target, D drafter)"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        if r.error:
            rows.append(f"{r.leg.name:<8} error: {r.error}")
            continue
        same = "yes" if r.tokens == ref.tokens else "NO"
        base = eager.get(r.leg.metadata)
        speed = (
            f"{r.tok_per_s() / base.tok_per_s():.2f}x" if base is not None and not base.error and base.step_ms else "-"
        )
        rows.append(
            f"{r.leg.name:<8} {'on' if r.leg.graphs else 'off':<6} "
            f"{int(r.leg.metadata):<3} {same:<11} {len(r.step_ms):>5} "
            f"{r.median_ms():>9.2f} {r.p90_ms():>8.2f} {r.tok_per_s():>8.1f} "
            f"{speed:>8} {graph_counts(r.graphs)}"
        )
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    from scripts.cli import ToolParser

    p = ToolParser(
        prog="python3 -m scripts.device.graph_check",
        description="Tiny Laguna with breakable graphs off and on: greedy tokens "
        "and per-step latency (CUDA GPU or XPU).",
    )
    p.add_argument(
        "--models",
        type=Path,
        help="folder from scripts.tiny_laguna (target/, draft/); default: generated in a temp folder",
    )
    p.add_argument("--tokens", type=int, default=128, help="tokens per prompt")
    p.add_argument("--prompts", type=int, default=2, help="number of prompts")
    p.add_argument("--width", type=int, default=8, help="verify width = capture size (the option verify_width)")
    p.add_argument(
        "--spec",
        choices=("none", "ngram", "dflash"),
        default="dflash",
        help="speculative method; draft tokens = width - 1",
    )
    p.add_argument(
        "--metadata", choices=("off", "on", "both"), default="both", help="prebuilt exact attention metadata setting(s)"
    )
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "xpu"),
        default="auto",
        help="device to run on (auto: XPU if present, else CUDA)",
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="model dtype")
    p.add_argument("--leg-timeout", type=int, default=600, help="seconds per leg")
    p.add_argument("--json", type=Path, help="also write the results here (default: not written)")
    p.add_argument(
        "--series-options",
        type=options_argument,
        default={},
        metavar="JSON",
        help=f"the series' options of every leg's engine, a JSON object (additional_config[{OPTIONS_KEY!r}]); "
        "the legs' breakable_graph, prebuilt_metadata and verify_width win (default: none)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the legs, their options and environments, run nothing")
    p.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=4608,
        help="tokens of a long first prompt (past 4K by default); 0: no long prompt",
    )
    p.add_argument("--min-cycles", type=int, default=200, help="every leg must run at least this many engine steps")
    p.add_argument(
        "--emulate-graphs",
        action="store_true",
        help="CPU self-test: run the graph legs through the recording stand-in graph (emulated, never a device result)",
    )
    p.add_argument(
        "--cpu-plumbing",
        action="store_true",
        help="self-test of this script on CPU: runs only the graphs-off legs (graph legs are reported as not run)",
    )
    p.add_argument("--leg", help=argparse.SUPPRESS)
    return p


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    validate(args)
    legs = plan_legs(args.metadata)
    if args.leg is not None:
        (leg,) = [lg for lg in plan_legs("both") if lg.name == args.leg]
        try:
            data = run_leg(args, leg)
        except CheckError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return NO_DEVICE_EXIT
        sys.stdout.write("\n" + json.dumps(data) + "\n")
        return 0
    if args.dry_run:
        device = args.device if args.device != "auto" else _guess_device()
        print(f"graph check plan ({device}, spec={args.spec}, width={args.width}):")
        for leg in legs:
            env = " ".join(f"{k}={v}" for k, v in leg.env(device).items())
            options = json.dumps(additional_config(leg.options(args.width, args.series_options)))
            print(f"  {leg.name:<7} --additional-config '{options}' {env}")
        return 0
    root = Path(__file__).resolve().parents[2]
    device = _detect_device(args.device, allow_cpu=args.cpu_plumbing or args.emulate_graphs)
    if args.cpu_plumbing:
        legs = [lg for lg in legs if not lg.graphs]
    with tempfile.TemporaryDirectory(prefix="graph-check-") as tmp:
        if args.models is None:
            from scripts.tiny_laguna import generate

            args.models = generate(Path(tmp) / "models").target.parent
        results = [_run_child(args, leg, root, device) for leg in legs]
    print(render_table(results))
    for r in results:
        for line in r.audit:
            print(f"[{r.leg.name}] {line}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "leg": r.leg.name,
                        "device": r.device,
                        "error": r.error,
                        "tokens": r.tokens,
                        "step_ms": r.step_ms,
                        "prefill_ms": r.prefill_ms,
                        "median_ms": r.median_ms(),
                        "p90_ms": r.p90_ms(),
                        "tok_per_s": r.tok_per_s(),
                        "audit": r.audit,
                        "cycles": r.cycles,
                        "prompt_tokens": r.prompt_tokens,
                        "graphs": r.graphs,
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    ref = results[0]
    bad = [r.leg.name for r in results if r.error or r.tokens != ref.tokens]
    # The target only: Model Runner V2 runs the DFlash drafter eagerly under PIECEWISE (as the
    # matrix expects, scripts/matrix/driver.py; docs/rebase/0.32.0-to-0.34.0.md).
    uncaptured = [
        r.leg.name for r in results if r.leg.graphs and not (r.audit and r.graphs.get("target", {}).get("captures"))
    ]
    short = [r.leg.name for r in results if not r.error and r.cycles < args.min_cycles]
    print("prompt tokens: " + ", ".join(f"{r.leg.name} {r.prompt_tokens}" for r in results if r.prompt_tokens))
    if args.cpu_plumbing and not bad:
        print("CPU plumbing self-test passed; graph legs NOT run (no device)")
        return NO_DEVICE_EXIT
    if bad or uncaptured or short:
        print(
            f"FAIL: differing/failed legs {bad}, graph legs without a capture "
            f"{uncaptured}, legs under {args.min_cycles} cycles {short}",
            file=sys.stderr,
        )
        return 1
    if device == "cpu":
        print("OK (EMULATED graphs on CPU, not a device result): all legs token-identical; graph legs captured")
        return 0
    print("OK: all legs token-identical; graph legs captured")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        with procs.stopping_on_signals():  # a SIGTERM to the check stops its leg's group too
            return _main(argv)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return NO_DEVICE_EXIT if "not run" in str(exc) else 2


if __name__ == "__main__":
    sys.exit(main())
