"""Find and download a release file through the package index that pip is configured with.

No index host is written in this repository: the index comes from pip's own configuration
(``pip config list``, which also reflects ``PIP_INDEX_URL``) and falls back to pip's built-in
default. Simple-API pages are read as PEP 691 JSON when offered, else as PEP 503 HTML.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from scripts.errors import ToolError
from scripts.log import detail

_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None


def pip_index_urls() -> list[str]:
    """Index URLs in pip's order: index-url first (pip's default if unset), then extras."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    index: str | None = None
    extras: list[str] = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        value = value.strip().strip("'\"")
        if key.endswith(".index-url") and not key.endswith("extra-index-url"):
            # the environment (PIP_INDEX_URL) overrides configuration files
            if index is None or key.startswith(":env:"):
                index = value.split()[0]
        elif key.endswith(".extra-index-url"):
            extras.extend(value.split())
    if index is None:
        from pip._internal.models.index import PyPI  # pip's own default, not a literal here

        index = PyPI.simple_url
    seen: list[str] = []
    for url in [index, *extras]:
        if url not in seen:
            seen.append(url)
    return seen


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


def list_files(index_url: str, project: str) -> list[IndexFile]:
    """Files of ``project`` on one simple index; an empty list when the index lacks it."""
    page = index_url.rstrip("/") + "/" + _normalize(project) + "/"
    if page.startswith("file:"):
        # a local mirror (as pip reads it): a directory per project holding index.html
        local = Path(urllib.request.url2pathname(urllib.parse.urlparse(page).path)) / "index.html"
        if not local.is_file():
            return []
        page = local.as_uri()
    request = urllib.request.Request(page, headers={"Accept": f"{_JSON}, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            body = resp.read()
            ctype = resp.headers.get("Content-Type", "") if hasattr(resp, "headers") else ""
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise ToolError(f"package index {index_url} answered HTTP {exc.code} for {project}") from None
    except (urllib.error.URLError, OSError):
        return []
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
    """Look ``filename`` up on pip's configured indexes, in pip's order."""
    urls = pip_index_urls()
    for index_url in urls:
        for item in list_files(index_url, project):
            if item.filename == filename:
                return item
    raise ToolError(f"{filename} is not on the package index pip is configured with ({len(urls)} index(es) searched)")


def download(item: IndexFile, dest: Path, expected_sha256: str) -> None:
    """Download to ``dest`` with progress; the sha256 is checked before ``dest`` appears."""
    if item.sha256 and item.sha256 != expected_sha256:
        raise ToolError(f"{item.filename}: the index lists sha256 {item.sha256}, the pin says {expected_sha256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f"{dest.name}.{os.getpid()}.part")  # concurrent downloads never share it
    digest = hashlib.sha256()
    got = 0
    started = time.monotonic()
    last = -1
    try:
        with urllib.request.urlopen(item.url, timeout=120) as resp, open(partial, "wb") as out:
            total = item.size or int(resp.headers.get("Content-Length") or 0) or None
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
    except (urllib.error.URLError, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise ToolError(f"download of {item.filename} failed: {exc}") from None
    actual = digest.hexdigest()
    if actual != expected_sha256:
        partial.unlink(missing_ok=True)
        raise ToolError(
            f"{item.filename}: sha256 mismatch (expected {expected_sha256}, got {actual}, {got} bytes): "
            "tampered or truncated download, nothing was kept"
        )
    os.replace(partial, dest)
