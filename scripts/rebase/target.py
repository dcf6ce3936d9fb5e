"""Where the series goes: the new upstream's pins (sdist sha256 from the index, commit) and git ids."""

from __future__ import annotations

import dataclasses
import re
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from scripts.digest import sha256_file
from scripts.errors import ToolError
from scripts.git import resolve_commit, run_git
from scripts.index import list_files, pip_index_urls
from scripts.log import detail
from scripts.pins import Pins
from scripts.source import cache_root, commit_of_version_file, fetch_git, fetch_sdist, mirror_path, sdist_name


def sdist_commit(archive: Path) -> str:
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


def release_sha256(version: str, offline: bool) -> str:
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


def index_urls() -> list[str]:
    """pip's configured index URLs (``pip config`` is asked once per environment: scripts.pipconf)."""
    return pip_index_urls()


def version_of_commit(mirror: Path, commit: str) -> str:
    """A version for a git commit: its release tag, else the next patch release's .devN."""
    proc = run_git(mirror, "describe", "--tags", "--match", "v[0-9]*", "--long", commit, check=False)
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-(\d+)-g[0-9a-f]+", proc.stdout.strip())
    if not match:
        raise ToolError(
            f"cannot derive a version for commit {commit[:12]} (no v* tag below it); pass --onto VERSION too"
        )
    major, minor, patch, ahead = (int(g) for g in match.groups())
    return f"{major}.{minor}.{patch}" if ahead == 0 else f"{major}.{minor}.{patch + 1}.dev{ahead}"


def full_commit(url: str, prefix: str) -> str | None:
    """The full id of ``prefix`` in the cached mirror of ``url`` (None without one)."""
    mirror = mirror_path(url)
    return resolve_commit(mirror, prefix) if mirror.exists() else None


def resolve_target(
    pins: Pins, onto_version: str | None, onto_commit: str | None, source: str, offline: bool
) -> tuple[Pins, str | None]:
    """Pins for the new upstream (a copy of ``pins`` with a new [vllm]); and the full git commit if known."""
    if source == "sdist":
        if onto_commit:
            raise ToolError("--onto-commit needs --source git (an sdist is named by its version)")
        if not onto_version:
            raise ToolError("say where to go: --onto VERSION or --onto-commit SHA")
        sha = release_sha256(onto_version, offline)
        probe = dataclasses.replace(pins.vllm, version=onto_version, sdist_sha256=sha)
        archive = fetch_sdist(probe, offline=offline)
        commit = sdist_commit(archive)[:9]
        detail(f"vllm {onto_version}: vllm/_version.py names commit {commit}")
        return dataclasses.replace(pins, vllm=dataclasses.replace(probe, commit=commit)), None
    if source != "git":
        raise ToolError(f"unknown --source {source!r} (choose sdist or git)")
    url = pins.vllm.git_url
    with tempfile.TemporaryDirectory(prefix="vxl-rebase-git-") as tmp:
        # make sure the cached mirror exists and holds the old base (exactly what apply does)
        fetch_git(pins.vllm, Path(tmp) / "old", offline=offline)
    mirror = mirror_path(url)
    if not mirror.exists():
        raise ToolError(f"no cached git mirror of {url} at {mirror}")
    wanted = onto_commit or f"v{onto_version}"
    full = resolve_commit(mirror, wanted)
    if full is None and not offline:
        run_git(mirror, "fetch", "--quiet", "origin", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
        full = resolve_commit(mirror, wanted)
    if full is None:
        raise ToolError(f"{url}: {wanted} not found")
    version = onto_version or version_of_commit(mirror, full)
    try:
        sha = release_sha256(version, offline)
    except ToolError as exc:
        detail(f"no sdist for {version} ({exc}); pins.toml cannot move there, a dry run still works")
        sha = ""
    vllm = dataclasses.replace(pins.vllm, version=version, commit=full[:9], sdist_sha256=sha or "0" * 64)
    return dataclasses.replace(pins, vllm=vllm), full
