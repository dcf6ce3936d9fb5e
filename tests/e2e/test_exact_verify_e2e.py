"""Exact verify + prebuilt metadata end to end on CPU (patches 0004/0005).

The tiny Laguna target and its DFlash drafter are served through the
FlashAttention backend (the code path Laguna takes on XPU) running on the
pure-torch reference kernels, and speculative decoding with M=8 (7 drafted +
1 verified) must emit exactly the greedy tokens of the non-speculative run of
the same backend, for every prompt, with the exact-verify metadata built
inline (prebuilt toggle off) and prebuilt (toggle on, device graphs off).

How the backend is selected on CPU: vLLM's CPU platform always returns the
``CPU_ATTN`` backend path. The attention backend registry lets a process
override what an enum member resolves to, so this test registers
``FlashAttentionBackend`` under ``CPU_ATTN``. The registry is per process, so
the engine runs in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the
CPU platform reads it from the environment) and the ``uni`` executor. On a
platform without FlashAttention kernels the patched backend binds the
reference kernels (patch 0004), so the real builder and impl code run,
including ``update_block_table`` across the tiny model's three sliding-window
KV-cache groups. Every exact-verify call is counted to prove the path ran.

One engine runs at a time and is shut down explicitly; the override, the
environment and the toggles are restored afterwards.
"""

from __future__ import annotations

import collections
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scripts.cpu_slots import leased_environ
from scripts.tiny_laguna import TinyModels

NUM_SPECULATIVE_TOKENS = 7  # M = 8
KV_CACHE_BYTES = 256 << 20
MAX_MODEL_LEN = 512
FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"


@dataclass
class Leg:
    tokens: list[list[int]]
    seconds: float
    metrics: dict[str, float]
    exact_calls: collections.Counter[int] = field(default_factory=collections.Counter)
    prebuilt_calls: int = 0


@pytest.fixture(scope="module")
def flash_attn_on_cpu() -> Iterator[Any]:
    """In-process engine with FLASH_ATTN (reference kernels) under CPU_ATTN."""
    mp = pytest.MonkeyPatch()
    import vllm.envs as envs
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends import xpu_laguna_exact
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if not current_platform.is_cpu():
        pytest.skip("needs a platform without FlashAttention kernels (CPU)")
    # what every engine does first: the CPU runtime's test-side plugin registers the reference kernels
    load_general_plugins()
    assert xpu_laguna_exact.kernel_seam_name() == "reference", "no reference kernels: run cpu_runtime sync"
    mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    mp.setattr(envs, "VLLM_ENABLE_V1_MULTIPROCESSING", False, raising=False)
    register_backend(AttentionBackendEnum.CPU_ATTN, FLASH_ATTN)
    selector._cached_get_attn_backend.cache_clear()
    try:
        yield mp
    finally:
        AttentionBackendEnum.CPU_ATTN.clear_override()
        selector._cached_get_attn_backend.cache_clear()
        mp.undo()


