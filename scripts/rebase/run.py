"""Start, continue and abort a rebase; write the rebased series when the whole of it is through."""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from scripts.errors import ToolError
from scripts.export import export, series_commits
from scripts.footprint import footprint
from scripts.git import git, run_git, status_porcelain
from scripts.layout import Layout
from scripts.log import detail, step
from scripts.pins import Pins, load_pins, parse_pins
from scripts.rebase.checks import run_checks
from scripts.rebase.evidence import files_of
from scripts.rebase.pins_update import OPTIONAL_XPU_KEYS, cpu_runtime_note, pins_update, rewrite_pins
from scripts.rebase.replay import BRANCH, Replay
from scripts.rebase.report import build_report, emit, error_report, summary
from scripts.rebase.state import (
    STAGE_REPLAY,
    STATE_SCHEMA,
    Base,
    Json,
    PatchEntry,
    RebaseState,
    Restore,
    load_state,
    save_state,
)
from scripts.rebase.target import full_commit, resolve_target
from scripts.series import load_series
from scripts.source import mirror_path
from scripts.worktree import (
    Inputs,
    State,
    apply,
    build_tree,
    lay_overlay,
    load_inputs,
    pristine_repo,
    read_state,
    state_path,
    write_state,
)

ONTO_REF = "refs/vxl/rebase/onto"
EXIT_STOPPED = 2  # conflict or failed check: the report says what to do next


@dataclass
class Session:
    """One invocation: the state, the tree it works in, and where its report goes."""

    layout: Layout
    state: RebaseState
    tree: Path
    report_path: Path | None

    def save(self) -> None:
        if not self.state.dry_run:
            save_state(self.layout.rebase_state, self.state)

    def footprint(self) -> Json:
        """The footprint (:mod:`scripts.footprint`) of the series in ``patches/`` as the report is
        written: the rebased one after a finished rebase, the one being rebased otherwise."""
        try:
            return footprint(load_series(self.layout.patches)).to_json()
        except ToolError as exc:
            return {"error": str(exc)}

    def replay(self) -> Replay:
        return Replay(self.state, self.tree, self.save)

    def finish(self, outcome: str, message: str, next_step: str | None, exit_code: int = 0) -> Json:
        dry = self.state.dry_run
        state_file = None if dry or outcome in ("success", "aborted") else self.layout.rebase_state
        report = build_report(self.state, outcome, message, next_step, state_file, None if dry else self.tree)
        report["footprint"] = self.footprint()
        emit(report, self.report_path, dry)
        summary(report)
        if exit_code:
            raise ToolError(message, exit_code=exit_code)
        return report


def _run_to_end(session: Session, start: int) -> Json:
    st, tree = session.state, session.tree
    if st.stage == STAGE_REPLAY:
        with step(f"replay {len(st.patches) - start} patch(es) onto vLLM {st.onto.version} (3-way merges)"):
            stopped = session.replay().run(start)
        if stopped is not None:
            files = ", ".join(f["file"] for f in (stopped.conflict or {}).get("files", []))
            return session.finish(
                "conflict",
                f"rebase stopped at {stopped.name}: conflict in {files}",
                f"resolve in {tree} (branch {BRANCH}), git add (or commit), then "
                "`nox -s rebase -- --continue`; or `nox -s rebase -- --abort`",
                EXIT_STOPPED,
            )
    with step("check the rebased tree: overlay twins, compile, Effect-Check commands"):
        failures = run_checks(st, tree, session.layout)
    conflicts = [p.name for p in st.patches if p.status == "conflict"]
    if st.dry_run:
        problems = [f"{name}: conflict" for name in conflicts] + failures
        if problems:
            return session.finish(
                "conflict" if conflicts else "checks-failed",
                f"dry run: {len(problems)} problem(s), first: {problems[0]}",
                None,
                EXIT_STOPPED,
            )
        return session.finish("success", "dry run: the whole series replays cleanly and every check passes", None)
    if failures:
        session.save()
        return session.finish(
            "checks-failed",
            f"rebase replayed but {len(failures)} check(s) failed; first: {failures[0]}",
            f"fix in {tree} (commit on branch {BRANCH}) or overlay/ and overlay.toml, then "
            "`nox -s rebase -- --continue`; or `--abort`",
            EXIT_STOPPED,
        )
    with step("write the rebased series: patches/ (export) and pins.toml"):
        _finalize(session)
    retired = [p.name for p in st.patches if p.status == "already-upstream"]
    return session.finish(
        "success",
        f"series moved to vLLM {st.onto.version}"
        + (f"; retired (already upstream): {', '.join(retired)}" if retired else ""),
        None,
    )


