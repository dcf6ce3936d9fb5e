# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The recording stand-in for a device graph, and a platform stand-in, for
the tests.

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

__all__ = [
    "BREAK_OPS",
    "PlatformStandIn",
    "Recorder",
    "RecordingGraph",
    "recording_capture",
]


class PlatformStandIn:
    """Answers the questions the breakable-graph configuration and backend
    choice ask of the platform: its device type, XPU or CUDA-alike."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type

    def is_xpu(self) -> bool:
        return self.device_type == "xpu"

    def is_cuda_alike(self) -> bool:
        return self.device_type == "cuda"
