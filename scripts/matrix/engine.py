"""One leg in its own process (``python -m scripts.matrix leg CONFIG OUT``): a fresh engine, the
attention counters, the graph emulation and the graph legs' fault injection. vLLM is imported
inside the functions only."""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

from scripts.matrix.legs import LOGPROBS_TOPK, WIDTH, Leg
from scripts.matrix.logprobs import collect_logprobs
from scripts.series_options import additional_config


def engine_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments of one leg (``LLM(**kwargs)``): the series' options of
    ``config["options"]`` (:meth:`scripts.matrix.legs.Leg.options`) in its ``additional_config``,
    and for an emulated graph leg the test side's ask beside them."""
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
        kv_cache_dtype=config.get("kv_cache_dtype", "auto"),
        # the series' options (checked with the engine's own words before it starts) reach every
        # process of the engine, workers included, with its config
        additional_config=additional_config(config["options"]),
    )
    if config["tp"] > 1:
        # one worker process per rank (vLLM-CPU's TP); on CPU the leg's environment carries the
        # OpenMP binding and the hooks that install the series' attention in every worker (the
        # series' options travel with the engine's config)
        kwargs["distributed_executor_backend"] = "mp"
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
    if leg.graph and config.get("emulate_graphs"):
        # CPU: the breakable graphs through the recording stand-in (emulated device graphs), asked
        # in the engine's config, which every worker gets with it
        from scripts.cpu_standins import standin_module

        kwargs["additional_config"].update(standin_module().emulation_entry())
        # As an eager leg (enforce_eager turns it off): no JIT warm-up of the scheduler-driven
        # Triton kernels, which only moves their first compile out of the first request and costs
        # start-up time on the stand-in runtime (Triton interpreted).
        kwargs["kernel_config"] = {"enable_jit_warmup": False}
    return kwargs


def run_leg(config: dict[str, Any]) -> dict[str, Any]:
    """Run one leg in this process: a fresh engine (:func:`engine_kwargs`), one request at a
    time."""
    import torch
    from vllm import LLM, SamplingParams

    leg = Leg(**config["leg"])
    kwargs = engine_kwargs(config)
    counts = route_and_count(config.get("cpu_flash_attn", False))
    began = time.monotonic()
    llm = LLM(**kwargs)
    startup_seconds = time.monotonic() - began
    if leg.graph and config.get("fault"):
        _inject_stale_input(llm, guarded=config["fault"] == "stale-input")
    if config.get("mutation"):
        _inject_mutation(llm, config["mutation"])
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
        metrics = llm.get_metrics()
        acceptance = _acceptance(metrics) if leg.speculative else {}
        for metric in metrics:
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
        attention = _worker_counts(llm, counts, config["tp"])
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort; the process exits next
            pass
        del llm
        gc.collect()
    return {
        "rows": rows,
        "startup_seconds": startup_seconds,
        # TP 1: the engine runs in this process; past TP 1 each rank's is in attention.ranks
        "interpreter": interpreter_time() if config["tp"] == 1 else attention["ranks"][0].get("interpreter", {}),
        # torch's thread count in each process that ran the model (scripts.cpu_slots: the lease's)
        "threads": [torch.get_num_threads()] if config["tp"] == 1 else [r["threads"] for r in attention["ranks"]],
        "draft_tokens": drafts,
        "accepted_tokens": accepted,
        "acceptance_rate": (accepted / drafts) if drafts else None,
        "block_size": block_size,
        "attention": attention,
        "graphs": graphs,
        "acceptance": acceptance,
    }


def _acceptance(metrics: Any) -> dict[str, Any]:
    """Accepted tokens per depth 1..7 from vLLM's counters (:mod:`scripts.spec_acceptance`)."""
    from scripts import spec_acceptance

    acc = spec_acceptance.from_metrics(metrics, WIDTH - 1)
    return {
        "drafts": acc.drafts,
        "draft_tokens": acc.draft_tokens,
        "accepted": acc.accepted,
        "per_depth": list(acc.per_depth),
        "mean_accepted_length": acc.mean_accepted_length,
    }


def _rank_counts(worker: Any) -> dict[str, Any]:
    import torch
    from vllm.xpu_laguna.attention import exact as xpu_laguna_exact

    return {
        **xpu_laguna_exact.counters.snapshot(),
        "interpreter": interpreter_time(),
        "threads": torch.get_num_threads(),
    }


