"""Wheels through pip's configured index: download one (no deps) into a cache, read its Requires-Dist,
install packages (:func:`install`: through uv where pip's configuration carries over to it).

No configured index URL is ever put on a command line: a URL may carry ``user:password@``, and
every user of the machine can read a process's arguments (``/proc/PID/cmdline``), not its
environment. pip reads its own configuration, so its commands name no index; uv gets pip's
configuration through the environment variables uv documents for it (:func:`uv_environment`).

Shared by the CPU runtime install (:mod:`scripts.cpu_runtime`) and the rebase's ``[cpu_runtime]``
update (:mod:`scripts.rebase.pins_update`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from scripts.errors import ToolError
from scripts.index_http import redact
from scripts.log import detail, info
from scripts.pipconf import PipConfig, pip_config


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    detail("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise ToolError(f"pip {args[0]} failed (exit {proc.returncode}): {' '.join(args[1:4])} ...")


def wheel_requires_dist(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise ToolError(f"{wheel.name}: expected one .dist-info/METADATA, found {len(names)}")
            text = zf.read(names[0]).decode("utf-8")
    except (OSError, zipfile.BadZipFile) as exc:
        raise ToolError(f"{wheel}: cannot read wheel: {exc}") from None
    return HeaderParser().parsestr(text).get_all("Requires-Dist") or []


def download_wheel(name: str, version: str, cache: Path) -> Path:
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        detail(f"using cached {found[0].name}")
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        pip("download", "--no-deps", "--only-binary=:all:", "--dest", tmp, f"{name}=={version}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ToolError(f"pip download {name}=={version} gave {len(wheels)} wheel(s), expected 1")
        dest = cache / wheels[0].name
        wheels[0].replace(dest)
    return dest


# ---------------------------------------------------------------- install (uv where it can stand in)

# keys that change nothing about what is installed from where (config-file: already read)
_COSMETIC = {
    "disable-pip-version-check",
    "no-python-version-warning",
    "progress-bar",
    "quiet",
    "verbose",
    "no-color",
    "config-file",
}


def uv_environment(config: PipConfig) -> dict[str, str] | None:
    """The environment under which ``uv pip install`` does what pip's ``config`` does (every index
    considered, like pip: ``UV_INDEX_STRATEGY=unsafe-best-match``; modules compiled, like pip);
    None when a key has no known uv meaning (then pip installs).

    Everything goes through uv's documented variables, never its options: credentials in an index,
    find-links or constraint URL stay out of the process list (uv reads the netrc file itself, as
    pip does). Each variable replaces one the caller's environment had, as an option would."""
    if any(key not in _COSMETIC for key, _ in config.other):
        return None
    # UV_COMPILE_BYTECODE: pip compiles every installed module; without it each import would compile
    # from source again wherever PYTHONDONTWRITEBYTECODE is set (this machine: 18.5 s against 8.3 s
    # for `import vllm.entrypoints.llm`)
    env = {"UV_INDEX_STRATEGY": "unsafe-best-match", "UV_COMPILE_BYTECODE": "1"}
    # uv's separators: space for indexes, constraints and hosts, comma for find-links (pip splits
    # its values on whitespace, so none holds a space)
    lists = (
        ("UV_INDEX_URL", " ", [config.index_url] if config.index_url else []),
        ("UV_EXTRA_INDEX_URL", " ", config.extra_index_urls),
        ("UV_FIND_LINKS", ",", config.find_links),
        ("UV_CONSTRAINT", " ", config.constraints),
        ("UV_INSECURE_HOST", " ", config.trusted_hosts),
    )
    for name, separator, values in lists:
        if values:
            env[name] = separator.join(values)
    if config.cert:
        env["SSL_CERT_DIR" if os.path.isdir(config.cert) else "SSL_CERT_FILE"] = config.cert
    if config.client_cert:
        env["SSL_CLIENT_CERT"] = config.client_cert
    if config.proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[name] = config.proxy
    if config.timeout is not None:
        env["UV_HTTP_TIMEOUT"] = str(math.ceil(config.timeout))
    if config.retries is not None:
        env["UV_HTTP_RETRIES"] = str(config.retries)
    return env


def _uv_command(args: tuple[str, ...]) -> tuple[list[str], dict[str, str]] | str:
    """The uv command for ``pip install ARGS`` into this interpreter and the environment it runs
    under (pip's configuration as ``pip install`` sees it, read once:
    :func:`scripts.pipconf.pip_config`), or why pip installs instead."""
    if importlib.util.find_spec("uv") is None:
        return "uv is not installed here"
    try:
        config = pip_config("install")
    except ToolError as exc:
        return str(exc)
    env = uv_environment(config)
    if env is None:
        return "pip's configuration has a key uv is not told about"
    return [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, *args], env


def install(*args: str) -> None:
    """``pip install ARGS`` into this interpreter's environment: through ``uv pip install`` with
    pip's configuration (:func:`uv_environment`) when uv is installed here (the CPU runtime from
    empty caches: 35.7 s against about 125 s through pip), else, or when uv fails, through pip."""
    planned = _uv_command(args)
    if isinstance(planned, str):
        detail(f"installing with pip: {planned}")
    else:
        command, env = planned
        detail("$ " + shlex.join(redact(part) for part in command))  # no password in the log
        proc = subprocess.run(command, env={**os.environ, **env}, check=False)
        if proc.returncode == 0:
            return
        info(f"uv pip install failed (exit {proc.returncode}); installing with pip instead")
    pip("install", *args)
