"""Wheels through pip's configured index: download one (no deps) into a cache, read its Requires-Dist,
install packages (:func:`install`: through uv where pip's configuration carries over to it).

Shared by the CPU runtime install (:mod:`scripts.cpu_runtime`) and the rebase's ``[cpu_runtime]``
update (:mod:`scripts.rebase.pins_update`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from scripts.errors import ToolError
from scripts.log import detail, info


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

# pip configuration keys and the uv option that means the same (values split on whitespace, as pip does)
_UV_OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
_UV_ENV = {"cert": "SSL_CERT_FILE", "default-timeout": "UV_HTTP_TIMEOUT", "timeout": "UV_HTTP_TIMEOUT"}
# keys that change nothing about what is installed from where
_COSMETIC = {"disable-pip-version-check", "no-python-version-warning", "progress-bar", "quiet", "verbose", "no-color"}


def pip_config(text: str) -> dict[str, str]:
    """``pip config list`` output as {key: value}, the section (``global.``, ``install.``,
    ``:env:.``) dropped; a later line wins, as in pip."""
    config = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            continue
        key = name.rsplit(".", 1)[-1].strip()
        config[key] = value.strip().strip("'\"")
    return config


def uv_arguments(config: dict[str, str]) -> tuple[list[str], dict[str, str]] | None:
    """The ``uv pip install`` options and environment that give what pip's ``config`` gives (every
    index considered, like pip: ``--index-strategy unsafe-best-match``; modules compiled, like
    pip); None when a key has no known uv meaning (then pip installs)."""
    # --compile-bytecode: pip compiles every installed module; without it each import would compile
    # from source again wherever PYTHONDONTWRITEBYTECODE is set (this machine: 18.5 s against 8.3 s
    # for `import vllm.entrypoints.llm`)
    args, env = ["--index-strategy", "unsafe-best-match", "--compile-bytecode"], {}
    for key, value in config.items():
        if key in _UV_OPTIONS:
            for item in value.split():
                args += [_UV_OPTIONS[key], item]
        elif key in _UV_ENV:
            env[_UV_ENV[key]] = value
        elif key not in _COSMETIC:
            return None
    return args, env


@functools.cache
def _uv_plan() -> tuple[list[str], dict[str, str]] | str:
    """The uv command prefix and environment for installing into this interpreter (pip's
    configuration read once per process), or why pip installs instead."""
    if importlib.util.find_spec("uv") is None:
        return "uv is not installed here"
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        return "`pip config list` failed"
    translated = uv_arguments(pip_config(listed.stdout))
    if translated is None:
        return "pip's configuration has a key uv is not told about"
    options, env = translated
    return [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, *options], env


def _uv_command(args: tuple[str, ...]) -> tuple[list[str], dict[str, str]] | str:
    """The uv command for ``pip install ARGS`` into this interpreter, or why pip installs instead."""
    plan = _uv_plan()
    if isinstance(plan, str):
        return plan
    prefix, env = plan
    return [*prefix, *args], env


def install(*args: str) -> None:
    """``pip install ARGS`` into this interpreter's environment: through ``uv pip install`` with
    pip's configuration (:func:`uv_arguments`) when uv is installed here (the CPU runtime from
    empty caches: 35.7 s against about 125 s through pip), else, or when uv fails, through pip."""
    planned = _uv_command(args)
    if isinstance(planned, str):
        detail(f"installing with pip: {planned}")
    else:
        command, env = planned
        detail("$ " + shlex.join(command))
        proc = subprocess.run(command, env={**os.environ, **env}, check=False)
        if proc.returncode == 0:
            return
        info(f"uv pip install failed (exit {proc.returncode}); installing with pip instead")
    pip("install", *args)