def _finalize(session: Session) -> None:
    st, tree, layout = session.state, session.tree, session.layout
    new_pins = _pins_from(st)
    upd = st.pins_update or {}
    tables = {"vllm": upd["vllm"], "xpu_runtime": upd["xpu_runtime"]}
    cpu_update = (st.cpu_runtime or {}).get("update")
    if cpu_update:
        tables["cpu_runtime"] = cpu_update
    new_text = rewrite_pins(layout.pins.read_text(encoding="utf-8"), tables, OPTIONAL_XPU_KEYS)
    parse_pins(new_text, layout.pins)  # validate before anything is written
    inputs = load_inputs(layout)
    patch_commits = git(tree, "rev-list", "--reverse", f"{st.onto.pristine}..HEAD").split()
    # export keeps each patch's number by pairing patches/series with State.patch_commits: pair every old
    # patch with its replayed commit (a retired one with its old commit, which export never meets)
    aligned = [(p.commit_new or [p.commit_old])[0] for p in st.patches]
    lay_overlay(tree, inputs)
    git(tree, "checkout", "-q", "-B", "main")
    run_git(tree, "branch", "-q", "-D", BRANCH, check=False)
    run_git(tree, "update-ref", "-d", ONTO_REF, check=False)
    write_state(
        tree,
        State(
            input_hash="rebase-pending",
            source=st.source,
            pristine=st.onto.pristine,
            patch_commits=aligned,
            head=git(tree, "rev-parse", "HEAD"),
        ),
    )
    export(layout)
    layout.pins.write_text(new_text, encoding="utf-8")
    final = read_state(tree)
    if final is None:
        raise ToolError(f"{tree}: work-tree state vanished during export")
    final.patch_commits = patch_commits  # now in step with the exported series
    final.input_hash = load_inputs(layout).input_hash
    write_state(tree, final)
    layout.rebase_state.unlink(missing_ok=True)
    detail(
        f"pins.toml: vLLM {new_pins.vllm.version} ({new_pins.vllm.commit}), torch {upd['xpu_runtime']['torch']}, "
        f"vllm_xpu_kernels {upd['xpu_runtime']['vllm_xpu_kernels']}"
    )


def _pins_from(st: RebaseState) -> Pins:
    pins = load_pins(Path(st.pins_path))
    return dataclasses.replace(
        pins,
        vllm=dataclasses.replace(
            pins.vllm,
            version=st.onto.version,
            sdist_sha256=st.onto.sdist_sha256 or pins.vllm.sdist_sha256,
            commit=st.onto.commit,
        ),
    )


def _replay_tree(layout: Layout, inputs: Inputs, offline: bool, scratch: Path | None) -> Path:
    """The work tree to replay in: build/worktree (made current by apply) or, for a dry run, a scratch one."""
    if scratch is not None:
        tree = Layout(layout.root, build_dir=scratch / "build").worktree
        tree.parent.mkdir(parents=True, exist_ok=True)
        state = read_state(layout.worktree) if layout.worktree.exists() else None
        build_tree(inputs, tree, source=state.source if state else "sdist", offline=offline)
        return tree
    previous = read_state(layout.worktree) if layout.worktree.exists() else None
    apply(layout, source=previous.source if previous else "sdist", offline=offline)
    tree = layout.worktree
    problems = status_porcelain(tree)
    if problems:
        raise ToolError(f"{tree} has uncommitted changes (first: {problems[0].strip()}); export or discard them")
    return tree


