"""The patched work tree: pristine upstream commit, one commit per patch, one overlay commit.

``apply`` is idempotent: an up-to-date tree is left alone; a stale one is rebuilt next to the
old one and swapped in only when complete; a tree with uncommitted or unexported work is never
clobbered without ``force``.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from scripts.errors import ToolError
from scripts.git import FIXED_DATE, blob_at, fixed_date_env, git, git_env, is_repo, run_git, status_porcelain
from scripts.layout import Layout
from scripts.log import detail, info, step
from scripts.overlay import OverlayFile, check_against_tree, list_overlay, read_replaces
from scripts.pins import Pins, load_pins
from scripts.series import Patch, load_series
from scripts.source import GIT_EXCLUDE, UNTRACKED, cache_root, fetch_git, fetch_sdist, import_sdist
from scripts.strict import check_patch
from scripts.typed_data import build, read_json

STATE_FILE = "vxl-state.json"
OVERLAY_SUBJECT = "overlay: lay the series' new files"
TOOL_FORMAT = "1"  # bump when the work-tree layout changes


@dataclass(frozen=True)
class Inputs:
    pins: Pins
    patches: list[Patch]
    overlay: list[OverlayFile]
    replaces: dict[str, str]
    input_hash: str

    @property
    def label(self) -> str:
        """Identifies the series in wheel versions; hex only, so it can never contain 'cpu'."""
        return self.input_hash[:12]


@dataclass
class State:
    input_hash: str
    source: str
    pristine: str
    patch_commits: list[str]
    head: str
    format: str = TOOL_FORMAT


def load_inputs(layout: Layout) -> Inputs:
    pins = load_pins(layout.pins)
    patches = load_series(layout.patches)
    overlay = list_overlay(layout.overlay)
    replaces = read_replaces(layout.overlay_manifest)
    digest = hashlib.sha256()
    digest.update(f"format {TOOL_FORMAT}\n".encode())
    for name, data in [("pins.toml", layout.pins.read_bytes()), ("series", (layout.patches / "series").read_bytes())]:
        digest.update(f"{name} {len(data)}\n".encode() + data)
    for patch in patches:
        digest.update(f"patch {patch.name} {len(patch.raw)}\n".encode() + patch.raw)
    for item in overlay:
        data = item.read()
        digest.update(f"overlay {item.relpath} {len(data)}\n".encode() + data)
    if layout.overlay_manifest.exists():
        digest.update(b"overlay.toml\n" + layout.overlay_manifest.read_bytes())
    return Inputs(pins, patches, overlay, replaces, digest.hexdigest())


def state_path(tree: Path) -> Path:
    """The tool's record of what a work tree was made from (kept inside its .git)."""
    return tree / ".git" / STATE_FILE


def read_state(tree: Path) -> State | None:
    """The tree's state, None when it has no state file; a malformed one is one
    :class:`ToolError` line naming the file and the field (:mod:`scripts.typed_data`)."""
    path = state_path(tree)
    if not path.exists():
        return None
    return build(State, read_json(path, "work-tree state"), str(path))


def _complete(tree: Path) -> bool:
    """Whether ``tree`` holds a readable state (written last, so the tree was built completely)."""
    try:
        return tree.is_dir() and read_state(tree) is not None
    except ToolError:
        return False


def write_state(tree: Path, state: State) -> None:
    state_path(tree).write_text(json.dumps(asdict(state), indent=2) + "\n")


def tree_problems(tree: Path, state: State | None) -> str | None:
    """Why rebuilding ``tree`` would lose work, or None when it is safe."""
    if not is_repo(tree) or state is None:
        return f"{tree} exists but was not made by this tool"
    dirty = status_porcelain(tree)
    if dirty:
        return f"{tree} has {len(dirty)} uncommitted change(s) (first: {dirty[0].strip()})"
    head = git(tree, "rev-parse", "HEAD")
    if head != state.head:
        count = (
            git(tree, "rev-list", "--count", f"{state.head}..HEAD")
            if run_git(tree, "cat-file", "-e", state.head, check=False).returncode == 0
            else "?"
        )
        return f"{tree} has {count} commit(s) not exported to patches/ (HEAD moved from {state.head[:12]})"
    return None


def keep_work_advice(problem: str) -> str:
    """What to do about ``tree_problems``' answer: steps that work, in order."""
    if "uncommitted" in problem:
        return (
            "to keep it, commit it in the work tree (git commit --fixup <patch commit>, or a new commit for a "
            "new patch), then nox -s export; or pass --force to discard it"
        )
    return "to keep it, nox -s export; or pass --force to discard it"


def pristine_message(pins: Pins, described: str) -> str:
    return f"upstream vLLM {pins.vllm.version} ({pins.vllm.commit}) pristine\n\nSource: {described}\n"


