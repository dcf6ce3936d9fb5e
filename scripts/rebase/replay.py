"""The replay: each patch cherry-picked onto the new base (merge-ort) and classified; the state is
saved before and after every pick so ``--continue`` resumes exactly where a run stopped or died."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from scripts.errors import ToolError
from scripts.git import blob_at, git, run_git, status_porcelain
from scripts.log import detail
from scripts.rebase.evidence import diff_hunks, files_of, reverse_applies, upstream_change
from scripts.rebase.hunks import (
    COMPARISON_KEYS,
    compare_hunks,
    keep_both,
    keep_both_where_inserted,
    markers,
    only_insertions,
)
from scripts.rebase.state import STAGE_CHECKS, STAGE_REPLAY, Json, PatchEntry, RebaseState

BRANCH = "vxl-rebase"


def file_markers(path: Path) -> list[Json]:
    return markers(path.read_text(encoding="utf-8", errors="replace")) if path.is_file() else []


class Replay:
    """Replays ``state.patches`` in ``tree``; ``save`` persists the state (a no-op in a dry run)."""

    def __init__(self, state: RebaseState, tree: Path, save: Callable[[], None]) -> None:
        self.state = state
        self.tree = tree
        self.save = save
        self.mirror = Path(state.git_mirror) if state.git_mirror else None

    def run(self, start: int) -> PatchEntry | None:
        """Cherry-pick patches from index ``start``; returns the stopping entry or None when all are through."""
        st = self.state
        for index in range(start, len(st.patches)):
            entry = st.patches[index]
            st.current = index
            entry.head_before = git(self.tree, "rev-parse", "HEAD")
            self.save()  # an interrupted pick resumes from here (see run.resume)
            self._pick(entry)
            if entry.status == "conflict" and st.keep_both_inserts:
                if self._union_inserts(entry):
                    self._auto_resolved(entry)
                elif not st.dry_run:
                    self._keep_both_where_inserted(entry)
            detail(f"[{index + 1}/{len(st.patches)}] {entry.name}: {entry.status}")
            if entry.status == "conflict":
                if not st.dry_run:
                    st.stage = STAGE_REPLAY
                    self.save()
                    return entry
                self._go_on_after_conflict(entry)
            self.save()
        st.current = len(st.patches)
        st.stage = STAGE_CHECKS
        self.save()
        return None

    def _go_on_after_conflict(self, entry: PatchEntry) -> None:
        """A dry run keeps going, to classify the rest: with the patch when both sides only inserted
        lines (keep both), else without it."""
        if self._union_inserts(entry):
            entry.dry_run_resolution = "kept both insertions (upstream's first) to go on"
            entry.commit_new = [self._commit_like(entry.commit_old)]
        else:
            run_git(self.tree, "reset", "-q", "--hard", "HEAD")
            run_git(self.tree, "clean", "-fdq")
            entry.dry_run_skipped = True
            self.state.skipped = [*(self.state.skipped or []), entry.name]

    def _auto_resolved(self, entry: PatchEntry) -> None:
        """--keep-both-inserts: an insert/insert conflict kept both sides; record it as a merge."""
        orig = entry.commit_old
        new = self._commit_like(orig)
        entry.commit_new = [new]
        entry.status = "merged"
        entry.auto_resolved = (
            "insert/insert conflict resolved by keeping both insertions, upstream's first "
            "(--keep-both-inserts); the conflict details are kept under 'conflict'"
        )
        entry.set_comparison(
            compare_hunks(diff_hunks(self.tree, f"{orig}^", orig), diff_hunks(self.tree, f"{new}^", new))
        )

    def _keep_both_where_inserted(self, entry: PatchEntry) -> None:
        """--keep-both-inserts on a conflict that also has other blocks: resolve the insert/insert blocks,
        leave the rest to the user (the report's markers are those left)."""
        resolved = 0
        for f in (entry.conflict or {}).get("files", []):
            path = self.tree / f["file"]
            if not f.get("markers"):
                continue
            text, count = keep_both_where_inserted(path.read_text(encoding="utf-8"))
            if count:
                path.write_text(text, encoding="utf-8")
                f["markers"] = markers(text)
                resolved += count
        if resolved:
            entry.auto_resolved = (
                f"{resolved} insert/insert block(s) resolved by keeping both insertions, upstream's first "
                "(--keep-both-inserts); the other blocks are left to resolve"
            )

    def _union_inserts(self, entry: PatchEntry) -> bool:
        """Resolve a conflict whose every block is 'both sides only inserted lines' by keeping both."""
        files = (entry.conflict or {}).get("files", [])
        if not only_insertions(files):
            return False
        for f in files:
            path = self.tree / f["file"]
            path.write_text(keep_both(path.read_text(encoding="utf-8")), encoding="utf-8")
            git(self.tree, "add", "--", f["file"])
        return True

    def _pick(self, entry: PatchEntry) -> None:
        tree, st = self.tree, self.state
        orig = entry.commit_old
        if st.skipped:
            entry.after_skipping = list(st.skipped)
            mine = set(entry.files)
            shared = [p.name for p in st.patches if p.name in st.skipped and mine & set(p.files)]
            if shared:  # its outcome may be an artefact of replaying without those
                entry.shares_files_with_skipped = shared
        proc = run_git(
            tree,
            "-c",
            "merge.conflictStyle=diff3",
            "-c",
            "rerere.enabled=false",
            "cherry-pick",
            "--no-commit",
            orig,
            check=False,
        )
        unmerged = sorted(set(git(tree, "diff", "--name-only", "--diff-filter=U").splitlines()))
        if proc.returncode != 0 and not unmerged:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            raise ToolError(f"{entry.name}: git cherry-pick failed: {lines[-1] if lines else proc.returncode}")
        run_git(tree, "cherry-pick", "--quit", check=False)
        old_hunks = diff_hunks(tree, f"{orig}^", orig)
        if unmerged:
            entry.status = "conflict"
            entry.conflict = {
                "files": [self._conflict_file(path, old_hunks.get(path, [])) for path in unmerged],
                "patch_reverse_applies_to_new_base": reverse_applies(tree, orig, "HEAD"),
            }
            if entry.conflict["patch_reverse_applies_to_new_base"]:
                entry.note = "the patch reverse-applies to the new upstream: it is probably already upstream"
            entry.head_at_stop = git(tree, "rev-parse", "HEAD")
            return
        if run_git(tree, "diff", "--cached", "--quiet", check=False).returncode == 0:
            self._already_upstream(entry, evidence="the 3-way replay onto the new base changes nothing")
            return
        new = self._commit_like(orig)
        entry.commit_new = [new]
        cmp = compare_hunks(old_hunks, diff_hunks(tree, f"{new}^", new))
        entry.set_comparison(cmp)
        entry.status = "merged" if any(cmp[key] for key in COMPARISON_KEYS) else "clean"
        if cmp["edits_differ"]:
            entry.note = (
                "the replayed edits differ from the original in "
                + ", ".join(cmp["edits_differ"])
                + ": upstream may have absorbed part of the patch"
            )

    def _commit_like(self, orig: str) -> str:
        date = git(self.tree, "log", "-1", "--format=%aI", orig)
        git(
            self.tree,
            "commit",
            "-q",
            "--no-verify",
            "--allow-empty-message",
            "-C",
            orig,
            env={"GIT_COMMITTER_DATE": date},
        )
        return git(self.tree, "rev-parse", "HEAD")

    def _already_upstream(self, entry: PatchEntry, evidence: str) -> None:
        tree = self.tree
        run_git(tree, "reset", "-q", "--hard", "HEAD")
        orig = entry.commit_old
        files = []
        for path in files_of(tree, orig):
            post = blob_at(tree, orig, path)
            now = blob_at(tree, "HEAD", path)
            files.append({"file": path, "patch_result_blob": post, "new_tree_blob": now, "identical": post == now})
        entry.status = "already-upstream"
        entry.commit_new = []
        entry.already_upstream = {
            "evidence": evidence,
            "reverse_applies_to_new_base": reverse_applies(tree, orig, "HEAD"),
            "files": files,
            "proposal": "retire: the rebased series omits it; review the evidence, then drop it from patches/series",
            "drop_when": entry.drop_when,
        }

    def _conflict_file(self, path: str, patch_hunks: list[Json]) -> Json:
        st = self.state
        return {
            "file": path,
            "markers": file_markers(self.tree / path),
            "patch_hunks": [h["header"] for h in patch_hunks],
            "upstream": upstream_change(
                self.tree,
                st.from_.pristine,
                st.onto.pristine,
                path,
                patch_hunks,
                self.mirror,
                st.from_.git_commit,
                st.onto.git_commit,
            ),
        }

    # ---- continue after a conflict
    def resume_conflict(self) -> None:
        """Take the user's resolution of the stopped patch (staged, or committed on the branch)."""
        tree = self.tree
        entry = self.state.entry
        unmerged = sorted(set(git(tree, "diff", "--name-only", "--diff-filter=U").splitlines()))
        if unmerged:
            raise ToolError(
                f"{entry.name}: {len(unmerged)} file(s) still unmerged in {tree} "
                f"(first: {unmerged[0]}); resolve, git add, then --continue"
            )
        conflicted = [f["file"] for f in (entry.conflict or {}).get("files", [])]
        left = [p for p in conflicted if file_markers(tree / p)]
        if left:
            raise ToolError(f"{entry.name}: conflict markers remain in {left[0]}; resolve them, then --continue")
        head = git(tree, "rev-parse", "HEAD")
        stop = entry.head_at_stop or head
        dirty = status_porcelain(tree)
        if head == stop:
            unstaged = [ln for ln in dirty if ln[1] != " " or ln.startswith("??")]
            if unstaged:
                raise ToolError(
                    f"{entry.name}: unstaged or untracked change {unstaged[0][3:]!r} in {tree}; "
                    "git add (or commit) the resolution, then --continue"
                )
            if run_git(tree, "diff", "--cached", "--quiet", check=False).returncode == 0:
                self._already_upstream(entry, evidence="the conflict was resolved to the new upstream's content")
                entry.resolved_by_user = True
                return
            entry.commit_new = [self._commit_like(entry.commit_old)]
        else:
            if run_git(tree, "merge-base", "--is-ancestor", stop, head, check=False).returncode != 0:
                raise ToolError(
                    f"{tree}: HEAD {head[:12]} does not descend from where the rebase stopped "
                    f"({stop[:12]}); check out {BRANCH} and resolve there"
                )
            if dirty:
                raise ToolError(
                    f"{tree}: committed resolution plus {len(dirty)} uncommitted change(s) "
                    f"(first: {dirty[0].strip()}); commit or discard them, then --continue"
                )
            entry.commit_new = git(tree, "rev-list", "--reverse", f"{stop}..HEAD").split()
        new = entry.commit_new
        entry.status = "resolved"
        entry.resolved_by_user = True
        entry.set_comparison(
            compare_hunks(
                diff_hunks(tree, f"{entry.commit_old}^", entry.commit_old), diff_hunks(tree, f"{new[0]}^", new[-1])
            )
        )
