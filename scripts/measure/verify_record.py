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

import re
from datetime import date as Date
from pathlib import Path
from typing import Any

from scripts.measure.artifacts import RECIPE_ARTIFACT, RECIPE_ENV_ARTIFACT
from scripts.measure.checks import Checker, Failure, Missing, Report, close, is_number, numeric_leaves
from scripts.measure.gates import Gates, load_gates
from scripts.measure.metrics import pct_change
from scripts.measure.record import FIXED_DRAFT_METHODS, SUMMARY_SUFFIX
from scripts.measure.record_shape import check_record
from scripts.measure.rederive import raw_checks
from scripts.measure.schema import LEG_ORDER, PAIRS, SCHEMA_VERSION, pair_name, parse_fraction
from scripts.typed_data import ShapeError, read_json

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


def _leg_keys(checker: Checker) -> dict[str, str]:
    starts = checker.get("starts")
    keys = list(starts) if isinstance(starts, dict) else []
    if len(keys) != len(LEG_ORDER) or not all(
        key == leg or key.startswith(leg + "_") for key, leg in zip(keys, LEG_ORDER)
    ):
        checker.fail("starts", f"expected legs {'/'.join(LEG_ORDER)} in that order, got {keys}")
        raise Missing("starts")
    return dict(zip(LEG_ORDER, keys))