def interpreter_time() -> dict[str, Any]:
    """Seconds and launches of the interpreted Triton kernels in this process: the stand-in CPU
    runtime's backend counts them (``xpu_laguna_triton_cpu.fast_launch``); empty elsewhere (a
    device, or the stock interpreter)."""
    try:
        from xpu_laguna_triton_cpu import fast_launch
    except ImportError:
        return {}
    return fast_launch.launch_time()


def _worker_counts(llm: Any, counts: dict[str, Any], tp: int) -> dict[str, Any]:
    """The overlay's counters where the model ran: this process at TP 1 (in-process engine),
    rank 0's worker past TP 1 (every rank's snapshot under ``ranks``)."""
    if tp == 1:
        return _read_counts(counts)
    ranks = llm.llm_engine.collective_rpc(_rank_counts)
    return {
        **counts,
        "backend": "FLASH_ATTN on CPU (reference kernels; series plugin per worker)",
        **ranks[0],
        "ranks": ranks,
    }


# ---------------------------------------------------------------- mutation (test-only)


def _inject_mutation(llm: Any, mutation: str) -> None:
    """Test-only fault: ``last-verify-row-logits`` moves every logit of the last verify row
    (row M-1 of a full M=8 verify step) one ulp up, in the target only. That row's output is
    used only when all 7 drafted tokens are accepted (the bonus token), so the logprob gate sees
    it only where the pair accepts at depth 7."""
    if mutation != "last-verify-row-logits":
        raise ValueError(f"unknown mutation {mutation!r}")

    def inject(worker: Any) -> None:
        import torch

        model = worker.model_runner.model
        real = model.compute_logits

        def compute_logits(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            logits = real(hidden_states, *args, **kwargs)
            if logits is not None and logits.shape[0] == WIDTH:
                last = logits[WIDTH - 1]
                last.copy_(torch.nextafter(last, torch.full_like(last, float("inf"))))
            return logits

        model.compute_logits = compute_logits

    llm.llm_engine.collective_rpc(inject)


# ---------------------------------------------------------------- graph legs (child process)


FAULTS = ("stale-input", "stale-input-unguarded")


def _inject_stale_input(llm: Any, guarded: bool) -> None:
    """Negative control: the target's input ids are handed over in a new tensor each step
    while the captured buffer keeps the previous step's ids (a refreshed tensor replaced
    instead of written in place). With the guard the replay must refuse; without it
    (``guarded=False``) the replay reads the stale buffer and the tokens must go wrong."""

    def inject(worker: Any) -> None:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        # Model Runner V2's breakable runner (the series' wrapper), built when it captured
        wrapper = worker.model_runner.cudagraph_manager.breakable_cg_runner
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
    from vllm.xpu_laguna.graphs.wrapper import graph_accounting

    return graph_accounting(worker.model_runner)


def _collect_graph_accounting(llm: Any) -> dict[str, Any]:
    """The breakable-graph wrappers' own accounting (target and drafter) from rank 0."""
    return llm.llm_engine.collective_rpc(_runner_graph_accounting)[0]


def route_and_count(cpu_flash_attn: bool) -> dict[str, Any]:
    """Exact-verify calls (by width), kernel calls and prebuilt-metadata uses in this process.

    The counts are the overlay's own (``xpu_laguna_exact.counters``), read when the leg ends.
    With ``cpu_flash_attn`` the series' FlashAttention backend, the path Laguna takes on XPU, is
    registered under ``CPU_ATTN`` so that the CPU engine (in-process, see the leg's
    environment) runs the real builder and impl on the reference kernels.
    """
    from vllm.plugins import load_general_plugins
    from vllm.xpu_laguna.attention import exact as xpu_laguna_exact

    load_general_plugins()  # as the engine will: on CPU the runtime's plugin registers the reference kernels
    xpu_laguna_exact.counters.reset()
    counts: dict[str, Any] = {"backend": "default", "kernel_seam": xpu_laguna_exact.kernel_seam_name()}
    if cpu_flash_attn:
        from vllm.v1.attention import selector
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        from scripts.measure.series_attention.xpu_laguna_cpu_attention import FLASH_ATTN

        register_backend(AttentionBackendEnum.CPU_ATTN, FLASH_ATTN)
        selector._cached_get_attn_backend.cache_clear()
        counts["backend"] = "FLASH_ATTN on CPU (reference kernels)"
    return counts


def _read_counts(counts: dict[str, Any]) -> dict[str, Any]:
    from vllm.xpu_laguna.attention import exact as xpu_laguna_exact

    return {**counts, **xpu_laguna_exact.counters.snapshot()}
