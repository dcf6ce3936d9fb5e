"""The record's graph section from the breakable-graph wrappers' own accounting.

With the series' option ``breakable_graph`` on (``--additional-config '{"xpu_laguna":
{"breakable_graph": true}}'``) every wrapper (target, DFlash drafter) logs one line
``XPU_LAGUNA_GRAPH_ACCOUNTING {json}`` at each capture, at the first replay and every 1000 replays after
(``vllm/xpu_laguna/graphs/wrapper.py``): graph class, captures with graphs and breaks by
kind, replays. This module reads those lines from a leg's server log; a leg without them has no
graphs (the section stays ``measured: false``).
"""

from __future__ import annotations

import json
import re
from typing import Any

ACCOUNTING_MARK = "XPU_LAGUNA_GRAPH_ACCOUNTING "  # same text as the wrapper's


def rank_accounting_from_log(text: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The last accounting line of each wrapper label (``target``, ``drafter``) per process
    (the ``pid=N`` vLLM puts before worker log lines; one process: ``""``)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for line in text.splitlines():
        head, mark, payload = line.partition(ACCOUNTING_MARK)
        if not mark:
            continue
        try:
            data = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and isinstance(data.get("label"), str):
            pid = re.search(r"pid=(\d+)", head)
            found.setdefault(pid.group(1) if pid else "", {})[data["label"]] = data
    return found


def accounting_from_log(text: str) -> dict[str, dict[str, Any]]:
    """The last accounting line of each wrapper label in ``text`` (of the first rank)."""
    ranks = rank_accounting_from_log(text)
    return ranks[min(ranks)] if ranks else {}


def graph_section(logs: dict[str, str]) -> dict[str, Any] | None:
    """The record's graph section from the legs' server logs, or None when no leg logged any
    accounting (graphs off everywhere).

    ``graphs_per_rank`` / ``eager_breaks_per_rank`` are the target's per captured shape (equal
    on every rank and every graph leg, else this raises); ``replays_at_least`` per leg and
    wrapper is the count of the last logged line (logged at capture, at replay 1, 1001, 2001, ...).
    """
    per_rank = {leg: ranks for leg, text in logs.items() if (ranks := rank_accounting_from_log(text))}
    if not per_rank:
        return None
    per_leg = {leg: ranks[min(ranks)] for leg, ranks in per_rank.items()}
    shapes = {
        (cap["graphs"], cap["breaks"]) for acc in per_leg.values() for cap in acc.get("target", {}).get("captures", [])
    }
    if len(shapes) > 1:
        raise ValueError(f"graph legs captured different target topologies: {sorted(shapes)}")
    graphs, breaks = next(iter(shapes)) if shapes else (None, None)
    sizes = sorted(
        {
            int(m.group(1))
            for acc in per_leg.values()
            for cap in acc.get("target", {}).get("captures", [])
            if (m := re.search(r"num_tokens=(\d+)", str(cap.get("batch_descriptor", ""))))
        }
    )
    classes = sorted({acc_w.get("graph_class", "") for acc in per_leg.values() for acc_w in acc.values()})
    section: dict[str, Any] = {
        "measured": True,
        "source": "breakable-graph wrapper accounting (server logs)",
        "graph_class": classes[0] if len(classes) == 1 else classes,
        "mode": "NONE",
        "cudagraph_mode": "PIECEWISE",
        "capture_sizes": sizes,
        "max_capture_size": max(sizes) if sizes else None,
        "graphs_per_rank": graphs,
        "eager_breaks_per_rank": breaks,
        "legs": {
            leg: {
                label: {
                    "captures": acc_w.get("captures", []),
                    "replays_at_least": acc_w.get("replays", 0),
                }
                for label, acc_w in sorted(acc.items())
            }
            for leg, acc in sorted(per_leg.items())
        },
    }
    for leg, ranks in sorted(per_rank.items()):
        targets = [acc["target"] for acc in ranks.values() if "target" in acc]
        section[f"{leg}_distinct_rank_captures"] = sum(1 for t in targets if t.get("captures"))
        section[f"{leg}_distinct_rank_replays"] = sum(1 for t in targets if t.get("replays", 0) > 0)
    return section