def _run(
    mp: pytest.MonkeyPatch,
    target: Path,
    prompts: tuple[str, ...],
    max_tokens: int,
    *,
    exact: bool,
    prebuilt: bool,
    draft: Path | None,
) -> Leg:
    import vllm.envs as envs
    from vllm.v1.attention.backends import xpu_laguna_exact

    mp.setattr(envs, "VLLM_XPU_LAGUNA_EXACT_VERIFY", exact, raising=False)
    mp.setattr(envs, "VLLM_XPU_LAGUNA_VERIFY_WIDTH", NUM_SPECULATIVE_TOKENS + 1, raising=False)
    mp.setattr(envs, "VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA", prebuilt, raising=False)
    # On CPU the series acts only where the run asks in the environment (patch 0012's scope).
    mp.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "1" if exact else "0")
    mp.setenv("VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA", "1" if prebuilt else "0")
    leg = Leg(tokens=[], seconds=0.0, metrics={})
    xpu_laguna_exact.counters.reset()  # the overlay's own call counts
    spec = (
        None
        if draft is None
        else {
            "method": "dflash",
            "model": str(draft),
            "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        }
    )
    start = time.monotonic()
    with leased_environ("e2e exact-verify engine"):
        _generate(leg, target, prompts, max_tokens, spec)
    leg.exact_calls.update(xpu_laguna_exact.counters.calls_by_width)
    leg.prebuilt_calls = xpu_laguna_exact.counters.prebuilt_calls
    leg.seconds = time.monotonic() - start
    return leg


def _generate(leg: Leg, target: Path, prompts: tuple[str, ...], max_tokens: int, spec: dict[str, Any] | None) -> None:
    """One in-process engine (uni executor: its worker binds this process's threads)."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(target),
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        max_num_seqs=1,  # one request per step: the exact path's shape
        distributed_executor_backend="uni",
        speculative_config=spec,
        disable_log_stats=spec is None,
    )
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True)
        outputs = llm.generate(list(prompts), params, use_tqdm=False)
        leg.tokens = [list(o.outputs[0].token_ids) for o in outputs]
        if spec is not None:
            for metric in llm.get_metrics():
                value = getattr(metric, "value", None)
                if isinstance(value, (int, float)):
                    leg.metrics[metric.name] = float(value)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def test_exact_verify_spec_decode_equals_teacher(
    flash_attn_on_cpu: pytest.MonkeyPatch, tiny_models: TinyModels, e2e: Any
) -> None:
    prompts = e2e.parity_prompts + e2e.spec_prompts
    n = e2e.max_new_tokens
    assert n >= 64 and len(prompts) >= 3
    common: dict[str, Any] = {"prompts": prompts, "max_tokens": n, "target": tiny_models.target}
    teacher = _run(flash_attn_on_cpu, exact=True, prebuilt=False, draft=None, **common)
    # single-request q=1 decodes run on the exact path (width 1: the planned split
    # count); prefill never does
    assert set(teacher.exact_calls) == {1}, dict(teacher.exact_calls)
    legs = {
        "metadata inline": _run(flash_attn_on_cpu, exact=True, prebuilt=False, draft=tiny_models.draft, **common),
        "metadata prebuilt": _run(flash_attn_on_cpu, exact=True, prebuilt=True, draft=tiny_models.draft, **common),
    }
    for name, leg in legs.items():
        for prompt, got, want in zip(prompts, leg.tokens, teacher.tokens):
            assert len(got) == n
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
            assert first is None, (
                f"{name}, {prompt!r}: differs from the teacher at new token {first}: "
                f"{got[first : first + 5]} vs {want[first : first + 5]}"
            )
        assert leg.exact_calls.get(NUM_SPECULATIVE_TOKENS + 1, 0) > 0, (
            f"{name}: the M=8 exact verify path never ran: {dict(leg.exact_calls)}"
        )
        drafted = leg.metrics.get("vllm:spec_decode_num_draft_tokens", 0.0)
        accepted = leg.metrics.get("vllm:spec_decode_num_accepted_tokens", 0.0)
        assert accepted > 0, f"{name}: no drafted token accepted: {leg.metrics}"
        e2e.measured[f"exact verify e2e, {name}"] = (
            f"tokens == teacher for {len(prompts)} prompts x {n}; exact-path layer calls "
            f"by width {dict(sorted(leg.exact_calls.items()))}; accepted "
            f"{accepted:.0f}/{drafted:.0f} drafted; {leg.seconds:.1f} s"
        )
    assert legs["metadata inline"].prebuilt_calls == 0
    total = sum(n for w, n in legs["metadata prebuilt"].exact_calls.items() if w > 1)
    assert legs["metadata prebuilt"].prebuilt_calls == total > 0
    e2e.measured["exact verify e2e, teacher (FLASH_ATTN reference, no spec)"] = f"{teacher.seconds:.1f} s"
