"""Loopback HTTP with the standard library: one streamed completion, ``/metrics``, ``/health``."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field

from scripts.measure.schema import SpecCounters

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
FINISHED = "vllm:request_success"


@dataclass
class StreamResult:
    sent_unix: float
    token_times_s: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    chunks: int = 0
    error: str | None = None


@dataclass(frozen=True)
class MetricsSnapshot:
    finished_requests: int
    spec: SpecCounters | None


def stream_completion(
    host: str,
    port: int,
    body: dict[str, object],
    timeout_s: float,
) -> StreamResult:
    """POST one streaming ``/v1/completions`` request; every output token gets the arrival
    time of the chunk that carried it. No retry: a failure is returned in ``error``."""
    payload = json.dumps(body).encode("utf-8")
    result = StreamResult(sent_unix=time.time())
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        start = time.perf_counter()
        connection.request("POST", "/v1/completions", body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            text = response.read().decode("utf-8", "replace")
            result.error = f"HTTP {response.status}: {' '.join(text.split())[:300]}"
            return result
        while True:
            line = response.readline()
            if not line:
                break
            now = time.perf_counter() - start
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event and not event.get("choices"):
                result.error = f"stream error: {event['error']}"
                break
            result.chunks += 1
            for choice in event.get("choices") or []:
                ids = choice.get("token_ids") or []
                result.token_ids.extend(int(t) for t in ids)
                result.token_times_s.extend([now] * len(ids))
                if choice.get("finish_reason") is not None:
                    result.finish_reason = choice["finish_reason"]
            usage = event.get("usage")
            if usage:
                result.prompt_tokens = usage.get("prompt_tokens")
                details = usage.get("prompt_tokens_details") or {}
                result.cached_tokens = details.get("cached_tokens")
    except (OSError, http.client.HTTPException, json.JSONDecodeError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    return result


def get(host: str, port: int, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> sum over label sets per metric name (``_total`` suffix dropped)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        if name.endswith("_total"):
            name = name[: -len("_total")]
        try:
            sums[name] = sums.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return sums


def snapshot(metrics: dict[str, float]) -> MetricsSnapshot:
    spec = None
    if all(name in metrics for name in SPEC_COUNTERS):
        spec = SpecCounters(*(int(metrics[name]) for name in SPEC_COUNTERS))
    return MetricsSnapshot(int(metrics.get(FINISHED, 0)), spec)


def scrape(host: str, port: int) -> MetricsSnapshot:
    status, text = get(host, port, "/metrics")
    if status != 200:
        raise OSError(f"/metrics answered HTTP {status}")
    return snapshot(parse_metrics(text))
