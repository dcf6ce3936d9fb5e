"""One PNG per crossover, readable without the code.

Left: per-row tok/s of the four legs (run order A1, B1, B2, A2), one line per leg with its median
as a thin line of the same colour. Right: the paired per-row deltas B1 vs A1 and B2 vs A2. The
title names the treatment (variable, control value, candidate value); the x axis names each
row's kind (normal, long, rollover); rows that fail a check are marked (a burst row: the timing
is a stall artifact; a row that differs from the teacher); legends sit below the panels.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scripts.errors import ToolError
from scripts.measure.schema import LEG_ORDER, PAIRS, pair_name

COLORS = {"A1": "#1f77b4", "B1": "#d62728", "B2": "#ff7f0e", "A2": "#2ca02c"}


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ToolError("the plot needs matplotlib: `pip install matplotlib` in this python (or --no-plot)") from None


def treatment_title(treatment: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """(headline, control side, candidate side), e.g. ``("treatment: X", "unset", "=1")``; with
    several variables each side names them (``"X=1, Y unset"``)."""
    if not treatment:
        return "treatment: not named", "control", "candidate"
    names = str(treatment.get("sole_difference", "")).split(",")
    control = treatment.get("control_value")
    candidate = treatment.get("candidate_value")
    if len(names) > 1:
        control = control if isinstance(control, dict) else {}
        candidate = candidate if isinstance(candidate, dict) else {}
    else:
        control, candidate = {names[0]: control}, {names[0]: candidate}

    def side(values: Mapping[str, Any]) -> str:
        def one(name: str) -> str:
            value = values.get(name)
            shown = "unset" if value is None else f"={value}"
            return shown if len(names) == 1 else f"{name} {shown}"

        return ", ".join(one(n) for n in names)

    return f"treatment: {', '.join(names)}", side(control), side(candidate)


def _flags(analysis: dict[str, Any]) -> dict[str, dict[int, list[str]]]:
    """Per leg, per row index: what is wrong with the row (burst, not teacher-exact)."""
    flags: dict[str, dict[int, list[str]]] = {leg: {} for leg in LEG_ORDER}
    for burst in analysis.get("burst_rows", []):
        flags[burst["leg"]].setdefault(burst["index"], []).append("burst")
    vs_teacher = (analysis.get("all_vs_teacher") or {}).get("legs", {})
    for leg in LEG_ORDER:
        for result in vs_teacher.get(leg, []):
            if not result["exact"]:
                flags[leg].setdefault(result["index"], []).append("not teacher-exact")
    return flags


def write_plot(analysis: dict[str, Any], path: Path, treatment: Mapping[str, Any] | None = None) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    legs = analysis["legs"]
    window = analysis["config"]["window"]
    headline, control_side, candidate_side = treatment_title(treatment)
    side = {"A": f"control ({control_side})", "B": f"candidate ({candidate_side})"}
    per_row = legs["A1"]["per_row"]
    rows = [r["index"] for r in per_row]
    ticks = [f"{r['index']}\n{r['kind']}" for r in per_row]
    flags = _flags(analysis)
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 7.2), dpi=100)

    for leg in LEG_ORDER:
        leg_rows = legs[leg]["per_row"]
        median = legs[leg]["tok_s_legacy"]["median"]
        left.plot(
            [r["index"] for r in leg_rows],
            [r["tok_s_legacy"] for r in leg_rows],
            marker="o" if leg.startswith("A") else "s",
            linestyle="-" if leg.endswith("1") else "--",
            color=COLORS[leg],
            label=f"{leg} {side[leg[0]]}: median {median:.2f} tok/s (thin line)",
        )
        left.axhline(median, color=COLORS[leg], linewidth=0.8, alpha=0.6, label="_median")
    bursts = [(leg, i) for leg in LEG_ORDER for i, f in flags[leg].items() if "burst" in f]
    wrong = [(leg, i) for leg in LEG_ORDER for i, f in flags[leg].items() if "not teacher-exact" in f]
    for marks, style, text in (
        (
            bursts,
            {"marker": "X", "s": 160, "color": "black"},
            "burst row: timing is a stall artifact (plausible_chunk_timing fails)",
        ),
        (
            wrong,
            {"marker": "o", "s": 220, "facecolors": "none", "edgecolors": "purple", "linewidths": 2},
            "row differs from the teacher",
        ),
    ):
        if marks:
            left.scatter(
                [i for _, i in marks],
                [legs[leg]["per_row"][i]["tok_s_legacy"] for leg, i in marks],
                zorder=5,
                label=text,
                **style,
            )
    values = [r["tok_s_legacy"] for leg in LEG_ORDER for r in legs[leg]["per_row"]]
    if min(values) > 0 and max(values) / min(values) > 20:
        left.set_yscale("log")  # a burst row can read thousands of times faster
    left.set_xticks(rows, ticks, fontsize=8)
    left.set_xlabel("row: prompt index and kind")
    left.set_ylabel(f"tok/s over output tokens 1..{window} after TTFT ({window}/span)")
    left.set_title("per-row throughput by leg (run order A1, B1, B2, A2)", fontsize=10)
    left.grid(alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    keep = [(h, lab) for h, lab in zip(handles, labels) if not lab.startswith("_")]
    left.legend(
        [h for h, _ in keep],
        [lab for _, lab in keep],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=1,
        frameon=False,
    )

    width = 0.4
    for offset, (cand, ctrl) in zip((-width / 2, width / 2), PAIRS):
        name = pair_name(cand, ctrl)
        pair = analysis["pairs"][name]
        deltas = pair["paired_delta_pct"]
        flagged = set(flags[cand]) | set(flags[ctrl])
        right.bar(
            [i + offset for i in range(len(deltas))],
            deltas,
            width=width,
            color=COLORS[cand],
            edgecolor=["black" if i in flagged else COLORS[cand] for i in range(len(deltas))],
            label=(
                f"{cand} vs {ctrl}: wins {pair['row_wins']}, median "
                f"{pair['median_paired_delta_pct']:+.2f}%, headline "
                f"{pair['headline_delta_pct']:+.2f}%" + ("" if pair["passed"] else " (FAILED)")
            ),
        )
        for i in sorted(flagged):
            right.annotate(
                "!",
                (i + offset, deltas[i]),
                ha="center",
                va="bottom",
                fontsize=12,
                fontweight="bold",
                color="black",
            )
    right.axhline(0.0, color="black", linewidth=0.8, label="_zero")
    right.margins(y=0.12)
    extreme = max(abs(d) for cand, ctrl in PAIRS for d in analysis["pairs"][pair_name(cand, ctrl)]["paired_delta_pct"])
    if extreme > 200:
        right.set_yscale("symlog", linthresh=10)
    right.set_xticks(rows, ticks, fontsize=8)
    right.set_xlabel("row: prompt index and kind")
    right.set_ylabel("paired delta: candidate row vs control row, %")
    right.set_title("paired per-row deltas (> 0: candidate faster)", fontsize=10)
    right.grid(alpha=0.3, axis="y")
    handles, labels = right.get_legend_handles_labels()
    if any(flags[leg] for leg in LEG_ORDER):
        handles.append(Line2D([], [], linestyle="none", marker="$!$", color="black", markersize=9))
        labels.append("pair with a flagged row (burst or not teacher-exact)")
    right.legend(
        handles,
        labels,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        frameon=False,
    )

    quality = analysis["quality"]
    value = analysis["record_value"]
    failing = analysis["failing_gates"]
    verdict = "record candidate" if not failing else f"NOT A RECORD (failing: {', '.join(failing)})"
    fig.suptitle(
        f"{headline}:  control A1, A2 {control_side}  vs  candidate B1, B2 {candidate_side}\n"
        f"value (lower candidate start, {value['leg']}) {value['tok_s']:.3f} tok/s: {verdict}\n"
        f"teacher-exact {quality['teacher_exact']}, cross-leg {quality['cross_leg_exact']}, "
        f"cached 0 {quality['cached_tokens_zero']}, chunk timing plausible "
        f"{quality.get('plausible_chunk_timing', 'not checked')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
