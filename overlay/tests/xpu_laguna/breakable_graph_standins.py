# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The recording stand-in for a device graph, for the tests.

It lives in :mod:`vllm.compilation.xpu_breakable_graph_emulation` (the same
class drives the emulated graph legs of the equivalence matrix); see there
what it reproduces of a device graph and what not.
"""

from vllm.compilation.xpu_breakable_graph_emulation import (
    BREAK_OPS,
    Recorder,
    RecordingGraph,
    recording_capture,
)

__all__ = ["BREAK_OPS", "Recorder", "RecordingGraph", "recording_capture"]
