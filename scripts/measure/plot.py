"""One PNG per crossover: per-row tok/s of the four legs, and the paired per-row deltas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripts.errors import ToolError
from scripts.measure.schema import LEG_ORDER, PAIRS, pair_name

COLORS = {"A1": "#1f77b4", "B1": "#d62728", "B2": "#ff7f0e", "A2": "#2ca02c"}


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ToolError(
            "the plot needs matplotlib: `pip install matplotlib` in this python (or --no-plot)"
        ) from None


def write_plot(analysis: dict[str, Any], path: Path) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    legs = analysis["legs"]
    labels = analysis["config"]["legs"]
    window = analysis["config"]["window"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=110)
    for leg in LEG_ORDER:
        rows = legs[leg]["per_row"]
        median = legs[leg]["tok_s_legacy"]["median"]
        left.plot(
            [r["index"] for r in rows],
            [r["tok_s_legacy"] for r in rows],
            marker="o" if leg.startswith("A") else "s",
            linestyle="-" if leg.endswith("1") else "--",
            color=COLORS[leg],
            label=f"{labels.get(leg, leg)} (median {median:.2f})",
        )
        left.axhline(median, color=COLORS[leg], linewidth=0.6, alpha=0.5)
    values = [r["tok_s_legacy"] for leg in LEG_ORDER for r in legs[leg]["per_row"]]
    if min(values) > 0 and max(values) / min(values) > 20:
        left.set_yscale("log")  # CPU runs: a starved server can flush a whole row at once
    rows = range(legs["A1"]["rows"])
    left.set_xticks(list(rows))
    left.set_xlabel("row (prompt index)")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_ylabel(f"tok/s, tokens 1..{window} after TTFT (legacy {window}/{window - 1})")
    left.set_title("per-row throughput by leg (run order A1, B1, B2, A2)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    width = 0.4
    for offset, (cand, ctrl) in zip((-width / 2, width / 2), PAIRS):
        name = pair_name(cand, ctrl)
        pair = analysis["pairs"][name]
        deltas = pair["paired_delta_pct"]
        right.bar(
            [i + offset for i in range(len(deltas))],
            deltas,
            width=width,
            color=COLORS[cand],
            label=(
                f"{name}: wins {pair['row_wins']}, median {pair['median_paired_delta_pct']:+.2f}%, "
                f"headline {pair['headline_delta_pct']:+.2f}%"
                + ("" if pair["passed"] else " (FAILED)")
            ),
        )
    right.axhline(0.0, color="black", linewidth=0.8)
    extreme = max(
        abs(d)
        for cand, ctrl in PAIRS
        for d in analysis["pairs"][pair_name(cand, ctrl)]["paired_delta_pct"]
    )
    if extreme > 200:
        right.set_yscale("symlog", linthresh=10)
    right.set_xticks(list(rows))
    right.set_xlabel("row (prompt index)")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylabel("paired delta, % of control row")
    right.set_title("paired per-row deltas")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, axis="y")
    quality = analysis["quality"]
    value = analysis["record_value"]
    fig.suptitle(
        f"record value (lower candidate start, {value['leg']}) {value['tok_s']:.3f} tok/s; "
        f"teacher-exact {quality['teacher_exact']}, cross-leg {quality['cross_leg_exact']}, "
        f"cached 0 {quality['cached_tokens_zero']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
