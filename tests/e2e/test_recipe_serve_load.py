"""``recipes/cpu-tiny.{yaml,env}`` served for real, then under load and bad input: ONE server for the module.

The server is started the way docs/serving.md ("On CPU") says: a clean environment with the recipe's env
file loaded by a shell (``set -a; . recipes/cpu-tiny.env``) plus the series-attention plugin's variables
(``scripts.measure.emulation.series_attention_env``), and ``python -m vllm.entrypoints.openai.api_server
--config recipes/cpu-tiny.yaml`` on loopback from the repository root (the recipe's paths are relative to
it), with ``--max-num-seqs 4`` overriding the recipe's 1 so that concurrent requests share steps. The
series' options come in the YAML (``additional-config``; the env file sets none), DFlash
speculation (M=8) is on as the recipe says; the recipe names a minimal chat template
(``recipes/cpu-tiny.chat.jinja``) because the tiny tokenizer has none.

* completions and chat answer; the server log carries the series' exact-verify counters (> 0);
* the log proves the served leg runs the series' attention: the plugin registered it in the API server,
  the engine core and the worker, and the overlay logged exact verify ON (reference kernel seam) and
  prebuilt metadata ON (the negative control, a server without the plugin, is
  ``test_served_series_attention.py``);
* 8 prompts alone, one after another, then the same prompts 4 times each (32 streamed completions) from
  8 concurrent clients: every request completes with the greedy tokens of its prompt served alone, the
  log shows no ERROR and no Traceback, and the server still answers;
* a client that disconnects mid-stream (the server aborts that request), a prompt longer than the
  model length and malformed requests (bad JSON, wrong field types) each get a clean error (HTTP 4xx for
  the last two) and a request after each succeeds.

Figures (requests, errors, wall time, tokens/s) go to the e2e terminal summary. No timed assertion.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from served_markers import EXACT_ON, PREBUILT_ON

from scripts import REPO_ROOT
from scripts.cpu_slots import cpu_lease
from scripts.measure import client
from scripts.measure.emulation import series_attention_env, settled_counters
from scripts.measure.series_attention.xpu_laguna_cpu_attention import COUNTERS_LINE, REGISTERED_LINE
from scripts.measure.server import HOST, Server, api_server_argv, base_env, free_port
from scripts.recipe import CPU_CHAT_TEMPLATE, RECIPE_DIR, VERIFY_WIDTH, shell_env

RECIPE = RECIPE_DIR / "cpu-tiny.yaml"
RECIPE_ENV = RECIPE_DIR / "cpu-tiny.env"
MAX_NUM_SEQS = 4
CLIENTS = 8
REPEATS = 4  # each prompt this often under load: 8 prompts x 4 = 32 requests
MAX_TOKENS = 32
READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 120.0
LOAD_TIMEOUT_S = 900.0
COUNTERS_WAIT_S = 10.0
ABORT_WAIT_S = 30.0
DISCONNECT_MAX_TOKENS = 768  # a prompt + this fits max-model-len 1024; alone it would take seconds
# one word that is one token of the tiny tokenizer per repetition (the long prompt: 1100 of them)
WORD = " lagoon"
EXTRA_PROMPTS = (
    "Tiny models answer quickly",
    "0 1 2 3 4 5 6 7 8 9",
    f"The word{WORD} again and again:{WORD}",
)
CHAT = [{"role": "user", "content": "Where is the lagoon?"}]
CHAT_PROMPT = "user: Where is the lagoon?\nassistant:"  # what the recipe's template must make of CHAT
_LOG_PROBLEM = re.compile(r"\bERROR\b|Traceback")


@dataclass
class RecipeServer:
    server: Server
    port: int
    model: str
    log_path: Path
    ready_s: float
    started: float
    figures: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def problems(self) -> list[str]:
        """ERROR and Traceback lines of the log so far (the server still running)."""
        return [line for line in self.log().splitlines() if _LOG_PROBLEM.search(line)]

    def body(self, prompt: str, **extra: Any) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "ignore_eos": True,
            **extra,
        }

    def complete(self, prompt: str) -> client.StreamResult:
        return client.stream_completion(HOST, self.port, self.body(prompt), REQUEST_TIMEOUT_S)

    def verify_calls(self) -> int:
        """Exact-path verify calls (layer calls of width > 1) the log shows so far."""
        counters = settled_counters(self.log_path, COUNTERS_WAIT_S) or {"exact_calls_by_width": {}}
        return sum(n for w, n in counters["exact_calls_by_width"].items() if int(w) > 1)


@pytest.fixture(scope="module")
def served(recipe_models: Path, tmp_path_factory: pytest.TempPathFactory, e2e: Any) -> Iterator[RecipeServer]:
    import httpx

    env = {**base_env(), **shell_env(RECIPE_ENV), **series_attention_env()}
    assert not any(key.startswith("VLLM_XPU_LAGUNA_") for key in env)  # the options travel in --config
    port = free_port()
    config = str(RECIPE.relative_to(REPO_ROOT))
    argv = api_server_argv(sys.executable, port, ["--config", config, "--max-num-seqs", str(MAX_NUM_SEQS)])
    log_path = tmp_path_factory.mktemp("recipe-serve") / "server.log"
    started = time.monotonic()
    with (
        cpu_lease("e2e recipe server") as lease,
        Server(argv, {**env, **lease.env()}, log_path, port, cwd=REPO_ROOT) as server,
    ):
        ready_s = server.wait_ready(READY_TIMEOUT_S)
        models = httpx.get(f"http://{HOST}:{port}/v1/models", timeout=30).json()["data"]
        run = RecipeServer(server, port, models[0]["id"], log_path, ready_s, started)
        yield run
        alive = server.process is not None and server.process.poll() is None
    e2e.measured[f"served {config} (+ --max-num-seqs {MAX_NUM_SEQS}), one server"] = (
        f"ready after {ready_s:.0f} s, {time.monotonic() - started:.0f} s from start to stopped, "
        f"alive until stopped: {alive}"
    )
    for key, value in run.figures.items():
        e2e.measured[key] = value


@pytest.fixture(scope="module")
def prompts(e2e: Any) -> tuple[str, ...]:
    return e2e.parity_prompts + e2e.spec_prompts + EXTRA_PROMPTS


@pytest.fixture(scope="module")
def alone(served: RecipeServer, prompts: tuple[str, ...]) -> dict[str, list[int]]:
    """Each prompt served alone (one request at a time, nothing else in flight): its greedy tokens."""
    out = {}
    calls = served.verify_calls()
    start = time.monotonic()
    for prompt in prompts:
        result = served.complete(prompt)
        assert result.error is None, result.error
        assert len(result.token_ids) == MAX_TOKENS and result.finish_reason == "length"
        out[prompt] = result.token_ids
    wall = time.monotonic() - start
    served.figures["recipe server, prompts alone"] = (
        f"{len(prompts)} streamed completions x {MAX_TOKENS} tokens one after another, {wall:.1f} s, "
        f"{len(prompts) * MAX_TOKENS / wall:.1f} output tokens/s, exact-path verify calls "
        f"{served.verify_calls() - calls}"
    )
    return out


def test_the_tiny_tokenizer_has_no_chat_template_the_recipe_one_renders(recipe_models: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(recipe_models / "target")
    assert tokenizer.chat_template is None
    with pytest.raises(ValueError, match="chat_template"):  # what chat would hit without the recipe's
        tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    template = (RECIPE_DIR / CPU_CHAT_TEMPLATE).read_text(encoding="utf-8")
    rendered = tokenizer.apply_chat_template(CHAT, chat_template=template, tokenize=False, add_generation_prompt=True)
    assert rendered == CHAT_PROMPT


def test_the_recipe_serves_completions_and_chat_on_the_series_path(
    served: RecipeServer, recipe_models: Path, e2e: Any
) -> None:
    import httpx
    from transformers import AutoTokenizer

    result = served.complete(e2e.spec_prompts[0])  # drafts get accepted on this one
    assert result.error is None, result.error
    assert len(result.token_ids) == MAX_TOKENS and result.finish_reason == "length"
    chat = httpx.post(
        f"{served.base_url}/v1/chat/completions",
        json={
            "model": served.model,
            "messages": CHAT,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
        timeout=REQUEST_TIMEOUT_S,
    )
    assert chat.status_code == 200, chat.text[:300]
    answer = chat.json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert isinstance(answer["choices"][0]["message"]["content"], str)
    assert answer["usage"]["completion_tokens"] == MAX_TOKENS
    tokenizer = AutoTokenizer.from_pretrained(recipe_models / "target")
    assert answer["prompt_token_ids"] == tokenizer(CHAT_PROMPT, add_special_tokens=False).input_ids
    counters = settled_counters(served.log_path, COUNTERS_WAIT_S)
    assert counters is not None, "no exact-verify counters in the server log"
    calls = {int(w): n for w, n in counters["exact_calls_by_width"].items()}
    assert calls.get(VERIFY_WIDTH, 0) > 0, calls
    verify_calls = sum(n for w, n in calls.items() if w > 1)
    assert counters["prebuilt_calls"] == verify_calls > 0, counters
    spec = client.scrape(HOST, served.port).spec
    assert spec is not None and spec.drafts > 0 and spec.accepted_tokens > 0, spec
    served.figures["recipe server, series counters after a completion and a chat"] = (
        f"exact-path layer calls by width {dict(sorted(calls.items()))}, prebuilt {counters['prebuilt_calls']}; "
        f"drafts {spec.drafts}, accepted {spec.accepted_tokens} of {spec.draft_tokens} drafted tokens"
    )


def test_the_server_log_shows_the_series_attention_in_every_process(served: RecipeServer) -> None:
    log = served.log()
    pids = set(re.findall(rf"{re.escape(REGISTERED_LINE)} \(pid (\d+)\)", log))
    assert len(pids) >= 3, pids  # API server, engine core, worker
    assert f"{EXACT_ON} (verify widths 2..{VERIFY_WIDTH}" in log
    assert "kernel seam: reference" in log
    assert PREBUILT_ON in log
    assert COUNTERS_LINE in log


@dataclass
class Timed:
    prompt: str
    result: client.StreamResult
    start: float
    end: float


def _max_in_flight(runs: list[Timed]) -> int:
    events = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def test_concurrent_streams_complete_with_the_tokens_of_each_prompt_alone(
    served: RecipeServer, alone: dict[str, list[int]], prompts: tuple[str, ...]
) -> None:
    order = [prompts[i % len(prompts)] for i in range(REPEATS * len(prompts))]
    calls = served.verify_calls()

    def one(prompt: str) -> Timed:
        start = time.monotonic()
        result = served.complete(prompt)
        return Timed(prompt, result, start, time.monotonic())

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=CLIENTS, thread_name_prefix="load-client") as pool:
        futures = [pool.submit(one, prompt) for prompt in order]
        done, pending = wait(futures, timeout=LOAD_TIMEOUT_S)
        for future in pending:
            future.cancel()
    wall = time.monotonic() - start
    assert not pending, f"{len(pending)} of {len(futures)} requests still running after {LOAD_TIMEOUT_S:.0f} s"
    runs = [f.result() for f in futures]
    errors = [r.result.error for r in runs if r.result.error is not None]
    tokens = sum(len(r.result.token_ids) for r in runs)
    differ = [i for i, r in enumerate(runs) if r.result.token_ids != alone[r.prompt]]
    in_flight = _max_in_flight(runs)
    served.figures["recipe server, load"] = (
        f"{len(runs)} streamed completions x {MAX_TOKENS} tokens from {CLIENTS} concurrent clients "
        f"(--max-num-seqs {MAX_NUM_SEQS}): {len(errors)} errors, {wall:.1f} s wall, {tokens / wall:.1f} output "
        f"tokens/s, at most {in_flight} in flight, greedy tokens equal to the prompt alone "
        f"{len(runs) - len(differ)}/{len(runs)}, exact-path verify calls {served.verify_calls() - calls} "
        "(steps with one request only)"
    )
    assert errors == []
    assert all(len(r.result.token_ids) == MAX_TOKENS and r.result.finish_reason == "length" for r in runs)
    assert in_flight > MAX_NUM_SEQS  # the requests were concurrent (some waited for a slot)
    assert differ == [], [(i, runs[i].prompt, runs[i].result.token_ids, alone[runs[i].prompt]) for i in differ]
    assert served.problems() == []
    after = served.complete(prompts[0])
    assert after.error is None and after.token_ids == alone[prompts[0]]


def _generated(port: int) -> int:
    """Output tokens the server has generated so far (``vllm:generation_tokens``)."""
    _, text = client.get(HOST, port, "/metrics")
    return int(client.parse_metrics(text).get("vllm:generation_tokens", 0))


def _settled_generated(port: int, timeout_s: float) -> int:
    """``vllm:generation_tokens`` once it stopped moving for a second (the engine idle)."""
    deadline = time.monotonic() + timeout_s
    last = _generated(port)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _generated(port)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the server was still generating {timeout_s:.0f} s after the client left")


def _still_serving(served: RecipeServer, alone: dict[str, list[int]]) -> None:
    """A request after a bad one: it completes with the tokens its prompt had alone."""
    prompt = next(iter(alone))
    result = served.complete(prompt)
    assert result.error is None, result.error
    assert result.token_ids == alone[prompt]


def test_bad_input_gets_a_clean_error_and_the_server_keeps_serving(
    served: RecipeServer, alone: dict[str, list[int]]
) -> None:
    import httpx

    seen: dict[str, str] = {}
    prompt = next(iter(alone))
    before = _settled_generated(served.port, ABORT_WAIT_S)
    body = served.body(prompt, max_tokens=DISCONNECT_MAX_TOKENS)
    with httpx.Client(base_url=served.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            chunks = 0
            for line in response.iter_lines():
                chunks += line.startswith("data:") and "token_ids" in line
                if chunks >= 2:
                    break  # leaving the block closes the connection mid-stream
        assert chunks == 2
        generated = _settled_generated(served.port, ABORT_WAIT_S) - before
        assert 0 < generated < DISCONNECT_MAX_TOKENS, f"{generated} tokens: the request was not aborted"
        seen[f"disconnect after 2 chunks (max_tokens {DISCONNECT_MAX_TOKENS})"] = f"aborted after {generated} tokens"
        _still_serving(served, alone)

        long = http.post("/v1/completions", json=served.body(WORD * 1100))  # streamed, as the others
        assert 400 <= long.status_code < 500, long.text[:300]
        assert "maximum context length is 1024 tokens" in long.json()["error"]["message"]
        seen["prompt of 1100 words, max-model-len 1024"] = f"HTTP {long.status_code}"
        _still_serving(served, alone)

        bad_json = http.post("/v1/completions", content=b'{"model": "x", "prompt": ', headers=_JSON)
        assert 400 <= bad_json.status_code < 500, bad_json.text[:300]
        seen["bad JSON"] = f"HTTP {bad_json.status_code}"
        _still_serving(served, alone)

        wrong = http.post(
            "/v1/completions",
            json={"model": served.model, "prompt": prompt, "max_tokens": "many", "temperature": [0]},
        )
        assert 400 <= wrong.status_code < 500, wrong.text[:300]
        assert "max_tokens" in wrong.text and "temperature" in wrong.text
        seen["max_tokens a string, temperature a list"] = f"HTTP {wrong.status_code}"
        _still_serving(served, alone)
    assert served.problems() == []
    assert served.server.process is not None and served.server.process.poll() is None
    served.figures["recipe server, bad input (a request after each: same tokens as alone)"] = ", ".join(
        f"{case}: {answer}" for case, answer in seen.items()
    )


_JSON = {"Content-Type": "application/json"}
