"""The matrix's legs, its prompts and the constants the other modules share (no torch at import)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from scripts.matrix.logprobs import long_prompt

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