def _patch_commits(tree: Path, inputs: Inputs, pristine: str) -> list[str]:
    overlay_paths = {o.relpath for o in inputs.overlay}
    commits = series_commits(tree, pristine, overlay_paths).patches
    if len(commits) != len(inputs.patches):
        raise ToolError(
            f"{tree} has {len(commits)} patch commit(s) but patches/series lists {len(inputs.patches)}; "
            "run nox -s apply (or export) first"
        )
    for commit, patch in zip(commits, inputs.patches, strict=True):
        subject = git(tree, "log", "-1", "--format=%s", commit)
        if subject != patch.subject:
            raise ToolError(f"{tree}: commit {commit[:12]} ({subject!r}) does not match {patch.name}; run nox -s apply")
    return commits


def _start(
    layout: Layout,
    onto_version: str | None,
    onto_commit: str | None,
    source: str | None,
    offline: bool,
    report_path: Path | None,
    scratch: Path | None,
    keep_both_inserts: bool,
) -> Json:
    dry_run = scratch is not None
    if layout.rebase_state.exists() and not dry_run:
        raise ToolError(f"a rebase is in progress ({layout.rebase_state}); use --continue or --abort")
    source = source or ("git" if onto_commit else "sdist")
    inputs = load_inputs(layout)
    pins = inputs.pins
    if source == "sdist" and onto_version == pins.vllm.version:
        raise ToolError(f"the series is already on vLLM {onto_version}")
    where = f"--onto {onto_version}" if onto_version else f"--onto-commit {onto_commit}"
    with step(f"acquire the new upstream ({where}, {source})"):
        new_pins, full = resolve_target(pins, onto_version, onto_commit, source, offline)
        if source == "git" and not new_pins.vllm.sdist_sha256.strip("0") and not dry_run:
            raise ToolError(
                f"vLLM {new_pins.vllm.version} has no sdist on the index, so pins.toml cannot pin it; "
                "rebase onto such a commit with --dry-run only"
            )
        cached = pristine_repo(new_pins, source, offline)
    tree = _replay_tree(layout, inputs, offline, scratch)
    wt_state = read_state(tree)
    if wt_state is None:
        raise ToolError(f"{tree}: not a work tree made by this tool")
    commits = _patch_commits(tree, inputs, wt_state.pristine)
    restore = _restore_point(tree)
    with step(f"fetch pristine vLLM {new_pins.vllm.version} into {tree} as a second base"):
        git(tree, "fetch", "-q", "--no-tags", str(cached), f"+pristine:{ONTO_REF}")
        new_base = git(tree, "rev-parse", "--verify", "--quiet", f"{ONTO_REF}^{{commit}}")
    is_git = source == "git"
    onto_sha = new_pins.vllm.sdist_sha256
    state = RebaseState(
        schema=STATE_SCHEMA,
        stage=STAGE_REPLAY,
        dry_run=dry_run,
        keep_both_inserts=keep_both_inserts,
        source=source,
        pins_path=str(layout.pins),
        git_mirror=str(mirror_path(pins.vllm.git_url)) if is_git else None,
        from_=Base(
            version=pins.vllm.version,
            commit=pins.vllm.commit,
            sdist_sha256=pins.vllm.sdist_sha256,
            pristine=wt_state.pristine,
            git_commit=full_commit(pins.vllm.git_url, pins.vllm.commit) if is_git else None,
        ),
        onto=Base(
            version=new_pins.vllm.version,
            commit=new_pins.vllm.commit,
            sdist_sha256=onto_sha if onto_sha.strip("0") else None,
            pristine=new_base,
            git_commit=full,
        ),
        restore=restore,
        patches=_pending(tree, commits, inputs),
        current=0,
        pins_update=pins_update(tree, new_base, new_pins),
        cpu_runtime=cpu_runtime_note(pins, new_pins.vllm.version, offline, layout.cpu_runtime),
    )
    git(tree, "checkout", "-q", "-B", BRANCH, new_base)
    new_version = cached / "vllm_version.py"
    if new_version.exists():
        shutil.copy2(new_version, tree / "vllm" / "_version.py")
    session = Session(layout, state, tree, report_path)
    session.save()
    return _run_to_end(session, 0)


