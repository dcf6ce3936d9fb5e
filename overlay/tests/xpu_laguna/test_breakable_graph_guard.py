# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The every-replay guard (``static_input_probe``) through the wrapper, with
the recording stand-in graph (emulated device graphs: a replay re-runs the
recorded ops on the recorded tensors, so a replaced buffer is stale).

The forward is called as the V1 runner calls the model: keyword arguments
only, the tensors fresh views of persistent buffers every step, a None
keyword, and a slot-mapping dict with one buffer per KV-cache group shared
by the group's layers. A captured segment reads every group's slot mapping
(as the captured KV-cache write does). Each refusal has its control: the
same step with the guard bypassed replays stale memory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from breakable_graph_standins import piecewise_step_context
from laguna_model_testlib import write_tiny_llama
from xpu_laguna_standins.emulated_graphs import recording_backend

from vllm.config import ModelConfig, VllmConfig
from vllm.forward_context import get_forward_context
from vllm.xpu_laguna.graphs.errors import StaticInputMismatchError
from vllm.xpu_laguna.graphs.guards import (
    static_input_pointers,
    static_input_probe,
)
from vllm.xpu_laguna.graphs.wrapper import XpuBreakableGraphWrapper

N = 8
# Two KV-cache groups; layers a0/a1 share group A's slot mapping.
LAYERS = {"a0": "A", "a1": "A", "b0": "B"}


def _config() -> VllmConfig:
    path = write_tiny_llama(Path(tempfile.mkdtemp(prefix="breakable-guard-")), 1)
    return VllmConfig(
        model_config=ModelConfig(
            model=str(path), skip_tokenizer_init=True, dtype="float32"
        )
    )


class _Runner:
    """Persistent buffers; every step hands out fresh views of them."""

    def __init__(self) -> None:
        self.x = torch.zeros(2 * N)
        self.positions = torch.zeros(2 * N)
        self.slots = {g: torch.zeros(2 * N, dtype=torch.int64) for g in "AB"}
        self.cache = torch.arange(64, dtype=torch.float32) * 0.5

    def fill(self, step: int) -> None:
        gen = torch.Generator().manual_seed(step)
        self.x.copy_(torch.randn(2 * N, generator=gen))
        self.positions.copy_(torch.arange(2 * N) + step)
        for g in "AB":
            self.slots[g].copy_(torch.randint(0, 64, (2 * N,), generator=gen))

    def kwargs(self) -> dict[str, object]:
        return {"x": self.x[:N], "positions": self.positions[:N], "embeds": None}

    def slot_mapping(self) -> dict[str, torch.Tensor]:
        return {layer: self.slots[g][:N] for layer, g in LAYERS.items()}

    def expected(self, kwargs, slot_mapping) -> torch.Tensor:
        """Plain torch on the step's own tensors (not through the wrapper)."""
        return (
            kwargs["x"]
            + kwargs["positions"]
            + self.cache[slot_mapping["a0"]]
            + self.cache[slot_mapping["b0"]]
        )


def _forward(runner: _Runner):
    def forward(x, positions, embeds=None):
        slots = get_forward_context().slot_mapping
        out = x + positions
        out = out + runner.cache.index_select(0, slots["a0"])
        out = out + runner.cache.index_select(0, slots["b0"])
        if embeds is not None:
            out = out + embeds
        return out

    return forward


def _setup():
    config = _config()
    runner = _Runner()
    wrapper = XpuBreakableGraphWrapper(
        _forward(runner), config, backend=recording_backend(), expected=None
    )

    def call(kwargs, slot_mapping):
        with (
            torch.inference_mode(),
            piecewise_step_context(config, N, slot_mapping=slot_mapping),
        ):
            return wrapper(**kwargs).clone()

    runner.fill(0)
    call(runner.kwargs(), runner.slot_mapping())  # capture
    return runner, wrapper, call


def _stepped():
    """A captured wrapper, the buffers filled for the next step, and that
    step's inputs."""
    runner, wrapper, call = _setup()
    runner.fill(1)
    return runner, wrapper, call, runner.kwargs(), runner.slot_mapping()


def _refused_and_stale_unguarded(runner, wrapper, call, kwargs, slots, match):
    """The guard refuses the replay; control: without the guard the replay
    reads the captured inputs (stale)."""
    with pytest.raises(StaticInputMismatchError, match=match):
        call(kwargs, slots)
    _bypass_guard(wrapper)
    assert not torch.equal(call(kwargs, slots), runner.expected(kwargs, slots))


