# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Shared helpers for the XPU Laguna tests that build tiny Laguna models on
CPU: the config-only checkpoints (a tiny Llama too, for the models the
series leaves alone), the engine arguments of the in-process configs (the
series' options in their ``additional_config``), a stand-in config for the
code that reads only the options and the target's architecture, the
one-rank gloo group, and the driver processes (a driver builds random tiny
targets and DFlash drafters, one pair per set of options, records the row
counts of its stand-ins' calls, prints one JSON object of observations on
its last stdout line; its test runs it once).

The series reads its options from the configuration only
(``VllmConfig.additional_config["xpu_laguna"]``, see
``vllm.xpu_laguna.options``): nothing here sets an environment
variable, and a driver runs with none of the series' old variables (a
config build refuses one).

Imports no vLLM or transformers at module level.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import traceback
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

HIDDEN = 64
HEADS = 8  # q rows per token: 8 (8 tokens: 64 rows, a multiple of 16)
KV_HEADS = 4
HEAD_DIM = 32
VOCAB = 256
WIDTH = 8  # the verify width the drivers build for (the series' default)
# How a CPU run asks for the series (``series_in_scope``): one of its
# switches set true explicitly; on XPU a Laguna target always gets it.
ASK_FOR_SERIES: dict[str, Any] = {"exact_verify": True}
# The series-wide options each row-invariant driver runs its observations
# under (next to its own): the defaults, exact verify off, a narrower width.
SERIES_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "exact_off": {"exact_verify": False},
    "width_4": {"verify_width": 4},
}


def series_options(**options: Any) -> dict[str, Any]:
    """The options of a CPU run that asks for the series
    (:data:`ASK_FOR_SERIES`), ``options`` over them."""
    return {**ASK_FOR_SERIES, **options}


