"""The matrix's legs, its prompts and the constants the other modules share (no torch at import)."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

from scripts.matrix.logprobs import crossing_prompt, long_prompt

WIDTH = 8  # DFlash M8: 7 drafted tokens + 1 verified
# The series' options a leg sets, typed values: keys of the engine's additional_config["xpu_laguna"]
# (scripts.series_options: the key, the checks; the series reads no environment variable)
GRAPH_OPTION = "breakable_graph"
META_OPTION = "prebuilt_metadata"
EXACT_OPTION = "exact_verify"
NO_PLAN_OPTION = "debug_no_split_plan"
TP_REDUCE_OPTION = "exact_tp_reduce"  # patch 0010: all-gather + fixed rank-order sum
STANDIN_OPTION = "debug_xccl_standin"  # CPU: XCCL's ring ownership rule where the sum is not fixed
LEG_OPTIONS = (GRAPH_OPTION, META_OPTION, EXACT_OPTION, NO_PLAN_OPTION, TP_REDUCE_OPTION, STANDIN_OPTION)
"""The options the legs themselves decide (``--series-options`` may not name them)."""
MUTATIONS = ("last-verify-row-logits",)
EQUAL_BY_ARITHMETIC = "equal by arithmetic (commutative 2-rank sum)"
LOGPROBS_TOPK = 5  # top-k logprobs compared per position (plus the sampled token's)
LONG_PROMPT_TOKENS = 4200  # > 4096: past the split-count divergence (~2.2K) of the global layer
NOT_RUN_NO_GRAPHS = "not run (no device graphs)"
# Graph legs on a machine without device graphs run through the recording stand-in graph
# (test-side xpu_laguna_standins.emulated_graphs): their verdict says so, never plain "passed".
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
    tp: int | None = None  # tensor-parallel size; None: the run's --tp
    tp_reduce: bool = True  # False: diagnostic leg, the all-reduce not on the fixed rank order
    xccl_standin: bool = False  # the CPU all-reduce is XCCL's ring rule wherever the fixed order is off
    teacher: str = "teacher"  # the non-speculative leg this one is compared with
    mutation: str | None = None  # test-only fault in the leg process (MUTATIONS): must make it differ

    @property
    def diagnostic(self) -> bool:
        """A negative control of the logprob gate: must NOT be bitwise equal to its teacher."""
        return self.speculative and (
            not (self.exact and self.split_plan and self.tp_reduce) or self.mutation is not None
        )

    def equal_by_arithmetic(self, default_tp: int) -> bool:
        """The fixed order off is this leg's only fault, at 2 ranks or fewer: the ring is a
        single add there and IEEE addition is commutative, so it must still be bitwise equal
        (reported as EQUAL_BY_ARITHMETIC, not as a negative control)."""
        return (
            self.speculative
            and not self.tp_reduce
            and self.tp_size(default_tp) <= 2
            and self.exact
            and self.split_plan
            and self.mutation is None
        )

    def tp_size(self, default: int) -> int:
        return self.tp if self.tp is not None else default

    def options(self, default_tp: int = 1, extra: Mapping[str, object] | None = None) -> dict[str, object]:
        """The series' options of this leg's engine (``additional_config["xpu_laguna"]``): its three
        switches always named (on CPU a switch named true is how an engine asks for the series, so
        the teacher too runs the series' decode path), the debug and TP switches where the leg sets
        them; ``extra`` (the run's ``--series-options``) under them."""
        options: dict[str, object] = {
            **(extra or {}),
            GRAPH_OPTION: self.graph,
            META_OPTION: self.metadata,
            EXACT_OPTION: self.exact,
        }
        if not self.split_plan:
            options[NO_PLAN_OPTION] = True
        tp = self.tp_size(default_tp)
        if tp > 1 or not self.tp_reduce or self.xccl_standin:
            options[TP_REDUCE_OPTION] = self.tp_reduce
            options[STANDIN_OPTION] = self.xccl_standin
        return options


LEGS = (
    Leg("teacher", speculative=False),
    Leg("dflash-graph0-meta0", True, graph=False, metadata=False),
    Leg("dflash-graph0-meta1", True, graph=False, metadata=True),
    Leg("dflash-graph1-meta0", True, graph=True, metadata=False),
    Leg("dflash-graph1-meta1", True, graph=True, metadata=True),
    Leg("dflash-exact0-diagnostic", True, exact=False),
    Leg("dflash-noplan-diagnostic", True, split_plan=False),
    # A one-ulp fault in the last verify row's logits (test-only, in the leg process): the
    # gate must catch it (its output is used only when all 7 drafts are accepted).
    Leg("dflash-lastrow-mutation", True, metadata=True, mutation="last-verify-row-logits"),
    # Real multi-process TP 2 (mp executor, one worker process per rank), the XCCL ring
    # stand-in on: any all-reduce not on the fixed rank order would run as the device's ring.
    Leg("teacher-tp2", False, tp=2, xccl_standin=True),
    Leg("dflash-graph0-meta0-tp2", True, tp=2, xccl_standin=True, teacher="teacher-tp2"),
    Leg("dflash-graph0-meta1-tp2", True, metadata=True, tp=2, xccl_standin=True, teacher="teacher-tp2"),
    Leg("dflash-graph1-meta1-tp2", True, graph=True, metadata=True, tp=2, xccl_standin=True, teacher="teacher-tp2"),
    # At 2 ranks the ring is one add (commutative): the fixed order off changes no bit.
    Leg(
        "dflash-ring-tp2-diagnostic",
        True,
        metadata=True,
        tp=2,
        tp_reduce=False,
        xccl_standin=True,
        teacher="teacher-tp2",
    ),
)

# TP 4 (opt-in with --legs: 4 worker processes per leg; tiny models: the ``tp4`` variant of
# scripts.tiny_laguna). At 4 ranks the ring's order of an element depends on the message size,
# so the fixed order off must break exactness: the ring leg is compared with a ring teacher (the
# fixed order off there too, so only the message sizes differ: M=8 verify rows against M=1
# decodes); against the fixed-order teacher it would differ even without speculation.
TP4_LEGS = (
    Leg("teacher-tp4", False, tp=4, xccl_standin=True),
    Leg("teacher-ring-tp4", False, tp=4, tp_reduce=False, xccl_standin=True),
    Leg("dflash-graph0-meta1-tp4", True, metadata=True, tp=4, xccl_standin=True, teacher="teacher-tp4"),
    Leg(
        "dflash-ring-tp4-diagnostic",
        True,
        metadata=True,
        tp=4,
        tp_reduce=False,
        xccl_standin=True,
        teacher="teacher-ring-tp4",
    ),
)
ALL_LEGS = LEGS + TP4_LEGS  # every leg --legs can name; LEGS: the default run


@dataclass(frozen=True)
class PromptSpec:
    text: str
    max_tokens: int
    role: str  # "plain", "long" (rollover), "long-then-next" (short one after a long one), "long-context"


def make_prompts(count: int, max_tokens: int, seed: int | None = None) -> list[PromptSpec]:
    """``count`` fresh prompts, unique per run (a run nonce is part of every prompt).

    Prompt 0 is long (the driver grows it so that its output crosses a KV block boundary:
    :func:`rollover_prompt`); prompt 1 is a short generation right after it in the same engine
    (long-then-next).
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


def rollover_prompt(target: str, spec: PromptSpec) -> PromptSpec:
    """``spec`` (the long prompt) grown to end one token short of a KV block boundary (counted with
    the target's tokenizer: :func:`scripts.matrix.logprobs.crossing_prompt`), so that its output
    crosses one whatever the run's random words."""
    text, _ = crossing_prompt(target, spec.text)
    return PromptSpec(text, spec.max_tokens, spec.role)


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
