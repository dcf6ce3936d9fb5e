"""The index client with pip's network configuration, against indexes on 127.0.0.1: basic
authentication (URL, netrc), HTTPS with a self-signed certificate (``cert``, ``trusted-host``,
``client-cert``), a proxy, a refused port, 404, and retries of a transient failure. Each
failure is one line naming its cause, with no password in it."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import synthetic
from scripts import index, index_http, pipconf
from scripts.errors import ToolError

NAME = f"vllm-{synthetic.VERSION}.tar.gz"
BODY = b"the release's bytes"
USER, PASSWORD = "reader", "s3cret-Pa55"


@pytest.fixture
def vxl_net(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[synthetic.SimpleIndex]:
    """pip's configuration from the environment alone (no files, no CA or proxy settings of this
    machine, an empty home), no backoff; an index (not started) serving NAME."""
    for key in list(os.environ):
        if key.startswith("PIP_") or key.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            monkeypatch.delenv(key)
    for key in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(index_http, "RETRY_BACKOFF_S", 0.0)
    served = synthetic.SimpleIndex()
    served.serve(NAME, BODY, listed_sha256=synthetic.sha256(BODY))
    yield served
    if served.started:
        served.stop()


def _fetched(tmp_path: Path) -> bytes:
    """NAME looked up on pip's indexes and downloaded (sha256 checked) as source.py does."""
    item = index.find_file("vllm", NAME)
    dest = tmp_path / "out" / NAME
    index.download(item, dest, synthetic.sha256(BODY))
    return dest.read_bytes()


def _error(tmp_path: Path) -> str:
    with pytest.raises(ToolError) as info:
        _fetched(tmp_path)
    message = str(info.value)
    assert synthetic.one_line(message) and PASSWORD not in message, message
    print(message)  # the line a user sees (pytest -s shows it)
    return message


def _with_credentials(url: str, user: str, password: str) -> str:
    return url.replace("://", f"://{user}:{password}@", 1)


def _free_port() -> int:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- basic authentication


def test_index_wanting_credentials_without_them_says_authentication(vxl_net, tmp_path, monkeypatch) -> None:
    vxl_net.auth = (USER, PASSWORD)
    monkeypatch.setenv("PIP_INDEX_URL", vxl_net.start().url)
    message = _error(tmp_path)
    assert "authentication failed (HTTP 401" in message and "no credentials were sent" in message
    assert vxl_net.url + "vllm/" in message


def test_refused_credentials_are_not_shown(vxl_net, tmp_path, monkeypatch) -> None:
    vxl_net.auth = (USER, PASSWORD)
    monkeypatch.setenv("PIP_INDEX_URL", _with_credentials(vxl_net.start().url, USER, "wrong-Pa55"))
    message = _error(tmp_path)
    assert "HTTP 401" in message and "credentials sent were refused" in message
    assert "wrong-Pa55" not in message and f"{USER}:" not in message
    assert len(vxl_net.requests) == 1  # not retried


def test_credentials_in_the_index_url_are_sent(vxl_net, tmp_path, monkeypatch) -> None:
    vxl_net.auth = (USER, PASSWORD)
    monkeypatch.setenv("PIP_INDEX_URL", _with_credentials(vxl_net.start().url, USER, PASSWORD))
    assert _fetched(tmp_path) == BODY  # the page and the file (same host) both authenticated


def test_credentials_from_netrc_are_sent(vxl_net, tmp_path, monkeypatch) -> None:
    vxl_net.auth = (USER, PASSWORD)
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login {USER} password {PASSWORD}\n")
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("PIP_INDEX_URL", vxl_net.start().url)
    assert _fetched(tmp_path) == BODY


# --------------------------------------------------------------------------- HTTPS, self-signed


