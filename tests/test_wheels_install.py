"""scripts.wheels.install: uv with pip's own configuration (through uv's environment, never its
command line) where it carries over, pip otherwise. The real install through an authenticated index,
watched for the password in the process list: tests/test_no_secret_argv.py."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from scripts import wheels
from scripts.pipconf import resolve

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


def test_pip_configuration_becomes_uv_environment() -> None:
    config = resolve(LISTED, "install")
    assert config.extra_index_urls == ("file:///opt/pypi/simple", "file:///opt/pypi-more/simple")
    env = wheels.uv_environment(config)
    # pip's order of the extra indexes is kept (uv tries them in the order given); uv splits
    # UV_EXTRA_INDEX_URL and UV_CONSTRAINT on spaces, UV_FIND_LINKS on commas
    assert env == {
        "UV_INDEX_STRATEGY": "unsafe-best-match",  # every index considered, as pip does
        "UV_COMPILE_BYTECODE": "1",  # as pip does: without it each import compiles again
        "UV_EXTRA_INDEX_URL": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "UV_FIND_LINKS": "/opt/wheels",
        "UV_CONSTRAINT": "/etc/xdg/pip/constraints.txt",
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
        "UV_HTTP_TIMEOUT": "180",
    }


def test_the_uv_command_names_no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = "global.index-url='http://user:s3cret@127.0.0.1:9/simple/'\nglobal.find-links='/a /b'\n"
    monkeypatch.setattr(wheels, "pip_config", lambda command: resolve(listed, command))
    monkeypatch.setattr(wheels.importlib.util, "find_spec", lambda name: object())
    planned = wheels._uv_command(("torch==2.13.0",))
    assert not isinstance(planned, str)
    command, env = planned
    assert command[-1] == "torch==2.13.0" and not any("s3cret" in part or "/a" == part for part in command)
    assert (env["UV_INDEX_URL"], env["UV_FIND_LINKS"]) == ("http://user:s3cret@127.0.0.1:9/simple/", "/a,/b")


@pytest.mark.parametrize("line", ["install.no-index='1'", "global.pre='1'"])
def test_a_key_uv_is_not_told_about_means_pip(line: str) -> None:
    assert wheels.uv_environment(resolve(LISTED + line + "\n", "install")) is None


def test_network_keys_carry_over_to_uv() -> None:
    listed = (
        "global.trusted-host='mirror.internal other:8443'\n"
        "global.proxy='http://proxy.internal:3128'\n"
        "global.client-cert='/etc/pip/client.pem'\n"
        "global.retries='7'\n"
        "global.timeout='2.5'\n"
        ":env:.config-file='/dev/null'\n"
    )
    env = wheels.uv_environment(resolve(listed, "install")) or {}
    assert env["UV_INSECURE_HOST"] == "mirror.internal other:8443"
    assert env["SSL_CLIENT_CERT"] == "/etc/pip/client.pem"
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == "http://proxy.internal:3128"
    assert (env["UV_HTTP_RETRIES"], env["UV_HTTP_TIMEOUT"]) == ("7", "3")


def test_uv_reads_pips_install_section_and_the_environment_wins() -> None:
    listed = (
        ":env:.index-url='file:///from/env'\n"
        "download.retries='9'\n"
        "global.index-url='file:///from/global'\n"
        "global.retries='1'\n"
        "install.retries='4'\n"
    )
    config = resolve(listed, "install")
    assert (config.index_url, config.retries) == ("file:///from/env", 4)
    assert resolve(listed, "download").retries == 9
    assert resolve(listed, "wheel").retries == 1


def test_logged_uv_command_has_no_password(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    # a caller's own argument (a wheel's URL) is logged without its password
    _record(monkeypatch, (["uv-cmd", "http://user:s3cret@127.0.0.1:9/x-1.0-py3-none-any.whl"], {}))
    wheels.install("http://user:s3cret@127.0.0.1:9/x-1.0-py3-none-any.whl")
    err = capfd.readouterr().err
    assert "s3cret" not in err and "http://127.0.0.1:9/x-1.0-py3-none-any.whl" in err


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