def _bypass_guard(wrapper: XpuBreakableGraphWrapper) -> None:
    """What ``--inject-fault stale-input-unguarded`` does in the matrix."""
    (entry,) = wrapper.entries.values()
    entry.input_pointers = None
    wrapper._check_static_inputs = lambda *a: None  # type: ignore[method-assign]


def test_fresh_views_of_the_same_buffers_replay_exactly() -> None:
    runner, wrapper, call = _setup()
    for step in range(1, 6):
        runner.fill(step)
        kwargs, slots = runner.kwargs(), runner.slot_mapping()
        out = call(kwargs, slots)
        assert torch.equal(out, runner.expected(kwargs, slots)), step
    assert wrapper.replays == 5


@pytest.mark.parametrize("layer", ["a0", "b0"])
def test_moved_slot_mapping_group_is_refused(layer: str) -> None:
    runner, wrapper, call, kwargs, slots = _stepped()
    group = LAYERS[layer]
    moved = torch.randint(0, 64, (N,), generator=torch.Generator().manual_seed(9))
    slots = {k: moved if g == group else slots[k] for k, g in LAYERS.items()}
    first_layer = next(k for k, g in LAYERS.items() if g == group)
    _refused_and_stale_unguarded(
        runner, wrapper, call, kwargs, slots, rf"slot_mapping\['{first_layer}'\]"
    )


def test_moved_input_is_refused() -> None:
    runner, wrapper, call, kwargs, slots = _stepped()
    kwargs["x"] = kwargs["x"] + 1.0  # a new tensor instead of the buffer
    _refused_and_stale_unguarded(runner, wrapper, call, kwargs, slots, r"kwargs\['x'\]")


def test_none_keyword_that_became_a_tensor_is_refused() -> None:
    runner, wrapper, call, kwargs, slots = _stepped()
    kwargs["embeds"] = torch.ones(N)
    with pytest.raises(StaticInputMismatchError, match="refusing to replay"):
        call(kwargs, slots)
    # Control: the capture never read it; unguarded, it is silently ignored.
    _bypass_guard(wrapper)
    out = call(kwargs, slots)
    assert torch.equal(out, runner.expected(kwargs, slots))
    assert not torch.equal(out, runner.expected(kwargs, slots) + 1.0)


def test_structure_changes_are_refused() -> None:
    runner, wrapper, call, kwargs, slots = _stepped()
    missing_layer = {k: v for k, v in slots.items() if k != "a1"}
    with pytest.raises(StaticInputMismatchError):
        call(kwargs, missing_layer)
    with pytest.raises(StaticInputMismatchError):
        call({**kwargs, "extra": torch.zeros(N)}, slots)
    with pytest.raises(StaticInputMismatchError):
        call({k: v for k, v in kwargs.items() if k != "positions"}, slots)
    with pytest.raises(StaticInputMismatchError):
        call({**kwargs, "embeds": torch.zeros(N)}, slots)


def test_a_keyword_passed_as_none_equals_one_not_passed() -> None:
    """Model Runner V2 captures without ``inputs_embeds`` and passes
    ``inputs_embeds=None`` on real steps: the same call, replayed."""
    runner, wrapper, call, kwargs, slots = _stepped()
    without = {k: v for k, v in kwargs.items() if k != "embeds"}
    assert torch.equal(call(without, slots), runner.expected(kwargs, slots))
    more = {**kwargs, "intermediate_tensors": None}
    assert torch.equal(call(more, slots), runner.expected(kwargs, slots))


def test_probe_agrees_with_the_general_form() -> None:
    """The generated probe and :func:`static_input_pointers` (the form for
    any calling convention) tell the same steps apart."""
    runner = _Runner()
    kwargs, slots = runner.kwargs(), runner.slot_mapping()
    names = ("a0", "b0")
    probe = static_input_probe((), kwargs, slots, names)
    general = static_input_probe((kwargs["x"],), {}, slots, names)
    assert probe.__name__ == "probe" and general.__name__ == "<lambda>"
    captured = probe((), kwargs, slots)
    assert captured == tuple(
        p for p in static_input_pointers((), kwargs, slots, names)[:-1]
    )
    moved_b = dict(slots, b0=slots["b0"].clone())
    same_views = (runner.kwargs(), runner.slot_mapping())
    assert probe((), *same_views) == captured
    assert probe((), kwargs, moved_b) != captured
    assert static_input_pointers((), kwargs, moved_b, names) != (
        static_input_pointers((), kwargs, slots, names)
    )
    assert probe((), kwargs, None) != captured
    assert probe((kwargs["x"],), kwargs, slots) != captured
