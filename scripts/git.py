"""A thin, deterministic layer over the git CLI."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from scripts.errors import ToolError

IDENTITY_NAME = "vllm-xpu-laguna"
IDENTITY_EMAIL = "vllm-xpu-laguna@users.noreply.invalid"
# Fixed date for tool-made commits (pristine upstream, overlay) so their ids are reproducible.
FIXED_DATE = "2000-01-01T00:00:00+0000"


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment that makes git output independent of the user's configuration and locale."""
    env = dict(os.environ)
    env.update(
        {
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "LC_ALL": "C",
            "TZ": "UTC",
            "GIT_COMMITTER_NAME": IDENTITY_NAME,
            "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL,
            "GIT_AUTHOR_NAME": IDENTITY_NAME,
            "GIT_AUTHOR_EMAIL": IDENTITY_EMAIL,
            "GIT_TERMINAL_PROMPT": "0",
        }
    )
    for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(key, None)
    if extra:
        env.update(extra)
    return env


def run_git(
    cwd: Path, *args: str, env: dict[str, str] | None = None, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(env), capture_output=True, text=True, input=input, check=False
    )
    if check and proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise ToolError(
            f"git {' '.join(args[:2])} failed in {cwd}: {lines[-1] if lines else 'exit ' + str(proc.returncode)}"
        )
    return proc


def git(cwd: Path, *args: str, env: dict[str, str] | None = None, input: str | None = None) -> str:
    return run_git(cwd, *args, env=env, input=input).stdout.strip()


def fixed_date_env() -> dict[str, str]:
    return {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}


def is_repo(path: Path) -> bool:
    return (path / ".git").is_dir()


def status_porcelain(path: Path) -> list[str]:
    out = run_git(path, "status", "--porcelain", "--untracked-files=all").stdout
    return [line for line in out.splitlines() if line.strip()]


def blob_at(path: Path, rev: str, file: str) -> str | None:
    proc = run_git(path, "rev-parse", "--verify", "--quiet", f"{rev}:{file}", check=False)
    return proc.stdout.strip() or None


def blob_bytes(cwd: Path, rev: str, path: str) -> bytes | None:
    """The content of ``rev:path``, or None when there is no such blob."""
    proc = subprocess.run(
        ["git", "cat-file", "blob", f"{rev}:{path}"], cwd=cwd, env=git_env(), capture_output=True, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


def git_live(cwd: Path | None, *args: str) -> int:
    """A git command whose progress goes to the terminal (long clones); returns its exit status."""
    return subprocess.run(["git", *args], cwd=cwd, env=git_env(), check=False).returncode


def git_popen(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A git process fed through its stdin (``fast-import``) with the fixed environment."""
    return subprocess.Popen(["git", *args], cwd=cwd, env=git_env(env), stdin=subprocess.PIPE, stderr=subprocess.PIPE)


def resolve_commit(repo: Path, rev: str) -> str | None:
    """The full id of the commit ``rev`` names in ``repo``, or None when there is none."""
    proc = run_git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def head_commit(repo: Path) -> str | None:
    """``repo``'s HEAD commit, or None outside a git checkout (or without git)."""
    try:
        proc = run_git(repo, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
    except OSError:
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def archive_to(repo: Path, rev: str, dest: Path) -> None:
    """Write the tree of ``rev`` into the existing directory ``dest`` (``git archive | tar -x``)."""
    archive = subprocess.Popen(["git", "archive", "--format=tar", rev], cwd=repo, env=git_env(), stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=False)
    if archive.stdout is not None:
        archive.stdout.close()
    archive.wait()
    if archive.returncode or untar.returncode:
        raise ToolError(f"git archive of {rev[:12]} in {repo} failed")
