# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The series' general plugin (vllm/xpu_laguna/plugin.py, the wheel's
``xpu_laguna`` entry point) and the Laguna class it registers
(vllm/xpu_laguna/model.py).

What is real: vLLM's plugin loader over the installed distribution's entry
points (the CPU runtime's are the tree's pyproject.toml, as in the wheel),
vLLM's model registry, ``EngineArgs.create_engine_config`` and the
configuration contract, and the tiny Laguna built under it on CPU."""

from __future__ import annotations

import importlib.metadata

import pytest
from contract_testlib import SERIES_OFF, error_line, make_config

from vllm.xpu_laguna import plugin as xpu_laguna_plugin

pytest_plugins = ("contract_testlib",)
pytestmark = pytest.mark.usefixtures("series_environment")


def test_the_wheel_names_the_plugin_as_a_general_plugin() -> None:
    (entry,) = [
        ep
        for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
        if ep.name == xpu_laguna_plugin.PLUGIN_NAME
    ]
    assert entry.value == "vllm.xpu_laguna.plugin:register"


def test_a_config_built_by_vllm_resolves_the_series_laguna(models) -> None:
    """``EngineArgs`` loads the general plugins, so the architecture
    resolves to the series' class, a subclass of upstream's."""
    from vllm.model_executor.model_loader.utils import get_model_cls
    from vllm.model_executor.models.laguna import LagunaForCausalLM

    cls = get_model_cls(make_config(models, draft=None).model_config)
    assert cls.__qualname__ == "XpuLagunaForCausalLM"
    assert issubclass(cls, LagunaForCausalLM)


def test_register_is_idempotent() -> None:
    from vllm.model_executor.models import ModelRegistry

    for _ in range(2):
        xpu_laguna_plugin.register()
        names = {
            arch: ModelRegistry.models[arch].load_model_cls().__qualname__
            for arch in xpu_laguna_plugin.MODEL_CLASSES
        }
        assert names == {
            "LagunaForCausalLM": "XpuLagunaForCausalLM",
            "DFlashLagunaForCausalLM": "XpuLagunaDFlashForCausalLM",
        }


@pytest.mark.parametrize(
    ("allowed", "left_out"),
    [
        (None, False),
        (["xpu_laguna"], False),
        (["lora_x", "xpu_laguna"], False),
        ([], True),
        (["lora_filesystem_resolver"], True),
    ],
)
def test_plugin_left_out(allowed, left_out) -> None:
    assert xpu_laguna_plugin.plugin_left_out(allowed) is left_out


def test_an_allow_list_without_the_plugin_is_refused(models, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    with pytest.raises(ValueError) as err:
        make_config(models)
    assert error_line(str(err.value)) == (
        "XPU Laguna series: VLLM_PLUGINS=lora_filesystem_resolver leaves out "
        "the series' plugin 'xpu_laguna' (vLLM would build upstream's Laguna: "
        "no routing bias, no row-invariant forms); add xpu_laguna to "
        "VLLM_PLUGINS or unset it"
    )


def test_the_allow_list_rule_acts_only_for_the_series(models, monkeypatch) -> None:
    """Negative control of the scope: the same allow-list with the series'
    switches off (a plain Laguna run on CPU), or naming the plugin, passes."""
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    make_config(models, options=SERIES_OFF)
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver,xpu_laguna")
    make_config(models)


UPSTREAM_CPU = "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"
SERIES_XPU = "vllm.xpu_laguna.communicator.XpuLagunaCommunicator"


def _communicator(monkeypatch, qualname: str) -> None:
    from vllm.platforms import current_platform

    monkeypatch.setattr(
        type(current_platform),
        "get_device_communicator_cls",
        classmethod(lambda cls: qualname),
    )


def test_the_runtime_platform_runs_the_series_all_reduce(models) -> None:
    """In the CPU runtime vLLM picks the test-side platform (its platform
    plugin), whose communicator runs the rank-order sum: a TP 2 config of
    the exact path passes the contract."""
    from vllm.platforms import current_platform

    assert type(current_platform).__name__ == "StandInCpuPlatform"
    make_config(models, tensor_parallel_size=2)


def test_a_communicator_without_the_mode_is_refused(models, monkeypatch) -> None:
    """Negative control: upstream's CPU communicator (a platform without the
    series' communicator) would sum with gloo at TP 2; refused in one line.
    TP 1 needs no reduction and passes."""
    _communicator(monkeypatch, UPSTREAM_CPU)
    with pytest.raises(ValueError) as err:
        make_config(models, tensor_parallel_size=2)
    assert error_line(str(err.value)) == (
        "XPU Laguna series: the rank-order all-reduce at tensor parallel 2 "
        "needs the series' device communicator; this platform "
        "(StandInCpuPlatform) builds CpuCommunicator; run on the series' XPU "
        "platform (its plugin 'xpu_laguna'), or on CPU in the runtime with "
        "the series' test-side platform"
    )
    make_config(models, tensor_parallel_size=1)


def test_the_ring_needs_the_test_side_communicator(models, monkeypatch) -> None:
    """The debug ring runs only on the runtime's communicator: the wheel's
    XPU communicator has no such mode, so the option is refused there."""
    ring = {**SERIES_OFF, "prebuilt_metadata": True, "exact_tp_reduce": False}
    ring["debug_xccl_standin"] = True
    make_config(models, tensor_parallel_size=2, options=ring)
    _communicator(monkeypatch, SERIES_XPU)
    with pytest.raises(ValueError) as err:
        make_config(models, tensor_parallel_size=2, options=ring)
    assert "the xccl-standin all-reduce at tensor parallel 2" in error_line(
        str(err.value)
    )
