"""A stand-in ``vllm`` package for probes of the test-side plugins (what ``cpu_runtime sync`` lays
into the runtime, the series-attention plugins) in a fresh interpreter, without vLLM: the modules a
test gives, every folder a package, and a platform that is CPU unless ``FAKE_PLATFORM`` says
otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

PLATFORM_ENV = "FAKE_PLATFORM"
PLATFORM_MODULE = (
    "import os\n"
    "class _P:\n"
    "    def is_cpu(self):\n"
    f"        return os.environ.get('{PLATFORM_ENV}', 'cpu') == 'cpu'\n"
    "current_platform = _P()\n"
)


def write_fake_vllm(root: Path, modules: Mapping[str, str]) -> Path:
    """``root``/vllm: ``platforms/__init__.py`` (the platform above) and ``modules`` (text by path
    inside the package), every folder with an ``__init__.py``; returns ``root`` (a PYTHONPATH entry)."""
    package = root / "vllm"
    for rel, text in {"platforms/__init__.py": PLATFORM_MODULE, **modules}.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [p for p in package.rglob("*") if p.is_dir()] + [package]:
        (folder / "__init__.py").touch(exist_ok=True)
    return root


def run_probe(
    code: str, path: Sequence[Path], *, drop: Iterable[str] = (), timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` with ``path`` as the whole PYTHONPATH, in this process's environment less
    ``drop`` and any ``FAKE_PLATFORM`` (the probe's own switches), plus ``env``; a non-zero exit
    raises ``subprocess.CalledProcessError``."""
    gone = {*drop, PLATFORM_ENV, "PYTHONPATH"}
    clean = {k: v for k, v in os.environ.items() if k not in gone}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env, "PYTHONPATH": os.pathsep.join(map(str, path))},
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