def _self_signed(folder: Path, name: str) -> Path:
    """A self-signed certificate for 127.0.0.1, key and certificate in one PEM file."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command here to make a self-signed certificate")
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    pem = folder / f"{name}.pem"
    pem.write_bytes(key.read_bytes() + cert.read_bytes())
    return pem


@pytest.fixture
def vxl_tls(vxl_net, tmp_path: Path, monkeypatch) -> tuple[synthetic.SimpleIndex, Path]:
    """The index on HTTPS with a self-signed certificate; returns it and the certificate (its own CA)."""
    pem = _self_signed(tmp_path, "index")
    vxl_net.use_tls(pem)
    monkeypatch.setenv("PIP_INDEX_URL", vxl_net.start().url)
    return vxl_net, tmp_path / "index.crt"


def test_self_signed_index_without_cert_says_tls(vxl_tls, tmp_path) -> None:
    served, _ = vxl_tls
    message = _error(tmp_path)
    assert "TLS certificate verification failed" in message and "self-signed" in message
    assert served.url + "vllm/" in message and "attempts" not in message  # not retried


def test_self_signed_index_with_pips_cert(vxl_tls, tmp_path, monkeypatch) -> None:
    _, ca = vxl_tls
    monkeypatch.setenv("PIP_CERT", str(ca))
    assert _fetched(tmp_path) == BODY


def test_self_signed_index_as_a_trusted_host(vxl_tls, tmp_path, monkeypatch) -> None:
    served, _ = vxl_tls
    port = served.url.split(":")[2].split("/")[0]
    monkeypatch.setenv("PIP_TRUSTED_HOST", f"127.0.0.2 127.0.0.1:{port}")
    assert _fetched(tmp_path) == BODY
    monkeypatch.setenv("PIP_TRUSTED_HOST", f"127.0.0.1:{int(port) + 1}")  # another port: verified
    assert "TLS certificate verification failed" in _error(tmp_path)


def test_index_wanting_a_client_certificate(vxl_net, tmp_path, monkeypatch) -> None:
    server_pem, client_pem = _self_signed(tmp_path, "index"), _self_signed(tmp_path, "client")
    vxl_net.use_tls(server_pem, client_ca=tmp_path / "client.crt")
    monkeypatch.setenv("PIP_INDEX_URL", vxl_net.start().url)
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "index.crt"))
    assert "TLS" in _error(tmp_path)
    monkeypatch.setenv("PIP_CLIENT_CERT", str(client_pem))
    assert _fetched(tmp_path) == BODY


# --------------------------------------------------------------------------- refused, 404, retries, proxy


def test_refused_port_is_retried_a_bounded_number_of_times(vxl_net, tmp_path, monkeypatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(index_http, "_sleep", waits.append)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_free_port()}/simple/")
    monkeypatch.setenv("PIP_RETRIES", "2")
    message = _error(tmp_path)
    assert "connection refused (gave up after 3 attempts)" in message
    assert waits == [0.0, 0.0]
    monkeypatch.delenv("PIP_RETRIES")
    waits.clear()
    assert f"gave up after {index_http.DEFAULT_RETRIES + 1} attempts" in _error(tmp_path)
    assert len(waits) == index_http.DEFAULT_RETRIES


def test_file_not_on_the_index_is_not_found(vxl_net, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", vxl_net.start().url)
    vxl_net.files.clear()
    assert "is not on the package index pip is configured with" in _error(tmp_path)
    # a 404 for the file the page lists: not found, not retried
    vxl_net.files[NAME] = synthetic.Served(BODY, synthetic.sha256(BODY))
    item = index.find_file("vllm", NAME)
    vxl_net.files.clear()
    with pytest.raises(ToolError) as info:
        index.download(item, tmp_path / NAME, synthetic.sha256(BODY))
    print(info.value)
    assert "not found (HTTP 404)" in str(info.value) and "attempts" not in str(info.value)


def test_server_errors_are_retried_until_it_answers(vxl_net, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", vxl_net.start().url)
    vxl_net.fail_first = [503, 503]
    assert _fetched(tmp_path) == BODY
    assert vxl_net.requests == ["/simple/vllm/"] * 3 + [f"/files/{NAME}"]


def test_server_error_that_lasts_names_the_status(vxl_net, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", vxl_net.start().url)
    monkeypatch.setenv("PIP_RETRIES", "1")
    vxl_net.fail_first = [503, 502, 503]
    assert "server error (HTTP 502 Bad Gateway) (gave up after 2 attempts)" in _error(tmp_path)


@pytest.mark.parametrize("how", ["pip's proxy", "http_proxy"])
def test_requests_go_through_the_proxy(how: str, vxl_net, tmp_path, monkeypatch) -> None:
    proxy = vxl_net.start()  # answers for any URL it is asked for, as a proxy would
    target = f"http://127.0.0.1:{_free_port()}/simple/"  # nothing listens there: only the proxy can answer
    monkeypatch.setenv("PIP_INDEX_URL", target)
    monkeypatch.setenv("PIP_PROXY" if how == "pip's proxy" else "http_proxy", proxy.url.removesuffix("/simple/"))
    assert _fetched(tmp_path) == BODY
    assert proxy.requests[0] == target + "vllm/"


# --------------------------------------------------------------------------- pip's configuration


def test_pip_configuration_is_read_once_for_the_index_client_and_uv(vxl_net, monkeypatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "file:///nowhere/simple")
    monkeypatch.setenv("PIP_TRUSTED_HOST", "127.0.0.1")
    runs: list[list[str]] = []
    real = pipconf.subprocess.run

    def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        runs.append(cmd)
        return real(cmd, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(pipconf.subprocess, "run", run)
    pipconf._listing.cache_clear()
    assert index.client().config.trusted_hosts == ("127.0.0.1",)
    assert pipconf.pip_config("install").index_url == "file:///nowhere/simple"
    assert index.pip_index_urls() == ["file:///nowhere/simple"]
    assert len(runs) == 1
    monkeypatch.setenv("PIP_RETRIES", "7")  # another environment: read again
    assert pipconf.pip_config("download").retries == 7 and len(runs) == 2


def test_pips_default_index_comes_from_pip(vxl_net) -> None:
    """The default read from pip's code is the one pip's own help states (a second route, read
    here only: the help is prose, so the tooling does not parse it)."""
    pipconf.pip_default_index_url.cache_clear()
    default = pipconf.pip_default_index_url()
    helped = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--help"], capture_output=True, text=True, check=True
    ).stdout
    stated = re.search(r"--index-url\s.*?\(default\s+(\S+?)\)", helped, re.DOTALL)
    assert stated and default == stated.group(1)
    assert default.startswith("https://") and pipconf.PipConfig().index_urls() == [default]


class _MovedPip:
    """pip's index module as a later pip might have it: no PyPI, or one whose URL is no URL."""

    def __init__(self, simple_url: object = None) -> None:
        if simple_url is not None:
            self.PyPI = types.SimpleNamespace(simple_url=simple_url)


