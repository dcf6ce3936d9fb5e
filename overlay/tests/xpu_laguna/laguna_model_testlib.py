# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Shared helpers for the XPU Laguna tests that build tiny Laguna models on
CPU: the config-only checkpoints (a tiny Llama too, for the models the
series leaves alone), the engine arguments of the in-process configs, the
one-rank gloo group, the series toggles (the ``toggles`` fixtures' body),
and the driver processes (a driver builds a random tiny target and DFlash
drafter, records the row counts of its stand-ins' calls, prints one JSON
object of observations on its last stdout line; its test runs it once).

Imports no vLLM or transformers at module level: the drivers set their
toggles before anything imports vLLM.
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

HIDDEN = 64
HEADS = 8  # q rows per token: 8 (8 tokens: 64 rows, a multiple of 16)
KV_HEADS = 4
HEAD_DIM = 32
VOCAB = 256
WIDTH = 8  # the verify width the drivers build for (the series' default)
# The row-invariant toggles the row dispatch tests switch (and clear).
ROW_DISPATCH_TOGGLES = (
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_QK_NORM",
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS",
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEAR_FORM",
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_INT4",
    "VLLM_XPU_LAGUNA_EXACT_VERIFY",
    "VLLM_XPU_LAGUNA_VERIFY_WIDTH",
)
# The toggles the row-invariant routed experts tests switch (and clear).
MOE_TOGGLES = (
    "VLLM_XPU_LAGUNA_ROW_INVARIANT_MOE",
    "VLLM_XPU_LAGUNA_EXACT_VERIFY",
    "VLLM_XPU_LAGUNA_VERIFY_WIDTH",
)
# The series-wide switches each row-invariant driver runs its observations
# under (next to its own): the defaults, exact verify off, a narrower width.
SERIES_VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "exact_off": {"EXACT_VERIFY": "0"},
    "width_4": {"VERIFY_WIDTH": "4"},
}
SettingsT = TypeVar("SettingsT")


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


def tiny_engine_args(model: str, speculative_config: dict | None = None) -> Any:
    """``EngineArgs`` of an eager float32 CPU config of a tiny model (128
    tokens, 8 sequences, a 16 MiB KV cache, no tokenizer)."""
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
    )


def init_one_rank(vllm_config: Any) -> None:
    """A one-rank gloo group (TP 1, PP 1) under ``vllm_config``."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
    )

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


def build_target_and_drafter(
    width: int, *, draft_mlp: str, tmp_prefix: str
) -> tuple[Any, Any, Any]:
    """The vLLM config (DFlash, ``width - 1`` speculative tokens) of
    :func:`write_target_and_draft`'s checkpoints under a one-rank group, and
    its ``LagunaForCausalLM`` target and ``DFlashLagunaForCausalLM`` drafter
    on CPU with seeded random weights (N(0, 0.2^2))."""
    import torch

    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.laguna import LagunaForCausalLM
    from vllm.model_executor.models.laguna_dflash import DFlashLagunaForCausalLM

    torch._dynamo.config.disable = True
    target_dir, draft_dir = write_target_and_draft(
        tempfile.mkdtemp(prefix=tmp_prefix), draft_mlp=draft_mlp
    )
    config = tiny_engine_args(
        target_dir,
        {"method": "dflash", "model": draft_dir, "num_speculative_tokens": width - 1},
    ).create_engine_config()
    init_one_rank(config)
    with set_current_vllm_config(config), torch.device("cpu"):
        target = LagunaForCausalLM(vllm_config=config, prefix="")
        drafter = DFlashLagunaForCausalLM(vllm_config=config, prefix="")
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for model in (target, drafter):
            for p in model.parameters():
                if p.dtype.is_floating_point:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return config, target, drafter


def set_series_env(names: Sequence[str], **values: str) -> None:
    """Clear ``names``, ask for the series (a CPU run sets a toggle:
    ``series_in_scope``), set ``VLLM_XPU_LAGUNA_<key>`` for each value and
    forget the scope decision."""
    from vllm.compilation.xpu_breakable_graph.config import reset_series_scope

    for name in names:
        os.environ.pop(name, None)
    os.environ["VLLM_XPU_LAGUNA_EXACT_VERIFY"] = "1"
    for key, value in values.items():
        os.environ[f"VLLM_XPU_LAGUNA_{key}"] = value
    reset_series_scope()


def toggles_fixture(
    monkeypatch: Any, names: Sequence[str], reload: Callable[[], SettingsT]
) -> Iterator[Callable[..., SettingsT]]:
    """The body of a ``toggles`` fixture (``yield from`` it): ``names``
    cleared, then ``set_(**values)``, which sets ``VLLM_XPU_LAGUNA_<key>``
    for each value and returns ``reload()`` (the module's settings read
    again, its counters reset); at teardown the environment is restored and
    ``reload()`` runs again."""
    for name in names:
        monkeypatch.delenv(name, raising=False)

    def set_(**values: str) -> SettingsT:
        for key, value in values.items():
            monkeypatch.setenv(f"VLLM_XPU_LAGUNA_{key}", value)
        return reload()

    set_()
    yield set_
    monkeypatch.undo()
    reload()


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
    """A driver's main: quiet vLLM logging and the series asked for (a CPU
    run sets a toggle: ``series_in_scope``) unless the environment says
    otherwise, before ``observe`` imports vLLM; then print ``observe()`` (or
    the traceback as ``crash``) as one JSON object on the last stdout line."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_XPU_LAGUNA_EXACT_VERIFY", "1")
    try:
        results = observe()
    except Exception:  # noqa: BLE001
        results = {"crash": traceback.format_exc()}
    sys.stdout.write("\n" + json.dumps(results) + "\n")
    sys.stdout.flush()
    return 0


def run_driver(driver: Path, cwd: Path, *args: str, **toggles: str) -> dict[str, Any]:
    """Run a driver with ``args`` in its own process, with no series toggle
    inherited but ``VLLM_XPU_LAGUNA_<key>`` from ``toggles``, and return its
    observations (a crash fails the caller)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_XPU_LAGUNA_")}
    env.update({f"VLLM_XPU_LAGUNA_{k}": v for k, v in toggles.items()})
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
