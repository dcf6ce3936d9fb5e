# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Shared parts of the configuration-contract tests (test_contract.py,
test_contract_modes.py): tiny config-only Laguna checkpoints, the series'
options of a configuration (:data:`SERIES_ON`, given to every
``make_config`` unless a test gives others), a clean environment
(``series_environment``: each test module uses it for all its tests through
``pytestmark``; an autouse fixture of a plugin module would reach every
test of the session), a recorder of the contract's log lines, and a real
``VllmConfig`` built through vLLM's ``EngineArgs.create_engine_config``
with the options in ``additional_config["xpu_laguna"]``. The patch tests
run without conftest files, so the test modules import the fixtures."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from laguna_model_testlib import VOCAB, tiny_laguna_config

from vllm.v1.executor.abstract import Executor
from vllm.xpu_laguna.options import ADDITIONAL_CONFIG_KEY, ENV_PREFIX

SERIES_ON: Mapping[str, Any] = {"prebuilt_metadata": True}
"""A known series state: prebuilt metadata on (a switch set true: the series
acts on CPU), the exact verify on (its default), width 8, graphs off."""
SERIES_OFF: Mapping[str, Any] = {"prebuilt_metadata": False}
"""Every switch off or left to its default: on CPU the series does not act."""
COMPILE_LINE = (
    "XPU Laguna series: compilation mode NONE and cudagraph_mode NONE on the "
    "exact path (Inductor's fused reductions and device graphs' captured split "
    "counts would make verify rows differ from the decode; "
    "xpu_laguna.breakable_graph true for graphs)"
)
CONTRACT = "XPU Laguna series: "
"""How every line of the contract starts."""
OPTIONS = f"additional_config[{ADDITIONAL_CONFIG_KEY!r}]"
"""How every line about an unusable option starts."""
TARGET_LAYERS = 4


class RayLikeExecutor(Executor):
    """A custom executor that orchestrates through Ray (``uses_ray``)."""

    uses_ray = True


# ------------------------------------------------------------------ models


def _laguna_config(path: Path, *, layers: int, moe: bool) -> dict:
    moe_layers = list(range(1, layers)) if moe else []
    cfg = tiny_laguna_config(layers, moe_layers, max_position_embeddings=1024)
    cfg.save_pretrained(path)
    return json.loads((path / "config.json").read_text())


def _write(path: Path, cfg: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


INT4_QUANTIZATION = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "group_size": 32,
                "strategy": "group",
            },
        }
    },
    "ignore": ["lm_head"],
    "kv_cache_scheme": {
        "num_bits": 8,
        "type": "float",
        "strategy": "tensor",
        "dynamic": False,
        "symmetric": True,
    },
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("contract-models")
    target = _laguna_config(root / "target", layers=TARGET_LAYERS, moe=True)
    draft = _laguna_config(root / "scratch", layers=1, moe=False)
    draft.update(
        architectures=["DFlashLagunaForCausalLM"],
        draft_vocab_size=VOCAB,
        layer_types=["full_attention"],
        mlp_only_layers=[0],
        dflash_config={"target_layer_ids": [0, 2], "mask_token_id": 255},
    )
    out = {"target": root / "target"}
    out["int4"] = _write(
        root / "target-int4", dict(target, quantization_config=INT4_QUANTIZATION)
    )
    out["draft"] = _write(root / "draft", draft)
    out["draft_int4_name"] = _write(root / "Tiny-DFlash-INT4", draft)
    out["draft_wide"] = _write(root / "draft-wide", dict(draft, hidden_size=128))
    out["draft_vocab"] = _write(root / "draft-vocab", dict(draft, draft_vocab_size=512))
    out["draft_layers"] = _write(
        root / "draft-layers",
        dict(draft, dflash_config={"target_layer_ids": [0, 4], "mask_token_id": 255}),
    )
    return out


@pytest.fixture
def series_environment(monkeypatch):
    """No ``VLLM_XPU_LAGUNA_*`` variable (the series reads none and refuses
    one: the options come with each configuration) and no hub access."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def log_lines(monkeypatch):
    """The contract's log lines. vLLM's logging setup (run again by every
    ``create_engine_config``) drops handlers of its child loggers, so the
    contract's logger is replaced by a recorder of its once-only methods."""
    from vllm.xpu_laguna import contract as xpu_laguna_contract

    lines: list[str] = []

    class _Recorder:
        def info_once(self, msg: str, *args) -> None:
            lines.append(msg % args)

        warning_once = info_once

    monkeypatch.setattr(xpu_laguna_contract, "logger", _Recorder())
    return lines


def additional_config(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``additional_config`` that gives the series ``options`` (None:
    no entry, the series' defaults; anything but a mapping as it is, for
    the tests of what is refused)."""
    if options is None:
        return {}
    value = dict(options) if isinstance(options, Mapping) else options
    return {ADDITIONAL_CONFIG_KEY: value}


def make_config(
    models,
    target="target",
    draft="draft",
    spec=None,
    options: Mapping[str, Any] | None = SERIES_ON,
    **kwargs,
):
    """A real ``VllmConfig`` of ``target`` (+ a DFlash ``draft``, None: no
    speculative decoding) with the series' ``options``, through
    ``EngineArgs.create_engine_config``."""
    from vllm.engine.arg_utils import EngineArgs

    speculative = None
    if draft is not None:
        speculative = {
            "method": "dflash",
            "model": str(models[draft]),
            "num_speculative_tokens": 7,
        }
        speculative.update(spec or {})
    kwargs.setdefault("dtype", "bfloat16" if target == "int4" else "float32")
    if target == "int4":
        kwargs.setdefault("kv_cache_dtype", "bfloat16")
    kwargs.setdefault("max_num_seqs", 1)
    args = EngineArgs(
        model=str(models[target]),
        max_model_len=512,
        skip_tokenizer_init=True,
        speculative_config=speculative,
        additional_config=additional_config(options),
        **kwargs,
    )
    return args.create_engine_config()


def error_line(text: str, marker: str = CONTRACT) -> str:
    """The one line of an error's text that holds ``marker``, without what
    pydantic wraps around it (the series' own message is one line)."""
    assert marker in text, text
    (line,) = [ln for ln in text.splitlines() if marker in ln]
    line = line.split("Value error, ", 1)[-1].split(" [type=value_error", 1)[0]
    return line.strip()


def refused_line(models, marker: str = CONTRACT, **kwargs) -> str:
    """The one line with which ``make_config(models, **kwargs)`` is refused."""
    with pytest.raises(ValueError) as err:
        make_config(models, **kwargs)
    return error_line(str(err.value), marker)
