"""A synthetic run's manifest (``run.json``), complete as the crossover writes it, for tests that
write a run directory through :func:`scripts.measure.artifacts.finish_run`."""

from __future__ import annotations

from _measure_synth import CONFIG
from scripts.measure.manifest import Manifest, RequestPolicy, ServerRun, StoredMeta
from scripts.measure.record import RecordMeta
from scripts.measure.runtime_probe import RuntimeProbe
from scripts.measure.schema import AnalysisConfig

ORDER = ["A1", "B1", "B2", "A2", "teacher"]
RUNTIME = RuntimeProbe(
    vllm="0.34.0+xpu.0123456789ab",
    vllm_distribution="vllm",
    vllm_commit="62d4bc3c7",
    vllm_commit_source="vllm/xpu_laguna_provenance.json pins.vllm.commit",
    kernels="0.1.17",
    torch="2.15.0",
)


def manifest_for(meta: RecordMeta, config: AnalysisConfig = CONFIG) -> Manifest:
    return Manifest(
        config=config,
        started_utc="2026-11-29T10:00:00+00:00",
        run_tag="0123456789",
        prompt_seed=7,
        order=ORDER,
        runtime=RUNTIME,
        environments={leg: {"X": "1" if leg.startswith("B") else "0"} for leg in ORDER},
        servers={
            leg: ServerRun(argv=["python", "-m", "vllm", "serve"], port=8000, ready_s=1.5, log=f"server-{leg}.log")
            for leg in ORDER
        },
        request=RequestPolicy(
            max_tokens=5, temperature=0.0, ignore_eos=True, prefix_caching=False, retries=0, warmup_requests=0
        ),
        record_meta=StoredMeta.of(meta),
    )
