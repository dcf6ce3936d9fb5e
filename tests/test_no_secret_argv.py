"""No password on a command line: the real install path (:func:`scripts.wheels.install`, what the
CPU runtime installs with) run in a fresh venv against an index on 127.0.0.1 that wants HTTP basic
authentication, pip's index URL carrying ``user:password@``, while a watcher reads every process's
arguments (``/proc/PID/cmdline``, which every user of the machine can read). The package must come
from that index (so the credentials reached the installer) and no argument may hold the password.
The control: the same watcher does see a password that is put on a command line."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import secrets
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

import synthetic

REPO = Path(__file__).resolve().parent.parent
USER = "reader"
REQUIREMENT = "vllm==0.0.1"  # the loopback index (synthetic.SimpleIndex) serves the project "vllm"
PROBE = "ARGV_PROBE"

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc (Linux)")


def _wheel() -> tuple[str, bytes]:
    """A pure-Python wheel ``vllm-0.0.1`` whose module says it came from the test index."""
    dist = "vllm-0.0.1.dist-info"
    files = {
        "vllm/__init__.py": f"{PROBE} = 'served'\n".encode(),
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.1\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, body in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(body)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, body in files.items():
            zf.writestr(name, body)
    return "vllm-0.0.1-py3-none-any.whl", out.getvalue()


class ArgvWatcher:
    """Reads every process's arguments over and over (a thread) while in use; keeps each argument
    list that holds ``secret`` and each one seen at all."""

    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.caught: list[list[str]] = []
        self.seen: set[tuple[str, ...]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                        raw = f.read()
                except OSError:  # gone meanwhile
                    continue
                argv = tuple(part.decode(errors="replace") for part in raw.split(b"\0")[:-1])
                self.seen.add(argv)
                if self.secret in raw:
                    self.caught.append(list(argv))
            self._stop.wait(0.002)

    def __enter__(self) -> ArgvWatcher:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def saw(self, *parts: str) -> bool:
        """Whether a process ran with all of ``parts`` among its arguments."""
        return any(set(parts) <= set(argv) for argv in self.seen)


@pytest.fixture
def vxl_secret_index(vxl_index: synthetic.SimpleIndex) -> Iterator[tuple[synthetic.SimpleIndex, str, str]]:
    """The loopback index serving the wheel to USER with a fresh password only; (index, password,
    index URL with the credentials in it)."""
    password = "pw-" + secrets.token_hex(12)
    name, body = _wheel()
    vxl_index.serve(name, body, listed_sha256=synthetic.sha256(body))
    vxl_index.auth = (USER, password)
    with pytest.raises(urllib.error.HTTPError) as refused:  # it really wants the credentials
        urllib.request.urlopen(vxl_index.url + "vllm/", timeout=10)
    assert refused.value.code == 401
    yield vxl_index, password, vxl_index.url.replace("://", f"://{USER}:{password}@", 1)


def _venv(where: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(where)
    return where / "bin" / "python"


def _isolated_env(tmp_path: Path, index_url: str) -> dict[str, str]:
    """pip's configuration is the index URL alone (from the environment: no files), uv's the same
    (no uv.toml); empty caches and home; loopback never through a proxy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=index_url,
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(tmp_path / "uv-cache"),
        HOME=str(tmp_path / "home"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        no_proxy="127.0.0.1",
        NO_PROXY="127.0.0.1",
    )
    return env


def _install(python: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``scripts.wheels.install(REQUIREMENT)`` run by ``python`` (the password only in ``env``)."""
    code = f"from scripts.wheels import install; install({REQUIREMENT!r})"
    env = {**env, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def _installed(python: Path, tmp_path: Path) -> str:
    """What the installed package says of itself (run outside the repository)."""
    code = f"import vllm; print(vllm.{PROBE})"
    proc = subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() or proc.stderr.strip()


def test_the_watcher_sees_a_password_on_a_command_line() -> None:
    password = "pw-" + secrets.token_hex(12)
    url = f"http://{USER}:{password}@127.0.0.1:9/simple/"
    with ArgvWatcher(password) as watcher:
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)", "--index-url", url], check=True)
    assert watcher.caught and url in watcher.caught[0]


def test_pip_install_keeps_the_password_off_every_command_line(tmp_path: Path, vxl_secret_index) -> None:
    index, password, url = vxl_secret_index
    python = _venv(tmp_path / "venv")  # no uv in it: pip installs
    with ArgvWatcher(password) as watcher:
        proc = _install(python, _isolated_env(tmp_path, url))
    assert "installing with pip: uv is not installed here" in proc.stderr
    assert _installed(python, tmp_path) == "served" and index.downloads()
    assert watcher.saw("pip", "install", REQUIREMENT)  # the watcher did see the installer run
    assert watcher.caught == []


def test_uv_install_keeps_the_password_off_every_command_line(tmp_path: Path, vxl_secret_index) -> None:
    index, password, url = vxl_secret_index
    python = _venv(tmp_path / "venv")
    # uv itself through this machine's own pip configuration (not the test index)
    got = subprocess.run([str(python), "-m", "pip", "install", "-q", "uv"], capture_output=True, text=True)
    if got.returncode != 0:
        last = (got.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"uv leg: uv cannot be installed from pip's configured index here ({last}); the pip leg still runs")
    env = _isolated_env(tmp_path, url)
    with ArgvWatcher(password) as watcher:
        proc = _install(python, env)
    assert "installing with pip" not in proc.stderr, proc.stderr  # uv did it, no fallback to pip
    assert _installed(python, tmp_path) == "served" and index.downloads()
    assert watcher.saw("pip", "install", "--python", REQUIREMENT)  # the uv process was seen
    assert watcher.caught == []
    # control: the command shape used before (the index as uv's option) shows the password
    old = [str(python), "-m", "uv", "pip", "install", "--dry-run", "--python", str(python), "--index-url", url]
    with ArgvWatcher(password) as watcher:
        subprocess.run([*old, REQUIREMENT], env=env, capture_output=True, timeout=120, check=True)
    assert watcher.caught
