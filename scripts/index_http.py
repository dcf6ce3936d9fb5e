"""HTTP for the index client, with pip's network configuration (:class:`scripts.pipconf.PipConfig`).

What pip honours, honoured here (stdlib only):

- credentials: ``user:password@`` in an index or find-links URL, sent to that host and port
  (never to another host a redirect leads to); else the host's entry in the netrc file
  (``NETRC``, else ``~/.netrc``, as pip's HTTP library looks it up);
- TLS: pip's ``cert`` as the CA bundle (else ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE``, else
  the default store, which ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` change); ``client-cert``;
  ``trusted-host`` skips verification for that host (and port) only;
- proxies: pip's ``proxy`` for http and https, else ``http_proxy`` / ``https_proxy`` /
  ``no_proxy`` from the environment;
- ``timeout`` and ``retries``: a transient failure (connection refused or reset, a timeout,
  HTTP 429/5xx) is tried again up to ``retries`` times with a doubling backoff; the others
  (TLS, 401/403, 404, an unknown host) fail at once.

A failure is a :class:`FetchError`: one line with the URL, its credentials removed, and the cause.
"""

from __future__ import annotations

import base64
import http.client
import netrc
import os
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TypeVar

from scripts.errors import ToolError
from scripts.pipconf import PipConfig

T = TypeVar("T")

DEFAULT_RETRIES = 3  # when pip's configuration sets none (pip's own default is 5)
DEFAULT_TIMEOUT_S = 60.0
RETRY_BACKOFF_S = 0.5  # before the first retry; doubled before each next one
_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504, 520, 527})  # pip's HTTP library retries these too
_sleep = time.sleep


def redact(url: str) -> str:
    """``url`` without its ``user:password@`` part (what every message shows)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def url_credentials(url: str) -> tuple[str, str] | None:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return None
    return urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")


def netrc_credentials(host: str) -> tuple[str, str] | None:
    """``host``'s login and password in the netrc file (``NETRC``, else the first of ``~/.netrc``
    and ``~/_netrc`` that exists)."""
    candidates = [os.environ["NETRC"]] if os.environ.get("NETRC") else ["~/.netrc", "~/_netrc"]
    for candidate in candidates:
        path = os.path.expanduser(candidate)
        if not os.path.isfile(path):
            continue
        try:
            found = netrc.netrc(path).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            return None
        return (found[0], found[2] or "") if found else None
    return None


class FetchError(ToolError):
    """A request that failed: ``status`` is the HTTP status (None for a network or TLS failure)."""

    def __init__(self, url: str, cause: str, status: int | None, attempts: int) -> None:
        tries = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{redact(url)}: {cause}{tries}")
        self.url = redact(url)
        self.cause = cause
        self.status = status
        self.attempts = attempts


def _classify(
    exc: BaseException, timeout: float, sent_credentials: bool, client_cert: bool
) -> tuple[str, int | None, bool]:
    """(cause in words, HTTP status, whether trying again may help) of one failed attempt."""
    if isinstance(exc, urllib.error.HTTPError):
        code = exc.code
        if code == 401:
            hint = (
                "the credentials sent were refused"
                if sent_credentials
                else "no credentials were sent: give them in the index URL (user:password@) or in ~/.netrc"
            )
            return f"authentication failed (HTTP 401 Unauthorized): {hint}", code, False
        if code == 403:
            return "access denied (HTTP 403 Forbidden): authentication or permission refused", code, False
        if code == 404:
            return "not found (HTTP 404)", code, False
        if code == 407:
            return "the proxy requires authentication (HTTP 407)", code, False
        if code in _TRANSIENT_STATUS:
            return f"server error (HTTP {code} {exc.reason})", code, True
        return f"HTTP {code} {exc.reason}", code, False
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (
            f"TLS certificate verification failed ({reason.verify_message}): pip's `cert` names the CA "
            "bundle to trust, `trusted-host` skips verification for a host",
            None,
            False,
        )
    if isinstance(reason, ssl.SSLError):
        hint = "" if client_cert else ": if the server wants a client certificate, pip's `client-cert` gives it"
        return f"TLS failure ({reason.reason or reason}){hint}", None, False
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused", None, True
    if isinstance(reason, TimeoutError):
        return f"timed out after {timeout:g} s", None, True
    if isinstance(reason, socket.gaierror):
        return f"host name not resolved ({reason.strerror})", None, False
    if isinstance(reason, (ConnectionError, http.client.HTTPException)):
        return f"connection reset or closed early ({reason or type(reason).__name__})", None, True
    if isinstance(reason, FileNotFoundError):
        return "not found", 404, False
    if isinstance(reason, OSError):
        return f"network error ({reason.strerror or reason})", None, False
    return str(reason), None, False


class Truncated(http.client.HTTPException):
    """The server closed the connection before the body's Content-Length was read."""