def _pristine_cache(pins: Pins, source: str) -> Path:
    key = pins.vllm.sdist_sha256 if source == "sdist" else pins.vllm.commit
    return cache_root() / "pristine" / f"{pins.vllm.version}-{source}-{key[:16]}.git"


def pristine_repo(pins: Pins, source: str, offline: bool) -> Path:
    """A cached bare repo whose ``pristine`` branch is the upstream tree as one reproducible commit."""
    cached = _pristine_cache(pins, source)
    if (cached / "refs" / "heads" / "pristine").exists() or (
        cached.exists() and run_git(cached, "rev-parse", "--verify", "--quiet", "pristine", check=False).returncode == 0
    ):
        detail(f"cached pristine upstream {cached.name}")
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent, prefix=".pristine-") as tmp:
        if source == "sdist":
            bare = Path(tmp) / "bare.git"
            archive = fetch_sdist(pins.vllm, offline=offline)
            with step(f"check {archive.name} and import it as the pristine commit"):
                git(Path(tmp), "init", "-q", "--bare", str(bare))
                described = f"sdist {archive.name} sha256 {pins.vllm.sdist_sha256}"
                version = import_sdist(
                    archive, bare, pins.vllm, pristine_message(pins, described), git_env(_fast_import_date())
                )
                if version is not None:
                    (bare / "vllm_version.py").write_bytes(version)
            _publish(bare, cached)
            return cached
        if source != "git":
            raise ToolError(f"unknown --source {source!r} (choose sdist or git)")
        src = Path(tmp) / "src"
        full = fetch_git(pins.vllm, src, offline=offline)
        described = f"git {pins.vllm.git_url} commit {full}"
        with step(f"commit pristine vLLM {pins.vllm.version} ({sum(1 for _ in src.rglob('*'))} paths)"):
            git(src, "init", "-q", "-b", "pristine")
            (src / ".git" / "info" / "exclude").write_text(GIT_EXCLUDE)
            git(src, "add", "--all", "--force", ".")
            run_git(src, "rm", "-r", "-q", "--cached", "--ignore-unmatch", *(p.rstrip("/") for p in UNTRACKED))
            git(src, "commit", "-q", "--no-verify", "-m", pristine_message(pins, described), env=fixed_date_env())
            bare = Path(tmp) / "bare.git"
            git(Path(tmp), "clone", "-q", "--bare", "--no-local", str(src), str(bare))  # packed, not loose
            # keep _version.py: the sdist's copy names the commit and the build rewrites it
            version_file = src / "vllm" / "_version.py"
            if version_file.exists():
                shutil.copy2(version_file, bare / "vllm_version.py")
            _publish(bare, cached)
    return cached


def _fast_import_date() -> dict[str, str]:
    """FIXED_DATE in fast-import's raw format, so the pristine commit id is reproducible."""
    from datetime import datetime

    stamp = int(datetime.strptime(FIXED_DATE, "%Y-%m-%dT%H:%M:%S%z").timestamp())
    return {"GIT_COMMITTER_DATE": f"{stamp} +0000"}


def _publish(bare: Path, cached: Path) -> None:
    try:
        os.replace(bare, cached)
    except OSError:
        # another process filled the cache first: use its entry when it is complete
        if run_git(cached, "rev-parse", "--verify", "--quiet", "pristine", check=False).returncode != 0:
            raise ToolError(f"cache entry {cached} is incomplete; remove it and retry") from None


def _checkout_pristine(cached: Path, dest: Path) -> str:
    git(dest.parent, "clone", "-q", "--no-checkout", "--local", "--branch", "pristine", str(cached), str(dest))
    (dest / ".git" / "info" / "exclude").write_text(GIT_EXCLUDE)
    # parallel checkout: writing ~7k files is the slowest step of a warm apply
    git(dest, "-c", "checkout.workers=0", "checkout", "-q", "-B", "main", "pristine")
    git(dest, "remote", "remove", "origin")
    version = cached / "vllm_version.py"
    if version.exists():
        shutil.copy2(version, dest / "vllm" / "_version.py")
    return git(dest, "rev-parse", "HEAD")


def apply_patch(tree: Path, patch: Patch) -> str:
    """Strict check, then ``git am`` (author, date and message from the patch); returns the commit."""
    check_patch(
        patch,
        blob_of=lambda p: blob_at(tree, "HEAD", p),
        read=lambda p: (tree / p).read_bytes() if (tree / p).is_file() else None,
    )
    proc = run_git(
        tree,
        "am",
        "--keep",
        "--keep-non-patch",
        "--committer-date-is-author-date",
        "--whitespace=nowarn",
        "--quiet",
        str(patch.path),
        check=False,
    )
    if proc.returncode != 0:
        run_git(tree, "am", "--abort", check=False)
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        raise ToolError(f"{patch.name} does not apply: {lines[0] if lines else 'git am failed'}")
    return git(tree, "rev-parse", "HEAD")


