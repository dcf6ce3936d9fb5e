# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The XPU Laguna series' entry points: a general plugin and a platform
plugin (both ``xpu_laguna`` in the wheel's metadata).

vLLM calls :func:`register` in every process that builds an engine (the
``EngineArgs`` of the API server and of the engine core, every worker)
before any model is built. It registers the series' Laguna classes for
the ``LagunaForCausalLM`` target and the ``DFlashLagunaForCausalLM``
drafter (:mod:`vllm.xpu_laguna.model`). A class decides,
from the configuration it is built with, whether the series' forms act:
registering turns nothing on.

:func:`platform` (``vllm.platform_plugins``) names the series' XPU platform
(:mod:`vllm.xpu_laguna.platform`: upstream's with the series' communicator)
wherever upstream's XPU plugin detects an XPU, and nothing elsewhere.

``VLLM_PLUGINS`` (vLLM's allow-list of plugins) must name ``xpu_laguna``
when it is set; the configuration contract refuses a series configuration
whose allow-list leaves it out (:func:`plugin_left_out`).
"""

PLUGIN_NAME = "xpu_laguna"
_MODELS = "vllm.xpu_laguna.model"
MODEL_CLASSES = {
    "LagunaForCausalLM": f"{_MODELS}:XpuLagunaForCausalLM",
    "DFlashLagunaForCausalLM": f"{_MODELS}:XpuLagunaDFlashForCausalLM",
}
PLATFORM_CLASS = "vllm.xpu_laguna.platform.XpuLagunaPlatform"


def register() -> None:
    """Register the series' Laguna model classes (idempotent)."""
    from vllm.model_executor.models import ModelRegistry

    for architecture, model_class in MODEL_CLASSES.items():
        ModelRegistry.register_model(architecture, model_class)


def platform() -> str | None:
    """The series' XPU platform where upstream detects an XPU, else None."""
    from vllm.platforms import xpu_platform_plugin

    return PLATFORM_CLASS if xpu_platform_plugin() is not None else None


def plugin_left_out(allowed: list[str] | None) -> bool:
    """Whether vLLM's plugin allow-list (``VLLM_PLUGINS``; None: every
    plugin loads) leaves the series' plugin out."""
    return allowed is not None and PLUGIN_NAME not in allowed