class InternalChecks(Checker):
    """Every relation between fields of the record itself, one method per check.

    :meth:`prepare` reads what all checks share (schema version, legs, metric window, status);
    :meth:`run_all` runs the checks in ``ORDER``. ``pairs`` must run before ``quality`` and
    ``legs``: it fills ``rows`` (row count per pair) that those two compare against.
    """

    ORDER = (
        "starts",
        "record",
        "pairs",
        "quality",
        "summary",
        "graph",
        "conventional",
        "legs",
        "sha256",
        "recipe",
        "disposition",
        "identity",
    )

    def __init__(self, record: dict[str, Any], gates: Gates, report: Report) -> None:
        super().__init__(record, report)
        self.gates = gates
        self.version = record.get("schema_version", 1)
        self.keys: dict[str, str] = {}
        self.start: dict[str, str] = {}
        self.window = 0
        self.status = str(record.get("status", ""))
        self.claims_record = "RECORD" in self.status and "NOT_A_RECORD" not in self.status
        self.summaries = [key for key in record if key.endswith(SUMMARY_SUFFIX)]
        self.rows: dict[str, int] = {}

    def prepare(self) -> bool:
        """Schema version, top-level keys, legs and metric; False when the checks cannot run."""
        if self.version not in (1, SCHEMA_VERSION):
            self.fail("schema_version", f"unknown schema version {self.version!r}")
            return False
        self.report.checked.add("schema_version")
        try:
            self.keys = _leg_keys(self)
            match = _METRIC.match(str(self.get("metric")))
            if match is None:
                self.fail("metric", f"unknown metric {self.record['metric']!r}")
                return False
            self.window = int(match.group(1))
        except Missing:
            return False
        self.start = {leg: f"starts.{self.keys[leg]}" for leg in LEG_ORDER}
        return True

    def run_all(self) -> None:
        if self.prepare():
            for name in self.ORDER:
                self.run(name, getattr(self, f"check_{name}"))

    def check_starts(self) -> None:
        for leg in LEG_ORDER:
            value = self.number(self.start[leg])
            self.constraint(value > 0, (self.start[leg],), f"must be > 0, got {value!r}")

    def check_record(self) -> None:
        b1, b2 = self.number(self.start["B1"]), self.number(self.start["B2"])
        cand = "record.candidate_lower_start_tok_s"
        lower, other = ("B1", "B2") if b1 <= b2 else ("B2", "B1")
        self.derived(cand, min(b1, b2), f"min(B1, B2) = {lower}", (self.start[lower],))
        self.constraint(
            self.number(self.start[other]) >= self.number(cand),
            (self.start[other], cand),
            f"{other} start is below the candidate value",
        )
        prior_path = "record.prior_approved_tok_s"
        prior = self.number(prior_path, optional=True)
        c = self.number(cand)
        if prior is None:
            for name in ("delta_tok_s", "delta_pct", "multiple", "strict_practical_floor_tok_s"):
                value = self.record["record"].get(name)
                self.constraint(value is None, (f"record.{name}",), f"{value!r} without a prior value")
            return
        inputs = (cand, prior_path)
        self.derived("record.delta_tok_s", c - prior, "candidate - prior", inputs)
        self.derived("record.delta_pct", (c / prior - 1) * 100, "(candidate/prior - 1)*100", inputs)
        self.derived("record.multiple", c / prior, "candidate / prior", inputs)
        floor = self.gates.practical_floor(prior)
        if self.record["record"].get("strict_practical_floor_tok_s") is not None:
            self.derived(
                "record.strict_practical_floor_tok_s",
                floor,
                f"round(prior * (1 + {self.gates.practical_floor_pct}/100), {self.gates.floor_decimals})",
                (prior_path,),
            )
        if self.claims_record:
            self.constraint(
                c > floor,
                (cand, prior_path),
                f"{c!r} does not beat the strict practical floor {floor!r} ({self.status})",
            )

    def check_pairs(self) -> None:
        pairs = self.get("pairs")
        expected = [pair_name(b, a) for b, a in PAIRS]
        if not isinstance(pairs, dict) or sorted(pairs) != sorted(expected):
            self.fail("pairs", f"expected exactly {expected}")
            return
        for cand, ctrl in PAIRS:
            name = pair_name(cand, ctrl)
            wins_path = f"pairs.{name}.row_wins"
            wins, n = parse_fraction(self.get(wins_path), wins_path)
            self.constraint(wins <= n and n > 0, (wins_path,), f"{wins}/{n} is not a count")
            self.rows[name] = n
            headline = None
            if "headline_delta_pct" in pairs[name]:
                path = f"pairs.{name}.headline_delta_pct"
                b, a = self.number(self.start[cand]), self.number(self.start[ctrl])
                headline = pct_change(b, a)
                self.derived(path, headline, f"({cand} - {ctrl})/{ctrl}*100", (self.start[cand], self.start[ctrl]))
                headline = self.number(path)
            median_path = f"pairs.{name}.median_paired_delta_pct"
            median = self.number(median_path)
            for optional in ("aggregate_cycle_saving_ms", "acceptance_rate_delta"):
                self.number(f"pairs.{name}.{optional}", optional=self.version > 1)
            passed_path = f"pairs.{name}.passed"
            passed = self.get(passed_path)
            should = self.gates.pair_passes(wins, n, headline, median)
            fields = (passed_path, wins_path, median_path) + (
                (f"pairs.{name}.headline_delta_pct",) if headline is not None else ()
            )
            self.constraint(
                passed is should,
                fields,
                f"passed={passed!r} but the gates say {should} (wins {wins}/{n}, "
                f"median paired delta {median!r}, headline {headline!r})",
            )
            if self.claims_record:
                self.constraint(bool(passed), (passed_path,), f"a failed pair in a {self.status} record")
        counts = set(self.rows.values())
        self.constraint(
            len(counts) == 1,
            tuple(f"pairs.{name}.row_wins" for name in self.rows),
            f"pairs disagree on the row count: {self.rows}",
        )

    def check_quality(self) -> None:
        n_rows = next(iter(self.rows.values()), None)
        legs = len(LEG_ORDER)
        for key in QUALITY_COUNTS:
            path = f"quality.{key}"
            k, n = parse_fraction(self.get(path), path)
            self.constraint(k <= n, (path,), f"{k}/{n}: more passes than checks")
            if self.claims_record and self.gates.require_complete:
                self.constraint(k == n, (path,), f"{k}/{n} incomplete in a {self.status} record")
            if n_rows is None:
                continue
            wins = tuple(f"pairs.{pair_name(b, a)}.row_wins" for b, a in PAIRS)
            if key in ("teacher_exact", "cached_tokens_zero"):
                self.constraint(n == legs * n_rows, (path, *wins), f"n={n} != {legs} legs x {n_rows} rows")
            elif key == "cross_leg_exact":
                allowed = {(legs - 1) * n_rows} if self.version > 1 else {(legs - 1) * n_rows, legs * n_rows}
                self.constraint(n in allowed, (path, *wins), f"n={n} not in {sorted(allowed)} for {n_rows} rows")
            else:
                self.constraint(
                    n % legs == 0 and n <= legs * n_rows,
                    (path, *wins),
                    f"n={n} is not a per-leg count over {legs} legs of {n_rows} rows",
                )
        for key in QUALITY_FLAGS:
            value = self.get(f"quality.{key}")
            if not isinstance(value, bool):
                self.fail(f"quality.{key}", f"expected true/false, got {value!r}")
            elif self.claims_record and self.gates.require_complete and not value:
                self.fail(f"quality.{key}", f"false in a {self.status} record")

    def check_summary(self) -> None:
        if len(self.summaries) != 1:
            self.fail("submission_summary", f"expected one *{SUMMARY_SUFFIX}, got {self.summaries}")
            return
        key = self.summaries[0]
        leg = key[: -len(SUMMARY_SUFFIX)].upper()
        if leg not in ("B1", "B2"):
            self.fail(key, "the summary must be of a candidate leg (b1 or b2)")
            return
        out = f"{key}.tok_s_out"
        self.derived(out, self.number(self.start[leg]), f"starts {leg}", (self.start[leg],))
        self.derived(
            out,
            self.number("record.candidate_lower_start_tok_s"),
            "record.candidate_lower_start_tok_s",
            ("record.candidate_lower_start_tok_s",),
        )
        p10 = self.number(f"{key}.tok_s_out_p10")
        median = self.number(out)
        self.constraint(0 < p10 <= median, (f"{key}.tok_s_out_p10", out), f"p10 {p10!r} not in (0, median]")
        stdev = self.number(f"{key}.tok_s_out_stdev")
        self.constraint(stdev >= 0, (f"{key}.tok_s_out_stdev",), "negative stdev")
        mean = self.number(f"{key}.tok_s_out_mean")
        self.constraint(mean > 0, (f"{key}.tok_s_out_mean",), "mean must be > 0")
        wall = self.number(f"{key}.tok_s_wall_full_median")
        full = self.number(f"{key}.tok_s_full_after_ttft_median")
        self.constraint(
            0 < wall < full,
            (f"{key}.tok_s_wall_full_median", f"{key}.tok_s_full_after_ttft_median"),
            "wall-clock rate must be below the after-TTFT rate (TTFT > 0 on every row)",
        )
        self.constraint(self.number(f"{key}.ttft_ms_median") > 0, (f"{key}.ttft_ms_median",), "must be > 0")
        cycles = self.number(f"{key}.draft_cycles", integer=True, optional=self.version > 1)
        if cycles is None:
            return
        drafted = self.number(f"{key}.draft_tokens", integer=True)
        accepted = self.number(f"{key}.accepted_draft_tokens", integer=True)
        per_cycle: int | None
        if self.version == 1:
            per_cycle, fixed = self.gates.legacy_num_speculative_tokens, True
        else:
            spec = self.record.get("speculative") or {}
            per_cycle = spec.get("num_speculative_tokens")
            fixed = spec.get("method") in FIXED_DRAFT_METHODS
        if per_cycle is not None:
            inputs: tuple[str, ...] = (f"{key}.draft_cycles",)
            if self.version > 1:
                inputs += ("speculative.num_speculative_tokens",)
            if fixed:
                self.derived(f"{key}.draft_tokens", per_cycle * cycles, f"{per_cycle} x draft_cycles", inputs)
            else:
                self.constraint(
                    drafted <= per_cycle * cycles,
                    (f"{key}.draft_tokens", *inputs),
                    f"more than {per_cycle} draft tokens per cycle",
                )
        self.constraint(
            0 <= accepted <= drafted,
            (f"{key}.accepted_draft_tokens", f"{key}.draft_tokens"),
            "accepted must be within 0..draft_tokens",
        )
        if drafted:
            self.derived(
                f"{key}.draft_acceptance_rate",
                accepted / drafted,
                "accepted_draft_tokens / draft_tokens",
                (f"{key}.accepted_draft_tokens", f"{key}.draft_tokens"),
            )

    def check_graph(self) -> None:
        graph = self.get("graph")
        if not isinstance(graph, dict):
            self.fail("graph", "expected an object")
            return
        if graph.get("graphs_per_rank") is not None or graph.get("eager_breaks_per_rank") is not None:
            breaks = self.number("graph.eager_breaks_per_rank", integer=True)
            self.derived(
                "graph.graphs_per_rank",
                breaks + 1,
                "eager_breaks_per_rank + 1",
                ("graph.eager_breaks_per_rank",),
            )
        sizes = graph.get("capture_sizes")
        if sizes:
            values = [self.number(f"graph.capture_sizes[{i}]", integer=True) for i in range(len(sizes))]
            self.derived(
                "graph.max_capture_size",
                max(values),
                "max(capture_sizes)",
                tuple(f"graph.capture_sizes[{i}]" for i in range(len(values))),
            )
        for name in graph:
            if name.endswith("_distinct_rank_captures"):
                twin = name.replace("_captures", "_replays")
                if twin in graph:
                    self.derived(
                        f"graph.{twin}",
                        self.number(f"graph.{name}", integer=True),
                        f"graph.{name} (every captured rank replays)",
                        (f"graph.{name}",),
                    )

    def check_conventional(self) -> None:
        if self.version == 1:
            return
        factor = (self.window - 1) / self.window
        self.constraint(
            self.record["metric_conventional"] == self.record["metric"] + "_conventional",
            ("metric_conventional",),
            "must name the conventional form of metric",
        )
        conv = self.get("starts_conventional")
        if not isinstance(conv, dict) or list(conv) != list(self.record["starts"]):
            self.fail("starts_conventional", "must have the keys of starts, in order")
            return
        for leg in LEG_ORDER:
            path = f"starts_conventional.{self.keys[leg]}"
            self.derived(
                path,
                self.number(self.start[leg]) * factor,
                f"starts x {self.window - 1}/{self.window}",
                (self.start[leg],),
            )

    def check_legs(self) -> None:
        if self.version == 1:
            return
        n_rows = next(iter(self.rows.values()), None)
        for leg in LEG_ORDER:
            base = f"legs.{leg}"
            for unit, source in (
                ("tok_s_legacy", self.start[leg]),
                ("tok_s_conventional", f"starts_conventional.{self.keys[leg]}"),
            ):
                self.derived(f"{base}.{unit}.median", self.number(source), source, (source,))
                p10 = self.number(f"{base}.{unit}.p10")
                median = self.number(f"{base}.{unit}.median")
                self.constraint(p10 <= median, (f"{base}.{unit}.p10",), "p10 above the median")
                count = self.number(f"{base}.{unit}.n", integer=True)
                if n_rows is not None:
                    self.derived(f"{base}.{unit}.n", n_rows, "pair row count", ())
                self.derived(f"{base}.rows", count, f"{base}.{unit}.n", ())
            drafted = self.record["legs"][leg].get("draft_tokens")
            accepted = self.record["legs"][leg].get("accepted_draft_tokens")
            if drafted:
                self.derived(
                    f"{base}.draft_acceptance_rate",
                    self.number(f"{base}.accepted_draft_tokens", integer=True)
                    / self.number(f"{base}.draft_tokens", integer=True),
                    "accepted_draft_tokens / draft_tokens",
                    (f"{base}.accepted_draft_tokens", f"{base}.draft_tokens"),
                )
            del accepted
        # per pair: (leg metric, pair field, word in the formula, saving: control minus candidate)
        deltas = (
            ("draft_acceptance_rate", "acceptance_rate_delta", "rate", False),
            ("cycle_ms", "aggregate_cycle_saving_ms", "cycle_ms", True),
        )
        for cand, ctrl in PAIRS:
            name = pair_name(cand, ctrl)
            for metric, pair_field, word, saving in deltas:
                values = {leg: self.record["legs"][leg].get(metric) for leg in (cand, ctrl)}
                if None in values.values():
                    continue
                first, second = (ctrl, cand) if saving else (cand, ctrl)
                self.derived(
                    f"pairs.{name}.{pair_field}",
                    values[first] - values[second],
                    f"{first} {word} - {second} {word}",
                    (f"legs.{cand}.{metric}", f"legs.{ctrl}.{metric}"),
                )
        if len(self.summaries) == 1:
            key = self.summaries[0]
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
                    value = self.get(f"legs.{leg}.{source}")
                    if value is not None:
                        self.derived(
                            f"{key}.{field_name}",
                            value,
                            f"legs.{leg}.{source}",
                            (f"legs.{leg}.{source}",),
                        )

    def check_sha256(self) -> None:
        hashes = self.get("sha256")
        if not isinstance(hashes, dict) or not hashes:
            self.fail("sha256", "expected a non-empty name -> sha256 map")
            return
        for name, value in hashes.items():
            if not isinstance(value, str) or not _SHA.match(value):
                self.fail(f"sha256.{name}", f"not a lowercase hex sha256: {value!r}")
        if self.version > 1:
            artifacts = self.record["artifacts"]
            if not isinstance(artifacts, dict) or sorted(artifacts) != sorted(hashes):
                self.fail(("artifacts", "sha256"), "artifacts and sha256 must name the same files")

    def check_recipe(self) -> None:
        """``crossover --recipe`` records: the recipe's path and digests, and the digests are those
        of the run's copies when the record lists them (records without the section: nothing)."""
        recipe = self.record.get("recipe")
        if recipe is None:
            return
        if not isinstance(recipe, dict):
            self.fail("recipe", "expected an object or null")
            return
        hashes = self.record.get("sha256") if isinstance(self.record.get("sha256"), dict) else {}
        for name, digest, artifact in (
            ("path", "sha256", RECIPE_ARTIFACT),
            ("env_path", "env_sha256", RECIPE_ENV_ARTIFACT),
        ):
            path, value = recipe.get(name), recipe.get(digest)
            self.constraint(isinstance(path, str) and path != "", (f"recipe.{name}",), f"not a path: {path!r}")
            if not isinstance(value, str) or not _SHA.match(value):
                self.fail(f"recipe.{digest}", f"not a lowercase hex sha256: {value!r}")
            elif artifact in hashes:
                self.constraint(
                    hashes[artifact] == value,
                    (f"recipe.{digest}", f"sha256.{artifact}"),
                    f"the recipe's digest differs from the run's copy ({hashes[artifact]})",
                )

    def check_disposition(self) -> None:
        if self.version == 1:
            return
        audits = self.get("audits")
        verdict = audits.get("committed_analyzer_disposition") if isinstance(audits, dict) else None
        self.constraint(
            verdict in ("record_candidate", "not_a_record"),
            ("audits.committed_analyzer_disposition",),
            f"unknown disposition {verdict!r}",
        )
        self.constraint(
            self.claims_record == (verdict == "record_candidate"),
            ("status", "audits.committed_analyzer_disposition"),
            f"status {self.status!r} disagrees with the analyzer's disposition {verdict!r}",
        )

    def check_identity(self) -> None:
        try:
            day = Date.fromisoformat(str(self.record["date"]))
        except ValueError:
            self.fail("date", f"not an ISO date: {self.record['date']!r}")
            return
        match = _RUN_ROOT.search(str(self.record["run_root"]))
        if match is not None:
            source = self.record["source"]
            for group, name in ((1, "main_tooling_commit"), (2, "vllm_commit")):
                value = str(source.get(name) or "")
                self.constraint(
                    value.startswith(match.group(group)),
                    ("run_root", f"source.{name}"),
                    f"run root names {match.group(group)} but source.{name} is {value!r}",
                )
            self.constraint(
                match.group(3) == day.strftime("%Y%m%d"),
                ("run_root", "date"),
                f"run root is stamped {match.group(3)}, date is {self.record['date']}",
            )
        lm = self.record["localmaxxing"]
        if not isinstance(lm, dict):
            self.fail("localmaxxing", "expected an object")
            return
        cand = self.record["record"].get("candidate_lower_start_tok_s")
        for name in ("queue_path", "response_path"):
            path = lm.get(name)
            if path is None or not is_number(cand):
                continue
            self.constraint(
                f"{cand:.3f}tok" in str(path),
                (f"localmaxxing.{name}", "record.candidate_lower_start_tok_s"),
                f"path does not carry the value {cand:.3f}tok",
            )
            self.constraint(
                day.strftime("%Y%m%d") in str(path),
                (f"localmaxxing.{name}", "date"),
                f"path does not carry the date {day:%Y%m%d}",
            )
        if lm.get("http_status") is not None:
            status_code = self.number("localmaxxing.http_status", integer=True)
            if lm.get("submission_status") == "APPROVED":
                self.constraint(
                    200 <= status_code < 300,
                    ("localmaxxing.http_status",),
                    f"APPROVED submission with HTTP status {status_code}",
                )
        submitted = lm.get("submitted_at_utc")
        if submitted is not None:
            self.constraint(
                str(submitted)[:10] >= day.isoformat(),
                ("localmaxxing.submitted_at_utc", "date"),
                "submitted before the run date",
            )


