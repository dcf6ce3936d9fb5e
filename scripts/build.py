"""Build the XPU wheel from the work tree, with the provenance record inside."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from scripts.build_deps import ensure_build_requirements
from scripts.errors import ToolError
from scripts.git import git
from scripts.log import detail, info, step
from scripts.provenance import RECORD_PATH, make_record, version_for
from scripts.source import GIT_EXCLUDE
from scripts.worktree import Layout, load_inputs, read_state, tree_problems

# What `pip wheel --no-build-isolation` needs in the building environment is the patched tree's own
# pyproject.toml [build-system].requires: build() installs it into this interpreter through pip's
# configuration (scripts/build_deps.py, with its one reviewed list of overrides) and pip checks it
# again (--check-build-dependencies), so no stale torch, setuptools or cmake builds the wheel.


def build_env(version: str, epoch: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "VLLM_TARGET_DEVICE": "xpu",
            "VLLM_VERSION_OVERRIDE": version,
            "SOURCE_DATE_EPOCH": str(epoch),
            "CARGO": "/bin/false",  # skip the optional Rust frontend
            "MAX_JOBS": env.get("MAX_JOBS", str(os.cpu_count() or 2)),
            "PIP_NO_INPUT": "1",
            # the building interpreter's scripts (cmake, ninja from pip) before the system ones
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        }
    )
    return env


def pip_wheel_command(out: Path, *options: str) -> list[str]:
    """``pip wheel`` of the tree in the working directory into ``out`` as the series is built: no
    dependencies, no build isolation but pip's check of the tree's [build-system].requires, no cache,
    the limited API of cp38; ``options`` go before ``-w``."""
    return [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--check-build-dependencies",
        "--no-cache-dir",
        *options,
        "-w",
        str(out),
        "--config-settings=--build-option=--py-limited-api=cp38",
        ".",
    ]


def build(layout: Layout | None = None, dist: Path | None = None) -> Path:
    """Build ``dist/vllm-<version>+xpu.<label>-*.whl``; the work tree must be up to date."""
    layout = layout or Layout()
    dist = dist or layout.dist
    inputs = load_inputs(layout)
    tree = layout.worktree
    state = read_state(tree)
    if state is None:
        raise ToolError(f"no work tree at {tree}; run nox -s apply first")
    problem = tree_problems(tree, state)
    if problem:
        raise ToolError(f"{problem}; export or discard it before building")
    if state.input_hash != inputs.input_hash:
        raise ToolError(f"{tree} is stale (patches, overlay or pins changed); run nox -s apply first")
    if "cpu" in inputs.label:
        raise ToolError(f"label {inputs.label} contains 'cpu', which vLLM reads as a CPU build")
    version = version_for(inputs)
    src = layout.build / "wheel-src"
    with step(f"prepare build tree {src} with the provenance record"):
        if src.exists():
            shutil.rmtree(src)
        git(layout.build, "clone", "-q", "--local", str(tree), str(src))
        shutil.copy2(tree / "vllm" / "_version.py", src / "vllm" / "_version.py") if (
            tree / "vllm" / "_version.py"
        ).exists() else None
        (src / ".git" / "info" / "exclude").write_text(GIT_EXCLUDE)
        ensure_build_requirements(src / "pyproject.toml")
        record = make_record(inputs, worktree_head=state.head)
        (src / RECORD_PATH).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        git(src, "add", "--force", RECORD_PATH, "pyproject.toml")  # pyproject.toml: changed by an override only
        epoch = int(git(tree, "log", "-1", "--format=%ct", "HEAD"))
        env_date = {"GIT_AUTHOR_DATE": f"@{epoch} +0000", "GIT_COMMITTER_DATE": f"@{epoch} +0000"}
        git(src, "commit", "-q", "--no-verify", "-m", f"provenance: series {inputs.label}", env=env_date)
    dist.mkdir(parents=True, exist_ok=True)
    out = layout.build / "wheel-out"
    shutil.rmtree(out, ignore_errors=True)
    cmd = pip_wheel_command(out)
    with step(f"pip wheel vllm {version} for VLLM_TARGET_DEVICE=xpu (log: {layout.build / 'wheel-build.log'})"):
        log_path = layout.build / "wheel-build.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                cmd, cwd=src, env=build_env(version, epoch), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if any(
                    k in line
                    for k in (
                        "Building wheel",
                        "Running command",
                        "Created wheel",
                        "-- Build files",
                        "Built target",
                        "error:",
                        "ERROR",
                    )
                ):
                    detail(line.strip()[:160])
            code = proc.wait()
        if code != 0:
            tail = [ln for ln in log_path.read_text().splitlines() if ln.strip()][-1:]
            raise ToolError(f"pip wheel failed (exit {code}); see {log_path}: {tail[0] if tail else ''}")
    wheels = sorted(out.glob("vllm-*.whl"))
    if len(wheels) != 1:
        raise ToolError(f"expected one vllm wheel in {out}, found {len(wheels)}")
    wheel = wheels[0]
    expected_prefix = f"vllm-{version}-"
    if not wheel.name.startswith(expected_prefix):
        raise ToolError(f"built {wheel.name}, expected {expected_prefix}*.whl")
    with zipfile.ZipFile(wheel) as zf:
        if RECORD_PATH not in zf.namelist():
            raise ToolError(f"{wheel.name} lacks {RECORD_PATH}")
    for old in dist.glob("vllm-*.whl"):
        old.unlink()
    final = dist / wheel.name
    shutil.move(str(wheel), final)
    shutil.rmtree(out, ignore_errors=True)
    info(f"built {final} ({final.stat().st_size / 1e6:.1f} MB)")
    return final


__all__ = ["build"]
