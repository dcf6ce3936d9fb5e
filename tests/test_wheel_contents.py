"""The wheel carries no test stand-ins: the series' share of the wheel (overlay files and patched
files under ``vllm*``, what ``nox -s build`` packages) computed from ``patches/`` and ``overlay/``
without a build, and ``nox -s lint``'s rule on it, with its negative controls."""

from __future__ import annotations

from pathlib import Path

import synthetic
from scripts import cpu_standins
from scripts.lint import lint_static
from scripts.wheel_contents import in_wheel, series_wheel_files, standin_module_names, standin_problems
from scripts.worktree import Layout, load_inputs
from synthetic import ENVS, Change

REFERENCE = "vllm/v1/attention/ops/xpu_laguna_reference.py"
EMULATION = "vllm/compilation/xpu_breakable_graph_emulation.py"
XCCL_RING = "vllm/distributed/xccl_ring.py"  # the XCCL ring stand-in under its own name...
XCCL_RING_FORMER = "vllm/distributed/xccl_ring_standin.py"  # ...and its name in the patch tests


def test_the_repository_wheel_has_no_standins() -> None:
    inputs = load_inputs(Layout())
    files = series_wheel_files(inputs)
    # the list is the real one: the kernel registry, the exact path, the patched backend...
    for expected in (
        "vllm/xpu_laguna/attention/kernels.py",
        "vllm/xpu_laguna/attention/exact.py",
        "vllm/xpu_laguna/graphs/backends.py",
        "vllm/v1/attention/backends/flash_attn.py",
    ):
        assert expected in files
    # ...and holds none of the stand-ins, which live beside the wheel's packages
    assert REFERENCE not in files and EMULATION not in files
    assert not [p for p in files if Path(p).stem in standin_module_names()]
    assert standin_problems(inputs) == []
    assert not in_wheel(f"{cpu_standins.PACKAGE}/reference_attention.py")
    assert {"reference_attention", "emulated_graphs", "xccl_ring", "xccl_ring_standin"} <= standin_module_names()
    # the patch tests may use them: tests/ is laid into the tree but never packaged
    assert not in_wheel("tests/xpu_laguna/test_exact_verify.py")


def test_a_standin_back_in_the_overlay_is_a_lint_problem(vxl_project: synthetic.SyntheticProject) -> None:
    """Negative control: the layout before the move (the stand-ins under vllm/) fails lint."""
    project = vxl_project
    assert lint_static(project.layout()) == []
    project.write_overlay(
        {
            REFERENCE: "def flash_attn_varlen_func(): ...\n",
            EMULATION: "X = 1\n",
            XCCL_RING: "def ring_chunk_bounds(): ...\n",
            XCCL_RING_FORMER: "def register(): ...\n",
        }
    )
    problems = lint_static(project.layout())
    for path in (REFERENCE, EMULATION, XCCL_RING, XCCL_RING_FORMER):
        assert f"{path}: a test stand-in in the wheel (it belongs in scripts/cpu_standins/)" in problems


def test_a_wheel_file_importing_the_test_side_is_a_lint_problem(vxl_project: synthetic.SyntheticProject) -> None:
    """Negative control: the old fallback (the backend importing the reference kernels) fails lint,
    from an overlay file or from a patch; a test laid into the tree may import them."""
    project = vxl_project
    project.write_overlay(
        {
            "vllm/uses_reference.py": "if True:\n    from xpu_laguna_standins import reference_attention\n",
            "tests/xpu_laguna/test_uses_reference.py": "from xpu_laguna_standins import reference_attention\n",
        }
    )
    base = project.patched_files()
    project.add_patch(Change("envs: fall back", {ENVS: base[ENVS] + "import xpu_laguna_standins\n"}), base, 3)
    problems = lint_static(project.layout())
    line = f"imports the test side ({cpu_standins.PACKAGE} or scripts) from the wheel"
    assert f"vllm/uses_reference.py: {line}" in problems
    assert f"{ENVS}: {line}" in problems
    assert not [p for p in problems if p.startswith("tests/")]
