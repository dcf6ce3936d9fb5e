"""Which vLLM release a patched work tree was made from: the subject of its pristine (first) commit.

A stand-in CPU runtime is one release's own Python tree, so a tree of another release must not be
synced into it (:mod:`scripts.cpu_venv`); :mod:`scripts.cpu_runtime` diffs a tree against its root.
"""

from __future__ import annotations

import re
from pathlib import Path

from scripts.errors import ToolError
from scripts.git import git


def tree_root_commit(tree: Path) -> str:
    roots = git(tree, "rev-list", "--max-parents=0", "HEAD").split()
    if len(roots) != 1:
        raise ToolError(f"{tree}: expected one root (pristine) commit, found {len(roots)}")
    return roots[0]


PRISTINE_SUBJECT = re.compile(r"^upstream vLLM (\S+) \((\w+)\) pristine$")
"""The subject of a work tree's first commit (:func:`scripts.worktree.pristine_message`)."""


def tree_release(tree: Path) -> str | None:
    """The vLLM release the work tree's pristine (first) commit imports, read from its subject;
    None when that commit is not a pristine import of this tooling."""
    subject = git(tree, "log", "-1", "--format=%s", tree_root_commit(tree))
    found = PRISTINE_SUBJECT.match(subject.strip())
    return found.group(1) if found else None


def check_tree_release(tree: Path, release: str) -> None:
    """Refuse, in one line, a work tree whose pristine commit is not vLLM ``release``."""
    got = tree_release(tree)
    if got != release:
        what = f"vLLM {got}" if got else "no pristine vLLM import"
        raise ToolError(
            f"--tree {tree}: its pristine commit is {what}, the runtime is vLLM {release}'s; a tree "
            f"syncs only into the runtime of its own release (apply the series onto {release}, or --no-sync)"
        )