def _restore_point(tree: Path) -> Restore:
    """What --abort needs to put ``tree`` back as it is now."""
    version_py = tree / "vllm" / "_version.py"
    state_file = state_path(tree)
    return Restore(
        head=git(tree, "rev-parse", "HEAD"),
        branch=_current_branch(tree),
        version_py=version_py.read_text(encoding="utf-8") if version_py.exists() else None,
        worktree_state=state_file.read_text(encoding="utf-8") if state_file.exists() else None,
    )


def _pending(tree: Path, commits: list[str], inputs: Inputs) -> list[PatchEntry]:
    """One not yet replayed entry per patch, with the fields its header declares."""
    return [
        PatchEntry(
            name=patch.name,
            subject=patch.subject,
            sha256=patch.sha256,
            status="pending",
            commit_old=commit,
            files=files_of(tree, commit),
            effect_check=patch.fields.get("Effect-Check"),
            drop_when=patch.fields.get("Drop-When"),
            upstream_status=patch.fields.get("Upstream-Status"),
        )
        for commit, patch in zip(commits, inputs.patches, strict=True)
    ]


def _current_branch(tree: Path) -> str | None:
    proc = run_git(tree, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return proc.stdout.strip() or None


def _continue(layout: Layout, report_path: Path) -> Json:
    session = Session(layout, load_state(layout.rebase_state), layout.worktree, report_path)
    st, tree = session.state, session.tree
    if _current_branch(tree) != BRANCH:
        raise ToolError(f"{tree} is not on branch {BRANCH} (the rebase works there); check it out, then --continue")
    if st.stage == STAGE_REPLAY and st.entry.status == "pending":
        entry = st.entry  # the previous run was interrupted while picking this patch
        with step(f"redo the interrupted replay of {entry.name}"):
            git(tree, "reset", "-q", "--hard", entry.head_before or "HEAD")
            git(tree, "clean", "-fdq")
        return _run_to_end(session, st.current)
    if st.stage == STAGE_REPLAY:
        with step(f"continue after {st.entry.name}"):
            session.replay().resume_conflict()
            detail(f"{st.entry.name}: {st.entry.status}")
            session.save()
        return _run_to_end(session, st.current + 1)
    dirty = status_porcelain(tree)
    if dirty:
        raise ToolError(f"{tree} has uncommitted changes (first: {dirty[0].strip()}); commit them on {BRANCH} first")
    with step("take the fixes made since the checks"):
        detail(repair_rewritten_history(st, tree))
        session.save()
    return _run_to_end(session, len(st.patches))


def repair_rewritten_history(st: RebaseState, tree: Path) -> str:
    """Re-pair the replayed patches with their commits after the user rewrote the branch (``git rebase -i``:
    reword a header, squash a fixup into its patch). Commits are paired in order, so the rewrite must keep
    each patch's commit count and order; commits added on top stay extra commits."""
    replayed = [p for p in st.patches if p.commit_new]
    recorded = [c for p in replayed for c in p.commit_new or []]
    if all(run_git(tree, "merge-base", "--is-ancestor", c, "HEAD", check=False).returncode == 0 for c in recorded):
        return "history kept: each patch keeps its replayed commit(s)"
    commits = git(tree, "rev-list", "--reverse", f"{st.onto.pristine}..HEAD").split()
    if len(commits) < len(recorded):
        raise ToolError(
            f"{tree}: branch {BRANCH} was rewritten and now has {len(commits)} commit(s) for {len(recorded)} "
            "replayed patch commit(s); keep one commit per patch (reword or squash fixups into their patch)"
        )
    changed = []
    position = 0
    for entry in replayed:
        count = len(entry.commit_new or [])
        new = commits[position : position + count]
        position += count
        if new != entry.commit_new:
            changed.append(entry.name)
            entry.commit_new = new
    names = ", ".join(changed)
    return f"history rewritten: re-paired {len(changed)} patch(es) with their new commit(s) in order ({names})"


def _abort(layout: Layout, report_path: Path) -> Json:
    session = Session(layout, load_state(layout.rebase_state), layout.worktree, report_path)
    tree, restore = session.tree, session.state.restore
    with step(f"abort: restore {tree} to {restore.head[:12]}"):
        run_git(tree, "cherry-pick", "--quit", check=False)
        git(tree, "reset", "-q", "--hard")
        if restore.branch:
            git(tree, "checkout", "-q", "-f", restore.branch)
            git(tree, "reset", "-q", "--hard", restore.head)
        else:
            git(tree, "checkout", "-q", "-f", "--detach", restore.head)
        git(tree, "clean", "-fdq")
        if restore.branch != BRANCH:
            run_git(tree, "branch", "-q", "-D", BRANCH, check=False)
        run_git(tree, "update-ref", "-d", ONTO_REF, check=False)
        version_py = tree / "vllm" / "_version.py"
        if restore.version_py is None:
            version_py.unlink(missing_ok=True)
        else:
            version_py.write_text(restore.version_py, encoding="utf-8")
        if restore.worktree_state is not None:
            state_path(tree).write_text(restore.worktree_state, encoding="utf-8")
        layout.rebase_state.unlink()
    return session.finish(
        "aborted", f"rebase onto vLLM {session.state.onto.version} aborted; {tree} is back at {restore.head[:12]}", None
    )


def _check_arguments(onto_version: str | None, onto_commit: str | None, dry_run: bool, cont: bool, abort: bool) -> None:
    if sum(bool(x) for x in (onto_version or onto_commit, cont, abort)) != 1:
        raise ToolError("choose exactly one of --onto VERSION / --onto-commit SHA, --continue, --abort")
    if (cont or abort) and dry_run:
        raise ToolError("--dry-run applies to starting a rebase only")
    if onto_commit and not re.fullmatch(r"[0-9a-fA-F]{7,40}", onto_commit):
        raise ToolError(f"--onto-commit: not a hex commit id: {onto_commit!r}")
    if onto_version and not re.fullmatch(r"\d+\.\d+\.\d+(?:(?:rc|\.post|\.dev)\d+)?", onto_version):
        raise ToolError(f"--onto: malformed version {onto_version!r}")


def rebase(
    onto_version: str | None = None,
    onto_commit: str | None = None,
    dry_run: bool = False,
    cont: bool = False,
    abort: bool = False,
    source: str | None = None,
    offline: bool = False,
    report: Path | None = None,
    layout: Layout | None = None,
    keep_both_inserts: bool = False,
) -> Json:
    """Entry point: start (``onto_version``/``onto_commit``), ``cont``inue or ``abort`` a rebase.

    ``keep_both_inserts``: resolve a conflict whose every block is "both sides only inserted lines
    here" by keeping both (upstream's lines first); it is reported as ``merged`` with the details.
    """
    layout = layout or Layout()
    _check_arguments(onto_version, onto_commit, dry_run, cont, abort)
    report_path = report.resolve() if report else None
    if not dry_run:
        report_path = report_path or layout.rebase_report
    try:
        if cont:
            return _continue(layout, report_path or layout.rebase_report)
        if abort:
            return _abort(layout, report_path or layout.rebase_report)
        commit = onto_commit.lower() if onto_commit else None
        if dry_run:
            with tempfile.TemporaryDirectory(prefix="vxl-rebase-dry-") as tmp:
                return _start(layout, onto_version, commit, source, offline, report_path, Path(tmp), keep_both_inserts)
        return _start(layout, onto_version, commit, source, offline, report_path, None, keep_both_inserts)
    except ToolError as exc:
        if exc.exit_code != EXIT_STOPPED:  # a stop has already written its full report
            in_progress = layout.rebase_state if layout.rebase_state.exists() and not dry_run else None
            emit(error_report(str(exc), dry_run, onto_version, onto_commit, in_progress), report_path, dry_run)
        raise


__all__ = ["rebase", "EXIT_STOPPED", "ONTO_REF"]
