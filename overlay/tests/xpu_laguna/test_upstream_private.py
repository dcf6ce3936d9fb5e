# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The private upstream names the series uses are listed in one place
(vllm/xpu_laguna/upstream_private.py), each still defined by this vLLM; a
renamed or removed one is one line naming it, why the series uses it and
the public API that would replace it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import vllm
from vllm.xpu_laguna.upstream_private import (
    PRIVATE_NAMES,
    PrivateName,
    missing_names,
)

_ROOT = Path(vllm.__file__).parent
# the series' modules that subclass or read upstream internals, and the
# upstream modules whose private names they may use
_USERS = {
    "compilation/breakable_cudagraph.py": (
        "xpu_laguna/graphs/capture.py",
        "xpu_laguna/graphs/wrapper.py",
        "xpu_laguna/graphs/collectives.py",
    ),
    "model_executor/layers/attention/attention.py": (
        "xpu_laguna/attention/exact.py",
        "xpu_laguna/attention/backend.py",
    ),
    "model_executor/layers/linear.py": ("xpu_laguna/model.py",),
    "v1/worker/xpu_worker.py": ("xpu_laguna/worker.py",),
}


def test_every_listed_private_name_is_still_upstream() -> None:
    assert missing_names() == []


def test_a_renamed_or_removed_name_is_one_line() -> None:
    """The negative control: the same check on a name upstream does not
    define, and on an owner that is gone."""
    owner = PRIVATE_NAMES[0].owner
    renamed = PrivateName(owner, "_begin_segment_v2", "why", "a public hook")
    gone = PrivateName("vllm.compilation.no_such_module:X", "_y", "why", "z")
    assert missing_names((renamed, gone)) == [
        f"{owner}._begin_segment_v2: renamed or removed upstream (the series "
        "uses it: why; replace with a public hook)",
        "vllm.compilation.no_such_module:X: gone from upstream (the series "
        "uses its _y: why; replace with z)",
    ]


@pytest.mark.parametrize("upstream", sorted(_USERS))
def test_the_series_uses_no_unlisted_private_name(upstream: str) -> None:
    """Every private name of the upstream module that the series' modules
    touch (attribute access, override or import) is in the list."""
    defined = set(re.findall(r"\b(_[A-Za-z]\w*)\b", (_ROOT / upstream).read_text()))
    used: set[str] = set()
    for user in _USERS[upstream]:
        text = (_ROOT / user).read_text()
        used |= set(re.findall(r"\.(_[A-Za-z]\w*)\b", text))
        used |= set(re.findall(r"def (_[A-Za-z]\w*)\(", text))
        used |= set(re.findall(r"^\s+(_[A-Z]\w*),?$", text, re.MULTILINE))
    listed = {entry.name for entry in PRIVATE_NAMES}
    dunder = {name for name in used if name.startswith("__")}
    assert (used & defined) - dunder - listed == set()