@pytest.mark.parametrize(
    "found,expect",
    [
        (
            ImportError("No module named 'pip._internal.models.index'"),
            "(pip._internal.models.index.PyPI.simple_url: ImportError)",
        ),
        (_MovedPip(), "(pip._internal.models.index.PyPI.simple_url: AttributeError)"),
        (_MovedPip(simple_url=3), "is not a URL: 3"),
    ],
    ids=["module-gone", "name-gone", "not-a-url"],
)
def test_pips_default_index_that_moved_is_one_line(vxl_net, monkeypatch, found: object, expect: str) -> None:
    def import_module(name: str) -> object:
        assert name == "pip._internal.models.index"
        if isinstance(found, Exception):
            raise found
        return found

    pipconf.pip_default_index_url.cache_clear()
    monkeypatch.setattr(pipconf.importlib, "import_module", import_module)
    message = synthetic.tool_error(pipconf.pip_default_index_url)
    assert expect in message and "set PIP_INDEX_URL" in message
    message = synthetic.tool_error(pipconf.PipConfig().index_urls)  # what the index client meets
    assert "set PIP_INDEX_URL" in message
    pipconf.pip_default_index_url.cache_clear()


def test_listed_values_are_read_as_pip_prints_them() -> None:
    listed = "global.index-url='file:///a b'\n:env:.extra-index-url=\"file:///it's\"\nnot a line\n"
    config = pipconf.resolve(listed, "download")
    assert config.index_url == "file:///a b" and config.extra_index_urls == ("file:///it's",)
