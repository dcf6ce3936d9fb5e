"""``verify-record``: re-derive a record's numbers and name every field that disagrees.

Two levels:

* **raw** (version-2 records whose artifacts are present): the sha256 of every artifact, then a
  fresh analysis of the raw rows rebuilt into a record and compared leaf by leaf;
* **internal** (always): every relation between fields of the record itself: the candidate is
  the lower candidate start, delta / delta_pct / multiple against the prior value, the practical
  floor, headline deltas against the starts, pair and quality counts against the row count, the
  pass flags against the gates, the submission summary against the starts and its own counts,
  conventional starts against legacy starts, graph counts, submission paths against the value.

Floats are compared with a relative and absolute tolerance of 1e-12: the reference records'
own formulas reproduce bit for bit, other evaluation orders differ by < 4e-15 and the floor is
written rounded to 12 decimals; an alteration of 1e-12 relative or more is reported.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date as Date
from pathlib import Path
from typing import Any

from scripts.errors import ToolError
from scripts.measure.gates import Gates, load_gates
from scripts.measure.metrics import pct_change
from scripts.measure.record import FIXED_DRAFT_METHODS, SUMMARY_SUFFIX
from scripts.measure.schema import LEG_ORDER, PAIRS, SCHEMA_VERSION, pair_name, parse_fraction

REL_TOL = 1e-12
ABS_TOL = 1e-12

V1_KEYS = (
    "schema",
    "date",
    "status",
    "source",
    "run_root",
    "metric",
    "starts",
    "record",
    "pairs",
    "quality",
    "graph",
    "audits",
    "sha256",
    "localmaxxing",
)
V2_KEYS = V1_KEYS + (
    "schema_version",
    "metric_conventional",
    "starts_conventional",
    "treatment",
    "speculative",
    "legs",
    "config",
    "gates",
    "artifacts",
)
QUALITY_COUNTS = (
    "teacher_exact",
    "cross_leg_exact",
    "cached_tokens_zero",
    "long_then_next",
    "rollover",
)
QUALITY_FLAGS = (
    "fresh_unique_prompts",
    "single_active_generation",
    "no_warmup_generation",
    "no_retry",
    "no_cache_history_ngram_or_response_reuse",
)
_METRIC = re.compile(r"^median_tok_s_1_(\d+)_after_ttft$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_RUN_ROOT = re.compile(r"-([0-9a-f]{9})-([0-9a-f]{9})-(\d{8})T\d{6}Z$")


@dataclass(frozen=True)
class Failure:
    fields: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{', '.join(self.fields)}: {self.message}"


@dataclass
class Report:
    mode: str
    failures: list[Failure] = field(default_factory=list)
    checked: set[str] = field(default_factory=set)
    """Fields a check read (re-derived, used as an input, or bounded)."""
    derived: set[str] = field(default_factory=set)
    """Fields in an exact relation (re-computed from other fields or from raw rows, or an
    input of such a computation): altering one of them alone is reported."""
    numeric: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def unchecked(self) -> list[str]:
        return [path for path in self.numeric if path not in self.checked]


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def numeric_leaves(data: object, prefix: str = "") -> Iterator[str]:
    """Paths of every number in a record, including the numbers inside 'k/n' strings."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from numeric_leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from numeric_leaves(value, f"{prefix}[{index}]")
    elif is_number(data) or isinstance(data, str) and re.fullmatch(r"\d+/\d+", data):
        yield prefix


class _Missing(Exception):
    pass


