"""The command line, ``python -m scripts ...``, run as a subprocess on a synthetic repository:
success exits 0; every expected failure exits non-zero with one ``error:`` line, no traceback.

The CLI always works on the repository that holds its ``scripts/`` package, so each test copies
``scripts/`` into the synthetic root (``SyntheticProject.install_cli``).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

import synthetic
from synthetic import ENVS, Change, Member

NAME = f"vllm-{synthetic.VERSION}.tar.gz"


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def _error(proc: subprocess.CompletedProcess[str], expect: str, code: int = 1) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == errors[0], proc.stderr
    assert expect in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def vxl_cli(vxl_project) -> synthetic.SyntheticProject:
    vxl_project.install_cli()
    return vxl_project


@pytest.fixture
def vxl_cold_cli(vxl_cold_project) -> synthetic.SyntheticProject:
    vxl_cold_project.install_cli()
    return vxl_cold_project


def test_help_lists_the_commands(vxl_cli) -> None:
    proc = vxl_cli.cli("--help")
    assert proc.returncode == 0
    for command in ("apply", "export", "lint", "build", "verify"):
        assert command in proc.stdout


def test_apply_then_noop_then_export_check(vxl_cold_cli) -> None:
    project = vxl_cold_cli
    err = _ok(project.cli("apply"))
    assert "100%" in err and "==> apply finished in" in err
    assert project.tree.is_dir() and project.index.downloads() == [f"/files/{NAME}"]
    head = project.head()
    start = time.monotonic()
    err = _ok(project.cli("apply"))
    took = time.monotonic() - start
    assert "up to date" in err and project.head() == head
    assert took < 5.0, f"no-op apply via the CLI took {took:.1f}s"
    assert "export is a fixpoint" in _ok(project.cli("export", "--check"))
    assert "lint: clean" in _ok(project.cli("lint"))
    _ok(project.cli("apply", "--offline"))


def _write_pins(text_of: Callable[[synthetic.SyntheticProject], str]) -> Callable[[synthetic.SyntheticProject], None]:
    return lambda p: (p.root / "pins.toml").write_text(text_of(p))


def _tamper(p: synthetic.SyntheticProject) -> None:
    p.index.serve(NAME, synthetic.make_sdist(dict(p.files, **{"vllm/utils.py": "evil = 1\n"})), listed_sha256=p.sha)


def _truncate(p: synthetic.SyntheticProject) -> None:
    p.index.serve(NAME, p.sdist[:300], listed_sha256=None)


def _wrong_commit(p: synthetic.SyntheticProject) -> None:
    p.set_upstream(dict(p.files, **{"vllm/_version.py": synthetic.version_py("fedcba9")}), seed=False)


def _unsafe_archive(p: synthetic.SyntheticProject) -> None:
    evil = synthetic.make_sdist(extra=[Member(f"vllm-{synthetic.VERSION}/vllm/x", kind="symlink", link="/etc")])
    p.sdist = evil
    p.write_pins()
    p.index.serve(NAME, evil, listed_sha256=synthetic.sha256(evil))


def _conflict(p: synthetic.SyntheticProject) -> None:
    base = p.patched_files()
    base[ENVS] = base[ENVS].replace('"VLLM_TOY_20", "20"', '"VLLM_TOY_20", "twenty"')
    p.add_patch(
        Change("envs: conflict", {ENVS: base[ENVS].replace('"VLLM_TOY_21", "21"', '"VLLM_TOY_21", "x"')}), base, 3
    )


def _malformed_series(p: synthetic.SyntheticProject) -> None:
    (p.patches / "series").write_text((p.patches / "series").read_text() + "oops.patch\n")


def _not_a_patch(p: synthetic.SyntheticProject) -> None:
    p.patch_file(2).write_text("just some text\n")


def _unsafe_patch_path(p: synthetic.SyntheticProject) -> None:
    p.edit_patch(1, lambda text: synthetic.moved_path(text, ENVS, "../x"))


def _shadow(p: synthetic.SyntheticProject) -> None:
    p.write_overlay({"vllm/utils.py": "shadow\n"})


def _manifest_drift(p: synthetic.SyntheticProject) -> None:
    p.write_overlay({"vllm/utils.py": "shadow\n"})
    (p.root / "overlay.toml").write_text(f'[replaces]\n"vllm/utils.py" = "{"3" * 40}"\n')


def _drift(p: synthetic.SyntheticProject) -> None:
    original = dict(p.files)
    p.set_upstream(dict(original, **{ENVS: synthetic.envs_py(tail="# later upstream line")}), seed=False)
    p.set_patches(synthetic.default_changes(original), base=original)


def _offset_only(p: synthetic.SyntheticProject) -> None:
    p.edit_patch(1, lambda text: synthetic.replace_first(text, synthetic.HUNK_HEADER, synthetic.hunk_moved(start=1)))


def _creates_existing(p: synthetic.SyntheticProject) -> None:
    base = p.patched_files()
    del base["vllm/utils.py"]
    p.add_patch(Change("add utils", {"vllm/utils.py": "x = 1\n"}), base, 3)


def _series_duplicate(p: synthetic.SyntheticProject) -> None:
    names = p.series_names()
    p.write_series(names + names[:1])


def _series_missing_file(p: synthetic.SyntheticProject) -> None:
    p.patch_file(2).unlink()


def _patch_without_diff(p: synthetic.SyntheticProject) -> None:
    p.edit_patch(2, lambda text: text[: text.index("diff --git ")])


def _archive(*extra: Member) -> Callable[[synthetic.SyntheticProject], None]:
    def setup(p: synthetic.SyntheticProject) -> None:
        evil = synthetic.make_sdist(extra=list(extra))
        p.sdist = evil
        p.write_pins()
        p.index.serve(NAME, evil, listed_sha256=synthetic.sha256(evil))

    return setup


def _corrupt_cache_offline(p: synthetic.SyntheticProject) -> None:
    p.seed_cache().write_bytes(b"corrupt")


APPLY_ERRORS: dict[str, tuple[Callable[[synthetic.SyntheticProject], None], tuple[str, ...], str]] = {
    "pins-unknown-key": (
        _write_pins(
            lambda p: synthetic.pins_text(p.sha).replace('commit = "abc1234"', 'commit = "abc1234"\ncolour = "red"')
        ),
        (),
        "vllm.colour: unknown field",
    ),
    "pins-malformed-sha": (_write_pins(lambda p: synthetic.pins_text(p.sha.upper())), (), "sdist_sha256"),
    "pins-malformed-version": (
        _write_pins(lambda p: synthetic.pins_text(p.sha, version="9.9")),
        (),
        "malformed version",
    ),
    "pins-missing-field": (
        _write_pins(lambda p: synthetic.pins_text(p.sha).replace('commit = "abc1234"\n', "")),
        (),
        "vllm.commit: missing required field",
    ),
    "pins-bad-toml": (_write_pins(lambda p: "[vllm\n"), (), "not valid TOML"),
    "offline-empty-cache": (lambda p: None, ("--offline",), f"{NAME} (sha256 "),
    "tampered-download": (_tamper, (), "sha256 mismatch"),
    "truncated-download": (_truncate, (), "sha256 mismatch"),
    "wrong-commit": (_wrong_commit, (), "upstream commit is fedcba9, the pin says abc1234"),
    "unsafe-archive": (_unsafe_archive, (), "unsafe archive: link"),
    "conflicting-patch": (_conflict, (), "no fuzz or offset"),
    "malformed-series": (_malformed_series, (), "malformed entry 'oops.patch'"),
    "not-a-patch": (_not_a_patch, (), "not a git format-patch file"),
    "unsafe-patch-path": (_unsafe_patch_path, (), "unsafe path '../x'"),
    "overlay-shadowing": (_shadow, (), "shadows upstream file vllm/utils.py"),
    "overlay-manifest-drift": (_manifest_drift, (), "upstream twin changed"),
    "drifted-blob": (_drift, (), "drifted: patch expects blob"),
    "offset-only-patch": (_offset_only, (), "no fuzz or offset"),
    "patch-creates-existing-file": (_creates_existing, (), "creates vllm/utils.py, which already exists"),
    "series-duplicate": (_series_duplicate, (), "is listed twice"),
    "series-missing-file": (_series_missing_file, (), "which does not exist"),
    "patch-without-diff": (_patch_without_diff, (), "not a git format-patch file"),
    "archive-dotdot": (_archive(Member("../x", b"x")), (), "unsafe archive: path escapes the tree"),
    "archive-absolute": (_archive(Member("/tmp/vxl-evil-cli", b"x")), (), "unsafe archive: absolute path"),
    "archive-hardlink-outside": (
        _archive(Member(f"vllm-{synthetic.VERSION}/h", kind="hardlink", link="/etc/passwd")),
        (),
        "unsafe archive: link",
    ),
    "corrupt-cache-offline": (_corrupt_cache_offline, ("--offline",), "is not in the cache"),
}


@pytest.mark.parametrize("case", sorted(APPLY_ERRORS))
def test_apply_errors_are_one_line_without_traceback(case: str, vxl_cold_cli) -> None:
    project = vxl_cold_cli
    setup, args, expect = APPLY_ERRORS[case]
    setup(project)
    _error(project.cli("apply", *args), expect)
    assert not project.tree.exists() and not (project.build / "worktree.new").exists()


def test_dirty_tree_needs_force(vxl_cli) -> None:
    project = vxl_cli
    _ok(project.cli("apply"))
    head = project.head()
    (project.tree / ENVS).write_text("work in progress\n")
    project.write_overlay({"vllm/toy_overlay.py": "VALUE = 2\n"})  # stale: apply wants to rebuild
    _error(project.cli("apply"), "uncommitted change(s)")
    assert (project.tree / ENVS).read_text() == "work in progress\n" and project.head() == head
    err = _ok(project.cli("apply", "--force"))
    assert "--force: discarding" in err
    assert (project.tree / "vllm/toy_overlay.py").read_text() == "VALUE = 2\n"
    assert synthetic.TOGGLE_LINE in (project.tree / ENVS).read_text()


def test_unexported_commit_needs_force(vxl_cli) -> None:
    project = vxl_cli
    _ok(project.cli("apply"))
    (project.tree / "vllm/utils.py").write_text("mine\n")
    project.tree_git("commit", "-q", "-am", "mine")
    mine = project.head()
    project.write_overlay({"vllm/toy_overlay.py": "VALUE = 2\n"})
    _error(project.cli("apply"), "1 commit(s) not exported")
    assert project.head() == mine


def test_export_errors(vxl_cli) -> None:
    project = vxl_cli
    _error(project.cli("export"), "run nox -s apply first")
    _ok(project.cli("apply"))
    (project.tree / "vllm/utils.py").write_text("def helper():\n    return 4\n")
    (project.tree / "vllm/toy_overlay.py").write_text("VALUE = 4\n")
    _error(project.cli("export"), "uncommitted change(s)")
    project.tree_git("commit", "-q", "-am", "mixed")
    _error(project.cli("export", "--check"), "mixes overlay files and upstream files")
    _error(project.cli("export"), "mixes overlay files and upstream files")


def test_export_writes_a_new_patch(vxl_cli) -> None:
    project = vxl_cli
    _ok(project.cli("apply"))
    (project.tree / "vllm/utils.py").write_text("def helper():\n    return 4\n")
    project.tree_git("commit", "-q", "-am", f"utils: return four\n\nWhy.\n\n{synthetic.HEADER}")
    _error(project.cli("export", "--check"), "export would change 2 file(s) (first: patches/series)")
    _ok(project.cli("export"))
    assert project.series_names()[-1] == "0003-utils-return-four.patch"
    _ok(project.cli("export", "--check"))
    assert "up to date" in _ok(project.cli("apply"))


def test_lint_errors(vxl_cli) -> None:
    project = vxl_cli
    (project.patches / "9999-stray.patch").write_text("stray\n")
    _error(project.cli("lint", "--static-only"), "patches/9999-stray.patch is not listed in patches/series")
    (project.patches / "9999-stray.patch").unlink()
    _conflict(project)
    _ok(project.cli("lint", "--static-only"))
    _error(project.cli("lint"), "no fuzz or offset")


def test_build_refuses_missing_or_stale_tree(vxl_cli) -> None:
    project = vxl_cli
    _error(project.cli("build"), "no work tree")
    _ok(project.cli("apply"))
    project.write_overlay({"vllm/toy_overlay.py": "VALUE = 5\n"})
    _error(project.cli("build"), "is stale")
    _ok(project.cli("apply"))
    (project.tree / ENVS).write_text("dirty\n")
    _error(project.cli("build"), "uncommitted change(s)")


def test_verify_via_cli(vxl_cli, tmp_path: Path) -> None:
    project = vxl_cli
    from scripts.provenance import RECORD_PATH, make_record, version_for
    from scripts.worktree import load_inputs

    # the CLI's record is made by its own copy of scripts/: build the wheel from the same inputs
    inputs = load_inputs(project.layout())
    record = make_record(inputs, worktree_head="") | {"tool": {"revision": "unknown", "dirty": False}}
    version = version_for(inputs)

    def wheel(path: Path, overlay_text: bytes) -> Path:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(RECORD_PATH, json.dumps(record))
            zf.writestr("vllm/toy_overlay.py", overlay_text)
            zf.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\n")
        return path

    good = wheel(tmp_path / "good.whl", synthetic.OVERLAY_FILES["vllm/toy_overlay.py"].encode())
    assert "OK: good.whl" in _ok(project.cli("verify", str(good)))
    bad = wheel(tmp_path / "bad.whl", b"VALUE = 0\n")
    _error(project.cli("verify", str(bad)), "overlay file vllm/toy_overlay.py differs")
    _error(project.cli("verify", str(tmp_path / "none.whl")), "no such wheel file")


def test_usage_errors_exit_2_without_traceback(vxl_cli) -> None:
    for args in (("apply", "--source", "svn"), ("frobnicate",), ()):
        proc = vxl_cli.cli(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "usage:" in proc.stderr


def test_git_source_via_cli(vxl_cli, tmp_path: Path) -> None:
    project = vxl_cli
    work = synthetic.patch_repo(tmp_path / "upstream-work", project.files)
    first = synthetic.git(work, "rev-parse", "HEAD")
    bare = tmp_path / "upstream.git"
    synthetic.git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    project.write_pins(commit="deadbee", git_url=f"file://{bare}")
    _error(project.cli("apply", "--source", "git"), "commit deadbee not found")
    project.write_pins(commit=first[:10], git_url=f"file://{bare}")
    _ok(project.cli("apply", "--source", "git"))
    assert re.search(rf"commit {first}", project.tree_git("log", "--format=%B", "-1", f"{project.head()}~3"))


def _replaces_not_a_table(p: synthetic.SyntheticProject) -> None:
    (p.root / "overlay.toml").write_text('replaces = "vllm/utils.py"\n')


def _series_not_utf8(p: synthetic.SyntheticProject) -> None:
    (p.patches / "series").write_bytes(b"# caf\xe9\n" + (p.patches / "series").read_bytes())


def _patch_is_a_directory(p: synthetic.SyntheticProject) -> None:
    (p.patches / "0009-x.patch").mkdir()
    p.write_series(p.series_names() + ["0009-x.patch"])


MALFORMED_INPUTS = {
    "overlay-replaces-not-a-table": (
        _replaces_not_a_table,
        "overlay.toml",
        "BUG: overlay.read_replaces calls .items() on a non-table [replaces]: AttributeError traceback",
    ),
    "series-not-utf8": (
        _series_not_utf8,
        "series",
        "BUG: series.read_series decodes without handling UnicodeDecodeError: traceback",
    ),
    "patch-is-a-directory": (
        _patch_is_a_directory,
        "0009-x.patch",
        "BUG: series.load_series checks exists(), not is_file(): IsADirectoryError traceback",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_INPUTS))
def test_malformed_inputs_are_one_line_errors(case: str, vxl_cli) -> None:
    setup, expect, _reason = MALFORMED_INPUTS[case]
    setup(vxl_cli)
    _error(vxl_cli.cli("apply"), expect)
