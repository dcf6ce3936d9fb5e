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
    env.update({
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "LC_ALL": "C",
        "TZ": "UTC",
        "GIT_COMMITTER_NAME": IDENTITY_NAME,
        "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL,
        "GIT_AUTHOR_NAME": IDENTITY_NAME,
        "GIT_AUTHOR_EMAIL": IDENTITY_EMAIL,
        "GIT_TERMINAL_PROMPT": "0",
    })
    for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(key, None)
    if extra:
        env.update(extra)
    return env


def run_git(cwd: Path, *args: str, env: dict[str, str] | None = None, input: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["git", *args], cwd=cwd, env=git_env(env), capture_output=True, text=True,
                          input=input, check=False)
    if check and proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise ToolError(f"git {' '.join(args[:2])} failed in {cwd}: {lines[-1] if lines else 'exit ' + str(proc.returncode)}")
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


def hash_object(data: bytes) -> str:
    proc = subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True,
                          env=git_env())
    return proc.stdout.decode().strip()