class Checker:
    def __init__(self, record: dict[str, Any], report: Report) -> None:
        self.record = record
        self.report = report

    def fail(self, fields: tuple[str, ...] | str, message: str) -> None:
        fields = (fields,) if isinstance(fields, str) else fields
        self.report.failures.append(Failure(fields, message))

    def get(self, path: str) -> Any:
        node: Any = self.record
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
            if part.startswith("["):
                index = int(part[1:-1])
                if not isinstance(node, list) or index >= len(node):
                    self.fail(path, "missing")
                    raise _Missing(path)
                node = node[index]
            else:
                if not isinstance(node, dict) or part not in node:
                    self.fail(path, "missing")
                    raise _Missing(path)
                node = node[part]
        return node

    def number(self, path: str, *, integer: bool = False, optional: bool = False) -> Any:
        value = self.get(path)
        if value is None and optional:
            return None
        if not is_number(value) or (integer and not isinstance(value, int)):
            self.fail(path, f"expected {'an integer' if integer else 'a number'}, got {value!r}")
            raise _Missing(path)
        if not math.isfinite(value):
            self.fail(path, f"not finite: {value!r}")
            raise _Missing(path)
        return value

    def derived(self, path: str, expected: float, formula: str, inputs: tuple[str, ...]) -> None:
        """``path`` must equal ``expected`` (computed from ``inputs`` as ``formula``)."""
        self.report.checked.update((path, *inputs))
        self.report.derived.update((path, *inputs))
        try:
            actual = self.number(path)
        except _Missing:
            return
        exact = isinstance(actual, int) and isinstance(expected, int)
        if (actual != expected) if exact else not close(actual, expected):
            self.fail((path, *inputs), f"{actual!r} != {formula} = {expected!r}")

    def constraint(self, ok: bool, fields: tuple[str, ...], message: str) -> None:
        self.report.checked.update(fields)
        if not ok:
            self.fail(fields, message)

    def run(self, check: Callable[[], None]) -> None:
        try:
            check()
        except _Missing:
            pass
        except (KeyError, TypeError, ValueError, ZeroDivisionError, ToolError) as exc:
            self.fail(check.__name__.lstrip("_"), f"malformed ({exc})")


def _leg_keys(checker: Checker) -> dict[str, str]:
    starts = checker.get("starts")
    keys = list(starts) if isinstance(starts, dict) else []
    if len(keys) != len(LEG_ORDER) or not all(
        key == leg or key.startswith(leg + "_") for key, leg in zip(keys, LEG_ORDER)
    ):
        checker.fail("starts", f"expected legs {'/'.join(LEG_ORDER)} in that order, got {keys}")
        raise _Missing("starts")
    return dict(zip(LEG_ORDER, keys))


