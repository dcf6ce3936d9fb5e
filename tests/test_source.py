"""Source acquisition: download through pip's configured index, sha256 check, cache, offline,
commit check, archive safety, and ``--source git``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import synthetic
from scripts.errors import ToolError
from scripts.git import blob_bytes, git, git_env, run_git
from scripts.pins import load_pins
from scripts.source import cached_sdist, fetch_git, fetch_sdist, import_sdist
from scripts.worktree import apply
from synthetic import Member

NAME = f"vllm-{synthetic.VERSION}.tar.gz"
TOP = f"vllm-{synthetic.VERSION}"


def _pin(project: synthetic.SyntheticProject):
    return load_pins(project.root / "pins.toml").vllm


def _tool_error(func, *args, **kwargs) -> str:
    with pytest.raises(ToolError) as info:
        func(*args, **kwargs)
    message = str(info.value)
    assert synthetic.one_line(message), message
    return message


def _import(archive: Path, dest: Path, pin) -> None:
    """Check ``archive`` and import it into a new bare repo ``dest`` (as apply does)."""
    dest.mkdir(parents=True)
    git(dest, "init", "-q", "--bare")
    import_sdist(archive, dest, pin, "pristine\n", git_env())


def _imported(dest: Path) -> dict[str, str]:
    """path -> content of every blob of the imported ``pristine`` commit."""
    names = git(dest, "ls-tree", "-r", "--name-only", "pristine").splitlines()
    return {name: (blob_bytes(dest, "pristine", name) or b"").decode() for name in names}


def _no_pristine(dest: Path) -> bool:
    return run_git(dest, "rev-parse", "--verify", "--quiet", "pristine", check=False).returncode != 0


def _nothing_cached(project: synthetic.SyntheticProject) -> None:
    folder = project.cache / "sdist" / project.sha
    left = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    assert left == [], f"cache keeps {left}"


def _no_tree(project: synthetic.SyntheticProject) -> None:
    assert not project.tree.exists()
    assert not (project.build / "worktree.new").exists()
    pristine = project.cache / "pristine"
    leftovers = sorted(p.name for p in pristine.iterdir()) if pristine.exists() else []
    assert leftovers == [], f"pristine cache keeps {leftovers}"


# --------------------------------------------------------------------------- download and cache


def test_download_goes_through_pips_index_and_is_cached(vxl_cold_project, capfd) -> None:
    project = vxl_cold_project
    path = fetch_sdist(_pin(project))
    assert path == cached_sdist(_pin(project))
    assert path.read_bytes() == project.sdist
    assert project.index.requests == ["/simple/vllm/", f"/files/{NAME}"]
    assert "100%" in capfd.readouterr().err  # visible progress
    # second run: no network at all (the server is even gone)
    project.index.stop()
    assert fetch_sdist(_pin(project)) == path
    assert fetch_sdist(_pin(project), offline=True) == path
    assert project.index.requests == ["/simple/vllm/", f"/files/{NAME}"]


def test_second_apply_needs_no_network(vxl_cold_project) -> None:
    project = vxl_cold_project
    apply(project.layout())
    assert project.index.downloads() == [f"/files/{NAME}"]
    project.index.stop()
    (project.build / "worktree").rename(project.build / "elsewhere")
    apply(project.layout(), offline=True)
    assert project.tree.is_dir()


def test_tampered_download_is_rejected_and_nothing_is_kept(vxl_cold_project) -> None:
    project = vxl_cold_project
    tampered = synthetic.make_sdist(dict(project.files, **{"vllm/utils.py": "import os; os.system('boom')\n"}))
    # the index page lists the pinned sha256 but serves other bytes
    project.index.serve(NAME, tampered, listed_sha256=project.sha)
    message = _tool_error(apply, project.layout())
    assert "sha256 mismatch" in message and project.sha in message and synthetic.sha256(tampered) in message
    _nothing_cached(project)
    _no_tree(project)


def test_index_listing_another_sha256_is_rejected_before_downloading(vxl_cold_project) -> None:
    project = vxl_cold_project
    other = "f" * 64
    project.index.serve(NAME, project.sdist, listed_sha256=other)
    message = _tool_error(fetch_sdist, _pin(project))
    assert other in message and project.sha in message
    assert project.index.downloads() == []
    _nothing_cached(project)


def test_download_without_listed_hash_is_still_checked(vxl_cold_project) -> None:
    project = vxl_cold_project
    project.index.serve(NAME, project.sdist[:-10] + b"0123456789", listed_sha256=None)
    assert "sha256 mismatch" in _tool_error(fetch_sdist, _pin(project))
    _nothing_cached(project)


def test_truncated_download_is_rejected(vxl_cold_project) -> None:
    project = vxl_cold_project
    project.index.serve(NAME, project.sdist[: len(project.sdist) // 2], listed_sha256=project.sha)
    message = _tool_error(apply, project.layout())
    assert "sha256 mismatch" in message and f"{len(project.sdist) // 2} bytes" in message
    _nothing_cached(project)
    _no_tree(project)


def test_connection_dropped_mid_download_is_a_one_line_error(vxl_cold_project) -> None:
    project = vxl_cold_project
    project.index.serve(NAME, project.sdist, listed_sha256=project.sha, drop_after=100)
    message = _tool_error(fetch_sdist, _pin(project))
    assert NAME in message
    _nothing_cached(project)


def test_corrupt_cache_entry_is_replaced_by_a_fresh_download(vxl_cold_project, capfd) -> None:
    project = vxl_cold_project
    path = cached_sdist(_pin(project))
    path.parent.mkdir(parents=True)
    path.write_bytes(project.sdist[:100])
    assert fetch_sdist(_pin(project)).read_bytes() == project.sdist
    assert project.index.downloads() == [f"/files/{NAME}"]
    assert "corrupt cache entry" in capfd.readouterr().err


def test_corrupt_cache_entry_offline_is_removed_and_reported_missing(vxl_cold_project) -> None:
    project = vxl_cold_project
    path = cached_sdist(_pin(project))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"junk")
    message = _tool_error(fetch_sdist, _pin(project), offline=True)
    assert "--offline" in message and NAME in message
    assert not path.exists()


def test_offline_with_empty_cache_says_what_is_missing(vxl_cold_project) -> None:
    project = vxl_cold_project
    message = _tool_error(apply, project.layout(), offline=True)
    assert "--offline" in message
    assert NAME in message and project.sha in message and str(project.cache) in message
    assert project.index.requests == []
    _no_tree(project)


def test_file_missing_from_the_index_is_an_error(vxl_cold_project) -> None:
    project = vxl_cold_project
    project.index.files.clear()
    message = _tool_error(fetch_sdist, _pin(project))
    assert NAME in message and "not on the package index" in message


def test_unreachable_index_is_an_error(vxl_cold_project, monkeypatch) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple/")
    assert NAME in _tool_error(fetch_sdist, _pin(vxl_cold_project))


def test_index_http_error_is_a_one_line_error(vxl_cold_project, monkeypatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", vxl_cold_project.index.url.replace("/simple/", "/"))
    # /vllm/ is a 404 there: the project is simply not found
    assert "not on the package index" in _tool_error(fetch_sdist, _pin(vxl_cold_project))


def test_pep691_json_index_is_read(vxl_cold_project, capfd) -> None:
    project = vxl_cold_project
    project.index.json_api = True
    assert fetch_sdist(_pin(project)).read_bytes() == project.sdist
    assert "100%" in capfd.readouterr().err


def test_pep691_json_index_listing_another_sha256_is_rejected(vxl_cold_project) -> None:
    project = vxl_cold_project
    project.index.json_api = True
    project.index.serve(NAME, project.sdist, listed_sha256="e" * 64)
    assert "e" * 64 in _tool_error(fetch_sdist, _pin(project))
    assert project.index.downloads() == []


def test_index_server_error_is_a_one_line_error(vxl_cold_project) -> None:
    project = vxl_cold_project
    project.index.page_status = 503
    message = _tool_error(fetch_sdist, _pin(project))
    assert "HTTP 503" in message and project.index.url in message
    _nothing_cached(project)


def test_extra_index_is_searched_after_the_main_index(vxl_cold_project, monkeypatch) -> None:
    project = vxl_cold_project
    with synthetic.running_index() as empty:
        monkeypatch.setenv("PIP_INDEX_URL", empty.url)
        monkeypatch.setenv("PIP_EXTRA_INDEX_URL", project.index.url)
        assert fetch_sdist(_pin(project)).read_bytes() == project.sdist
        assert empty.requests == ["/simple/vllm/"]


def test_file_url_index_as_pip_reads_it(vxl_cold_project, tmp_path: Path, monkeypatch) -> None:
    project = vxl_cold_project
    url = synthetic.write_file_index(tmp_path / "mirror", {NAME: project.sdist})
    monkeypatch.setenv("PIP_INDEX_URL", url)
    assert fetch_sdist(_pin(project)).read_bytes() == project.sdist


# --------------------------------------------------------------------------- commit check


def test_wrong_commit_in_version_file_is_rejected(vxl_cold_project) -> None:
    project = vxl_cold_project
    wrong = synthetic.make_sdist(dict(project.files, **{"vllm/_version.py": synthetic.version_py("def5678")}))
    project.sdist = wrong
    project.write_pins()  # the sha matches: only the commit is wrong
    project.index.serve(NAME, wrong, listed_sha256=synthetic.sha256(wrong))
    message = _tool_error(apply, project.layout())
    assert "def5678" in message and "abc1234" in message
    _no_tree(project)


def test_version_file_without_commit_is_rejected(tmp_path: Path, vxl_project) -> None:
    archive = tmp_path / NAME
    archive.write_bytes(
        synthetic.make_sdist(dict(synthetic.upstream_files(), **{"vllm/_version.py": "__version__ = '9.9.9'\n"}))
    )
    message = _tool_error(_import, archive, tmp_path / "out", _pin(vxl_project))
    assert "names no commit id" in message
    assert _no_pristine(tmp_path / "out")


def test_sdist_without_version_file_is_rejected(tmp_path: Path, vxl_project) -> None:
    files = synthetic.upstream_files()
    del files["vllm/_version.py"]
    archive = tmp_path / NAME
    archive.write_bytes(synthetic.make_sdist(files))
    assert "names no commit id" in _tool_error(_import, archive, tmp_path / "out", _pin(vxl_project))


def test_full_commit_extending_the_pin_is_accepted(tmp_path: Path, vxl_project) -> None:
    archive = tmp_path / NAME
    archive.write_bytes(
        synthetic.make_sdist(
            dict(synthetic.upstream_files(), **{"vllm/_version.py": synthetic.version_py("abc1234" + "5" * 33)})
        )
    )
    _import(archive, tmp_path / "out", _pin(vxl_project))
    assert _imported(tmp_path / "out")["vllm/envs.py"] == synthetic.envs_py()


# --------------------------------------------------------------------------- archive safety

UNSAFE = {
    "dotdot-name": [Member("../x", b"evil")],
    "dotdot-inside": [Member(f"{TOP}/vllm/../../x", b"evil")],
    "absolute-path": [Member("/tmp/vxl-evil-absolute", b"evil")],
    "outside-top-folder": [Member("other/x", b"evil")],
    "symlink-dotdot": [Member(f"{TOP}/vllm/evil", kind="symlink", link="../../../etc")],
    "symlink-absolute": [Member(f"{TOP}/vllm/evil", kind="symlink", link="/etc/passwd")],
    "symlink-to-sibling": [Member(f"{TOP}/evil", kind="symlink", link="../vllm-other/x")],
    "hardlink-dotdot": [Member(f"{TOP}/vllm/evil", kind="hardlink", link="../etc/passwd")],
    "hardlink-absolute": [Member(f"{TOP}/vllm/evil", kind="hardlink", link="/etc/passwd")],
    "hardlink-outside-top": [Member(f"{TOP}/vllm/evil", kind="hardlink", link="other/x")],
    "fifo": [Member(f"{TOP}/vllm/fifo", kind="fifo")],
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_archive_members_are_rejected_before_import(case: str, tmp_path: Path, vxl_project) -> None:
    archive = tmp_path / NAME
    archive.write_bytes(synthetic.make_sdist(extra=UNSAFE[case]))
    dest = tmp_path / "a" / "b" / "out"
    message = _tool_error(_import, archive, dest, _pin(vxl_project))
    assert message.startswith("unsafe archive:"), message
    kind = case.split("-")[0]
    expect = {
        "symlink": "points outside the tree",
        "hardlink": "points outside the tree",
        "fifo": "special file",
        "dotdot": "escapes the tree",
        "absolute": "absolute path",
        "outside": "outside the top folder",
    }[kind]
    assert expect in message, message
    assert _no_pristine(dest)
    assert not (tmp_path / "a" / "x").exists() and not Path("/tmp/vxl-evil-absolute").exists()


@pytest.mark.parametrize("case", ["dotdot-name", "symlink-dotdot", "hardlink-absolute"])
def test_unsafe_archive_through_apply_leaves_nothing(case: str, vxl_cold_project) -> None:
    project = vxl_cold_project
    evil = synthetic.make_sdist(extra=UNSAFE[case])
    project.sdist = evil
    project.write_pins()
    project.index.serve(NAME, evil, listed_sha256=synthetic.sha256(evil))
    assert "unsafe archive" in _tool_error(apply, project.layout())
    _no_tree(project)


def test_links_inside_the_tree_are_accepted(tmp_path: Path, vxl_project) -> None:
    archive = tmp_path / NAME
    archive.write_bytes(
        synthetic.make_sdist(
            extra=[
                Member(f"{TOP}/vllm/alias.py", kind="symlink", link="utils.py"),
                Member(f"{TOP}/vllm/hard.py", kind="hardlink", link=f"{TOP}/vllm/utils.py"),
            ]
        )
    )
    dest = tmp_path / "out"
    _import(archive, dest, _pin(vxl_project))
    assert git(dest, "ls-tree", "pristine", "vllm/alias.py").split()[0] == "120000"
    assert _imported(dest)["vllm/alias.py"] == "utils.py"
    assert _imported(dest)["vllm/hard.py"] == synthetic.upstream_files()["vllm/utils.py"]


def test_top_folder_is_stripped_and_files_imported(tmp_path: Path, vxl_project) -> None:
    archive = tmp_path / NAME
    archive.write_bytes(vxl_project.sdist)
    dest = tmp_path / "out"
    _import(archive, dest, _pin(vxl_project))
    expected = {k: v for k, v in synthetic.upstream_files().items() if k != "vllm/_version.py"}
    assert _imported(dest) == expected  # the generated _version.py is never part of the pristine commit


@pytest.mark.parametrize(
    "data", [b"not a tarball at all", b"", "truncated"], ids=["garbage", "empty-file", "truncated"]
)
def test_unreadable_archive_is_a_one_line_error(data, tmp_path: Path, vxl_project) -> None:
    archive = tmp_path / NAME
    archive.write_bytes(vxl_project.sdist[: len(vxl_project.sdist) // 2] if data == "truncated" else data)
    message = _tool_error(_import, archive, tmp_path / "out", _pin(vxl_project))
    assert NAME in message
    assert _no_pristine(tmp_path / "out")


def test_empty_archive_is_an_error(tmp_path: Path, vxl_project) -> None:
    archive = tmp_path / NAME
    archive.write_bytes(synthetic.tar_gz([]))
    assert "empty archive" in _tool_error(_import, archive, tmp_path / "out", _pin(vxl_project))


# --------------------------------------------------------------------------- --source git


def _bare_upstream(project: synthetic.SyntheticProject, tmp: Path) -> tuple[str, str, Path]:
    """A bare repo with the upstream at commit 1 and a later commit that changes envs.py."""
    work = synthetic.patch_repo(tmp / "upstream-work", project.files)
    first = synthetic.git(work, "rev-parse", "HEAD")
    synthetic.commit_change(
        work,
        synthetic.Change(
            "later upstream work", {"vllm/envs.py": synthetic.envs_py(extra_top="# later upstream change")}
        ),
    )
    second = synthetic.git(work, "rev-parse", "HEAD")
    bare = tmp / "upstream.git"
    synthetic.git(tmp, "clone", "-q", "--bare", str(work), str(bare))
    return first, second, bare


def test_git_source_checks_out_the_pinned_commit(tmp_path: Path, vxl_project) -> None:
    project = vxl_project
    first, second, bare = _bare_upstream(project, tmp_path)
    url = f"file://{bare}"
    project.write_pins(commit=first[:9], git_url=url)
    state = apply(project.layout(), source="git")
    assert state.source == "git"
    message = project.tree_git("log", "-1", "--format=%B", state.pristine)
    assert f"git {url} commit {first}" in message
    # the tree is commit 1 (+ patches), not the branch head
    assert "# later upstream change" not in (project.tree / "vllm" / "envs.py").read_text()
    assert synthetic.TOGGLE_LINE in (project.tree / "vllm" / "envs.py").read_text()
    assert f"g{first[:9]}" in (project.tree / "vllm" / "_version.py").read_text()
    # a fresh export of the git tree reproduces the series
    from scripts.export import export

    assert export(project.layout(), check=True) is False


def test_git_source_fetch_returns_the_full_commit(tmp_path: Path, vxl_project) -> None:
    first, _second, bare = _bare_upstream(vxl_project, tmp_path)
    vxl_project.write_pins(commit=first[:7], git_url=f"file://{bare}")
    dest = tmp_path / "src"
    assert fetch_git(_pin(vxl_project), dest) == first
    assert (dest / "vllm" / "envs.py").read_text() == synthetic.envs_py()
    # cached mirror: offline works now
    assert fetch_git(_pin(vxl_project), tmp_path / "src2", offline=True) == first


def test_git_source_offline_with_mirror_but_missing_commit_is_an_error(tmp_path: Path, vxl_project) -> None:
    first, _second, bare = _bare_upstream(vxl_project, tmp_path)
    vxl_project.write_pins(commit=first[:9], git_url=f"file://{bare}")
    fetch_git(_pin(vxl_project), tmp_path / "src")  # the mirror is cached now
    vxl_project.write_pins(commit="fedcba98", git_url=f"file://{bare}")
    message = _tool_error(fetch_git, _pin(vxl_project), tmp_path / "src2", offline=True)
    assert "--offline: commit fedcba98 is not in the cached mirror" in message


def test_git_source_wrong_commit_prefix_is_an_error(tmp_path: Path, vxl_project) -> None:
    project = vxl_project
    _first, _second, bare = _bare_upstream(project, tmp_path)
    project.write_pins(commit="0123456789", git_url=f"file://{bare}")
    message = _tool_error(apply, project.layout(), source="git")
    assert "0123456789" in message and "not found" in message
    assert not project.tree.exists()


def test_git_source_offline_without_mirror_is_an_error(tmp_path: Path, vxl_project) -> None:
    _first, _second, bare = _bare_upstream(vxl_project, tmp_path)
    vxl_project.write_pins(git_url=f"file://{bare}")
    message = _tool_error(apply, vxl_project.layout(), source="git", offline=True)
    assert "--offline" in message and "mirror" in message


def test_git_source_unreachable_url_is_an_error(tmp_path: Path, vxl_project) -> None:
    vxl_project.write_pins(git_url=f"file://{tmp_path}/nowhere.git")
    assert "git clone" in _tool_error(apply, vxl_project.layout(), source="git")
    assert not vxl_project.tree.exists()
