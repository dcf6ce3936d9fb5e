"""The graph legs' accounting checks (pure): the captures, graphs and breaks that the models'
layer counts and the TP size imply, against the breakable-graph wrappers' own accounting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scripts.matrix.legs import EMULATED_GRAPH_CLASS


@dataclass(frozen=True)
class Topology:
    """Graphs and eager breaks one captured forward of a decoder must have."""

    attention: int
    collective: int

    @property
    def graphs(self) -> int:
        return self.attention + self.collective + 1


def decoder_topology(num_layers: int, tp: int) -> Topology:
    """A decoder breaks at every attention layer and, at TP > 1, at every all-reduce: the
    embedding's and two per layer (attention output, MLP/MoE output)."""
    return Topology(attention=num_layers, collective=2 * num_layers + 1 if tp > 1 else 0)


@dataclass(frozen=True)
class GraphExpectation:
    target: Topology
    drafter: Topology
    min_replays: int
    # False: the drafter is not under a breakable-graph wrapper (Model Runner V2's DFlash speculator
    # captures FULL decode graphs or none, never PIECEWISE: eager under the series' graph mode)
    drafter_wrapped: bool = False


def graph_leg_is_emulated(graphs: dict[str, Any]) -> bool:
    return any(EMULATED_GRAPH_CLASS in str(acc.get("graph_class", "")) for acc in graphs.values())


def check_graph_accounting(graphs: dict[str, Any], expected: GraphExpectation | None) -> list[str]:
    """Mismatches between the wrappers' own accounting and the expected topology: the target (and
    the drafter, when a drafter topology is expected) wrapped, every captured shape with the
    expected graphs and breaks by kind, and at least ``min_replays`` replays of each; a wrapped
    drafter where none is expected is a mismatch too."""
    notes: list[str] = []
    labels = ["target"]
    if expected is not None and not expected.drafter_wrapped:
        if graphs.get("drafter"):
            notes.append("graphs: the drafter is under a breakable-graph wrapper, expected eager (V2's DFlash policy)")
    else:
        labels.append("drafter")
    for label in labels:
        acc = graphs.get(label)
        if not acc:
            notes.append(f"graphs: no breakable-graph wrapper accounting for the {label}")
            continue
        if not acc.get("captures"):
            notes.append(f"graphs: the {label} captured nothing")
            continue
        if expected is None:
            continue
        want: Topology = getattr(expected, label)
        for cap in acc["captures"]:
            kinds = cap.get("breaks_by_kind", {})
            got = (cap.get("graphs"), kinds.get("attention"), kinds.get("collective"))
            if got != (want.graphs, want.attention, want.collective):
                notes.append(
                    f"graphs: {label} captured graphs={got[0]} attention={got[1]} collective={got[2]}, "
                    f"expected graphs={want.graphs} attention={want.attention} "
                    f"collective={want.collective}"
                )
        if acc.get("replays", 0) < expected.min_replays:
            notes.append(
                f"graphs: {label} replayed {acc.get('replays', 0)} times, "
                f"fewer than the {expected.min_replays} required"
            )
    return notes
