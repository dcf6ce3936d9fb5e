# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' entry points: a general plugin and a platform
plugin (both ``xpu_laguna`` in the wheel's metadata).

vLLM calls :func:`register` in every process that builds an engine (the
``EngineArgs`` of the API server and of the engine core, every worker)
before any model is built; the entry point is ``xpu_laguna`` in the wheel's
metadata (the series' one-line edit of ``pyproject.toml``). It registers the
series' Laguna model class for the ``LagunaForCausalLM`` architecture. The
class decides, from the configuration it is built with, whether the series
acts (:mod:`vllm.model_executor.models.xpu_laguna`): registering turns
nothing on.

:func:`platform` (``vllm.platform_plugins``) names the series' XPU platform
(:mod:`vllm.platforms.xpu_laguna`: upstream's with the series' communicator)
wherever upstream's XPU plugin detects an XPU, and nothing elsewhere.

``VLLM_PLUGINS`` (vLLM's allow-list of plugins) must name ``xpu_laguna``
when it is set; the configuration contract refuses a series configuration
whose allow-list leaves it out (:func:`plugin_left_out`).
"""

PLUGIN_NAME = "xpu_laguna"
ARCHITECTURE = "LagunaForCausalLM"
MODEL_CLASS = "vllm.model_executor.models.xpu_laguna:XpuLagunaForCausalLM"
PLATFORM_CLASS = "vllm.platforms.xpu_laguna.XpuLagunaPlatform"


def register() -> None:
    """Register the series' Laguna model class (idempotent)."""
    from vllm.model_executor.models import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)


def platform() -> str | None:
    """The series' XPU platform where upstream detects an XPU, else None."""
    from vllm.platforms import xpu_platform_plugin

    return PLATFORM_CLASS if xpu_platform_plugin() is not None else None


def plugin_left_out(allowed: list[str] | None) -> bool:
    """Whether vLLM's plugin allow-list (``VLLM_PLUGINS``; None: every
    plugin loads) leaves the series' plugin out."""
    return allowed is not None and PLUGIN_NAME not in allowed
