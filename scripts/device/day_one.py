"""Day one on the device: every device check in order, one report, the series' options it recommends.

One command for the first run on a B70 machine (``--python`` of ``nox -s day_one``, or run
directly with the wheel installed). It runs, each as a child in a process group of its own with a
time limit (stopped as a group, :mod:`scripts.procs`), its output in ``OUT/logs/STEP.log``:

1. ``stack``: the doctor (``vllm.xpu_laguna.doctor``): the installed torch, Triton and
   ``vllm_xpu_kernels`` against ``pins.toml``, the XPU count and memory against TP 4, the recipe's
   variables and the series' options; with ``--model-dir``/``--draft-dir`` the drafter identified
   by content;
2. ``checkpoint``: ``checkpoint_check`` on the target and drafter (strict parse, exactly the
   routed experts packed W4A16 group 32, the ignore list, groups per rank at TP 4, KV scales);
3. ``split-divergence``: the KV lengths where verify and decode would split differently;
4. ``attention``: ``xpu_attention_check`` (exact verify vs q=1 decode, with and without the plan);
5. ``ops``: ``op_invariance_check`` at Laguna-S TP 4 shapes (q/k norm, linears per form, INT4,
   all-reduce, elementwise);
6. ``moe``: ``moe_invariance_check`` (the INT4 routed experts, plain and per row);
7. ``graphs``: ``graph_check`` (breakable graphs off and on, tokens equal, 200+ cycles);
8. ``rows``: ``row_invariance_check`` on the real pair (every module of each verify row vs the
   teacher's decode).

The checks run under the recipe's settings: the variables of its env file in their environment,
and the series' options of its YAML (``additional-config``, ``xpu_laguna``; ``--series-options``
over them) where a check takes them (the doctor, ``ops``, ``graphs``, ``rows``): the series reads
no environment variable. It ends with one table, one JSON report (``OUT/day-one.json``) and the
options it recommends from the results, by option key (``row_invariant_linear_form``, ...):
``OUT/recommended.json`` is the whole ``--additional-config`` argument, the run's options with the
recommendations applied (``vllm serve --config recipes/laguna-s-int4-dflash-tp4.yaml
--additional-config "$(cat OUT/recommended.json)"``; the command line wins over the file). Exit
status 1 when an exactness check fails (or no form of an op is row-invariant), 2 for bad options.

``--cpu-self-test`` runs the same steps on CPU with each check's own self-test options (reference
kernels, small shapes, emulated graphs, the tiny INT4 pair): it proves this command, never the
device, and every line of its report says so.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scripts import procs
from scripts.device import _report as report
from scripts.errors import ToolError, exit_status
from scripts.recipe import shell_env
from scripts.series_options import (
    ADDITIONAL_CONFIG_ARG,
    OPTIONS_KEY,
    additional_config,
    options_argument,
    refuse_series_env,
)

RECOMMENDED_FILE = "recommended.json"
"""The recommended ``--additional-config`` (JSON), in the report folder."""
SELF_TEST_LABEL = "CPU SELF-TEST (stand-in kernels, emulated graphs, tiny models): not a device result"
EXACTNESS = "exactness"
MEASUREMENT = "measurement"
INFO = "info"


class DayOneError(ToolError):
    """An output folder that cannot be written, or a failed run (exit status 1)."""


@dataclass(frozen=True)
class Step:
    """One device check: its command (without the interpreter), time limit and kind."""

    name: str
    argv: tuple[str, ...] | None  # None: not run, ``why`` says why
    limit_s: float
    kind: str
    json_out: str = ""
    why: str = ""


@dataclass
class Outcome:
    """How a step ended, as the report and the table show it."""

    name: str
    kind: str
    status: str  # pass, FAIL, timed out, not run
    seconds: float
    command: str
    last_line: str
    log: str
    returncode: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------- the steps


def _module(name: str, *args: str) -> tuple[str, ...]:
    return ("-m", name, *args)


def _reporting(name: str, module: str, out: Path, limit_s: float, kind: str, *args: str) -> Step:
    """A step whose check also writes its rows to ``OUT/NAME.json`` (its ``--json``)."""
    file = f"{name}.json"
    return Step(name, _module(module, *args, "--json", str(out / file)), limit_s, kind, json_out=file)


def _series(options: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The series' options on a check's command line (``--series-options JSON``)."""
    return ("--series-options", json.dumps(dict(options or {})))