def lay_overlay(tree: Path, inputs: Inputs) -> None:
    check_against_tree(inputs.overlay, inputs.replaces, lambda p: blob_at(tree, "HEAD", p))
    if not inputs.overlay:
        return
    for item in inputs.overlay:
        dest = tree / item.relpath
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(item.source, dest)
        os.chmod(dest, 0o755 if os.access(item.source, os.X_OK) else 0o644)
    git(tree, "add", "--force", "--", *[i.relpath for i in inputs.overlay])
    body = "\n".join(f"  {i.relpath}" for i in inputs.overlay)
    git(
        tree,
        "commit",
        "-q",
        "--no-verify",
        "--allow-empty",
        "-m",
        f"{OVERLAY_SUBJECT}\n\n{body}\n",
        env=fixed_date_env(),
    )


def build_tree(inputs: Inputs, dest: Path, source: str, offline: bool) -> State:
    cached = pristine_repo(inputs.pins, source, offline)
    with step(f"check out pristine upstream into {dest}"):
        pristine = _checkout_pristine(cached, dest)
    commits = []
    with step(f"apply {len(inputs.patches)} patch(es) strictly (no fuzz, no offset)"):
        for number, patch in enumerate(inputs.patches, 1):
            commits.append(apply_patch(dest, patch))
            detail(f"[{number}/{len(inputs.patches)}] {patch.name}")
    with step(f"lay {len(inputs.overlay)} overlay file(s)"):
        lay_overlay(dest, inputs)
    state = State(
        input_hash=inputs.input_hash,
        source=source,
        pristine=pristine,
        patch_commits=commits,
        head=git(dest, "rev-parse", "HEAD"),
    )
    write_state(dest, state)
    return state


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the platform or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(code, os.strerror(code), str(a))


def _switch_in(staging: Path, tree: Path, old: Path) -> None:
    """Make the complete ``staging`` tree the work tree; ``tree`` is never missing for a moment where
    the atomic exchange works, and :func:`recover_interrupted_switch` repairs the fallback's gap."""
    if not tree.exists():
        os.replace(staging, tree)
    elif _exchange(staging, tree):
        shutil.rmtree(staging)  # now the previous tree
    else:
        shutil.rmtree(old, ignore_errors=True)
        os.replace(tree, old)
        # killed here: no work tree; the next run's recover_interrupted_switch puts one back
        os.replace(staging, tree)
        shutil.rmtree(old, ignore_errors=True)


def recover_interrupted_switch(layout: Layout) -> str | None:
    """Repair what a run killed while switching trees left; returns (and prints) what it did."""
    tree, staging, old = layout.worktree, layout.staging, layout.build / "worktree.old"
    message = None
    if not tree.exists():
        if _complete(staging):
            os.replace(staging, tree)
            message = f"recovered {tree}: a run was interrupted while switching in its completed rebuild; kept that"
        elif _complete(old):
            os.replace(old, tree)
            message = f"recovered {tree}: a run was interrupted while switching trees; put the previous tree back"
    if tree.exists() and old.exists():
        shutil.rmtree(old, ignore_errors=True)
    if message:
        info(message)
    return message


def apply(layout: Layout | None = None, force: bool = False, source: str = "sdist", offline: bool = False) -> State:
    """Make ``build/worktree`` match pins + series + overlay (a no-op when it already does)."""
    layout = layout or Layout()
    inputs = load_inputs(layout)
    tree = layout.worktree
    recover_interrupted_switch(layout)
    info(
        f"series {inputs.label}: vLLM {inputs.pins.vllm.version}, {len(inputs.patches)} patch(es), "
        f"{len(inputs.overlay)} overlay file(s)"
    )
    if tree.exists():
        try:
            state = read_state(tree)
        except ToolError as exc:
            if not force:
                raise ToolError(f"{exc}; pass --force to rebuild {tree}") from None
            state = None
        problem = tree_problems(tree, state)
        if problem and not force:
            raise ToolError(f"{problem}; {keep_work_advice(problem)}")
        if problem is None and state is not None and state.input_hash == inputs.input_hash and state.source == source:
            info(f"{tree} is up to date (HEAD {state.head[:12]}); nothing to do")
            return state
        if problem:
            info(f"--force: discarding {problem}")
        else:
            info(f"{tree} is stale; rebuilding")
    layout.build.mkdir(parents=True, exist_ok=True)
    staging = layout.staging
    if staging.exists():
        shutil.rmtree(staging)
    try:
        state = build_tree(inputs, staging, source, offline)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _switch_in(staging, tree, layout.build / "worktree.old")
    info(f"{tree} ready at {state.head[:12]}")
    return state
