# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Drives the breakable graph capture through a real tiny Laguna forward on
CPU and prints one JSON object of observations on its last stdout line.

Run in its own process (``test_breakable_graph_laguna.py`` does): the fake
tensor-parallel size must not leak into other tests. The series' options
(breakable graphs on) are in each config it builds
(``additional_config["xpu_laguna"]``), never in the environment.

Device graphs do not exist on CPU: a stand-in graph class with the
``capture_begin / capture_end / replay`` protocol logs its calls, the ops
between breaks run for real, and attention and collectives are the real
vLLM call sites (the collective is a real in-place all-reduce on a one-rank
gloo group whose size the tensor-parallel group reports as N, so every
layer is sharded and reduces as at TP N).

The harness and the scenarios live next to it: ``breakable_graph_driver_harness``
(stand-in graph, model builder, observers), ``..._topology`` (break counts,
ceiling), ``..._replay`` (numerics, guard, out-of-place break) and
``..._config`` (configure_breakable_graph). None imports vLLM at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from breakable_graph_driver_config import run_config  # noqa: E402
from breakable_graph_driver_harness import Harness  # noqa: E402
from breakable_graph_driver_replay import (  # noqa: E402
    run_guard,
    run_numerics,
    run_out_of_place,
)
from breakable_graph_driver_topology import (  # noqa: E402
    run_ceiling,
    run_counts,
    run_drafter_counts,
)

SCENARIOS = {
    "counts": None,  # handled specially
    "ceiling": run_ceiling,
    "guard": run_guard,
    "out_of_place": run_out_of_place,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument(
        "--moe-tp",
        type=int,
        nargs="*",
        default=[],
        help="also run all-MoE variants at these TP sizes (needs the CPU MoE "
        "sigmoid-routing patch)",
    )
    ap.add_argument("--numerics-tp", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument(
        "--drafter-layers",
        type=int,
        nargs="*",
        default=[1, 2],
        help="DFlash drafter depths whose capture is counted at every --tp",
    )
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    try:
        results["config"] = run_config()
    except Exception:  # noqa: BLE001
        results["config"] = {"crash": traceback.format_exc()}
    h = Harness()
    for layers in args.layers:
        for tp in args.tp:
            for moe in (False, True) if tp in args.moe_tp else (False,):
                key = f"counts/L{layers}/tp{tp}/{'moe' if moe else 'dense'}"
                try:
                    results[key] = run_counts(h, layers, tp, moe)
                except Exception:  # noqa: BLE001
                    results[key] = {"crash": traceback.format_exc()}
    for layers in args.drafter_layers:
        for tp in args.tp:
            key = f"drafter/L{layers}/tp{tp}"
            try:
                results[key] = run_drafter_counts(h, layers, tp)
            except Exception:  # noqa: BLE001
                results[key] = {"crash": traceback.format_exc()}
    for tp in args.numerics_tp:
        key = f"numerics/L3/tp{tp}"
        try:
            results[key] = run_numerics(h, 3, tp)
        except Exception:  # noqa: BLE001
            results[key] = {"crash": traceback.format_exc()}
    for name, fn in SCENARIOS.items():
        if fn is None:
            continue
        try:
            results[name] = fn(h)
        except Exception:  # noqa: BLE001
            results[name] = {"crash": traceback.format_exc()}
    sys.stdout.write("\n" + json.dumps(results) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
