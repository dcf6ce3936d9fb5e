# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The replay guard against real FlashAttention metadata built the way the
DFlash drafter builds it, prebuilt exact metadata off and on.

DFlash makes ``query_start_loc`` and ``seq_lens`` new tensors every step
(vllm/v1/spec_decode/dflash.py), so their addresses depend on the caching
allocator. Attention runs in an eager break and reads the current step's
metadata: nothing captured reads it, so the wrapper must not guard it. A
wrapped forward must survive 500+ cycles of such steps over varying lengths
and verify widths, and still refuse a replay whose captured input moved.
"""

from __future__ import annotations

import pytest
import torch
from breakable_graph_standins import piecewise_step_context
from laguna_attn_testlib import BLOCK_SIZE, kv_spec, options, vllm_config

from vllm.config import (
    VllmConfig,
    set_current_vllm_config,
)
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.xpu_laguna.attention.backend import (
    XpuLagunaFlashAttentionMetadataBuilder as FlashAttentionMetadataBuilder,
)
from vllm.xpu_laguna.graphs.backends import DeviceGraphBackend
from vllm.xpu_laguna.graphs.errors import StaticInputMismatchError
from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

WIDTH = 8
COLS = 16
# (query rows, sequence length) per step: verify steps of the full width,
# narrower ones near the end, plain decode steps.
STEPS = [(8, 40), (8, 48), (1, 49), (8, 57), (5, 62), (8, 70), (3, 73), (8, 81)]


class _Runner:
    """Persistent step buffers refreshed in place, as the V1 runner does."""

    def __init__(self, config: VllmConfig) -> None:
        self.qsl = torch.zeros(2, dtype=torch.int32)
        self.seq_lens = torch.zeros(1, dtype=torch.int32)
        self.table = torch.arange(COLS, dtype=torch.int32).reshape(1, COLS) + 3
        self.slots = torch.full((WIDTH,), -1, dtype=torch.int64)
        with set_current_vllm_config(config):
            self.builders = {
                "model.layers.0.self_attn.attn": FlashAttentionMetadataBuilder(
                    kv_spec(512),
                    ["model.layers.0.self_attn.attn"],
                    config,
                    torch.device("cpu"),
                ),
                "model.layers.1.self_attn.attn": FlashAttentionMetadataBuilder(
                    kv_spec(None),
                    ["model.layers.1.self_attn.attn"],
                    config,
                    torch.device("cpu"),
                ),
            }

    def step(self, q: int, seq_len: int) -> dict[str, object]:
        self.qsl.copy_(torch.tensor([0, q], dtype=torch.int32))
        self.seq_lens.fill_(seq_len)
        self.slots.fill_(-1)
        self.slots[:q] = torch.arange(seq_len - q, seq_len) + 3 * BLOCK_SIZE
        common = CommonAttentionMetadata(
            query_start_loc=self.qsl,
            query_start_loc_cpu=self.qsl.clone(),
            seq_lens=self.seq_lens,
            num_reqs=1,
            num_actual_tokens=q,
            max_query_len=q,
            max_seq_len=seq_len,
            block_table_tensor=self.table,
            slot_mapping=self.slots,
            causal=True,
            seq_lens_cpu_upper_bound=self.seq_lens.clone(),
        )
        return {name: b.build(0, common) for name, b in self.builders.items()}


class _Graph:
    """Stand-in device graph (replays nothing): only the guards matter here."""

    def capture_begin(self, pool=None) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        pass


def _dflash_step(runner: _Runner, q: int, seq_len: int) -> dict[str, object]:
    """Like DFlash: query_start_loc and seq_lens are fresh tensors each step."""
    runner.qsl = torch.arange(2, dtype=torch.int32) * q
    runner.seq_lens = torch.full((1,), seq_len, dtype=torch.int32)
    return runner.step(q, seq_len)


def _metadata_pointers(metadata: dict[str, object]) -> tuple[int, ...]:
    md = metadata["model.layers.1.self_attn.attn"]
    return (md.query_start_loc.data_ptr(), md.seq_lens.data_ptr())


@pytest.mark.parametrize("prebuilt", [False, True], ids=["md-off", "md-on"])
def test_wrapped_forward_survives_500_dflash_cycles(prebuilt):
    config = vllm_config(8, options(exact=True, width=WIDTH, prebuilt=prebuilt))
    runner = _Runner(config)
    # the builders took the prebuilt option from the config they were made with
    owners = [b.laguna_prebuilt is not None for b in runner.builders.values()]
    assert owners == [prebuilt] * len(owners)
    input_ids = torch.zeros(WIDTH, dtype=torch.int64)
    positions = torch.zeros(WIDTH, dtype=torch.int64)
    wrapper = XpuBreakableGraphWrapper(
        lambda input_ids, positions: input_ids,
        config,
        backend=DeviceGraphBackend(name="stand-in", graph_factory=_Graph),
        expected=None,
    )
    slots = {name: runner.slots for name in runner.builders}

    def call(metadata, ids=input_ids):
        with piecewise_step_context(
            config, WIDTH, attn_metadata=metadata, slot_mapping=slots
        ):
            return wrapper(input_ids=ids, positions=positions)

    seen = set()
    keep = []  # keep old metadata alive: the allocator cannot hand back an address
    cycles = 0
    for prompt_len in (17, 40, 96, 200, 333, 512):  # prompts of varying length
        for step in range(90):
            q = STEPS[step % len(STEPS)][0]
            metadata = _dflash_step(runner, q, prompt_len + step * 3)
            keep.append(metadata)
            seen.add(_metadata_pointers(metadata))
            input_ids.fill_(step)
            call(metadata)
            cycles += 1
    assert cycles >= 500
    assert wrapper.replays == cycles - 1  # the first call captured
    # The metadata really moved (the old per-layout address guard refused it).
    assert len(seen) == cycles
    # What a captured segment reads is still guarded: a moved input id buffer.
    with pytest.raises(StaticInputMismatchError, match=r"kwargs\['input_ids'\]"):
        call(_dflash_step(runner, 8, 900), ids=input_ids.clone())