def additional_config(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``VllmConfig.additional_config`` holding ``options`` as the series'
    options (none: an empty one, the series' defaults)."""
    from vllm.xpu_laguna.options import ADDITIONAL_CONFIG_KEY

    return {} if options is None else {ADDITIONAL_CONFIG_KEY: dict(options)}


def assert_reads_no_variable(
    monkeypatch: Any,
    decide: Callable[[Any], Any],
    configs: Sequence[Any],
    contrary: Mapping[str, str],
) -> None:
    """``decide`` gives every config of ``configs`` the same answer with
    every variable the series used to read set: each option in ``contrary``
    to that value (one that would change the decision if it were read),
    every other one to ``1``."""
    from vllm.xpu_laguna.options import ENV_REPLACED_BY

    before = [decide(c) for c in configs]
    for name, key in ENV_REPLACED_BY.items():
        monkeypatch.setenv(name, contrary.get(key, "1"))
    assert [decide(c) for c in configs] == before


def config_stand_in(
    options: Mapping[str, Any] | None,
    architecture: str | None = "LagunaForCausalLM",
    **fields: Any,
) -> Any:
    """A stand-in ``VllmConfig`` for the code that reads only the series'
    options, the target's architecture and the parallel layout: the options
    in ``additional_config``, a model config of ``architecture`` (None: no
    model), one rank, and ``fields`` over these."""
    model = (
        None
        if architecture is None
        else SimpleNamespace(architectures=[architecture], enforce_eager=False)
    )
    return SimpleNamespace(
        **{
            "additional_config": additional_config(options),
            "model_config": model,
            "parallel_config": SimpleNamespace(
                tensor_parallel_size=1, pipeline_parallel_size=1, all2all_backend=None
            ),
            **fields,
        }
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_laguna_config(
    num_layers: int,
    moe_layers: Sequence[int] = (),
    *,
    layer_types: list[str] | None = None,
    max_position_embeddings: int = 256,
) -> Any:
    """A transformers ``LagunaConfig`` of the tiny target (``HIDDEN`` wide,
    ``HEADS`` query and ``KV_HEADS`` KV heads of ``HEAD_DIM``, ``VOCAB``
    tokens; every fourth layer full attention unless ``layer_types``; the
    ``moe_layers`` sparse, the others dense)."""
    from transformers import LagunaConfig

    cfg = LagunaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=HEADS,
        num_attention_heads_per_layer=[HEADS] * num_layers,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_position_embeddings,
        sliding_window=16,
        layer_types=layer_types
        or [
            "full_attention" if i % 4 == 3 else "sliding_attention"
            for i in range(num_layers)
        ],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        mlp_only_layers=[i for i in range(num_layers) if i not in moe_layers],
        mlp_layer_types=[
            "sparse" if i in moe_layers else "dense" for i in range(num_layers)
        ],
        decoder_sparse_step=1,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["LagunaForCausalLM"]
    return cfg


def write_tiny_llama(path: Path, num_layers: int = 2) -> Path:
    """A config-only ``LlamaForCausalLM`` checkpoint in ``path`` (``HIDDEN``
    wide, 4 query and 2 KV heads, ``VOCAB`` tokens, 256 positions): a model
    the series does not act on."""
    from transformers import LlamaConfig

    LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    ).save_pretrained(path)
    return path


def tiny_engine_args(
    model: str,
    speculative_config: dict | None = None,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """``EngineArgs`` of an eager float32 CPU config of a tiny model (128
    tokens, 8 sequences, a 16 MiB KV cache, no tokenizer), with the series'
    ``options`` in its ``additional_config`` (None: none)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        max_num_batched_tokens=128,
        max_num_seqs=8,
        kv_cache_memory_bytes=1 << 24,
        speculative_config=speculative_config,
        additional_config=additional_config(options),
    )


def init_one_rank(vllm_config: Any) -> None:
    """A one-rank gloo group (TP 1, PP 1) under ``vllm_config``, once per
    process (a later call keeps the group)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1, 1)


def write_target_and_draft(tmp: str, *, draft_mlp: str) -> tuple[str, str]:
    """Config-only checkpoints in ``tmp``: a 2-layer target (layer 1 sparse,
    sliding then full attention) and a 1-layer DFlash drafter reading both
    target layers, whose MLP is ``draft_mlp`` (``dense`` or ``sparse``)."""
    target, draft = os.path.join(tmp, "target"), os.path.join(tmp, "draft")
    cfg = tiny_laguna_config(
        2, (1,), layer_types=["sliding_attention", "full_attention"]
    )
    cfg.save_pretrained(target)
    cfg.architectures = ["DFlashLagunaForCausalLM"]
    cfg.num_hidden_layers = 1
    cfg.num_attention_heads_per_layer = None
    cfg.layer_types = ["full_attention"]
    cfg.mlp_only_layers = [0] if draft_mlp == "dense" else []
    cfg.mlp_layer_types = [draft_mlp]
    cfg.save_pretrained(draft)
    with open(os.path.join(draft, "config.json")) as f:
        raw = json.load(f)
    raw.update(
        draft_vocab_size=256,
        dflash_config={"target_layer_ids": [0, 1], "mask_token_id": 255},
    )
    with open(os.path.join(draft, "config.json"), "w") as f:
        json.dump(raw, f)
    return target, draft


class Built(NamedTuple):
    """A config and the target and drafter built under it."""

    config: Any
    target: Any
    drafter: Any
    refused: str | None
    """The configuration contract's one line when it refused the options
    (then the config was built without them and given them afterwards:
    the negative controls' forms off, which the contract refuses on the
    exact path), else None."""


CONTRACT_PREFIX = "XPU Laguna series: "  # the configuration contract's refusals
_CHECKPOINTS: dict[tuple[str, str], tuple[str, str]] = {}


def build_target_and_drafter(
    options: Mapping[str, Any], *, draft_mlp: str, tmp_prefix: str
) -> Built:
    """A vLLM config (DFlash, ``verify_width - 1`` speculative tokens) of
    :func:`write_target_and_draft`'s checkpoints with the series' ``options``
    (:func:`series_options` of them: the CPU run asks for the series) under
    a one-rank group, and its target (the class vLLM's registry resolves for
    ``LagunaForCausalLM``: the series' ``XpuLagunaForCausalLM``, which its
    general plugin registers) and drafter (``DFlashLagunaForCausalLM``'s) built
    under it on CPU, with seeded
    random weights (N(0, 0.2^2), the same for every call). The model reads
    its forms from the config it is built under, so every set of options
    gets its own pair. Options the configuration contract refuses are given
    to the config after it is built (:attr:`Built.refused` says so)."""
    import torch

    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import get_model_cls

    torch._dynamo.config.disable = True
    key = (tmp_prefix, draft_mlp)
    if key not in _CHECKPOINTS:
        _CHECKPOINTS[key] = write_target_and_draft(
            tempfile.mkdtemp(prefix=tmp_prefix), draft_mlp=draft_mlp
        )
    target_dir, draft_dir = _CHECKPOINTS[key]
    options = series_options(**options)
    width = int(options.get("verify_width", WIDTH))
    speculative = {
        "method": "dflash",
        "model": draft_dir,
        "num_speculative_tokens": width - 1,
    }
    refused = None
    try:
        config = tiny_engine_args(
            target_dir, speculative, options
        ).create_engine_config()
    except ValueError as err:  # pydantic's ValidationError wraps the line
        text = str(err)
        if CONTRACT_PREFIX not in text:
            raise
        refused = text[text.index(CONTRACT_PREFIX) :].splitlines()[0]
        refused = refused.split(" [type=")[0]
        config = tiny_engine_args(
            target_dir, speculative, series_options()
        ).create_engine_config()
        config.additional_config = additional_config(options)
    init_one_rank(config)
    with set_current_vllm_config(config), torch.device("cpu"):
        target = get_model_cls(config.model_config)(vllm_config=config, prefix="")
        drafter_cls = get_model_cls(config.speculative_config.draft_model_config)
        drafter = drafter_cls(vllm_config=config, prefix="")
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for model in (target, drafter):
            for p in model.parameters():
                if p.dtype.is_floating_point:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return Built(config, target, drafter, refused)


class Recorder:
    """What a driver's stand-ins record: the row count of each call, by the
    recorded name (``calls``), and which implementation each stand-in runs
    (``mode``)."""

    def __init__(self, **mode: str) -> None:
        self.calls: dict[str, list[int]] = defaultdict(list)
        self.mode = mode

    def rows(self, name: str, x: Any) -> None:
        """A call of ``name`` on the rows of ``x``."""
        self.calls[name].append(int(x.shape[0]))


def driver_main(observe: Callable[[], dict[str, Any]]) -> int:
    """A driver's main: quiet vLLM logging unless the environment says
    otherwise, before ``observe`` imports vLLM; then print ``observe()`` (or
    the traceback as ``crash``) as one JSON object on the last stdout line.
    The series' options are in the configs ``observe`` builds."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        results = observe()
    except Exception:  # noqa: BLE001
        results = {"crash": traceback.format_exc()}
    sys.stdout.write("\n" + json.dumps(results) + "\n")
    sys.stdout.flush()
    return 0


def run_driver(driver: Path, cwd: Path, *args: str) -> dict[str, Any]:
    """Run a driver with ``args`` in its own process, with none of the
    series' old variables inherited (its configs carry the options), and
    return its observations (a crash fails the caller)."""
    from vllm.xpu_laguna.options import ENV_PREFIX

    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    proc = subprocess.run(
        [sys.executable, str(driver), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "crash" not in result, result["crash"]
    return result
