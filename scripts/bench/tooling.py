"""Benchmark of the tooling against the raw baseline, measured side by side in one run.

Baseline: ``tar -xzf`` of the cached sdist + ``git apply`` of the same series + copying the
overlay, then ``pip wheel`` of that tree. Tool: cold apply (sdist cached, no pristine repo,
no tree), warm apply (pristine repo cached, no tree), no-op apply (tree up to date), build.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from scripts.build import build, build_env, pip_wheel_command
from scripts.build_deps import ensure_build_requirements
from scripts.errors import ToolError
from scripts.log import info
from scripts.source import cached_sdist, fetch_sdist
from scripts.worktree import Layout, apply, load_inputs


def _time(func: Callable[[], object]) -> float:
    start = time.monotonic()
    func()
    return time.monotonic() - start


def _quiet(func: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        saved = sys.stderr
        with open(os.devnull, "w") as sink:
            sys.stderr = sink
            try:
                return func()
            finally:
                sys.stderr = saved

    return run


def _checked(cmd: list[str], what: str, **kwargs: object) -> None:
    """Run a baseline step quietly; when it fails, one line plus the tail of its output."""
    proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = "\n".join("    " + line for line in proc.stdout.splitlines()[-20:])
        raise ToolError(f"bench: {what} failed (exit {proc.returncode}); last lines of its output:\n{tail}")


def _baseline_prepare(layout: Layout, dest: Path) -> None:
    inputs = load_inputs(layout)
    sdist = cached_sdist(inputs.pins.vllm)
    dest.mkdir(parents=True)
    _checked(["tar", "-xzf", str(sdist), "-C", str(dest), "--strip-components=1"], "baseline tar -xzf")
    for patch in inputs.patches:
        subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch.path)], cwd=dest, check=True)
    for item in inputs.overlay:
        target = dest / item.relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(item.source, target)


def _baseline_wheel(layout: Layout, tree: Path, out: Path) -> None:
    inputs = load_inputs(layout)
    env = build_env(f"{inputs.pins.vllm.version}+xpu.{inputs.label}", 946684800)
    ensure_build_requirements(tree / "pyproject.toml")  # the scratch copy: an override may rewrite it
    _checked(
        pip_wheel_command(out, "-q"),
        "baseline pip wheel (needs the build deps of `nox -s bench`: cmake >= 3.26 on PATH, torch, ...)",
        cwd=tree,
        env=env,
    )


def main(rounds: int = 1) -> None:
    root = Layout().root
    fetch_sdist(load_inputs(Layout()).pins.vllm)  # make sure the download is not part of any timing
    results: dict[str, list[float]] = {
        k: []
        for k in (
            "baseline prepare (tar + git apply)",
            "baseline pip wheel",
            "apply cold",
            "apply warm",
            "apply no-op",
            "build",
        )
    }
    saved_cache = os.environ.get("VXL_CACHE_DIR")
    for number in range(1, rounds + 1):
        info(f"bench round {number}/{rounds}")
        with tempfile.TemporaryDirectory(prefix="vxl-bench-") as tmp:
            tmpdir = Path(tmp)
            base = tmpdir / "baseline"
            results["baseline prepare (tar + git apply)"].append(_time(lambda: _baseline_prepare(Layout(root), base)))
            results["baseline pip wheel"].append(_time(lambda: _baseline_wheel(Layout(root), base, tmpdir / "bw")))
            # cold: a cache holding only the sdist
            cold_cache = tmpdir / "cache"
            sdist = cached_sdist(load_inputs(Layout(root)).pins.vllm)
            seeded = cold_cache / sdist.relative_to(sdist.parents[2])
            seeded.parent.mkdir(parents=True)
            shutil.copyfile(sdist, seeded)
            os.environ["VXL_CACHE_DIR"] = str(cold_cache)
            try:
                layout = Layout(root, build_dir=tmpdir / "build")
                results["apply cold"].append(_time(_quiet(lambda: apply(layout))))
                shutil.rmtree(layout.worktree)
                results["apply warm"].append(_time(_quiet(lambda: apply(layout))))
                results["apply no-op"].append(_time(_quiet(lambda: apply(layout))))
                results["build"].append(_time(_quiet(lambda: build(layout, dist=tmpdir / "dist"))))
            finally:
                if saved_cache is None:
                    os.environ.pop("VXL_CACHE_DIR", None)
                else:
                    os.environ["VXL_CACHE_DIR"] = saved_cache
    med = {k: statistics.median(v) for k, v in results.items()}
    prep = med["baseline prepare (tar + git apply)"]
    wheel = med["baseline pip wheel"]
    rows = [
        ("baseline prepare (tar + git apply)", prep, "1.00x"),
        (
            "apply cold (check + fast-import + checkout + am)",
            med["apply cold"],
            f"{med['apply cold'] / prep:.2f}x of prepare",
        ),
        ("apply warm (pristine repo cached)", med["apply warm"], f"{med['apply warm'] / prep:.2f}x of prepare"),
        ("apply no-op (tree up to date)", med["apply no-op"], f"{med['apply no-op'] / prep:.3f}x of prepare"),
        ("baseline pip wheel", wheel, "1.00x"),
        ("build (clone + provenance + pip wheel)", med["build"], f"{med['build'] / wheel:.2f}x of pip wheel"),
    ]
    print(f"\nmedian of {rounds} round(s), {os.cpu_count()} CPU(s), series {load_inputs(Layout(root)).label}")
    print(f"{'step':<46} {'seconds':>8}  ratio")
    for name, secs, ratio in rows:
        print(f"{name:<46} {secs:8.2f}  {ratio}")
