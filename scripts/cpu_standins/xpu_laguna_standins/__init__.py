"""Test-side stand-ins of the XPU Laguna series: what the CPU runtime and the tests run instead of
the device, kept out of the wheel (nothing under ``vllm/`` imports this package).

* :mod:`.reference_attention`: pure-torch reference kernels for the FlashAttention backend (the
  XPU paged-decode kernel's split-K, the cache write), and the oracle of the device checks;
* :mod:`.emulated_graphs`: emulated device graphs for breakable-graph runs on CPU, only for an
  engine whose config asks for them (:func:`emulation_entry` in its ``additional_config``: the
  matrix's and the e2e tests' graph legs, a CPU server with ``--emulate-graphs``, the device graph
  check's self test);
* :mod:`.int4_experts`: the XPU routed INT4 experts' kernel call (a reference dequantize and
  matmul), so a CPU engine loads a compressed-tensors W4A16 MoE through vLLM's XPU path (only
  with ``VXL_XPU_INT4_EXPERTS=1``);
* :mod:`.standin_platform`, :mod:`.standin_communicator` and :mod:`.standin_worker`: the CPU
  platform of the runtime (upstream's ``CpuPlatform`` whose device communicator runs the series'
  all-reduce modes, as the series' XPU platform's does on the device; where a run asks for
  emulated graphs, its graphs are the recording graph and its worker captures them), chosen by
  vLLM through :func:`platform_plugin`;
* :mod:`.xccl_ring`: XCCL's ring all-reduce (oneCCL's chunk split, sum order and rounding) for
  that communicator's ``debug_xccl_standin`` mode (the series' option of that name in the
  engine's ``additional_config["xpu_laguna"]``; the matrix's ring legs and the patch tests'
  negative controls).

How it gets there: ``python -m scripts.cpu_runtime sync`` (so ``ensure`` too) copies this folder
and ``xpu_laguna_standins-0.dist-info`` into the CPU runtime's site-packages (a pristine runtime
never syncs, and never gets it). The dist-info names :func:`register` in vLLM's
``vllm.general_plugins`` group, which vLLM calls in every process it builds an engine in (the
API server, the engine core, every worker) before any model is built, and
:func:`platform_plugin` in ``vllm.platform_plugins``, which vLLM asks when it resolves the
platform of a process.

:func:`register`, on the CPU platform only, registers the reference kernels with the overlay's
kernel registry (``vllm.xpu_laguna.attention.kernels.registry``); on any other platform,
and in a vLLM without the series (no registry), it does nothing. Registering turns nothing on: a
CPU engine still takes upstream's ``CPU_ATTN`` unless a test registers FlashAttention under it.
The communicator runs the ring only for an engine whose options turn ``debug_xccl_standin`` on.
A process that never builds an engine (a unit test) calls :func:`register` itself.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig

KERNELS_NAME = "reference"
PLATFORM = "xpu_laguna_standins.standin_platform.StandInCpuPlatform"
EMULATION_KEY = "xpu_laguna_standins"
"""The key of ``VllmConfig.additional_config`` where an engine asks the test side for emulated
graphs (:func:`emulation_entry`); beside the series' own key, which holds the series' options."""
EMULATED_GRAPHS = "emulated_graphs"


def emulation_entry() -> dict[str, dict[str, bool]]:
    """The ``additional_config`` entry of an engine whose breakable graphs the test side emulates on
    CPU: merged into its ``additional_config``, it reaches every process of the engine with the
    config (workers included, whatever the executor), and no other engine."""
    return {EMULATION_KEY: {EMULATED_GRAPHS: True}}


def emulation_asked(vllm_config: VllmConfig | None) -> bool:
    """Whether ``vllm_config`` asks for emulated graphs (:func:`emulation_entry`). A malformed entry
    is refused in one line naming the key."""
    extra: Any = getattr(vllm_config, "additional_config", None) or {}
    entry = extra.get(EMULATION_KEY) if isinstance(extra, dict) else None
    if entry is None:
        return False
    if not isinstance(entry, dict) or set(entry) != {EMULATED_GRAPHS} or not isinstance(entry[EMULATED_GRAPHS], bool):
        raise ValueError(
            f"additional_config[{EMULATION_KEY!r}]: expected {{{EMULATED_GRAPHS!r}: true or false}}, got {entry!r}"
        )
    return entry[EMULATED_GRAPHS]


def register() -> bool:
    """The ``vllm.general_plugins`` entry point (may run more than once): True when the reference
    kernels are registered in this process."""
    if importlib.util.find_spec("vllm.xpu_laguna.attention.kernels") is None:
        return False  # a vLLM without the series
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.xpu_laguna.attention.kernels import AttentionKernels, registry

    from . import int4_experts, reference_attention

    registry.register(
        AttentionKernels(
            name=KERNELS_NAME,
            flash_attn_varlen_func=reference_attention.flash_attn_varlen_func,
            reshape_and_cache_flash=reference_attention.reshape_and_cache_flash,
        )
    )
    int4_experts.install()
    return True


def platform_plugin() -> str | None:
    """The ``vllm.platform_plugins`` entry point: the runtime's CPU platform
    (:class:`~xpu_laguna_standins.standin_platform.StandInCpuPlatform`) where upstream detects a CPU,
    else None (a vLLM without the series: upstream's platform)."""
    import vllm  # imported already: vLLM is resolving its platform

    # looked up without importing vllm.distributed (it needs the platform)
    if not any((Path(p) / "xpu_laguna" / "collectives.py").is_file() for p in vllm.__path__):
        return None
    from vllm.platforms import cpu_platform_plugin

    return PLATFORM if cpu_platform_plugin() is not None else None