def internal_checks(record: dict[str, Any], gates: Gates, report: Report) -> None:
    InternalChecks(record, gates, report).run_all()


def prior_checks(record: dict[str, Any], prior: dict[str, Any], report: Report) -> None:
    """The prior value and id must be those of the prior record (a chain of records)."""
    checker = Checker(record, report)
    try:
        value = checker.number("record.prior_approved_tok_s")
    except Missing:
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
    """A record file, its shape checked (:mod:`scripts.measure.record_shape`): one line naming
    the first field of the wrong type, missing or unknown."""
    data = read_json(path, "record")
    check_record(data, str(path))
    return data


def record_gates(record: dict[str, Any], default: Gates) -> Gates:
    """The thresholds a record was judged with (its own when it carries them, else the defaults)."""
    stored = record.get("gates")
    return Gates.from_json(stored, "record", "gates") if stored is not None else default


def verify(
    record: dict[str, Any],
    *,
    gates: Gates | None = None,
    artifacts_root: Path | None = None,
    prior: dict[str, Any] | None = None,
) -> Report:
    report = Report(mode="internal", numeric=list(numeric_leaves(record)))
    try:
        check_record(record, "record")
        gates = record_gates(record, gates or load_gates())
    except ShapeError as exc:
        report.failures.append(Failure((exc.path or "record",), exc.problem))
        return report
    internal_checks(record, gates, report)
    if prior is not None:
        prior_checks(record, prior, report)
    if artifacts_root is not None:
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
