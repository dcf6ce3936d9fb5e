"""The series' share of the wheel, and the rule that keeps the test stand-ins out of it.

``nox -s build`` packages the patched tree's ``vllm*`` packages (the tree's ``pyproject.toml``:
``[tool.setuptools.packages.find] include = ["vllm*"]``), so what the series adds to the wheel is
every overlay file and every patched file under those packages. The test-side stand-ins (the
reference attention kernels, the emulated device graphs, the XCCL ring all-reduce:
:mod:`scripts.cpu_standins`) must not be among them, by name or by import: a production install
must not be able to fall into them.
Checked without building, from ``patches/`` and ``overlay/`` (:func:`standin_problems`, part of
``nox -s lint``).

The same files decide what the series does when vLLM builds an object, from the config it is
given: none of them writes the process environment (a later engine in the process, and every
child it starts, would inherit the decision) or runs generated source (:func:`construction_problems`).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from scripts import cpu_standins
from scripts.series import parse_diff
from scripts.worktree import Inputs

WHEEL_PACKAGE_PREFIX = "vllm"  # setuptools packages.find include "vllm*"
# The stand-ins' earlier homes (inside the wheel up to the vLLM 0.34.0 port; the XCCL ring's in
# the patch tests, as xccl_ring_standin): never in the wheel.
FORMER_STANDIN_MODULES = frozenset({"xpu_laguna_reference", "xpu_breakable_graph_emulation", "xccl_ring_standin"})
_CONSTRUCTION_RULES = (
    (re.compile(r"\b(?:exec|eval)\("), "runs generated source (exec/eval); build the object instead"),
    (
        re.compile(
            "|".join(
                (
                    r"os\.environ\[[^\]]+\]\s*=(?!=)",
                    r"os\.environ\.(?:update|setdefault|pop|clear)\(",
                    r"os\.putenv\(",
                    r"del os\.environ",
                )
            )
        ),
        "writes os.environ; decide from the config the object is built with",
    ),
)
_TEST_SIDE_IMPORT = re.compile(rf"^\s*(?:from|import)\s+(?:{cpu_standins.PACKAGE}|scripts)\b", re.MULTILINE)


def standin_module_names() -> frozenset[str]:
    """Module names no wheel file may have: the stand-in package's own, its name, former homes."""
    own = {p.stem for p in (cpu_standins.HERE / cpu_standins.PACKAGE).glob("*.py") if p.stem != "__init__"}
    return frozenset(own | {cpu_standins.PACKAGE} | FORMER_STANDIN_MODULES)


def in_wheel(relpath: str) -> bool:
    """Whether a tree path is packaged (under a top-level ``vllm*`` package)."""
    parts = PurePosixPath(relpath).parts
    return len(parts) > 1 and parts[0].startswith(WHEEL_PACKAGE_PREFIX)


def series_wheel_files(inputs: Inputs) -> dict[str, str]:
    """Tree path -> the text the series puts there, for every packaged file it adds or patches
    (an overlay file whole; a patched file its added lines)."""
    out: dict[str, str] = {}
    for item in inputs.overlay:
        if in_wheel(item.relpath):
            out[item.relpath] = item.read().decode("utf-8", "replace")
    for patch in inputs.patches:
        for changed in parse_diff(patch):
            if in_wheel(changed.path):
                added = "\n".join(line.value.rstrip("\n") for hunk in changed for line in hunk if line.is_added)
                out[changed.path] = out.get(changed.path, "") + added + "\n"
    return out


def standin_problems(inputs: Inputs) -> list[str]:
    """One line per packaged file that is a test stand-in or imports one; empty when clean."""
    names = standin_module_names()
    problems = []
    for path, text in sorted(series_wheel_files(inputs).items()):
        pure = PurePosixPath(path)
        if pure.stem in names or any(part in names for part in pure.parts):
            problems.append(f"{path}: a test stand-in in the wheel (it belongs in scripts/cpu_standins/)")
        elif _TEST_SIDE_IMPORT.search(text):
            problems.append(f"{path}: imports the test side ({cpu_standins.PACKAGE} or scripts) from the wheel")
    return problems


def construction_problems(inputs: Inputs) -> list[str]:
    """One line per packaged line of the series (an overlay file's, a patch's added one) that writes
    the environment or runs generated source, naming the line; empty when clean."""
    problems = []
    for path, text in sorted(series_wheel_files(inputs).items()):
        for line in text.splitlines():
            code = line.split("#", 1)[0].strip()
            problems += [f"{path}: `{code}` {why}" for rule, why in _CONSTRUCTION_RULES if rule.search(code)]
    return problems
