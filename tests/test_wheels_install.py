"""scripts.wheels.install: uv with pip's own configuration where it carries over, pip otherwise."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from scripts import wheels

# what `pip config list` prints on a machine like CI's (names of local folders, no index host)
LISTED = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_pip_configuration_becomes_uv_options() -> None:
    config = wheels.pip_config(LISTED)
    assert config["extra-index-url"] == "file:///opt/pypi/simple file:///opt/pypi-more/simple"
    args, env = wheels.uv_arguments(config) or ([], {})
    assert args[2] == "--compile-bytecode"  # as pip does: without it each import compiles again
    rest = args[:2] + args[3:]
    pairs = sorted(zip(rest[::2], rest[1::2], strict=True))
    assert pairs == [
        ("--constraint", "/etc/xdg/pip/constraints.txt"),
        ("--extra-index-url", "file:///opt/pypi-more/simple"),
        ("--extra-index-url", "file:///opt/pypi/simple"),
        ("--find-links", "/opt/wheels"),
        ("--index-strategy", "unsafe-best-match"),
    ]
    # pip's order of the extra indexes is kept (uv tries them in the order given)
    assert args.index("file:///opt/pypi/simple") < args.index("file:///opt/pypi-more/simple")
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}


@pytest.mark.parametrize("line", ["global.trusted-host='mirror.internal'", "install.no-index='1'", "global.proxy='x'"])
def test_a_key_uv_is_not_told_about_means_pip(line: str) -> None:
    assert wheels.uv_arguments(wheels.pip_config(LISTED + line + "\n")) is None


def _record(monkeypatch: pytest.MonkeyPatch, planned: Any, uv_exit: int = 0) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(wheels, "_uv_command", lambda args: planned)
    monkeypatch.setattr(wheels, "pip", lambda *args: calls.append(("pip", *args)))

    def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(("uv", *command))
        return subprocess.CompletedProcess(command, uv_exit)

    monkeypatch.setattr(wheels.subprocess, "run", run)
    return calls


def test_uv_installs_when_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record(monkeypatch, (["uv-cmd", "torch==2.13.0"], {}))
    wheels.install("torch==2.13.0")
    assert calls == [("uv", "uv-cmd", "torch==2.13.0")]


def test_pip_installs_when_uv_cannot_or_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record(monkeypatch, "uv is not installed here")
    wheels.install("--no-deps", "x.whl")
    assert calls == [("pip", "install", "--no-deps", "x.whl")]
    calls = _record(monkeypatch, (["uv-cmd"], {}), uv_exit=2)
    wheels.install("torch==2.13.0")
    assert calls == [("uv", "uv-cmd"), ("pip", "install", "torch==2.13.0")]
