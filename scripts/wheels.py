"""Wheels through pip's configured index: download one (no deps) into a cache, read its Requires-Dist.

Shared by the CPU runtime install (:mod:`scripts.cpu_runtime`) and the rebase's ``[cpu_runtime]``
update (:mod:`scripts.rebase.pins_update`).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from scripts.errors import ToolError
from scripts.log import detail


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