def internal_checks(record: dict[str, Any], gates: Gates, report: Report) -> None:
    checker = Checker(record, report)
    version = record.get("schema_version", 1)
    if version not in (1, SCHEMA_VERSION):
        checker.fail("schema_version", f"unknown schema version {version!r}")
        return
    report.checked.add("schema_version")
    for key in V1_KEYS if version == 1 else V2_KEYS:
        if key not in record:
            checker.fail(key, "missing")
    if report.failures:
        return
    try:
        keys = _leg_keys(checker)
        match = _METRIC.match(str(checker.get("metric")))
        if match is None:
            checker.fail("metric", f"unknown metric {record['metric']!r}")
            return
        window = int(match.group(1))
    except _Missing:
        return
    start = {leg: f"starts.{keys[leg]}" for leg in LEG_ORDER}
    status = str(record.get("status", ""))
    claims_record = "RECORD" in status and "NOT_A_RECORD" not in status
    summaries = [key for key in record if key.endswith(SUMMARY_SUFFIX)]
    rows: dict[str, int] = {}

    def _starts() -> None:
        for leg in LEG_ORDER:
            value = checker.number(start[leg])
            checker.constraint(value > 0, (start[leg],), f"must be > 0, got {value!r}")

    def _record() -> None:
        b1, b2 = checker.number(start["B1"]), checker.number(start["B2"])
        cand = "record.candidate_lower_start_tok_s"
        lower, other = ("B1", "B2") if b1 <= b2 else ("B2", "B1")
        checker.derived(cand, min(b1, b2), f"min(B1, B2) = {lower}", (start[lower],))
        checker.constraint(
            checker.number(start[other]) >= checker.number(cand),
            (start[other], cand),
            f"{other} start is below the candidate value",
        )
        prior_path = "record.prior_approved_tok_s"
        prior = checker.number(prior_path, optional=True)
        c = checker.number(cand)
        if prior is None:
            for name in ("delta_tok_s", "delta_pct", "multiple", "strict_practical_floor_tok_s"):
                value = record["record"].get(name)
                checker.constraint(
                    value is None, (f"record.{name}",), f"{value!r} without a prior value"
                )
            return
        inputs = (cand, prior_path)
        checker.derived("record.delta_tok_s", c - prior, "candidate - prior", inputs)
        checker.derived(
            "record.delta_pct", (c / prior - 1) * 100, "(candidate/prior - 1)*100", inputs
        )
        checker.derived("record.multiple", c / prior, "candidate / prior", inputs)
        floor = gates.practical_floor(prior)
        if record["record"].get("strict_practical_floor_tok_s") is not None:
            checker.derived(
                "record.strict_practical_floor_tok_s",
                floor,
                f"round(prior * (1 + {gates.practical_floor_pct}/100), {gates.floor_decimals})",
                (prior_path,),
            )
        if claims_record:
            checker.constraint(
                c > floor,
                (cand, prior_path),
                f"{c!r} does not beat the strict practical floor {floor!r} ({status})",
            )

    def _pairs() -> None:
        pairs = checker.get("pairs")
        expected = [pair_name(b, a) for b, a in PAIRS]
        if not isinstance(pairs, dict) or sorted(pairs) != sorted(expected):
            checker.fail("pairs", f"expected exactly {expected}")
            return
        for cand, ctrl in PAIRS:
            name = pair_name(cand, ctrl)
            wins_path = f"pairs.{name}.row_wins"
            wins, n = parse_fraction(checker.get(wins_path), wins_path)
            checker.constraint(wins <= n and n > 0, (wins_path,), f"{wins}/{n} is not a count")
            rows[name] = n
            headline = None
            if "headline_delta_pct" in pairs[name]:
                path = f"pairs.{name}.headline_delta_pct"
                b, a = checker.number(start[cand]), checker.number(start[ctrl])
                headline = pct_change(b, a)
                checker.derived(
                    path, headline, f"({cand} - {ctrl})/{ctrl}*100", (start[cand], start[ctrl])
                )
                headline = checker.number(path)
            median_path = f"pairs.{name}.median_paired_delta_pct"
            median = checker.number(median_path)
            for optional in ("aggregate_cycle_saving_ms", "acceptance_rate_delta"):
                checker.number(f"pairs.{name}.{optional}", optional=version > 1)
            passed_path = f"pairs.{name}.passed"
            passed = checker.get(passed_path)
            should = gates.pair_passes(wins, n, headline, median)
            fields = (passed_path, wins_path, median_path) + (
                (f"pairs.{name}.headline_delta_pct",) if headline is not None else ()
            )
            checker.constraint(
                passed is should,
                fields,
                f"passed={passed!r} but the gates say {should} (wins {wins}/{n}, "
                f"median paired delta {median!r}, headline {headline!r})",
            )
            if claims_record:
                checker.constraint(
                    bool(passed), (passed_path,), f"a failed pair in a {status} record"
                )
        counts = set(rows.values())
        checker.constraint(
            len(counts) == 1,
            tuple(f"pairs.{name}.row_wins" for name in rows),
            f"pairs disagree on the row count: {rows}",
        )

    def _quality() -> None:
        n_rows = next(iter(rows.values()), None)
        legs = len(LEG_ORDER)
        for key in QUALITY_COUNTS:
            path = f"quality.{key}"
            k, n = parse_fraction(checker.get(path), path)
            checker.constraint(k <= n, (path,), f"{k}/{n}: more passes than checks")
            if claims_record and gates.require_complete:
                checker.constraint(k == n, (path,), f"{k}/{n} incomplete in a {status} record")
            if n_rows is None:
                continue
            wins = tuple(f"pairs.{pair_name(b, a)}.row_wins" for b, a in PAIRS)
            if key in ("teacher_exact", "cached_tokens_zero"):
                checker.constraint(
                    n == legs * n_rows, (path, *wins), f"n={n} != {legs} legs x {n_rows} rows"
                )
            elif key == "cross_leg_exact":
                allowed = (
                    {(legs - 1) * n_rows} if version > 1 else {(legs - 1) * n_rows, legs * n_rows}
                )
                checker.constraint(
                    n in allowed, (path, *wins), f"n={n} not in {sorted(allowed)} for {n_rows} rows"
                )
            else:
                checker.constraint(
                    n % legs == 0 and n <= legs * n_rows,
                    (path, *wins),
                    f"n={n} is not a per-leg count over {legs} legs of {n_rows} rows",
                )
        for key in QUALITY_FLAGS:
            value = checker.get(f"quality.{key}")
            if not isinstance(value, bool):
                checker.fail(f"quality.{key}", f"expected true/false, got {value!r}")
            elif claims_record and gates.require_complete and not value:
                checker.fail(f"quality.{key}", f"false in a {status} record")

    def _summary() -> None:
        if len(summaries) != 1:
            checker.fail("submission_summary", f"expected one *{SUMMARY_SUFFIX}, got {summaries}")
            return
        key = summaries[0]
        leg = key[: -len(SUMMARY_SUFFIX)].upper()
        if leg not in ("B1", "B2"):
            checker.fail(key, "the summary must be of a candidate leg (b1 or b2)")
            return
        out = f"{key}.tok_s_out"
        checker.derived(out, checker.number(start[leg]), f"starts {leg}", (start[leg],))
        checker.derived(
            out,
            checker.number("record.candidate_lower_start_tok_s"),
            "record.candidate_lower_start_tok_s",
            ("record.candidate_lower_start_tok_s",),
        )
        p10 = checker.number(f"{key}.tok_s_out_p10")
        median = checker.number(out)
        checker.constraint(
            0 < p10 <= median, (f"{key}.tok_s_out_p10", out), f"p10 {p10!r} not in (0, median]"
        )
        stdev = checker.number(f"{key}.tok_s_out_stdev")
        checker.constraint(stdev >= 0, (f"{key}.tok_s_out_stdev",), "negative stdev")
        mean = checker.number(f"{key}.tok_s_out_mean")
        checker.constraint(mean > 0, (f"{key}.tok_s_out_mean",), "mean must be > 0")
        wall = checker.number(f"{key}.tok_s_wall_full_median")
        full = checker.number(f"{key}.tok_s_full_after_ttft_median")
        checker.constraint(
            0 < wall < full,
            (f"{key}.tok_s_wall_full_median", f"{key}.tok_s_full_after_ttft_median"),
            "wall-clock rate must be below the after-TTFT rate (TTFT > 0 on every row)",
        )
        checker.constraint(
            checker.number(f"{key}.ttft_ms_median") > 0, (f"{key}.ttft_ms_median",), "must be > 0"
        )
        cycles = checker.number(f"{key}.draft_cycles", integer=True, optional=version > 1)
        if cycles is None:
            return
        drafted = checker.number(f"{key}.draft_tokens", integer=True)
        accepted = checker.number(f"{key}.accepted_draft_tokens", integer=True)
        per_cycle: int | None
        if version == 1:
            per_cycle, fixed = gates.legacy_num_speculative_tokens, True
        else:
            spec = record.get("speculative") or {}
            per_cycle = spec.get("num_speculative_tokens")
            fixed = spec.get("method") in FIXED_DRAFT_METHODS
        if per_cycle is not None:
            inputs: tuple[str, ...] = (f"{key}.draft_cycles",)
            if version > 1:
                inputs += ("speculative.num_speculative_tokens",)
            if fixed:
                checker.derived(
                    f"{key}.draft_tokens", per_cycle * cycles, f"{per_cycle} x draft_cycles", inputs
                )
            else:
                checker.constraint(
                    drafted <= per_cycle * cycles,
                    (f"{key}.draft_tokens", *inputs),
                    f"more than {per_cycle} draft tokens per cycle",
                )
        checker.constraint(
            0 <= accepted <= drafted,
            (f"{key}.accepted_draft_tokens", f"{key}.draft_tokens"),
            "accepted must be within 0..draft_tokens",
        )
        if drafted:
            checker.derived(
                f"{key}.draft_acceptance_rate",
                accepted / drafted,
                "accepted_draft_tokens / draft_tokens",
                (f"{key}.accepted_draft_tokens", f"{key}.draft_tokens"),
            )

    def _graph() -> None:
        graph = checker.get("graph")
        if not isinstance(graph, dict):
            checker.fail("graph", "expected an object")
            return
        if (
            graph.get("graphs_per_rank") is not None
            or graph.get("eager_breaks_per_rank") is not None
        ):
            breaks = checker.number("graph.eager_breaks_per_rank", integer=True)
            checker.derived(
                "graph.graphs_per_rank",
                breaks + 1,
                "eager_breaks_per_rank + 1",
                ("graph.eager_breaks_per_rank",),
            )
        sizes = graph.get("capture_sizes")
        if sizes:
            values = [
                checker.number(f"graph.capture_sizes[{i}]", integer=True) for i in range(len(sizes))
            ]
            checker.derived(
                "graph.max_capture_size",
                max(values),
                "max(capture_sizes)",
                tuple(f"graph.capture_sizes[{i}]" for i in range(len(values))),
            )
        for name in graph:
            if name.endswith("_distinct_rank_captures"):
                twin = name.replace("_captures", "_replays")
                if twin in graph:
                    checker.derived(
                        f"graph.{twin}",
                        checker.number(f"graph.{name}", integer=True),
                        f"graph.{name} (every captured rank replays)",
                        (f"graph.{name}",),
                    )

    def _conventional() -> None:
        if version == 1:
            return
        factor = (window - 1) / window
        checker.constraint(
            record["metric_conventional"] == record["metric"] + "_conventional",
            ("metric_conventional",),
            "must name the conventional form of metric",
        )
        conv = checker.get("starts_conventional")
        if not isinstance(conv, dict) or list(conv) != list(record["starts"]):
            checker.fail("starts_conventional", "must have the keys of starts, in order")
            return
        for leg in LEG_ORDER:
            path = f"starts_conventional.{keys[leg]}"
            checker.derived(
                path,
                checker.number(start[leg]) * factor,
                f"starts x {window - 1}/{window}",
                (start[leg],),
            )

    def _legs() -> None:
        if version == 1:
            return
        n_rows = next(iter(rows.values()), None)
        for leg in LEG_ORDER:
            base = f"legs.{leg}"
            for unit, source in (
                ("tok_s_legacy", start[leg]),
                ("tok_s_conventional", f"starts_conventional.{keys[leg]}"),
            ):
                checker.derived(f"{base}.{unit}.median", checker.number(source), source, (source,))
                p10 = checker.number(f"{base}.{unit}.p10")
                median = checker.number(f"{base}.{unit}.median")
                checker.constraint(p10 <= median, (f"{base}.{unit}.p10",), "p10 above the median")
                count = checker.number(f"{base}.{unit}.n", integer=True)
                if n_rows is not None:
                    checker.derived(f"{base}.{unit}.n", n_rows, "pair row count", ())
                checker.derived(f"{base}.rows", count, f"{base}.{unit}.n", ())
            drafted = record["legs"][leg].get("draft_tokens")
            accepted = record["legs"][leg].get("accepted_draft_tokens")
            if drafted:
                checker.derived(
                    f"{base}.draft_acceptance_rate",
                    checker.number(f"{base}.accepted_draft_tokens", integer=True)
                    / checker.number(f"{base}.draft_tokens", integer=True),
                    "accepted_draft_tokens / draft_tokens",
                    (f"{base}.accepted_draft_tokens", f"{base}.draft_tokens"),
                )
            del accepted
        for cand, ctrl in PAIRS:
            name = pair_name(cand, ctrl)
            rates = [record["legs"][leg].get("draft_acceptance_rate") for leg in (cand, ctrl)]
            if None not in rates:
                checker.derived(
                    f"pairs.{name}.acceptance_rate_delta",
                    rates[0] - rates[1],
                    f"{cand} rate - {ctrl} rate",
                    (f"legs.{cand}.draft_acceptance_rate", f"legs.{ctrl}.draft_acceptance_rate"),
                )
            cycles = [record["legs"][leg].get("cycle_ms") for leg in (cand, ctrl)]
            if None not in cycles:
                checker.derived(
                    f"pairs.{name}.aggregate_cycle_saving_ms",
                    cycles[1] - cycles[0],
                    f"{ctrl} cycle_ms - {cand} cycle_ms",
                    (f"legs.{cand}.cycle_ms", f"legs.{ctrl}.cycle_ms"),
                )
        if len(summaries) == 1:
            key = summaries[0]
            leg = key[: -len(SUMMARY_SUFFIX)].upper()
            if leg in ("B1", "B2"):
                for field_name, source in (
                    ("tok_s_out_p10", "tok_s_legacy.p10"),
                    ("tok_s_out_mean", "tok_s_legacy.mean"),
                    ("tok_s_out_stdev", "tok_s_legacy.stdev"),
                    ("draft_cycles", "draft_cycles"),
                    ("draft_tokens", "draft_tokens"),
                    ("accepted_draft_tokens", "accepted_draft_tokens"),
                ):
                    value = checker.get(f"legs.{leg}.{source}")
                    if value is not None:
                        checker.derived(
                            f"{key}.{field_name}",
                            value,
                            f"legs.{leg}.{source}",
                            (f"legs.{leg}.{source}",),
                        )

    def _sha256() -> None:
        hashes = checker.get("sha256")
        if not isinstance(hashes, dict) or not hashes:
            checker.fail("sha256", "expected a non-empty name -> sha256 map")
            return
        for name, value in hashes.items():
            if not isinstance(value, str) or not _SHA.match(value):
                checker.fail(f"sha256.{name}", f"not a lowercase hex sha256: {value!r}")
        if version > 1:
            artifacts = record["artifacts"]
            if not isinstance(artifacts, dict) or sorted(artifacts) != sorted(hashes):
                checker.fail(
                    ("artifacts", "sha256"), "artifacts and sha256 must name the same files"
                )

    def _disposition() -> None:
        if version == 1:
            return
        audits = checker.get("audits")
        verdict = audits.get("committed_analyzer_disposition") if isinstance(audits, dict) else None
        checker.constraint(
            verdict in ("record_candidate", "not_a_record"),
            ("audits.committed_analyzer_disposition",),
            f"unknown disposition {verdict!r}",
        )
        checker.constraint(
            claims_record == (verdict == "record_candidate"),
            ("status", "audits.committed_analyzer_disposition"),
            f"status {status!r} disagrees with the analyzer's disposition {verdict!r}",
        )

    def _identity() -> None:
        try:
            day = Date.fromisoformat(str(record["date"]))
        except ValueError:
            checker.fail("date", f"not an ISO date: {record['date']!r}")
            return
        match = _RUN_ROOT.search(str(record["run_root"]))
        if match is not None:
            source = record["source"]
            for group, name in ((1, "main_tooling_commit"), (2, "vllm_commit")):
                value = str(source.get(name) or "")
                checker.constraint(
                    value.startswith(match.group(group)),
                    ("run_root", f"source.{name}"),
                    f"run root names {match.group(group)} but source.{name} is {value!r}",
                )
            checker.constraint(
                match.group(3) == day.strftime("%Y%m%d"),
                ("run_root", "date"),
                f"run root is stamped {match.group(3)}, date is {record['date']}",
            )
        lm = record["localmaxxing"]
        if not isinstance(lm, dict):
            checker.fail("localmaxxing", "expected an object")
            return
        cand = record["record"].get("candidate_lower_start_tok_s")
        for name in ("queue_path", "response_path"):
            path = lm.get(name)
            if path is None or not is_number(cand):
                continue
            checker.constraint(
                f"{cand:.3f}tok" in str(path),
                (f"localmaxxing.{name}", "record.candidate_lower_start_tok_s"),
                f"path does not carry the value {cand:.3f}tok",
            )
            checker.constraint(
                day.strftime("%Y%m%d") in str(path),
                (f"localmaxxing.{name}", "date"),
                f"path does not carry the date {day:%Y%m%d}",
            )
        if lm.get("http_status") is not None:
            status_code = checker.number("localmaxxing.http_status", integer=True)
            if lm.get("submission_status") == "APPROVED":
                checker.constraint(
                    200 <= status_code < 300,
                    ("localmaxxing.http_status",),
                    f"APPROVED submission with HTTP status {status_code}",
                )
        submitted = lm.get("submitted_at_utc")
        if submitted is not None:
            checker.constraint(
                str(submitted)[:10] >= day.isoformat(),
                ("localmaxxing.submitted_at_utc", "date"),
                "submitted before the run date",
            )

    for check in (
        _starts,
        _record,
        _pairs,
        _quality,
        _summary,
        _graph,
        _conventional,
        _legs,
        _sha256,
        _disposition,
        _identity,
    ):
        checker.run(check)


