"""The previous release lines of the series stay buildable: the README's instructions, run as written.

``python -m scripts.old_line build`` clones this repository into a scratch folder, checks out the
last commit of each earlier vLLM line (:data:`LINES`, the commits docs/editing-the-series.md names)
and runs ``nox -s apply build`` there, as a user following the instruction would. It passes when
each clone's ``dist/`` holds exactly one ``vllm-<version>+xpu.*`` wheel. CI runs it.
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

LINES = {
    "0.26.0": "e794f680ad5b8df1e5e425df18b4b61320e31f10",
    "0.32.0": "b4a526471116ae551019b6124238eb4317556cf4",
}
"""The last commit of the series on each earlier vLLM release (docs/editing-the-series.md names them;
a test checks they agree and that each commit carries its release's pins)."""


def instruction(version: str) -> str:
    """The documented instruction that builds the ``version`` line from a clone with history."""
    return f"git checkout {LINES[version][:12]} && nox -s apply build"


def build_old_line(repo: Path, dest: Path, version: str) -> Path:
    """Clone ``repo`` into ``dest``, check out the ``version`` line and build its wheel; returns the wheel."""
    commit = LINES[version]
    if resolve_commit(repo, commit) is None:
        raise ToolError(f"{repo} has no commit {commit[:12]} (a shallow clone?): run `git fetch --unshallow` first")
    clone = dest / f"line-{version}"
    with step(f"clone {repo} into {clone} and check out {commit[:12]} (vLLM {version} series)"):
        if git_live(None, "clone", "--quiet", "--no-checkout", str(repo), str(clone)) != 0:
            raise ToolError(f"git clone {repo} failed")
        if git_live(clone, "checkout", "--quiet", commit) != 0:
            raise ToolError(f"git checkout {commit[:12]} failed in {clone}")
    with step(f"nox -s apply build in {clone} (the documented instruction)"):
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "nox", "-s", "apply", "build"], cwd=clone, check=False)
        if proc.returncode != 0:
            raise ToolError(f"`nox -s apply build` failed (exit {proc.returncode}) on the {version} line")
    wheels = sorted((clone / "dist").glob(f"vllm-{version}+xpu.*.whl"))
    if len(wheels) != 1:
        raise ToolError(f"expected one vllm-{version}+xpu wheel in {clone / 'dist'}, found {len(wheels)}")
    info(f"the {version} line builds: {wheels[0].name} in {time.monotonic() - started:.0f} s")
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(
        prog="python -m scripts.old_line",
        description=__doc__.splitlines()[0],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "build",
        help="clone, check out an earlier line and run `nox -s apply build` there (each line in turn)",
    )
    b.add_argument(
        "--line",
        choices=sorted(LINES),
        action="append",
        default=None,
        help="the vLLM release whose line to build (repeatable; default: every line)",
    )
    b.add_argument("--repo", type=Path, default=REPO_ROOT, help="the repository to clone")
    b.add_argument("--dest", type=Path, default=None, help="scratch folder (default: a new temporary folder)")
    args = parser.parse_args(argv)

    versions = args.line or sorted(LINES)

    def run() -> None:
        for version in versions:
            if args.dest is None:
                with tempfile.TemporaryDirectory(prefix="vxl-old-line-") as tmp:
                    build_old_line(args.repo, Path(tmp), version)
            else:
                args.dest.mkdir(parents=True, exist_ok=True)
                build_old_line(args.repo, args.dest, version)

    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
