"""The rebase report (schema ``vxl-rebase-report/1``): JSON file, or stdout for a dry run, and a summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

from scripts.log import detail, info
from scripts.rebase.state import Json, RebaseState, write_json

REPORT_SCHEMA = "vxl-rebase-report/1"
STATUSES = ("clean", "merged", "resolved", "conflict", "already-upstream", "pending")


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def build_report(
    state: RebaseState,
    outcome: str,
    message: str,
    next_step: str | None,
    state_file: Path | None,
    work_tree: Path | None,
) -> Json:
    patches = [p.to_json() for p in state.patches]
    return {
        "schema": REPORT_SCHEMA,
        "outcome": outcome,
        "message": message,
        "dry_run": state.dry_run,
        "from": state.from_.to_json(),
        "onto": state.onto.to_json(),
        "source": state.source,
        "patches": patches,
        "overlay": state.overlay or [],
        "pins_update": state.pins_update,
        "cpu_runtime": state.cpu_runtime,
        "retire_proposals": [p.name for p in state.patches if p.status == "already-upstream"],
        "counts": {status: sum(1 for p in state.patches if p.status == status) for status in STATUSES},
        "effect_check_failures": [p.name for p in state.patches if (p.effect or {}).get("ok") is False],
        "state_file": None if state_file is None else str(state_file),
        "work_tree": None if work_tree is None else str(work_tree),
        "next": next_step,
        "generated_at": now_utc(),
    }


def error_report(
    message: str, dry_run: bool, onto_version: str | None, onto_commit: str | None, state_file: Path | None
) -> Json:
    return {
        "schema": REPORT_SCHEMA,
        "outcome": "error",
        "message": message,
        "dry_run": dry_run,
        "onto": {"version": onto_version, "commit": onto_commit},
        "state_file": None if state_file is None else str(state_file),
        "generated_at": now_utc(),
    }


def emit(report: Json, path: Path | None, dry_run: bool) -> None:
    """Write the report to ``path``; a dry run without a path prints it on stdout."""
    if path is not None:
        write_json(path, report)
        detail(f"report: {path}")
    elif dry_run:
        print(json.dumps(report, indent=2), flush=True)


def _patch_line(p: Json) -> str:
    status = p.get("status", "pending")
    extra = ""
    if status in ("merged", "resolved"):
        moved = ", ".join(f"{m['file']}#{m['hunk']} {m['offset']:+d}" for m in p.get("moved_hunks", []))
        extra = (
            (f"moved: {moved}" if moved else "")
            + (" context changed" if p.get("context_changed") else "")
            + (" hunks regrouped" if p.get("regrouped") else "")
        )
    elif status == "conflict":
        extra = "; ".join(conflict_line(f) for f in p["conflict"]["files"])
    elif status == "already-upstream":
        extra = "propose retiring: " + p["already_upstream"]["evidence"]
    effect = p.get("effect") or {}
    if effect.get("ok") is False:
        extra += f" | EFFECT-CHECK FAILED (exit {effect.get('rc')})"
    if (p.get("compile") or {}).get("errors"):
        extra += f" | COMPILE ERROR {p['compile']['errors'][0]}"
    if p.get("dry_run_skipped"):
        extra += " | skipped for the rest of the dry run"
    if p.get("auto_resolved"):
        extra += " | insert/insert conflict: kept both (--keep-both-inserts)"
    if p.get("dry_run_resolution"):
        extra += " | dry run kept both insertions to go on"
    if p.get("shares_files_with_skipped"):
        extra += " | replayed without " + ", ".join(n[:4] for n in p["shares_files_with_skipped"]) + " (same files)"
    return f"{p['name']:<64} {status:<17} {extra.strip()}"


def summary(report: Json) -> None:
    onto = report["onto"]
    info(
        f"rebase {report['from']['version']} -> {onto['version']} ({onto['commit']}): {report['outcome']}"
        f"{' (dry run)' if report['dry_run'] else ''}"
    )
    for p in report["patches"]:
        detail(_patch_line(p))
    edits = report.get("footprint") or {}
    if "edited_upstream_lines" in edits:
        detail(
            f"footprint: {edits['patches']} patch(es), {len(edits['upstream_files'])} upstream file(s), "
            f"{edits['edited_upstream_lines']} edited upstream line(s)"
        )
    for o in report.get("overlay", []):
        if o["status"] != "ok" or o.get("problem"):
            detail(f"overlay/{o['file']}: {o['status']}{': ' + o['problem'] if o.get('problem') else ''}")
    if report.get("next"):
        info(report["next"])


def conflict_line(f: Json) -> str:
    up = f["upstream"]
    if f["markers"]:
        both = sum(1 for m in f["markers"] if m.get("kind") == "both-inserted")
        return (
            f"{f['file']} markers at lines "
            + ",".join(f"{m['start']}-{m['end']}" for m in f["markers"])
            + f" (upstream {up['state']}"
            + (f"; {both} block(s) where both sides only inserted lines: keep both" if both else "")
            + ")"
        )
    kind = "delete" if up["state"] == "removed" else up["state"]
    text = f"{f['file']}: {up['state']} upstream, no markers (modify/{kind})"
    if up.get("possibly_moved_to"):
        best = up["possibly_moved_to"][0]
        text += f"; its context is now in {best['file']}? ({best['matching_lines']}/{best['probes']} lines)"
    return text
