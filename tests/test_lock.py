"""The exclusive lock on build/ (two real processes) and the switch of a rebuilt work tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import synthetic
from scripts import worktree
from scripts.worktree import apply, read_state
from synthetic import ENVS

# holds the lock until its stdin closes; prints "held" once it has it
HOLDER = """
import sys
from pathlib import Path
from scripts.layout import Layout
from scripts.lock import build_lock
with build_lock(Layout(Path.cwd()), "holder-test"):
    print("held", flush=True)
    sys.stdin.read()
"""


def _env(project: synthetic.SyntheticProject) -> dict[str, str]:
    env = dict(os.environ)
    env.update(project.env)
    env.pop("PYTHONPATH", None)
    return env


def _holder(project: synthetic.SyntheticProject) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        cwd=project.root,
        env=_env(project),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held", proc.stderr
    return proc


def _cli(project: synthetic.SyntheticProject, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "scripts", *args],
        cwd=project.root,
        env=_env(project),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("command", ["apply", "export", "build", "rebase"])
def test_no_wait_fails_with_one_line_while_another_process_holds_build(command: str, vxl_project) -> None:
    project = vxl_project
    project.install_cli()
    holder = _holder(project)
    try:
        args = ["--onto", "9.9.10"] if command == "rebase" else []
        proc = project.cli(command, *args, "--no-wait")
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        assert len(errors) == 1 and "is in use by `holder-test`" in errors[0], proc.stderr
        assert not project.tree.exists()  # nothing was done
    finally:
        holder.communicate("")
    # negative control: the same command once the holder is gone is not refused by the lock
    if command == "apply":
        proc = project.cli("apply", "--no-wait")
        assert proc.returncode == 0 and "in use" not in proc.stderr, proc.stderr


def test_second_apply_waits_for_the_first_and_both_succeed(vxl_project) -> None:
    project = vxl_project
    project.install_cli()
    holder = _holder(project)
    waiter = _cli(project, "apply")
    deadline = time.monotonic() + 60
    seen = ""
    assert waiter.stderr is not None
    while "waiting for" not in seen and time.monotonic() < deadline:  # it says whom it waits for
        seen += waiter.stderr.readline()
    assert "waiting for `holder-test`" in seen, seen
    assert waiter.poll() is None and not project.tree.exists()  # still waiting, nothing written
    holder.communicate("")
    _out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, seen + err
    assert read_state(project.tree) is not None


def test_two_concurrent_applies_on_one_checkout(vxl_project) -> None:
    """The issue's race: two rebuilds at once used to die on worktree.new; now they take turns."""
    project = vxl_project
    project.install_cli()
    assert project.cli("apply").returncode == 0
    procs = [_cli(project, "apply", "--force") for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for proc, (_out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0 and "Traceback" not in err, err
    assert read_state(project.tree) is not None
    assert not (project.build / "worktree.new").exists() and not (project.build / "worktree.old").exists()


# --------------------------------------------------------------------------- switching trees


def _mark(tree: Path) -> Path:
    marker = tree / ".git" / "vxl-test-marker"
    marker.write_text("this very directory\n")
    return marker


def _stale(project: synthetic.SyntheticProject) -> None:
    changes = synthetic.default_changes(project.files)
    changes[0].edits[ENVS] = changes[0].edits[ENVS].replace('"VLLM_TOY_XPU", "0"', '"VLLM_TOY_XPU", "1"')
    project.set_patches(changes)


def test_rebuild_switches_in_one_atomic_step(vxl_project, monkeypatch) -> None:
    project = vxl_project
    apply(project.layout())
    marker = _mark(project.tree)
    _stale(project)
    real_replace = os.replace

    def no_rename_of_the_tree(src, dst, *a, **kw):  # the two-rename fallback would move the tree away
        assert Path(src) != project.tree, "the work tree was renamed away instead of exchanged"
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(worktree.os, "replace", no_rename_of_the_tree)
    apply(project.layout())
    assert not marker.exists()  # the new tree is in place
    assert '"VLLM_TOY_XPU", "1"' in (project.tree / ENVS).read_text()
    assert not (project.build / "worktree.new").exists() and not (project.build / "worktree.old").exists()


def test_fallback_switch_killed_between_renames_is_recovered(vxl_project, monkeypatch, capfd) -> None:
    project = vxl_project
    apply(project.layout())
    _stale(project)
    monkeypatch.setattr(worktree, "_exchange", lambda a, b: False)  # a file system without RENAME_EXCHANGE
    real_replace = os.replace
    calls = []

    def killed_after_first_rename(src, dst, *a, **kw):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies between the two renames
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(worktree.os, "replace", killed_after_first_rename)
    with pytest.raises(KeyboardInterrupt):
        apply(project.layout())
    monkeypatch.setattr(worktree.os, "replace", real_replace)
    assert not project.tree.exists()  # the gap the fallback has
    staged = read_state(project.build / "worktree.new")
    assert staged is not None
    _mark(project.build / "worktree.new")
    capfd.readouterr()
    state = apply(project.layout())
    assert "recovered" in capfd.readouterr().err
    assert (
        project.tree / ".git" / "vxl-test-marker"
    ).exists() and state.head == staged.head  # the completed rebuild was kept, not redone
    assert not (project.build / "worktree.old").exists()


def test_previous_tree_is_put_back_when_no_complete_rebuild_exists(vxl_project, capfd) -> None:
    project = vxl_project
    apply(project.layout())
    marker = _mark(project.tree)
    os.replace(project.tree, project.build / "worktree.old")  # killed after the first rename of a rebuild
    (project.build / "worktree.new").mkdir()  # and the staging tree was incomplete (no state)
    capfd.readouterr()
    apply(project.layout())
    err = capfd.readouterr().err
    assert "recovered" in err and "put the previous tree back" in err and "up to date" in err
    assert marker.exists()


def test_no_recovery_on_a_normal_rebuild(vxl_project, capfd) -> None:
    project = vxl_project
    apply(project.layout())
    _stale(project)
    capfd.readouterr()
    apply(project.layout())
    err = capfd.readouterr().err
    assert "is stale; rebuilding" in err and "recovered" not in err


def test_a_dry_run_rebase_does_not_take_the_lock(vxl_project) -> None:
    """--dry-run writes nothing under build/ (not even the lock file), so it never waits."""
    project = vxl_project
    project.install_cli()
    holder = _holder(project)
    try:
        proc = project.cli("rebase", "--onto", "9.9.10", "--dry-run", "--no-wait")
    finally:
        holder.communicate("")
    assert "in use by" not in proc.stderr and "not on the package index" in proc.stderr, proc.stderr
