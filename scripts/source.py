"""Acquire the pinned upstream source: sdist from pip's index (cached by sha256) or git."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from scripts.digest import sha256_file
from scripts.errors import ToolError
from scripts.git import archive_to, git, git_live, git_popen, resolve_commit
from scripts.index import download, find_file
from scripts.log import detail, step
from scripts.pins import VllmPin


def cache_root() -> Path:
    """Where downloads are cached (``VXL_CACHE_DIR`` overrides)."""
    env = os.environ.get("VXL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm-xpu-laguna"


def mirror_path(url: str) -> Path:
    """The cached bare git mirror of ``url``."""
    return cache_root() / "git" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")


def sdist_name(version: str) -> str:
    return f"vllm-{version}.tar.gz"


def cached_sdist(pin: VllmPin) -> Path:
    return cache_root() / "sdist" / pin.sdist_sha256 / sdist_name(pin.version)


def fetch_sdist(pin: VllmPin, offline: bool = False) -> Path:
    """The pinned sdist, from the cache or downloaded through pip's configured index."""
    path = cached_sdist(pin)
    if path.exists():
        actual = sha256_file(path)
        if actual == pin.sdist_sha256:
            detail(f"cached {path.name} (sha256 {actual[:12]}...)")
            return path
        path.unlink()
        detail(f"removed corrupt cache entry {path} (sha256 {actual[:12]}...)")
    if offline:
        raise ToolError(
            f"--offline: {sdist_name(pin.version)} (sha256 {pin.sdist_sha256}) is not in the cache "
            f"{cache_root()}; run once without --offline"
        )
    with step(f"download {sdist_name(pin.version)} through pip's configured index"):
        item = find_file("vllm", sdist_name(pin.version))
        download(item, path, pin.sdist_sha256)
    return path


_COMMIT_LINE = re.compile(r"""__commit_id__\s*=\s*commit_id\s*=\s*['"]g?([0-9a-f]+)['"]""")


def commit_of_version_file(text: str) -> str | None:
    match = _COMMIT_LINE.search(text)
    return match.group(1) if match else None


def check_commit(found: str | None, pin: VllmPin, where: str) -> None:
    if not found:
        raise ToolError(f"{where}: vllm/_version.py names no commit id; cannot confirm pin {pin.commit}")
    if not (found.startswith(pin.commit) or pin.commit.startswith(found)):
        raise ToolError(f"{where}: upstream commit is {found}, the pin says {pin.commit}")


def _safe_member_path(name: str, top: str | None) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")):
        raise ToolError(f"unsafe archive: absolute path {name!r}")
    if ".." in path.parts:
        raise ToolError(f"unsafe archive: path escapes the tree {name!r}")
    if top is not None and path.parts[0] != top:
        raise ToolError(f"unsafe archive: {name!r} is outside the top folder {top!r}")
    return path


def _checked_members(tar: tarfile.TarFile, archive: Path, pin: VllmPin) -> tuple[str, list[tarfile.TarInfo]]:
    """Validate every member (paths, links, types) and the pinned commit; return (top folder, members)."""
    try:
        members = tar.getmembers()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ToolError(f"{archive.name}: truncated or corrupt archive ({exc})") from None
    if not members:
        raise ToolError(f"{archive.name}: empty archive")
    top = PurePosixPath(members[0].name).parts[0]
    version_text = None
    for member in members:
        path = _safe_member_path(member.name, top)
        if "\n" in member.name:
            raise ToolError(f"unsafe archive: newline in path {member.name!r}")
        if member.issym() or member.islnk():
            target = PurePosixPath(member.linkname)
            resolved = (path.parent / target) if member.issym() else target
            if (
                target.is_absolute()
                or ".." in PurePosixPath(os.path.normpath(str(resolved))).parts
                or PurePosixPath(os.path.normpath(str(resolved))).parts[:1] != (top,)
            ):
                raise ToolError(f"unsafe archive: link {member.name!r} points outside the tree ({member.linkname!r})")
        elif not (member.isfile() or member.isdir()):
            raise ToolError(f"unsafe archive: special file {member.name!r}")
        if path.parts[1:] == ("vllm", "_version.py"):
            try:
                fh = tar.extractfile(member)
                version_text = fh.read().decode("utf-8", "replace") if fh else None
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise ToolError(f"{archive.name}: truncated or corrupt archive ({exc})") from None
    check_commit(commit_of_version_file(version_text or ""), pin, archive.name)
    return top, members