def _doctor(options: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The series' options on the doctor's command line: the server's whole ``--additional-config``."""
    return (ADDITIONAL_CONFIG_ARG, json.dumps(additional_config(dict(options or {}))))


def device_steps(
    out: Path, model: Path | None, draft: Path | None, options: Mapping[str, Any] | None = None
) -> list[Step]:
    """The steps at the real shapes, on the XPU; ``options``: the series' options of the checks
    that take them."""
    pair = model is not None and draft is not None
    need_pair = "needs --model-dir and --draft-dir"
    models = ("--model", str(model), "--draft", str(draft)) if pair else ()
    stack = _module("vllm.xpu_laguna.doctor", *models, *_doctor(options))
    series = _series(options)
    return [
        Step("stack", stack, 300, EXACTNESS),
        Step(
            "checkpoint",
            _module(
                "scripts.device.checkpoint_check", "--model-dir", str(model), "--draft-dir", str(draft), "--tp", "4"
            )
            if pair
            else None,
            600,
            EXACTNESS,
            why=need_pair,
        ),
        Step("split-divergence", _module("scripts.device.split_divergence"), 120, INFO),
        Step("attention", _module("scripts.device.xpu_attention_check", "--device", "xpu"), 3600, EXACTNESS),
        _reporting("ops", "scripts.device.op_invariance_check", out, 3600, MEASUREMENT, "--device", "xpu", *series),
        _reporting("moe", "scripts.device.moe_invariance_check", out, 1800, MEASUREMENT, "--device", "xpu"),
        _reporting("graphs", "scripts.device.graph_check", out, 3600, EXACTNESS, "--device", "xpu", *series),
        Step(
            "rows",
            _module(
                "scripts.device.row_invariance_check", "--model-dir", str(model), "--draft-dir", str(draft), *series
            )
            if pair
            else None,
            3600,
            EXACTNESS,
            why=need_pair,
        ),
    ]


def self_test_steps(out: Path, tiny: Path, tiny_int4: Path, options: Mapping[str, Any] | None = None) -> list[Step]:
    """The same steps with each check's CPU self-test options (small shapes, reference kernels,
    emulated graphs, the tiny pairs); ``tiny_int4`` is written by the first step."""
    target, draft = tiny_int4 / "target", tiny_int4 / "draft"
    series = _series(options)
    return [
        Step("models", _module("scripts.tiny_laguna_int4", "--out", str(tiny_int4)), 600, INFO),
        Step(
            "stack",
            _module(
                "vllm.xpu_laguna.doctor",
                *("--no-device", "--model", str(target), "--draft", str(draft)),
                *_doctor(options),
            ),
            300,
            INFO,  # no XPU stack here: the lines are shown, not gated
        ),
        Step(
            "checkpoint",
            _module(
                "scripts.device.checkpoint_check", "--model-dir", str(target), "--draft-dir", str(draft), "--tp", "2"
            ),
            600,
            EXACTNESS,
        ),
        Step("split-divergence", _module("scripts.device.split_divergence", "--max-len", "16384"), 120, INFO),
        Step("attention", _module("scripts.device.xpu_attention_check", "--device", "cpu", "--quick"), 900, EXACTNESS),
        _reporting(
            "ops",
            "scripts.device.op_invariance_check",
            *(out, 900, MEASUREMENT, "--device", "cpu", "--shapes", "small", "--trials", "1", "--ranks", "2"),
            *series,
        ),
        _reporting(
            "moe",
            "scripts.device.moe_invariance_check",
            *(out, 600, MEASUREMENT, "--device", "cpu", "--shapes", "small", "--trials", "1", "--rows", "1,8"),
        ),
        _reporting(
            "graphs",
            "scripts.device.graph_check",
            *(out, 1200, EXACTNESS, "--emulate-graphs", "--models", str(tiny), "--metadata", "on"),
            *("--prompts", "1", "--tokens", "24", "--long-prompt-tokens", "0", "--min-cycles", "3"),
            *series,
        ),
        Step(
            "rows",
            _module(
                "scripts.device.row_invariance_check",
                *("--tiny", str(tiny), "--prompts", "1", "--max-tokens", "8"),
                *series,
            ),
            1200,
            EXACTNESS,
        ),
    ]


# ----------------------------------------------------------------------------- recommendation


@dataclass(frozen=True)
class Recommendation:
    """One series option (its key in ``additional_config["xpu_laguna"]``) chosen from the
    measurements, its typed value (None: none works)."""

    key: str
    value: str | bool | None
    why: str


def _invariant(rows: list[dict[str, Any]], switch: str) -> bool | None:
    """All ``rows`` of ``switch`` bitwise equal (None: none of them ran)."""
    ran = [r for r in rows if r.get("switch", r.get("form")) == switch and r.get("compared") is not None]
    if not ran:
        return None
    return all(r["equal"] == r["compared"] for r in ran)


def _choose(rows: list[dict[str, Any]], key: str, forms: tuple[str, ...], what: str) -> Recommendation:
    """The first of ``forms`` row-invariant on every measured row (empty: none is)."""
    form = next((f for f in forms if _invariant(rows, f)), None)
    why = f"{form}: row-invariant on every {what} shape measured" if form else f"no {what} form row-invariant"
    return Recommendation(key, form, why)


def recommend(ops: list[dict[str, Any]], moe: list[dict[str, Any]]) -> list[Recommendation]:
    """The series' options from the ``ops`` and ``moe`` rows (their JSON files' ``rows``): per op,
    the fastest form whose every measured row is bitwise equal to its one-row call."""
    out: list[Recommendation] = []
    linears = [r for r in ops if str(r["op"]).startswith("linear:")]
    if linears:
        out.append(_choose(linears, "row_invariant_linear_form", ("batch_invariant", "rows"), "linear"))
    norms = [r for r in ops if r["op"] == "qk_norm"]
    if norms:
        out.append(_choose(norms, "row_invariant_qk_norm", ("pad", "tokens"), "q/k norm"))
    reduce_rows = [r for r in ops if r["op"] == "all_reduce"]
    if _invariant(reduce_rows, "gather+rank-sum") is not None:
        ok = bool(_invariant(reduce_rows, "gather+rank-sum"))
        out.append(
            Recommendation(
                "exact_tp_reduce",
                True if ok else None,
                "true: the rank-order sum is row-invariant" if ok else "the rank-order sum is not row-invariant",
            )
        )
    if moe:
        plain = _invariant(moe, "plain") and all(r.get("repeat_equal") in (None, r["compared"]) for r in moe)
        per_row = _invariant(moe, "rows")
        value = "off" if plain else "rows" if per_row else None
        why = {
            "off": "off: the plain call is row-invariant and repeatable at every M measured (fewer weight reads)",
            "rows": "rows: the plain call is not row-invariant; one call per row is",
            None: "no routed-experts form row-invariant (not run-to-run deterministic at one row?)",
        }[value]
        out.append(Recommendation("row_invariant_moe", value, why))
    return out


def recommended_config(recommendations: list[Recommendation], options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--additional-config`` a server takes: the run's ``options`` with each recommended value
    applied; a key with no working value keeps the run's value (the run failed: see the report)."""
    chosen = {rec.key: rec.value for rec in recommendations if rec.value is not None}
    return additional_config({**options, **chosen})


# --------------------------------------------------------------------------------------- running


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def run_step(step: Step, python: str, out: Path, index: int, total: int, env: dict[str, str]) -> Outcome:
    """One step as a child group with its time limit, its output in ``OUT/logs/NAME.log``."""
    log = out / "logs" / f"{step.name}.log"
    if step.argv is None:
        print(f"[{index}/{total}] {step.name}: not run ({step.why})", flush=True)
        return Outcome(step.name, step.kind, "not run", 0.0, "", step.why, "")
    argv = [python, *step.argv]
    command = shlex.join(argv)
    if step.json_out:
        (out / step.json_out).unlink(missing_ok=True)  # never an earlier run's rows
    print(f"[{index}/{total}] {step.name}: {command} (limit {step.limit_s:.0f} s, log {log})", flush=True)
    with log.open("w", encoding="utf-8") as handle:
        done = procs.run(argv, timeout_s=step.limit_s, env=env, stdout=handle, stderr=subprocess.STDOUT)
    last = _last_line(log)
    if done.timed_out:
        status = "timed out"
    else:
        status = "pass" if done.returncode == 0 else "FAIL"
    data: dict[str, Any] = {}
    if step.json_out and (out / step.json_out).is_file():
        data = json.loads((out / step.json_out).read_text(encoding="utf-8"))
    print(f"    {status} in {done.seconds:.0f} s: {last}", flush=True)
    return Outcome(step.name, step.kind, status, round(done.seconds, 1), command, last, str(log), done.returncode, data)


def verdict(outcomes: list[Outcome], recommendations: list[Recommendation]) -> list[str]:
    """What failed: an exactness step not passed (run and failed, or timed out), a measurement
    that did not finish, or an option with no working value."""
    failed = [f"{o.name}: {o.status}" for o in outcomes if o.kind != INFO and o.status in ("FAIL", "timed out")]
    failed += [f"{r.key}: {r.why}" for r in recommendations if r.value is None]
    return failed


def day_one(args: Any) -> None:
    """The steps the options select, run by :func:`run_all` into ``args.out``."""
    out: Path = args.out
    options = {**recipe_options(args.cpu_self_test), **args.series_options}
    if args.cpu_self_test:
        from scripts.layout import Layout

        steps = self_test_steps(out, Layout().tiny_models, out / "tiny-int4", options)
    else:
        steps = device_steps(out, args.model_dir, args.draft_dir, options)
    if args.only:
        steps = [s for s in steps if s.name in args.only]
    label = SELF_TEST_LABEL if args.cpu_self_test else "device run (XPU)"
    env_path = args.env_file or recipe_env(args.cpu_self_test)
    env = {**os.environ, **shell_env(env_path)}
    refuse_series_env(env, f"the checks' environment (this one and {env_path})")
    print(f"variables from {env_path} (over this environment); the series' options: {json.dumps(options)}", flush=True)
    run_all(steps, args.python, out, label, device_result=not args.cpu_self_test, env=env, options=options)


def _recipe(cpu: bool) -> Any:
    from scripts.recipe import recipes

    xpu, cpu_tiny = recipes()
    return cpu_tiny if cpu else xpu


def recipe_env(cpu: bool) -> Path:
    """The env file of the recipe the checks run under: the XPU recipe's, or the tiny CPU one's."""
    from scripts.recipe import RECIPE_DIR

    return RECIPE_DIR / _recipe(cpu).env_name


def recipe_options(cpu: bool) -> dict[str, Any]:
    """The series' options of that recipe (its YAML's ``additional-config``)."""
    return dict(_recipe(cpu).additional_config.get(OPTIONS_KEY, {}))


def run_all(
    steps: list[Step],
    python: str,
    out: Path,
    label: str,
    device_result: bool,
    env: dict[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> None:
    """Run ``steps`` in order with ``python``; write ``OUT/day-one.json`` and
    ``OUT/recommended.json`` (``options``, the run's, with the recommendations applied), print the
    table; raise :class:`DayOneError` when anything failed."""
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DayOneError(f"--out {out}: {exc.strerror}") from None
    env = dict(os.environ) if env is None else env
    began = time.monotonic()
    print(f"day one: {label}; {len(steps)} step(s); report in {out}", flush=True)
    outcomes = [run_step(s, python, out, i, len(steps), env) for i, s in enumerate(steps, 1)]
    by_name = {o.name: o for o in outcomes}
    recommendations = recommend(
        by_name["ops"].data.get("rows", []) if "ops" in by_name else [],
        by_name["moe"].data.get("rows", []) if "moe" in by_name else [],
    )
    failed = verdict(outcomes, recommendations)
    recommended = recommended_config(recommendations, options or {})
    (out / RECOMMENDED_FILE).write_text(json.dumps(recommended, indent=1) + "\n", encoding="utf-8")
    header = [
        f"day one: {label}",
        f"{len(outcomes)} step(s) in {time.monotonic() - began:.0f} s; logs in {out}/logs",
    ]
    report.print_table(
        header,
        ("step", "kind", "status", "s", "last line"),
        [[o.name, o.kind, o.status, f"{o.seconds:.0f}", o.last_line] for o in outcomes],
        pad_last=False,
    )
    for rec in recommendations:
        shown = "NONE" if rec.value is None else json.dumps(rec.value).strip('"')
        print(f"recommend {OPTIONS_KEY}.{rec.key}={shown}  ({rec.why})")
    document = {
        "label": label,
        "device_result": device_result,
        "steps": [asdict(o) for o in outcomes],
        "recommended": [asdict(r) for r in recommendations],
        "additional_config": recommended,
        "failed": failed,
    }
    (out / "day-one.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    print(
        f"recommended options: {out / RECOMMENDED_FILE} (vllm serve --config RECIPE.yaml "
        f'{ADDITIONAL_CONFIG_ARG} "$(cat {out / RECOMMENDED_FILE})"); report: {out / "day-one.json"}'
    )
    if failed:
        raise DayOneError(f"FAILED ({len(failed)}): " + "; ".join(failed))
    print(f"OK: {label}")


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


STEP_NAMES = ("models", "stack", "checkpoint", "split-divergence", "attention", "ops", "moe", "graphs", "rows")


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser
    from scripts.layout import Layout

    parser = ToolParser(
        prog="python -m scripts.device.day_one",
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    parser.add_argument("--model-dir", type=Path, default=None, help="the INT4 target's folder (default: not checked)")
    parser.add_argument(
        "--draft-dir", type=Path, default=None, help="its DFlash drafter's folder (default: not checked)"
    )
    parser.add_argument("--out", type=Path, default=Layout().build / "day-one", help="report folder")
    parser.add_argument(
        "--env-file",
        type=Path,
        help="the variables the checks run under, read as `set -a; . FILE` reads it (default: the "
        "XPU recipe's recipes/*.env; with --cpu-self-test the tiny CPU recipe's); the series reads none",
    )
    parser.add_argument(
        "--series-options",
        type=options_argument,
        default={},
        metavar="JSON",
        help=f"the series' options of the checks, a JSON object over the recipe's additional-config "
        f"{OPTIONS_KEY!r} (e.g. '{{\"exact_verify\": false}}'; default: the recipe's as they are)",
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter of the checks (default: this one)")
    parser.add_argument("--only", type=_names, default=(), help=f"comma list of steps to run: {', '.join(STEP_NAMES)}")
    parser.add_argument(
        "--cpu-self-test", action="store_true", help="run the checks' CPU self-tests (not a device run)"
    )
    parser.add_argument("--check-only", action="store_true", help="check the options and exit; nothing runs")
    args = parser.parse_args(argv)
    if (args.model_dir is None) != (args.draft_dir is None):
        parser.error("--model-dir and --draft-dir go together")
    if args.cpu_self_test and args.model_dir is not None:
        parser.error("--cpu-self-test uses the tiny INT4 pair; --model-dir is for the device run")
    for flag, folder in (("--model-dir", args.model_dir), ("--draft-dir", args.draft_dir)):
        if folder is not None and not (folder / "config.json").is_file():
            parser.error(f"{flag} {folder}: no config.json there")
    if args.env_file is not None and not args.env_file.is_file():
        parser.error(f"--env-file {args.env_file}: no such file")
    try:
        refuse_series_env(os.environ, "this environment")
        if args.env_file is not None:
            refuse_series_env(shell_env(args.env_file), f"--env-file {args.env_file}")
    except ToolError as exc:
        parser.error(str(exc))
    unknown = [n for n in args.only if n not in STEP_NAMES]
    if unknown:
        parser.error(f"--only: unknown step(s) {', '.join(unknown)}; steps: {', '.join(STEP_NAMES)}")
    if args.check_only:
        print("options OK")
        return 0
    return exit_status(lambda: day_one(args))


if __name__ == "__main__":
    sys.exit(main())
