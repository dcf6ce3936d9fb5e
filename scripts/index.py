"""Find and download a release file through the package index that pip is configured with.

No index host is written in this repository: the indexes come from pip's own configuration
as ``pip download`` sees it (:mod:`scripts.pipconf`, which also reflects ``PIP_INDEX_URL``),
else pip's built-in default; requests go with pip's network settings (credentials, netrc, CA
bundle, client certificate, trusted hosts, proxies, timeout, retries: :mod:`scripts.index_http`).
Simple-API pages are read as PEP 691 JSON when offered, else as PEP 503 HTML.
"""

from __future__ import annotations

import hashlib
import html.parser
import http.client
import json
import os
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from scripts.errors import ToolError
from scripts.index_http import FetchError, IndexClient, Truncated, redact
from scripts.log import detail, info
from scripts.pipconf import pip_config

_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None


def client() -> IndexClient:
    """An index client with pip's configuration as ``pip download`` sees it."""
    return IndexClient(pip_config("download"))


def pip_index_urls() -> list[str]:
    """Index URLs in pip's order: index-url first (pip's default if unset), then extras."""
    return pip_config("download").index_urls()


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def list_files(index_url: str, project: str, via: IndexClient | None = None) -> list[IndexFile]:
    """Files of ``project`` on one simple index; an empty list when the index lacks it (404)."""
    page = index_url.rstrip("/") + "/" + _normalize(project) + "/"
    if page.startswith("file:"):
        # a local mirror (as pip reads it): a directory per project holding index.html
        local = Path(urllib.request.url2pathname(urllib.parse.urlparse(page).path)) / "index.html"
        if not local.is_file():
            return []
        page = local.as_uri()

    def read(resp: http.client.HTTPResponse) -> tuple[bytes, str]:
        return resp.read(), resp.headers.get("Content-Type", "") if hasattr(resp, "headers") else ""

    try:
        body, ctype = (via or client()).fetch(page, read, accept=f"{_JSON}, text/html;q=0.1")
    except FetchError as exc:
        if exc.status == 404:
            return []
        raise ToolError(f"package index {exc}") from None
    page = redact(page)
    files: list[IndexFile] = []
    if _JSON in ctype:
        for item in json.loads(body)["files"]:
            files.append(
                IndexFile(
                    item["filename"],
                    urllib.parse.urljoin(page, item["url"]),
                    item.get("hashes", {}).get("sha256"),
                    item.get("size"),
                )
            )
        return files
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    for href in parser.links:
        url = urllib.parse.urljoin(page, href)
        path, _, frag = url.partition("#")
        sha = frag[len("sha256=") :] if frag.startswith("sha256=") else None
        files.append(IndexFile(urllib.parse.unquote(path.rsplit("/", 1)[-1]), path, sha, None))
    return files


def find_file(project: str, filename: str) -> IndexFile:
    """Look ``filename`` up on pip's configured indexes, in pip's order. An index that fails
    (network, TLS, authentication, server) is passed over, as pip does; when no index has the
    file, the first such failure is the error."""
    via = client()
    urls = pip_index_urls()
    failures: list[ToolError] = []
    for index_url in urls:
        try:
            listed = list_files(index_url, project, via)
        except ToolError as exc:
            failures.append(exc)
            continue
        for item in listed:
            if item.filename == filename:
                for failure in failures:
                    info(f"passed over: {failure}")
                return item
    if failures:
        more = f" (and {len(failures) - 1} more failing index(es))" if len(failures) > 1 else ""
        raise ToolError(f"{filename}: {failures[0]}{more}")
    raise ToolError(f"{filename} is not on the package index pip is configured with ({len(urls)} index(es) searched)")


def download(item: IndexFile, dest: Path, expected_sha256: str, via: IndexClient | None = None) -> None:
    """Download to ``dest`` with progress; the sha256 is checked before ``dest`` appears."""
    if item.sha256 and item.sha256 != expected_sha256:
        raise ToolError(f"{item.filename}: the index lists sha256 {item.sha256}, the pin says {expected_sha256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f"{dest.name}.{os.getpid()}.part")  # concurrent downloads never share it

    def read(resp: http.client.HTTPResponse) -> tuple[str, int]:
        # from the start on every attempt
        digest = hashlib.sha256()
        got = 0
        started = time.monotonic()
        last = -1
        length = int(resp.headers.get("Content-Length") or 0) if hasattr(resp, "headers") else 0
        total = item.size or length or None
        with open(partial, "wb") as out:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                got += len(chunk)
                if total:
                    pct = got * 100 // total
                    if pct // 10 != last // 10 or pct == 100 and last != 100:
                        last = pct
                        rate = got / max(time.monotonic() - started, 1e-6) / 1e6
                        detail(f"{item.filename}: {pct:3d}% of {total / 1e6:.1f} MB ({rate:.1f} MB/s)")
        if length and got < length:
            raise Truncated(f"{got} of {length} bytes")
        return digest.hexdigest(), got

    try:
        actual, got = (via or client()).fetch(item.url, read)
    except ToolError as exc:
        partial.unlink(missing_ok=True)
        raise ToolError(f"download of {item.filename} failed: {exc}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if actual != expected_sha256:
        partial.unlink(missing_ok=True)
        raise ToolError(
            f"{item.filename}: sha256 mismatch (expected {expected_sha256}, got {actual}, {got} bytes): "
            "tampered or truncated download, nothing was kept"
        )
    os.replace(partial, dest)
