# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Errors raised by the breakable graph capture and its configuration."""


class BreakableGraphError(RuntimeError):
    """Base class of the errors raised by the breakable graph capture."""


class BreakableGraphConfigError(ValueError):
    """An unsupported configuration was asked for with breakable graphs on."""


class CaptureCeilingError(BreakableGraphError):
    """A capture produced more segments than the ceiling allows."""


class TopologyMismatchError(BreakableGraphError):
    """A capture's break counts differ from the expected topology."""


class StaticInputMismatchError(BreakableGraphError):
    """A replay was asked for with inputs at other addresses than captured."""


class OutOfPlaceBreakError(BreakableGraphError):
    """An eager break returned a tensor at a new address on replay."""
