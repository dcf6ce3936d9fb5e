"""The previous release line of the series stays buildable: the README's instruction, run as written.

``python -m scripts.old_line build`` clones this repository into a scratch folder, checks out the
last commit of the vLLM 0.26.0 series (:data:`LAST_0_26_0_COMMIT`, the commit the README names)
and runs ``nox -s apply build`` there, as a user following the README would. It passes when the
clone's ``dist/`` holds exactly one ``vllm-0.26.0+xpu.*`` wheel. CI runs it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts import REPO_ROOT
from scripts.cli import ToolParser
from scripts.errors import ToolError, exit_status
from scripts.git import git_live, resolve_commit
from scripts.log import info, step

OLD_VERSION = "0.26.0"
LAST_0_26_0_COMMIT = "e794f680ad5b8df1e5e425df18b4b61320e31f10"
"""The last commit of the series on vLLM 0.26.0 (the README names it; a test checks they agree)."""
INSTRUCTION = f"git checkout {LAST_0_26_0_COMMIT[:12]} && nox -s apply build"


def build_old_line(repo: Path, dest: Path) -> Path:
    """Clone ``repo`` into ``dest``, check out the 0.26.0 line and build its wheel; returns the wheel."""
    if resolve_commit(repo, LAST_0_26_0_COMMIT) is None:
        raise ToolError(
            f"{repo} has no commit {LAST_0_26_0_COMMIT[:12]} (a shallow clone?): run `git fetch --unshallow` first"
        )
    clone = dest / "old-line"
    with step(f"clone {repo} into {clone} and check out {LAST_0_26_0_COMMIT[:12]} (vLLM {OLD_VERSION} series)"):
        if git_live(None, "clone", "--quiet", "--no-checkout", str(repo), str(clone)) != 0:
            raise ToolError(f"git clone {repo} failed")
        if git_live(clone, "checkout", "--quiet", LAST_0_26_0_COMMIT) != 0:
            raise ToolError(f"git checkout {LAST_0_26_0_COMMIT[:12]} failed in {clone}")
    with step(f"nox -s apply build in {clone} (the README's instruction)"):
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "nox", "-s", "apply", "build"], cwd=clone, check=False)
        if proc.returncode != 0:
            raise ToolError(f"`nox -s apply build` failed (exit {proc.returncode}) on the {OLD_VERSION} line")
    wheels = sorted((clone / "dist").glob(f"vllm-{OLD_VERSION}+xpu.*.whl"))
    if len(wheels) != 1:
        raise ToolError(f"expected one vllm-{OLD_VERSION}+xpu wheel in {clone / 'dist'}, found {len(wheels)}")
    info(f"the {OLD_VERSION} line builds: {wheels[0].name} in {time.monotonic() - started:.0f} s")
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(
        prog="python -m scripts.old_line",
        description=__doc__.splitlines()[0],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "build",
        help=f"clone, check out the {OLD_VERSION} line and run `nox -s apply build` there",
    )
    b.add_argument("--repo", type=Path, default=REPO_ROOT, help="the repository to clone")
    b.add_argument("--dest", type=Path, default=None, help="scratch folder (default: a new temporary folder)")
    args = parser.parse_args(argv)

    def run() -> None:
        if args.dest is None:
            with tempfile.TemporaryDirectory(prefix="vxl-old-line-") as tmp:
                build_old_line(args.repo, Path(tmp))
        else:
            args.dest.mkdir(parents=True, exist_ok=True)
            build_old_line(args.repo, args.dest)

    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