def _open_sdist(archive: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as exc:
        raise ToolError(f"{archive.name}: not a readable gzip tar archive ({exc})") from None


# Generated by the build; never part of the pristine commit (also git's info/exclude of every tree).
UNTRACKED = ("vllm/_version.py", "vllm.egg-info/")
GIT_EXCLUDE = "".join(f"/{path}\n" for path in UNTRACKED)


def import_sdist(archive: Path, bare: Path, pin: VllmPin, message: str, env: dict[str, str]) -> bytes | None:
    """Check every member (paths, links, types) and the pinned commit, then stream the archive into
    ``bare`` as the ``pristine`` commit with ``git fast-import`` (no files are written); returns the
    sdist's ``vllm/_version.py``."""
    with _open_sdist(archive) as tar:
        top, members = _checked_members(tar, archive, pin)
        proc = git_popen(bare, "fast-import", "--quiet", "--done", env=env)
        assert proc.stdin is not None
        files: list[tuple[str, str, int]] = []
        version: bytes | None = None
        try:
            for member in members:
                rel = "/".join(PurePosixPath(member.name).parts[1:])
                if not rel or member.isdir():
                    continue
                if member.issym():
                    data, mode = member.linkname.encode(), "120000"
                else:
                    fh = tar.extractfile(member)
                    data = fh.read() if fh else b""
                    mode = "100755" if member.mode & 0o111 else "100644"
                if rel == "vllm/_version.py":
                    version = data
                if rel == UNTRACKED[0] or rel.startswith(UNTRACKED[1]):
                    continue
                files.append((rel, mode, len(files) + 1))
                proc.stdin.write(b"blob\nmark :%d\ndata %d\n" % (len(files), len(data)) + data + b"\n")
            when = env.get("GIT_COMMITTER_DATE", "946684800 +0000")
            who = f"{env['GIT_COMMITTER_NAME']} <{env['GIT_COMMITTER_EMAIL']}>"
            msg = message.encode()
            head = (
                (f"commit refs/heads/pristine\nauthor {who} {when}\ncommitter {who} {when}\ndata {len(msg)}\n").encode()
                + msg
                + b"\n"
            )
            proc.stdin.write(head)
            for rel, mode, mark in sorted(files):
                proc.stdin.write(f"M {mode} :{mark} {rel}\n".encode())
            proc.stdin.write(b"\ndone\n")
            proc.stdin.close()
        except (tarfile.TarError, OSError, EOFError) as exc:
            proc.kill()
            raise ToolError(f"{archive.name}: truncated or corrupt archive ({exc})") from None
        if proc.wait() != 0:
            err = (proc.stderr.read().decode(errors="replace").strip().splitlines() or ["?"]) if proc.stderr else ["?"]
            raise ToolError(f"git fast-import of {archive.name} failed: {err[-1]}")
        return version


def fetch_git(pin: VllmPin, dest: Path, offline: bool = False, url: str | None = None) -> str:
    """Export the pinned commit from git (a cached bare mirror) into ``dest``; returns the full id."""
    url = url or pin.git_url
    mirror = mirror_path(url)
    if not mirror.exists():
        if offline:
            raise ToolError(f"--offline: no cached git mirror of {url} in {mirror.parent}")
        with step(f"clone {url} (bare, cached)"):
            mirror.parent.mkdir(parents=True, exist_ok=True)
            code = git_live(None, "clone", "--bare", "--progress", url, str(mirror))
            if code != 0:
                shutil.rmtree(mirror, ignore_errors=True)
                raise ToolError(f"git clone of {url} failed (exit {code})")
    full = resolve_commit(mirror, pin.commit)
    if full is None:
        if offline:
            raise ToolError(f"--offline: commit {pin.commit} is not in the cached mirror of {url}")
        git(mirror, "fetch", "--quiet", "origin", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
        full = resolve_commit(mirror, pin.commit)
        if full is None:
            raise ToolError(f"{url}: commit {pin.commit} not found")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive_to(mirror, full, dest)
    version_file = dest / "vllm" / "_version.py"
    if not version_file.exists():  # a git checkout has no generated _version.py: write what setuptools-scm would
        version_file.write_text(f"__version__ = version = {pin.version!r}\n__commit_id__ = commit_id = 'g{full[:9]}'\n")
    check_commit(full, pin, url)
    return full


__all__ = ["cache_root", "fetch_sdist", "fetch_git", "import_sdist", "mirror_path"]
