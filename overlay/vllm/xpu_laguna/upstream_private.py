# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The private upstream names the XPU Laguna series relies on, in one place.

Each entry is a name upstream keeps private (leading underscore) that the
series reads, writes or overrides, with why, and the public API that would
replace it. :func:`missing_names` says in one line per entry what a new
upstream release renamed or removed, so a rebase shows it as a failed check
(``tests/xpu_laguna/test_upstream_private.py``) instead of a silent change
of behaviour. A name is present when its owner (a module, or a class in a
module) still defines it: a module or class attribute, or an attribute the
class's source assigns or reads (instance state set in ``__init__``)."""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PrivateName:
    owner: str
    """``module`` or ``module:Class`` that defines the name."""
    name: str
    why: str
    public: str
    """The public API that would make the private use unnecessary."""


_CAPTURE = "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphCapture"
_WRAPPER = "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper"
_ATTENTION = "vllm.model_executor.layers.attention.attention:Attention"
_SEGMENT_HOOKS = (
    "overridable segment hooks on BreakableCUDAGraphCapture "
    "(begin/end a segment, count graphs and breaks)"
)

PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        _CAPTURE,
        "_begin_segment",
        "overridden: each segment captures on the series' graph backend",
        _SEGMENT_HOOKS,
    ),
    PrivateName(
        _CAPTURE,
        "_end_segment",
        "overridden: a closed segment is materialised and accounted by kind",
        _SEGMENT_HOOKS,
    ),
    PrivateName(
        _CAPTURE,
        "_capturing",
        "whether a segment is open (the collective break and the hooks)",
        "a public is_capturing property",
    ),
    PrivateName(
        _CAPTURE,
        "_current_graph",
        "the open segment's graph, set and cleared by the segment hooks",
        _SEGMENT_HOOKS,
    ),
    PrivateName(
        _CAPTURE,
        "_num_graphs",
        "graph count checked against the breaks (graphs = breaks + 1)",
        "public capture accounting (graphs, breaks)",
    ),
    PrivateName(
        _CAPTURE,
        "_num_eager_breaks",
        "break count checked against the graphs and logged",
        "public capture accounting (graphs, breaks)",
    ),
    PrivateName(
        _CAPTURE,
        "_tls",
        "the active capture is cleared on a failed capture's exit",
        "a public context API for the active capture",
    ),
    PrivateName(
        _WRAPPER,
        "_capture",
        "overridden: the audited capture of one batch descriptor",
        "an overridable capture step on BreakableCUDAGraphWrapper",
    ),
    PrivateName(
        _WRAPPER,
        "_replay",
        "overridden: the static-input guard runs before every replay",
        "an overridable replay step on BreakableCUDAGraphWrapper",
    ),
    PrivateName(
        "vllm.compilation.breakable_cudagraph",
        "_BreakableEntry",
        "subclassed: the series' entry adds the static-input guard's state",
        "a public entry type (or an entry factory on the wrapper)",
    ),
    PrivateName(
        _ATTENTION,
        "_q_scale",
        "the exact verify passes the layer's FP8 descales to the decode "
        "kernel, as upstream's backends do",
        "public scale accessors on the attention layer",
    ),
    PrivateName(
        _ATTENTION,
        "_k_scale",
        "as _q_scale",
        "public scale accessors on the attention layer",
    ),
    PrivateName(
        _ATTENTION,
        "_v_scale",
        "as _q_scale",
        "public scale accessors on the attention layer",
    ),
    PrivateName(
        "vllm.model_executor.layers.linear:UnquantizedLinearMethod",
        "_cpu_skip_gemm_dispatch",
        "set on the DFlash drafter's qkv_proj on CPU (upstream's own opt-out, "
        "as MLA's kv_b_proj): its fused context-KV buffers read the weight "
        "after loading",
        "upstream's drafter keeping (or re-reading) the weight (docs/upstream/0013-*)",
    ),
    PrivateName(
        "vllm.v1.worker.xpu_worker:XPUWorker",
        "_make_model_runner",
        "overridden: the series' XPU worker builds its model runner, which "
        "presets the series' breakable graph wrapper (upstream documents it "
        "as the method subclasses override)",
        "Platform.get_breakable_graph_wrapper_cls (docs/upstream/0006-*)",
    ),
)


def _defines(owner: object, name: str) -> bool:
    if hasattr(owner, name):
        return True
    if not inspect.isclass(owner):
        return False
    # instance state: self.<name> in the class's source, or a buffer its
    # module registers under that name (register_buffer("<name>", ...))
    try:
        source = inspect.getsource(owner)
        module = inspect.getsource(inspect.getmodule(owner))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    quoted = rf"[\"']{re.escape(name)}[\"']"
    return (
        re.search(rf"\bself\.{re.escape(name)}\b", source) is not None
        or re.search(quoted, module) is not None
    )


def missing_names(names: tuple[PrivateName, ...] = PRIVATE_NAMES) -> list[str]:
    """One line for each entry whose owner no longer defines it."""
    problems = []
    for entry in names:
        module_name, _, class_name = entry.owner.partition(":")
        try:
            owner: object = importlib.import_module(module_name)
            if class_name:
                owner = getattr(owner, class_name)
        except (ImportError, AttributeError):
            problems.append(
                f"{entry.owner}: gone from upstream (the series uses its "
                f"{entry.name}: {entry.why}; replace with {entry.public})"
            )
            continue
        if not _defines(owner, entry.name):
            problems.append(
                f"{entry.owner}.{entry.name}: renamed or removed upstream (the "
                f"series uses it: {entry.why}; replace with {entry.public})"
            )
    return problems
