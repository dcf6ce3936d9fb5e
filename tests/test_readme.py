"""The README's commands, taken from README.md and the docs pages it links, so the two cannot drift.

Snippets are marked in README.md or a linked ``docs/`` page with ``<!-- readme-test: NAME -->``
right before their fenced block. In CI (``nox -s tests``): every ``nox -s`` session and
``python -m`` module the README and its pages name exists; the series-editing snippet runs as
written (real ``nox``, its sessions run on this interpreter with ``--no-venv --no-install``) on a
copy of the repository against the real pinned sdist; the crossover snippet's options pass the
crossover's own checks. The full crossover snippet (five servers, minutes) runs with
``nox -s readme`` (``VXL_README_FULL=1``).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import REPO_ROOT
from scripts.git import git

README = REPO_ROOT / "README.md"
MARKER = "<!-- readme-test: {} -->"
FULL = os.environ.get("VXL_README_FULL") == "1"


def linked_pages(readme: Path = README) -> list[Path]:
    """README.md and every local Markdown page it links to (one level: the README is the index)."""
    text = readme.read_text(encoding="utf-8")
    pages = [readme]
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text):
        page = (readme.parent / target).resolve()
        if page.is_file() and page not in pages:
            pages.append(page)
    return pages


def all_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in linked_pages())


def snippet(name: str, text: str | None = None) -> str:
    """The fenced block right after the marker ``name`` (in the README or a page it links)."""
    text = all_text() if text is None else text
    marker = MARKER.format(name)
    if marker not in text:
        raise AssertionError(f"README.md and its linked pages have no {marker}")
    after = text.split(marker, 1)[1].lstrip("\n")
    match = re.match(r"```(?:bash|sh)\n(.*?)\n```", after, re.DOTALL)
    if match is None:
        raise AssertionError(f"no ```bash block right after {marker}")
    return match.group(1)


def commands(block: str) -> list[list[str]]:
    """Shell words per command line (continuations joined, comments dropped, `&&` split)."""
    joined = block.replace("\\\n", " ")
    out: list[list[str]] = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in words:
            if word == "&&":
                out.append(current)
                current = []
            else:
                current.append(word)
        if current:
            out.append(current)
    return out


def nox_sessions() -> set[str]:
    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text(encoding="utf-8"))
    names = set()
    for func in tree.body:
        if not isinstance(func, ast.FunctionDef):
            continue
        for deco in func.decorator_list:
            if isinstance(deco, ast.Call) and "session" in ast.unparse(deco.func):
                named = [k.value.value for k in deco.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)]
                names.add(named[0] if named else func.name)
    return names


def test_snippets_are_marked() -> None:
    for name in ("crossover", "series-editing"):
        assert commands(snippet(name))
    with pytest.raises(AssertionError, match="have no <!-- readme-test: nothing -->"):
        snippet("nothing")


def test_linked_pages_are_found_and_exist(tmp_path: Path) -> None:
    pages = linked_pages()
    names = {p.relative_to(REPO_ROOT).as_posix() for p in pages}
    assert {"README.md", "docs/crossover.md", "docs/editing-the-series.md", "docs/architecture.md"} <= names
    links = re.findall(r"\]\(([^)#\s:]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    missing = [link for link in links if not (REPO_ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
    # negative control: a README whose link target is absent finds only itself
    fake = tmp_path / "README.md"
    fake.write_text("see [x](docs/absent.md)\n", encoding="utf-8")
    assert linked_pages(fake) == [fake]


def test_every_nox_session_and_module_the_readme_names_exists() -> None:
    text = all_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)\n```", text, re.DOTALL)
    inline = re.findall(r"`([^`\n]*(?:nox -s|python3? -m) [^`\n]*)`", text)
    sessions = nox_sessions()
    seen_sessions, seen_modules = set(), set()
    for line in [w for b in blocks for w in commands(b)] + [shlex.split(i) for i in inline if "<" not in i]:
        for i, word in enumerate(line):
            if word == "nox" and i + 1 < len(line) and line[i + 1] == "-s":
                for name in line[i + 2 :]:
                    if name == "--":
                        break
                    seen_sessions.add(name)
            if word == "-m" and i + 1 < len(line) and line[i + 1].startswith("scripts"):
                seen_modules.add(line[i + 1])
    assert {"apply", "build", "tests", "cpu_tests", "cpu_runtime", "crossover", "verify-record"} <= seen_sessions
    assert seen_sessions <= sessions, f"README names unknown nox sessions: {seen_sessions - sessions}"
    missing = [m for m in seen_modules if importlib.util.find_spec(m) is None]
    assert not missing, f"README names missing modules: {missing}"


def _crossover_args(block: str) -> list[list[str]]:
    found = []
    for line in commands(block):
        if line[:3] == ["nox", "-s", "crossover"]:
            assert line[3] == "--"
            found.append(line[4:])
    assert found, "the crossover snippet runs no crossover"
    return found


def _check_only(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "scripts.measure", "crossover", *args, "--check-only"],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def test_crossover_snippet_passes_the_crossover_checks(tmp_path: Path) -> None:
    """The options as written fit the tiny model (its config: max_position_embeddings 1024)."""
    for kind in ("target", "draft"):
        folder = tmp_path / "build" / "tiny-laguna" / kind
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"max_position_embeddings": 1024}')
    for args in _crossover_args(snippet("crossover")):
        done = _check_only(args, tmp_path)
        assert done.returncode == 0, done.stderr
        # negative control: the command the README used to show (default --long-prompt-tokens
        # 1024 with --max-model-len 1024) is refused in one line, before anything starts
        old = [a for a in args]
        for option in ("--long-prompt-tokens", "--prompt-tokens", "--rollover-at"):
            if option in old:
                index = old.index(option)
                del old[index : index + 2]
        done = _check_only(old, tmp_path)
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and "the long prompt (1024 tokens" in done.stderr


def _shell(block: str, cwd: Path, no_venv: bool) -> subprocess.CompletedProcess[str]:
    """Run ``block`` with bash -e; ``nox`` is the real nox of this interpreter."""
    flags = " --no-venv --no-install" if no_venv else ""
    script = f'nox() {{ "{sys.executable}" -m nox{flags} "$@"; }}\nset -e\n{block}\n'
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("VXL_BUILD_DIR", None)
    return subprocess.run(
        ["bash", "-c", script], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=3000
    )


def test_series_editing_snippet_runs_as_written(tmp_path: Path) -> None:
    if importlib.util.find_spec("nox") is None:
        pytest.fail("nox is not installed in this interpreter (run the tests through `nox -s tests`)")
    clone = tmp_path / "clone"
    for rel in git(REPO_ROOT, "ls-files", "-z").split("\0"):
        if rel and (REPO_ROOT / rel).is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / rel, clone / rel)
    before = {p.relative_to(clone): p.read_bytes() for p in (clone / "patches").rglob("*") if p.is_file()}
    done = _shell(snippet("series-editing"), clone, no_venv=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (clone / "build" / "worktree" / ".git").exists()
    after = {p.relative_to(clone): p.read_bytes() for p in (clone / "patches").rglob("*") if p.is_file()}
    assert after == before  # apply then export is a fixpoint; lint passed


@pytest.mark.skipif(not FULL, reason="the full crossover snippet runs with `nox -s readme` (five servers)")
def test_crossover_snippet_runs_as_written() -> None:
    for args in _crossover_args(snippet("crossover")):
        out = Path(args[args.index("--out") + 1])
        shutil.rmtree(REPO_ROOT / out, ignore_errors=True)  # --out must be new
    done = _shell(snippet("crossover"), REPO_ROOT, no_venv=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert "verify-record:" in done.stdout + done.stderr and ": OK (" in done.stdout + done.stderr


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0"])
def test_old_line_snippet_names_the_commit_ci_builds(version: str) -> None:
    """Each earlier line's documented instruction and `python -m scripts.old_line build` (CI) use one
    commit, and that commit is in this repository's history and carries that release's pins."""
    from scripts.old_line import LINES, instruction

    name = f"old-line-{version}"
    assert snippet(name).strip() == f"git checkout {LINES[version][:12]} && nox -s apply build"
    assert instruction(version) == snippet(name).strip()
    pins = git(REPO_ROOT, "show", f"{LINES[version]}:pins.toml")
    assert re.search(rf'^version = "{re.escape(version)}"$', pins, re.M)


# "session 7", "sessions 10 and 11", "session-10": a figure numbered by a working session of this project
# ("the `tests` session 4 min" is a nox session's time, not a label)
SESSION_LABEL = re.compile(r"\bsessions?[ -]\d+(?![\d.]*\s*(?:min|s\b|seconds))", re.IGNORECASE)


def _session_labels(paths: list[Path]) -> list[str]:
    """Each line of ``paths`` that labels something by session number, as ``path:line: text``."""
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SESSION_LABEL.search(line):
                found.append(f"{path.name}:{number}: {line.strip()[:100]}")
    return found


def test_no_page_numbers_its_figures_by_session(tmp_path: Path) -> None:
    """A figure is dated and tied to a commit and a command; "session 9" means nothing to a reader."""
    pages = [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    labels = _session_labels(pages)
    assert not labels, "\n".join(labels)
    # negative control: each spelling the check exists for is caught; a nox session's name is not
    page = tmp_path / "page.md"
    page.write_text("in session 11 it took\nsessions 10 and 11\nthe session-10 code\nthe `tests` session 4 min\n")
    assert [hit.split(":")[1] for hit in _session_labels([page])] == ["1", "2", "3"]


def _fenced_commands(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)\n```", text, re.DOTALL)]


def test_the_readme_commands_are_the_noxfile_and_ci_commands() -> None:
    """The README's two commands are its only commands; the main job is nox's default sessions, the
    test command is what .ci/run runs, verbatim, and the noxfile's docstring names both."""
    commands = _fenced_commands(README.read_text(encoding="utf-8"))
    assert commands == [
        "python3 -m pip install nox && nox -s apply build",
        "python3 -m pip install nox && nox -s tests cpu_tests",
    ]
    main_job, test_command = (c.split("&& ")[1] for c in commands)
    noxfile = (REPO_ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert f"Main job:   {main_job}" in noxfile and f"Tests:      {test_command}" in noxfile
    assert 'nox.options.sessions = ["apply", "build"]' in noxfile
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[1] in ci, ".ci/run does not run the README's test command verbatim"
    assert {"apply", "build", "tests", "cpu_tests"} <= nox_sessions()
