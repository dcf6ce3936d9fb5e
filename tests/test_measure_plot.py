"""The crossover plot names the treatment, marks flagged rows and keeps legends off the panels."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_measure_burst import burst_legs

from _measure_synth import CONFIG, teacher
from scripts.measure.analyze import analyze
from scripts.measure.gates import load_gates
from scripts.measure.plot import treatment_title

TREATMENT = {"sole_difference": "VLLM_X", "control_value": None, "candidate_value": "1"}


def test_treatment_is_named_with_its_values() -> None:
    assert treatment_title(TREATMENT) == ("treatment: VLLM_X", "unset", "=1")
    two = {
        "sole_difference": "X,Y",
        "control_value": {"X": None, "Y": "0"},
        "candidate_value": {"X": "1", "Y": "1"},
    }
    assert treatment_title(two) == ("treatment: X, Y", "X unset, Y =0", "X =1, Y =1")
    assert treatment_title(None)[0] == "treatment: not named"


def test_plot_marks_the_burst_row_and_legends_cover_nothing(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from scripts.measure import plot

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to inspect it
    analysis = analyze(burst_legs(), teacher(), CONFIG, load_gates())
    plot.write_plot(analysis, tmp_path / "p.png", TREATMENT)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = figures
    left, right = fig.axes
    title = fig._suptitle.get_text()
    assert "treatment: VLLM_X" in title and "unset" in title and "=1" in title
    assert "NOT A RECORD (failing: plausible_chunk_timing)" in title
    assert [t.get_text() for t in left.get_xticklabels()] == ["0\nlong", "1\nnormal", "2\nrollover"]
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert any(lab.startswith("burst row") for lab in labels)
    assert sum("(thin line)" in lab for lab in labels) == 4  # every median line is explained
    renderer = fig.canvas.get_renderer()
    for axes in (left, right):
        legend = axes.get_legend().get_window_extent(renderer)
        panel = axes.get_window_extent(renderer)
        assert not legend.overlaps(panel), "a legend covers a panel"
