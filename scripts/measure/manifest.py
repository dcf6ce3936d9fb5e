"""The run manifest, ``run.json``: what a crossover run was besides its raw rows (the analysis
config, the prompt seed, the runtime, each leg's environment and server, the request policy and
what the record keeps that no row gives). Written by the crossover, read back (re-analysis,
``verify-record``'s raw level) through :mod:`scripts.typed_data`: a wrong type, a missing or an
unknown field is one line naming ``run.json`` and the dotted field::

    .../run.json: servers.A1.port: expected an integer, got string '8000'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scripts.measure.record import Prior, RecordMeta
from scripts.measure.runtime_probe import RuntimeProbe, Scalar
from scripts.measure.schema import AnalysisConfig, dump_json
from scripts.typed_data import build, read_json

MANIFEST_FILE = "run.json"


@dataclass(frozen=True)
class ServerRun:
    """One leg's ``vllm serve``."""

    argv: list[str]
    port: int
    ready_s: float
    log: str


@dataclass(frozen=True)
class RequestPolicy:
    """How every request was sent."""

    max_tokens: int
    temperature: float
    ignore_eos: bool
    prefix_caching: bool
    retries: int
    warmup_requests: int


@dataclass(frozen=True)
class StoredMeta:
    """``record_meta``: the record's inputs that no row gives (artifacts and hashes are made anew
    when the run is re-analyzed)."""

    schema: str
    date: str
    source: dict[str, str | None]
    treatment: dict[str, Any]
    speculative: dict[str, Any] | None
    prior: Prior | None
    graph: dict[str, Any] | None = None
    recipe: dict[str, str] | None = None
    runtime: dict[str, Scalar] | None = None
    """The last three are optional: manifests written before them still read."""

    @staticmethod
    def of(meta: RecordMeta) -> StoredMeta:
        return StoredMeta(
            schema=meta.schema,
            date=meta.date,
            source=meta.source,
            treatment=meta.treatment,
            speculative=meta.speculative,
            prior=meta.prior,
            graph=meta.graph,
            recipe=meta.recipe,
            runtime=meta.runtime,
        )

    def record_meta(self, run_root: str) -> RecordMeta:
        return RecordMeta(
            schema=self.schema,
            date=self.date,
            run_root=run_root,
            source=self.source,
            treatment=self.treatment,
            speculative=self.speculative,
            artifacts={},
            sha256={},
            prior=self.prior,
            graph=self.graph,
            recipe=self.recipe,
            runtime=self.runtime,
        )


@dataclass(frozen=True)
class Manifest:
    """``run.json``."""

    config: AnalysisConfig
    started_utc: str
    run_tag: str
    prompt_seed: int
    order: list[str]
    runtime: RuntimeProbe
    environments: dict[str, dict[str, str]]
    servers: dict[str, ServerRun]
    request: RequestPolicy
    record_meta: StoredMeta

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_manifest(manifest: Manifest, path: Path) -> None:
    dump_json(manifest.to_json(), path)


def load_manifest(path: Path) -> Manifest:
    """A run's ``run.json``, every field checked."""
    return build(Manifest, read_json(path, "run manifest"), str(path))
