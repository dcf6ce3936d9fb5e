"""pip's configuration, read once, for the index client (:mod:`scripts.index`) and for uv
(:mod:`scripts.wheels`).

Read the documented way: ``python -m pip config list`` lists every configuration file's keys
(``global.``, ``install.``, ``download.`` ...) and the ``PIP_*`` environment (``:env:.``), each
file's values already merged in pip's file order. pip then applies, for one command,
``global`` < the command's own section < the environment; :func:`resolve` does the same. No
index host is written here: when no ``index-url`` is configured, pip's own default is asked of
pip (:func:`pip_default_index_url`).
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import subprocess
import sys
from dataclasses import dataclass

from scripts.errors import ToolError

# what decides which configuration pip reads: its files' places and the PIP_* environment
_LOCATION_ENV = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "VIRTUAL_ENV", "APPDATA")


@dataclass(frozen=True)
class PipConfig:
    """The keys of pip's configuration that the index client and the uv invocation use; every
    other key is kept, as pip lists it, in ``other``."""

    index_url: str | None = None  # None: pip's own default (pip_default_index_url)
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    cert: str | None = None  # CA bundle (file or directory)
    client_cert: str | None = None  # one PEM file: the key and the certificate
    trusted_hosts: tuple[str, ...] = ()  # "host" or "host:port": no TLS verification there
    proxy: str | None = None  # for http and https, as pip's --proxy
    timeout: float | None = None  # seconds, pip's --timeout / --default-timeout
    retries: int | None = None  # pip's --retries
    other: tuple[tuple[str, str], ...] = ()

    def index_urls(self) -> list[str]:
        """Index URLs in pip's order: index-url first (pip's default if unset), then extras."""
        seen: list[str] = []
        for url in [self.index_url or pip_default_index_url(), *self.extra_index_urls]:
            if url not in seen:
                seen.append(url)
        return seen


def listed_items(text: str) -> list[tuple[str, str, str]]:
    """``pip config list`` output as (section, key, value); pip prints each value as a Python
    string literal."""
    items = []
    for line in text.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.strip().rpartition(".")
        if not sep or not dot:
            continue
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip().strip("'\"")
        items.append((section, key, str(value)))
    return items


def _number(key: str, value: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise ToolError(f"pip's configuration: {key}={value!r} is not a number") from None


def resolve(text: str, command: str) -> PipConfig:
    """The configuration ``pip COMMAND`` sees, from ``pip config list`` output ``text``:
    ``global`` < ``COMMAND`` < the environment, a later one replacing a key's value."""
    order = {"global": 0, command: 1, ":env:": 2}
    merged: dict[str, str] = {}
    for section, key, value in sorted(listed_items(text), key=lambda item: order.get(item[0], -1)):
        if section in order:
            merged["timeout" if key == "default-timeout" else key] = value
    known = {
        "index-url",
        "extra-index-url",
        "find-links",
        "constraint",
        "cert",
        "client-cert",
        "trusted-host",
        "proxy",
        "timeout",
        "retries",
    }
    # options that pip may give more than once: whitespace-separated, as pip splits them
    return PipConfig(
        index_url=merged.get("index-url", "").strip() or None,
        extra_index_urls=tuple(merged.get("extra-index-url", "").split()),
        find_links=tuple(merged.get("find-links", "").split()),
        constraints=tuple(merged.get("constraint", "").split()),
        cert=merged.get("cert") or None,
        client_cert=merged.get("client-cert") or None,
        trusted_hosts=tuple(merged.get("trusted-host", "").split()),
        proxy=merged.get("proxy") or None,
        timeout=float(_number("timeout", merged["timeout"], float)) if merged.get("timeout") else None,
        retries=int(_number("retries", merged["retries"], int)) if merged.get("retries") else None,
        other=tuple(sorted((k, v) for k, v in merged.items() if k not in known)),
    )


@functools.lru_cache(maxsize=8)
def _listing(environment: tuple[tuple[str, str], ...]) -> str:
    """``pip config list`` in this environment (``environment``, the part of it pip reads, is only
    the cache key: the same environment, one run)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolError(f"`pip config list` failed (exit {proc.returncode}): {last}")
    return proc.stdout


def _environment() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_") or k in _LOCATION_ENV))


def pip_config(command: str) -> PipConfig:
    """pip's configuration as ``pip COMMAND`` sees it (``download`` for the index client,
    ``install`` for uv); ``pip config list`` runs once per process and environment."""
    return resolve(_listing(_environment()), command)


# Where pip keeps its built-in index. pip has no public Python API and no command prints its default
# index (`pip config list` shows configured values only; `pip index`, `pip inspect`, `pip download
# --report` show none; `--help` text is prose, not an interface). `PyPI.simple_url` in this module
# is the value pip's own `--index-url` option takes as its default (pip/_internal/cli/cmdoptions.py);
# it is read from the pip `python -m pip` runs here (this interpreter's), and if a later pip moves
# it, that is one clear line, not a guess.
_PIP_INDEX_MODULE = "pip._internal.models.index"


@functools.cache
def pip_default_index_url() -> str:
    """pip's built-in index URL, the default of its ``--index-url`` (no host name is written here)."""
    where = f"{_PIP_INDEX_MODULE}.PyPI.simple_url"
    try:
        url = importlib.import_module(_PIP_INDEX_MODULE).PyPI.simple_url
    except (ImportError, AttributeError) as exc:
        raise ToolError(f"cannot read pip's default index ({where}: {type(exc).__name__}); set PIP_INDEX_URL") from None
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise ToolError(f"pip's default index ({where}) is not a URL: {url!r}; set PIP_INDEX_URL")
    return url