def prior_checks(record: dict[str, Any], prior: dict[str, Any], report: Report) -> None:
    """The prior value and id must be those of the prior record (a chain of records)."""
    checker = Checker(record, report)
    try:
        value = checker.number("record.prior_approved_tok_s")
    except _Missing:
        return
    expected = prior.get("record", {}).get("candidate_lower_start_tok_s")
    checker.constraint(
        is_number(expected) and close(value, expected),
        ("record.prior_approved_tok_s",),
        f"{value!r} != prior record's candidate_lower_start_tok_s {expected!r}",
    )
    prior_id = prior.get("localmaxxing", {}).get("id")
    claimed = record["record"].get("prior_approved_id")
    checker.constraint(
        claimed == prior_id,
        ("record.prior_approved_id",),
        f"{claimed!r} != prior record's localmaxxing.id {prior_id!r}",
    )


def load_record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ToolError(f"cannot read record {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ToolError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ToolError(f"{path}: a record is a JSON object")
    return data


def record_gates(record: dict[str, Any], default: Gates) -> Gates:
    """The thresholds a record was judged with (its own for version 2, else the defaults)."""
    stored = record.get("gates")
    return Gates.from_json(stored, "record gates") if isinstance(stored, dict) else default


def verify(
    record: dict[str, Any],
    *,
    gates: Gates | None = None,
    artifacts_root: Path | None = None,
    prior: dict[str, Any] | None = None,
) -> Report:
    gates = record_gates(record, gates or load_gates())
    report = Report(mode="internal", numeric=list(numeric_leaves(record)))
    internal_checks(record, gates, report)
    if prior is not None:
        prior_checks(record, prior, report)
    if artifacts_root is not None:
        from scripts.measure.rederive import raw_checks

        report.mode = "raw"
        raw_checks(record, artifacts_root, report)
    return report


def find_artifacts_root(record: dict[str, Any], record_path: Path) -> Path | None:
    """The record's own directory or its run_root, if it holds every listed artifact."""
    artifacts = record.get("artifacts")
    if not isinstance(artifacts, dict) or not artifacts:
        return None
    for root in (record_path.resolve().parent, Path(str(record.get("run_root", "")))):
        if root.is_dir() and any((root / str(rel)).is_file() for rel in artifacts.values()):
            return root
    return None
