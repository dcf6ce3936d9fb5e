"""vLLM general plugin: test-side workarounds for two pristine upstream bugs met on CPU (vLLM 0.34.0).

Each one is behind its own switch (an environment variable set to ``1``), off by default, and acts
only in a process on the CPU platform; nothing here changes a vLLM file. The same folder's
``.dist-info`` names :func:`register` in ``vllm.general_plugins``, so with this folder on
``PYTHONPATH`` vLLM calls it in every process (the engine core and workers included) before any
model is built. Written up for upstream in ``docs/upstream/cpu-0.34.0-workarounds.md``.

* :data:`DFLASH_QKV_ENV` (bug A): DFlash crashes on CPU with ``IndexError`` at the fused-KV
  transpose of ``laguna_dflash.py``: the CPU linear method
  (``dispatch_cpu_unquantized_gemm(..., remove_weight=True)``) has replaced each drafter layer's
  ``qkv_proj.weight`` by an empty tensor before the drafter's ``process_weights_after_loading``
  stacks those weights into its context-KV buffers. The workaround marks the drafter's
  ``qkv_proj`` layers ``_cpu_skip_gemm_dispatch`` (upstream's own opt-out, used for MLA's
  ``kv_b_proj``): they keep their weight and run ``torch.nn.functional.linear``.
* :data:`LAGUNA_BIAS_ENV` (bug B): Laguna drops ``mlp.experts.e_score_correction_bias``: the
  loader ignores the ``_bias`` suffix it does not map, so routing runs with a zero bias and tokens
  differ from transformers from the third token. The workaround copies each layer's checkpoint
  tensor into the router's ``e_score_correction_bias`` parameter after the model's own load. The
  series' patch 0002 is the real fix (it also fixes the device).
"""

from __future__ import annotations

import os
import re
import sys

DFLASH_QKV_ENV = "XPU_LAGUNA_CPU_FIX_DFLASH_QKV"
LAGUNA_BIAS_ENV = "XPU_LAGUNA_CPU_FIX_LAGUNA_BIAS"
APPLIED_LINE = "XPU Laguna CPU workaround applied"
_BIAS_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts\.e_score_correction_bias$")
_done: set[str] = set()


def _say(text: str) -> None:
    print(f"{text} (pid {os.getpid()})", file=sys.stderr, flush=True)


def _dflash_keeps_qkv_weight() -> None:
    from vllm.model_executor.models import laguna_dflash

    cls = laguna_dflash.DFlashLagunaModel
    original = cls.__init__

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        for module in self.modules():
            if type(module).__name__ == "QKVParallelLinear":
                module._cpu_skip_gemm_dispatch = True

    cls.__init__ = __init__


def bias_copies(names_and_tensors, layers):  # type: ignore[no-untyped-def]
    """Split checkpoint weights into those for the model's own loader and the routing correction
    biases, which are copied into each layer's router parameter (``layers[i].mlp``)."""
    rest = []
    copied = []
    for name, tensor in names_and_tensors:
        match = _BIAS_NAME.search(name)
        if not match:
            rest.append((name, tensor))
            continue
        mlp = layers[int(match.group(1))].mlp
        targets = [p for n, p in mlp.named_parameters() if n.endswith("e_score_correction_bias")]
        if not targets:
            raise RuntimeError(f"{name}: no e_score_correction_bias parameter under layer {match.group(1)}'s mlp")
        for param in targets:
            param.data.copy_(tensor.to(param.dtype))
        copied.append(name)
    return rest, copied


def _laguna_loads_bias() -> None:
    from vllm.model_executor.models import laguna

    cls = laguna.LagunaModel
    original = cls.load_weights

    def load_weights(self, weights):  # type: ignore[no-untyped-def]
        rest, copied = bias_copies(list(weights), self.layers)
        loaded = original(self, rest)
        return set(loaded) | set(copied)

    cls.load_weights = load_weights


WORKAROUNDS = {DFLASH_QKV_ENV: _dflash_keeps_qkv_weight, LAGUNA_BIAS_ENV: _laguna_loads_bias}


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM may call it more than once)."""
    wanted = [env for env in WORKAROUNDS if os.environ.get(env) == "1" and env not in _done]
    if not wanted:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for env in wanted:
        _done.add(env)
        try:
            WORKAROUNDS[env]()
        except (ImportError, AttributeError) as exc:  # a release without the module or class
            _say(f"XPU Laguna CPU workaround {env} not applicable here: {exc!r}")
            continue
        _say(f"{APPLIED_LINE}: {env}")
