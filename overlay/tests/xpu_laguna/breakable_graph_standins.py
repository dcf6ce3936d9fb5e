# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The recording stand-in for a device graph, a platform stand-in and the
forward context of a piecewise replay, for the tests.

It lives in the CPU runtime's test-side stand-ins,
``xpu_laguna_standins.emulated_graphs`` (never in the wheel; the same class
drives the emulated graph legs of the equivalence matrix); see there what it
reproduces of a device graph and what not.
"""

from xpu_laguna_standins.emulated_graphs import (
    BREAK_OPS,
    Recorder,
    RecordingGraph,
    piecewise_step_context,
    recording_capture,
)

__all__ = [
    "BREAK_OPS",
    "PlatformStandIn",
    "Recorder",
    "RecordingGraph",
    "piecewise_step_context",
    "recording_capture",
]


class PlatformStandIn:
    """Answers the questions the breakable-graph configuration, the series'
    scope and the backend choice ask of the platform: its device type, XPU,
    CPU or CUDA-alike."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type

    def is_xpu(self) -> bool:
        return self.device_type == "xpu"

    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    def is_cuda_alike(self) -> bool:
        return self.device_type == "cuda"
