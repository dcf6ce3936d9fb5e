"""``--emulate-graphs``: breakable graphs through the recording stand-in in a CPU ``vllm serve``.

The matrix installs the overlay's emulation in-process (``install_cpu_emulation``); a server
spawns its engine core and worker, so the installation has to happen in each of them. The
leg environment puts ``emulated_graphs/`` (a ``sitecustomize``) on ``PYTHONPATH`` with a marker
variable; it installs the emulation in every vLLM process of a leg that sets
``VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1`` and in no other. Results are EMULATED: the graph class
in the wrappers' accounting, and so in the record's graph section, is the recording stand-in.
"""

from __future__ import annotations

from pathlib import Path

from scripts.measure.emulated_graphs.sitecustomize import MARK_ENV

SITE_DIR = Path(__file__).resolve().parent / "emulated_graphs"


def emulated_graphs_env() -> dict[str, str]:
    """Variables that make every CPU server of a run emulate its breakable graphs."""
    return {"PYTHONPATH": str(SITE_DIR), MARK_ENV: "1"}
