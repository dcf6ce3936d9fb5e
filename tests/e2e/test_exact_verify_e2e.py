"""Exact verify + prebuilt metadata end to end on CPU (patches 0004/0005).

The tiny Laguna target and its DFlash drafter are served through the FlashAttention backend (the
code path Laguna takes on XPU) running on the pure-torch reference kernels, and speculative
decoding with M=8 (7 drafted + 1 verified) must emit exactly the greedy tokens of the
non-speculative run of the same backend, for every prompt, with the exact-verify metadata built
inline (prebuilt toggle off) and prebuilt (toggle on, device graphs off).

The three engines are the fast matrix run's ``teacher``, ``dflash-graph0-meta0`` and
``dflash-graph0-meta1`` legs (``conftest.fast_matrix_run``, one run for this file and
test_matrix_fast.py): each a fresh engine in its own process that routes the FlashAttention
backend on CPU and counts, per layer call, what the overlay's exact path ran
(``scripts/matrix/engine.py``). This file reads those counts; the matrix's own tests gate the
legs' tokens and logprobs bitwise. Here: the exact path is what ran, at the widths it must run
at, and the prebuilt metadata served every verify call of its leg and none of the other's.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from matrix_runs import FAST_PROMPTS

NUM_SPECULATIVE_TOKENS = 7  # M = 8
VERIFY_WIDTH = str(NUM_SPECULATIVE_TOKENS + 1)
ALL = f"{FAST_PROMPTS + 1}/{FAST_PROMPTS + 1}"  # the prompts and the long-context one
LEGS = {"metadata inline": "dflash-graph0-meta0", "metadata prebuilt": "dflash-graph0-meta1"}


@pytest.fixture(scope="module")
def legs(fast_matrix_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    proc, data = fast_matrix_run
    assert data, f"the fast matrix run wrote no report (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return {leg["name"]: leg for leg in data["legs"]}


def test_the_teacher_decodes_on_the_exact_path_at_width_one(legs: dict[str, dict[str, Any]]) -> None:
    """Single-request q=1 decodes run on the exact path (width 1: the planned split count);
    prefill never does."""
    teacher = legs["teacher"]
    assert teacher["status"] == "passed"
    by_width = teacher["attention"]["exact_calls_by_width"]
    assert set(by_width) == {"1"} and by_width["1"] > 0, by_width
    assert teacher["attention"]["prebuilt_calls"] == 0


@pytest.mark.parametrize("name", sorted(LEGS))
def test_exact_verify_spec_decode_equals_teacher(name: str, legs: dict[str, dict[str, Any]], e2e: Any) -> None:
    leg = legs[LEGS[name]]
    assert leg["status"] == "passed", leg["mismatches"]
    assert leg["teacher"] == "teacher" and leg["teacher_exact"] == ALL
    by_width = leg["attention"]["exact_calls_by_width"]
    assert by_width.get(VERIFY_WIDTH, 0) > 0, f"{name}: the M=8 exact verify path never ran: {by_width}"
    assert leg["accepted_tokens"] > 0, f"{name}: no drafted token accepted"
    e2e.measured[f"exact verify e2e, {name}"] = (
        f"tokens == teacher for {ALL} prompts; exact-path layer calls by width {by_width}; "
        f"accepted {leg['accepted_tokens']}/{leg['draft_tokens']} drafted"
    )


def test_prebuilt_metadata_serves_every_verify_call_of_its_leg_only(legs: dict[str, dict[str, Any]]) -> None:
    inline, prebuilt = (legs[LEGS[name]]["attention"] for name in ("metadata inline", "metadata prebuilt"))
    assert inline["prebuilt_calls"] == 0
    verify_calls = sum(n for width, n in prebuilt["exact_calls_by_width"].items() if int(width) > 1)
    assert prebuilt["prebuilt_calls"] == verify_calls > 0