class _Auth(urllib.request.BaseHandler):
    """Basic authentication for the hosts that have credentials, sent with the first request."""

    def __init__(self, lookup: Callable[[str], tuple[str, str] | None]) -> None:
        self._lookup = lookup

    def http_request(self, req: urllib.request.Request) -> urllib.request.Request:
        found = self._lookup(urllib.parse.urlsplit(req.full_url).netloc)
        if found and not req.has_header("Authorization"):
            token = base64.b64encode(f"{found[0]}:{found[1]}".encode()).decode()
            # unredirected: a redirect to another host does not carry it
            req.add_unredirected_header("Authorization", f"Basic {token}")
        return req

    https_request = http_request


class _Https(urllib.request.HTTPSHandler):
    """HTTPS with the TLS settings of the target host (trusted hosts unverified)."""

    def __init__(self, context_for: Callable[[str], ssl.SSLContext]) -> None:
        super().__init__()
        self._context_for = context_for

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        context = self._context_for(urllib.parse.urlsplit(req.full_url).netloc)
        return self.do_open(http.client.HTTPSConnection, req, context=context)  # type: ignore[no-any-return]


class IndexClient:
    """GETs with pip's network configuration, bounded retries and one-line failures."""

    def __init__(self, config: PipConfig) -> None:
        self.config = config
        self.timeout = config.timeout or DEFAULT_TIMEOUT_S
        self.retries = DEFAULT_RETRIES if config.retries is None else max(config.retries, 0)
        self._given: dict[str, tuple[str, str]] = {}
        self._netrc: dict[str, tuple[str, str] | None] = {}
        self._contexts: dict[bool, ssl.SSLContext] = {}
        for url in [config.index_url or "", *config.extra_index_urls, *config.find_links]:
            self._remember(url)
        proxies = {"http": config.proxy, "https": config.proxy} if config.proxy else None  # None: environment
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler(proxies), _Auth(self.credentials), _Https(self.ssl_context)
        )

    def _remember(self, url: str) -> None:
        found = url_credentials(url)
        if found:
            self._given.setdefault(urllib.parse.urlsplit(redact(url)).netloc.lower(), found)

    def credentials(self, netloc: str) -> tuple[str, str] | None:
        """What is sent to ``netloc``: credentials from a configured URL, else the netrc entry."""
        netloc = netloc.lower()
        if netloc in self._given:
            return self._given[netloc]
        if netloc not in self._netrc:
            self._netrc[netloc] = netrc_credentials(urllib.parse.urlsplit(f"//{netloc}").hostname or netloc)
        return self._netrc[netloc]

    def trusted(self, netloc: str) -> bool:
        host = urllib.parse.urlsplit(f"//{netloc}").hostname or netloc
        return any(entry.lower() in (netloc.lower(), host) for entry in self.config.trusted_hosts)

    def ssl_context(self, netloc: str) -> ssl.SSLContext:
        return self._context(verify=not self.trusted(netloc))

    def _context(self, verify: bool) -> ssl.SSLContext:
        if verify not in self._contexts:
            self._contexts[verify] = self._new_context(verify)
        return self._contexts[verify]

    def _new_context(self, verify: bool) -> ssl.SSLContext:
        bundle = self.config.cert or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        try:
            if not verify:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            elif bundle and os.path.isdir(bundle):
                context = ssl.create_default_context(capath=bundle)
            else:
                context = ssl.create_default_context(cafile=bundle or None)
        except (OSError, ssl.SSLError) as exc:
            raise ToolError(f"pip's cert {bundle}: cannot load the CA bundle ({exc})") from None
        if self.config.client_cert:
            try:
                context.load_cert_chain(self.config.client_cert)
            except (OSError, ssl.SSLError) as exc:
                raise ToolError(f"pip's client-cert {self.config.client_cert}: cannot load it ({exc})") from None
        return context

    def _proxy_note(self, url: str) -> str:
        parts = urllib.parse.urlsplit(url)
        proxy = self.config.proxy or urllib.request.getproxies().get(parts.scheme)
        if not proxy or parts.scheme not in ("http", "https") or urllib.request.proxy_bypass(parts.hostname or ""):
            return ""
        return f" through proxy {redact(proxy)}"

    def fetch(self, url: str, read: Callable[[http.client.HTTPResponse], T], accept: str | None = None) -> T:
        """GET ``url`` and return ``read(response)``; a transient failure, also one while
        ``read`` runs, starts the request again (``read`` must start over)."""
        self._remember(url)
        clean = redact(url)
        attempt = 0
        while True:
            attempt += 1
            request = urllib.request.Request(clean, headers={"Accept": accept} if accept else {})
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    return read(response)
            except (OSError, http.client.HTTPException) as exc:  # URLError, HTTPError, ssl errors are OSErrors
                sent = self.credentials(urllib.parse.urlsplit(clean).netloc) is not None
                cause, status, transient = _classify(exc, self.timeout, sent, bool(self.config.client_cert))
                if not transient or attempt > self.retries:
                    raise FetchError(clean, cause + self._proxy_note(clean), status, attempt) from None
                _sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))
