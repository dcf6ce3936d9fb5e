# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Unit tests of vllm/xpu_laguna/graphs/ on CPU.

``RecordingGraph`` (breakable_graph_standins.py) stands in for a device
graph with the property that matters: between ``capture_begin`` and
``capture_end`` kernels are recorded, not executed (their outputs hold
garbage, here NaN), and ``replay`` runs them on the same tensors. The
capture module is the real one.

The configuration step and the wrapper choice read the series' options from
the config given (``additional_config["xpu_laguna"]``); configs here are
stand-ins carrying them (``laguna_model_testlib.config_stand_in``).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from breakable_graph_standins import PlatformStandIn, RecordingGraph
from laguna_model_testlib import config_stand_in, series_options

from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
from vllm.xpu_laguna.graphs.backends import (
    DeviceGraphBackend,
    device_graph_backend,
)
from vllm.xpu_laguna.graphs.capture import XpuBreakableGraphCapture
from vllm.xpu_laguna.graphs.errors import (
    BreakableGraphConfigError,
    CaptureCeilingError,
    OutOfPlaceBreakError,
    TopologyMismatchError,
)
from vllm.xpu_laguna.graphs.guards import (
    first_difference,
    reachable_tensor_identities,
)
from vllm.xpu_laguna.graphs.topology import (
    BreakKind,
    ExpectedTopology,
)

BACKEND = DeviceGraphBackend(name="recording", graph_factory=RecordingGraph)


def _forward(capture, x, buf, *, in_place=True):
    """graph: y = 2x | eager: buf = y + 1 | graph: w = 3 * buf."""
    y = x * 2

    def eager():
        if in_place:
            return torch.add(y, 1, out=buf)
        return y + 1  # out-of-place: a new tensor each call

    z = capture.add_eager(eager, kind=BreakKind.COLLECTIVE)
    return z * 3


def test_expected_topology_laguna_s() -> None:
    tp4 = ExpectedTopology.decoder(48, 4)
    assert (tp4.attention, tp4.collective) == (48, 97)
    assert (tp4.graphs, tp4.breaks) == (146, 145)
    assert tp4.segments == 291 and tp4.ceiling == 582
    tp1 = ExpectedTopology.decoder(48, 1)
    assert (tp1.attention, tp1.collective, tp1.graphs) == (48, 0, 49)
    with pytest.raises(ValueError):
        ExpectedTopology.decoder(4, 0)


def test_materialisation_makes_first_capture_correct() -> None:
    x = torch.arange(4, dtype=torch.float32)
    buf = torch.empty(4)
    cap = XpuBreakableGraphCapture(backend=BACKEND)
    with cap:
        w = _forward(cap, x, buf)
    assert torch.equal(w, (x * 2 + 1) * 3)
    assert cap.break_counts() == {"graph": 2, "attention": 0, "collective": 1}
    assert cap.kinds == [BreakKind.GRAPH, BreakKind.COLLECTIVE, BreakKind.GRAPH]
    # Each graph ran exactly once, at capture.
    graphs = RecordingGraph.created[-2:]
    assert [g.replays for g in graphs] == [1, 1]
    # Replay after an in-place input update recomputes through the break.
    x.copy_(torch.tensor([5.0, 6.0, 7.0, 8.0]))
    cap.replay()
    assert torch.equal(w, (x * 2 + 1) * 3)


def test_without_materialisation_first_capture_is_garbage() -> None:
    """The failure the materialisation prevents: the eager break consumes
    a segment output that was never computed."""
    x = torch.arange(4, dtype=torch.float32)
    buf = torch.empty(4)
    cap = XpuBreakableGraphCapture(backend=BACKEND, materialize=False)
    with cap:
        w = _forward(cap, x, buf)
    assert torch.isnan(w).all()
    cap.replay()  # a later replay is right again
    assert torch.equal(w, (x * 2 + 1) * 3)


def test_out_of_place_break_is_refused_on_replay() -> None:
    x = torch.arange(4, dtype=torch.float32)
    cap = XpuBreakableGraphCapture(backend=BACKEND)
    with cap:
        w = _forward(cap, x, torch.empty(4), in_place=False)
    assert torch.equal(w, (x * 2 + 1) * 3)  # the capture itself looks fine
    x.add_(1)
    with pytest.raises(OutOfPlaceBreakError, match="write in place"):
        cap.replay()


def test_ceiling_refuses_and_releases_capture_slot() -> None:
    cap = XpuBreakableGraphCapture(
        backend=BACKEND, expected=ExpectedTopology(attention=1, collective=0)
    )
    assert cap.max_segments == 6
    x = torch.ones(2)
    with pytest.raises(CaptureCeilingError, match="ceiling of 6 segments"), cap:
        for _ in range(4):
            cap.add_eager(lambda: torch.mul(x, 2, out=x))
    assert BreakableCUDAGraphCapture.current() is None
    assert cap.num_eager_breaks == 3  # refused at the 3rd break (7 > 6)


def test_topology_mismatch_raises() -> None:
    cap = XpuBreakableGraphCapture(
        backend=BACKEND, expected=ExpectedTopology(attention=2, collective=5)
    )
    x = torch.ones(2)
    with cap:
        for kind in (BreakKind.COLLECTIVE, BreakKind.ATTENTION):
            cap.add_eager(lambda: torch.mul(x, 2, out=x), kind=kind)
    with pytest.raises(TopologyMismatchError, match="attention=1 collective=1"):
        cap.check_topology()
    ok = XpuBreakableGraphCapture(
        backend=BACKEND, expected=ExpectedTopology(attention=1, collective=1)
    )
    with ok:
        for kind in (BreakKind.COLLECTIVE, BreakKind.ATTENTION):
            ok.add_eager(lambda: torch.mul(x, 2, out=x), kind=kind)
    ok.check_topology()
    assert "graphs=3 breaks=2 (attention=1 collective=1)" in ok.audit_line("s8")


def test_identities_cover_nested_metadata() -> None:
    base = torch.zeros(10)
    obj = {"a": [base[2:4], (base,)], "b": {"c": base[::2]}}
    ids = reachable_tensor_identities(obj, "m")
    assert [i[0] for i in ids] == ["m['a'][0]", "m['a'][1][0]", "m['b']['c']"]
    assert ids[0][2] == 2 and ids[2][4] == (2,)
    moved = {"a": [base[3:5], (base,)], "b": {"c": base[::2]}}
    diff = first_difference(ids, reachable_tensor_identities(moved, "m"))
    assert diff is not None and diff.startswith("m['a'][0]")
    assert first_difference(ids, reachable_tensor_identities(obj, "m")) is None


def test_in_place_breaks_skip_the_result_check_unless_debug() -> None:
    """Default replay checks only breaks whose result the next segment reads
    and that are not in place by construction; debug checks them all."""
    x = torch.arange(4, dtype=torch.float32)
    fresh = []

    def out_of_place_but_declared_in_place():
        fresh.append(x + 1)
        return fresh[-1]

    cap = XpuBreakableGraphCapture(backend=BACKEND)
    with cap:
        cap.add_eager(out_of_place_but_declared_in_place, in_place=True)
    cap.finish()
    cap.replay()  # trusted: not checked
    with pytest.raises(OutOfPlaceBreakError):
        cap.replay(debug=True)
    assert cap.replays == 2


def test_shared_capture_stream_for_every_capture() -> None:
    """Target and drafter captures run on one stream (a shared pool needs
    it); a new stream per capture was the old behaviour."""
    from types import ModuleType

    from vllm.xpu_laguna.graphs.backends import _side_stream_capture

    class _Stream:
        def wait_stream(self, other) -> None:
            pass

    used = []
    device = ModuleType("fake_device_for_stream_test")
    device.Stream = _Stream
    device.current_stream = _Stream

    class _Use:
        def __init__(self, stream) -> None:
            used.append(stream)

        def __enter__(self) -> None:
            pass

        def __exit__(self, *exc) -> None:
            pass

    device.stream = _Use
    for _ in range(3):  # e.g. target, drafter, target at another shape
        with _side_stream_capture(device):
            pass
    assert len(used) == 3 and used[0] is used[1] is used[2]


class _PlatformStandIn(PlatformStandIn):
    def get_global_graph_pool(self):
        return ("pool", self.device_type)


def test_device_graph_choice() -> None:
    cfg = _config_stand_in()
    xpu = device_graph_backend(cfg, _PlatformStandIn("xpu"))
    assert xpu.name == "xpu" and xpu.graph_factory is torch.xpu.XPUGraph
    assert xpu.pool() == ("pool", "xpu")
    cuda = device_graph_backend(cfg, _PlatformStandIn("cuda"))
    assert cuda.name == "cuda" and cuda.graph_factory is torch.cuda.CUDAGraph
    with pytest.raises(BreakableGraphConfigError, match="XPU or CUDA"):
        device_graph_backend(cfg, _PlatformStandIn("cpu"))


BREAKABLE = {"breakable_graph": True}


class _Manager:
    """V2's graph manager as ``preset_breakable_runner`` reads it."""

    def __init__(self, use_breakable_cg: bool = True, runner=None) -> None:
        self.use_breakable_cg = use_breakable_cg
        self.breakable_cg_runner = runner


class _Runner:
    def __init__(self, vllm_config, manager) -> None:
        self.vllm_config = vllm_config
        self.cudagraph_manager = manager
        self.model = torch.nn.Identity()


def test_the_runner_gets_the_series_wrapper_where_its_config_asks() -> None:
    """The worker's hook presets the series' wrapper for a Laguna config whose
    options turn breakable graphs on (on CPU: asked for explicitly), before
    V2's ``init_breakable_cg_runner`` would build upstream's; every other
    config, a manager without breakable graphs or one that has a wrapper
    already is left to upstream. Two configs in one process each get their
    own choice."""
    from vllm.config import CompilationConfig
    from vllm.xpu_laguna.graphs.wrapper import (
        XpuBreakableGraphWrapper,
        preset_breakable_runner,
    )

    backend = BACKEND
    compiled = {"compilation_config": CompilationConfig(cudagraph_capture_sizes=[8])}
    on = config_stand_in(BREAKABLE, **compiled)
    off = config_stand_in(series_options(breakable_graph=False), **compiled)
    for _ in range(2):
        runner = _Runner(on, _Manager())
        assert preset_breakable_runner(runner, backend=backend)
        wrapper = runner.cudagraph_manager.breakable_cg_runner
        assert isinstance(wrapper, XpuBreakableGraphWrapper)
        assert wrapper.runnable is runner.model
        # the negative controls: upstream's wrapper stays V2's to build
        for runner in (
            _Runner(off, _Manager()),
            _Runner(config_stand_in(None, **compiled), _Manager()),
            _Runner(on, _Manager(use_breakable_cg=False)),
        ):
            assert not preset_breakable_runner(runner, backend=backend)
            assert runner.cudagraph_manager.breakable_cg_runner is None
    built = object()
    kept = _Runner(on, _Manager(runner=built))
    assert not preset_breakable_runner(kept, backend=backend)
    assert kept.cudagraph_manager.breakable_cg_runner is built
    assert not preset_breakable_runner(_Runner(on, None), backend=backend)


@pytest.mark.parametrize(
    "options,architecture,series",
    [
        (series_options(breakable_graph=False), "LagunaForCausalLM", False),
        (None, "LagunaForCausalLM", False),
        (BREAKABLE, None, False),
        (BREAKABLE, "LagunaForCausalLM", True),
        (BREAKABLE, "LlamaForCausalLM", False),
    ],
)
def test_v2_manager_keeps_the_wrapper_the_worker_preset(
    monkeypatch, options, architecture, series
) -> None:
    """The series' worker hook, then Model Runner V2's own
    ``CudaGraphManager.init_breakable_cg_runner`` (which builds upstream's
    wrapper only when none is set): the series' wrapper when the config's
    options turn breakable graphs on and the target is one the series is
    for, upstream's otherwise. The option off (or not given) is the negative
    control of the choice being the hook's, the Laguna row the control of
    the Llama and no-model rows (a model out of scope keeps upstream's
    wrapper under upstream's own breakable graphs)."""
    from xpu_laguna_standins.emulated_graphs import recording_backend

    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.config import CompilationConfig
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager
    from vllm.xpu_laguna.graphs.wrapper import (
        XpuBreakableGraphWrapper,
        preset_breakable_runner,
    )

    monkeypatch.setattr(type(current_platform), "_global_graph_pool", "pool")
    vllm_config = config_stand_in(
        options,
        architecture,
        compilation_config=CompilationConfig(cudagraph_capture_sizes=[8]),
    )
    manager = SimpleNamespace(
        breakable_cg_runner=None, vllm_config=vllm_config, use_breakable_cg=True
    )
    model = torch.nn.Identity()
    runner = SimpleNamespace(
        cudagraph_manager=manager, vllm_config=vllm_config, model=model
    )
    assert preset_breakable_runner(runner, backend=recording_backend()) is series
    CudaGraphManager.init_breakable_cg_runner(manager, model)
    built = manager.breakable_cg_runner
    assert isinstance(built, BreakableCUDAGraphWrapper)
    assert isinstance(built, XpuBreakableGraphWrapper) is series


@pytest.fixture(autouse=True)
def _breakable_switch_restored(monkeypatch):
    """Each test here starts without VLLM_USE_BREAKABLE_CUDAGRAPH and
    leaves none behind (it changes how later configs resolve compilation);
    configure_breakable_graph never writes it. The torch here has XPU
    graphs (the XPU platform stand-in's configuration needs them)."""
    from vllm.utils import torch_utils

    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH")
    monkeypatch.setattr(torch_utils, "supports_xpu_graph", lambda: True)


def _config_stand_in(
    options: dict | None = BREAKABLE, architecture: str | None = "LagunaForCausalLM"
):
    """A config the configuration step reads: a Laguna target with the
    series' breakable graphs asked for (default), nothing else set."""
    from vllm.config import CompilationConfig

    return config_stand_in(
        options,
        architecture,
        compilation_config=CompilationConfig(),
        speculative_config=None,
        scheduler_config=None,
    )


XPU = _PlatformStandIn("xpu")


def test_the_configuration_forces_no_runner_and_arms_v2s_path(monkeypatch) -> None:
    """Model Runner V2 is vLLM 0.34.0's only runner: the configuration step
    accepts it and turns on V2's breakable path in this config
    (compilation_config.use_breakable_cudagraph, the field V2 reads), not
    through the environment a later config would inherit."""
    from vllm.xpu_laguna.graphs.config import configure_breakable_graph

    cfg = _config_stand_in()
    assert configure_breakable_graph(cfg, XPU) is True
    cc = cfg.compilation_config
    assert cc.use_breakable_cudagraph is True
    assert cc.cudagraph_capture_sizes == [8]
    assert cc.prefill_cudagraph_capture_token_sizes == [8]
    assert cc.max_prefill_cudagraph_capture_tokens == 8
    assert cc.decode_cudagraph_capture_request_sizes == []
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH" not in os.environ


def test_two_configs_in_one_process_get_their_own_graphs() -> None:
    """Each config is configured from its own options, in any order: the
    width of one (4) never reaches another (8), the option off (a Laguna
    with the series but not its graphs) leaves that config as upstream
    resolves it, and configuring the first again gives the same result."""
    from vllm.xpu_laguna.graphs.config import configure_breakable_graph

    narrow = _config_stand_in({"breakable_graph": True, "verify_width": 4})
    default = _config_stand_in()
    without = _config_stand_in(series_options(breakable_graph=False))
    assert configure_breakable_graph(narrow, XPU) is True
    assert configure_breakable_graph(without, XPU) is False
    assert configure_breakable_graph(default, XPU) is True
    assert configure_breakable_graph(narrow, XPU) is True
    assert narrow.compilation_config.cudagraph_capture_sizes == [4]
    assert narrow.compilation_config.prefill_cudagraph_capture_token_sizes == [4]
    assert default.compilation_config.cudagraph_capture_sizes == [8]
    assert without.compilation_config.cudagraph_capture_sizes is None
    assert without.compilation_config.use_breakable_cudagraph is not True


def test_nothing_is_read_from_the_environment(monkeypatch) -> None:
    """The variables the series used to read change nothing: a config
    without the option stays upstream's, one with it gets its own width."""
    from vllm.xpu_laguna.graphs.config import configure_breakable_graph
    from vllm.xpu_laguna.options import ENV_REPLACED_BY

    contrary = {"breakable_graph": "1", "verify_width": "4"}
    for name, key in ENV_REPLACED_BY.items():
        if key in contrary:
            monkeypatch.setenv(name, contrary[key])
    without = _config_stand_in(series_options())
    assert configure_breakable_graph(without, XPU) is False
    cfg = _config_stand_in()
    assert configure_breakable_graph(cfg, XPU) is True
    assert cfg.compilation_config.cudagraph_capture_sizes == [8]


def test_a_cuda_platform_is_not_the_series(monkeypatch) -> None:
    """The series acts on XPU (and on CPU when a run asks): on a CUDA
    platform the option leaves the configuration as upstream resolves it;
    the XPU row is the control."""
    from vllm.xpu_laguna.graphs.config import (
        breakable_graph_enabled,
        configure_breakable_graph,
    )

    cuda, xpu = _config_stand_in(), _config_stand_in()
    assert configure_breakable_graph(cuda, _PlatformStandIn("cuda")) is False
    assert not breakable_graph_enabled(cuda, _PlatformStandIn("cuda"))
    assert cuda.compilation_config.cudagraph_capture_sizes is None
    assert configure_breakable_graph(xpu, XPU) is True
    assert breakable_graph_enabled(xpu, XPU)


@pytest.mark.parametrize(
    "field,value,accepted,message",
    [
        ("prefill_cudagraph_capture_token_sizes", [16], False, "not prefill_"),
        ("prefill_cudagraph_capture_token_sizes", [4, 8], False, "not prefill_"),
        ("prefill_cudagraph_capture_token_sizes", [8], True, ""),
        ("decode_cudagraph_capture_request_sizes", [1, 2], False, "FULL decode"),
        ("decode_cudagraph_capture_request_sizes", [], True, ""),
    ],
)
def test_v2_capture_sizes_other_than_the_width_are_refused(
    monkeypatch, field, value, accepted, message
) -> None:
    """V2's own capture-size fields: PIECEWISE prefill graphs of exactly the
    verify width and no FULL decode graphs; anything else is refused in one
    line (the accepted rows are the negative control: the same call with the
    width's value passes)."""
    from vllm.xpu_laguna.graphs.config import configure_breakable_graph

    cfg = _config_stand_in()
    setattr(cfg.compilation_config, field, value)
    if accepted:
        configure_breakable_graph(cfg, XPU)
        assert getattr(cfg.compilation_config, field) == value
        return
    with pytest.raises(BreakableGraphConfigError) as info:
        configure_breakable_graph(cfg, XPU)
    text = str(info.value)
    assert message in text and str(value) in text and "\n" not in text
    assert text.startswith("xpu_laguna.breakable_graph: ")


class _EmulatingPlatformStandIn(_PlatformStandIn):
    """A CPU platform that names graphs of its own (as the CPU runtime's
    test-side platform does for an engine whose config asks for emulation);
    it keeps the configs it was asked with."""

    def __init__(self, device_type: str, backend) -> None:
        super().__init__(device_type)
        self._backend = backend
        self.asked_with: list = []

    def xpu_laguna_graph_backend(self, vllm_config):
        self.asked_with.append(vllm_config)
        return self._backend


def test_emulated_backend_is_accepted_on_cpu_and_named() -> None:
    """A platform's own graphs (the hook the test-side platform answers) are
    taken, and said to be emulated; a CPU platform without them (negative
    control), or whose hook names none, is refused."""
    from xpu_laguna_standins.emulated_graphs import recording_backend

    from vllm.xpu_laguna.graphs.backends import PLATFORM_BACKEND_HOOK
    from vllm.xpu_laguna.graphs.config import configure_breakable_graph

    assert PLATFORM_BACKEND_HOOK == "xpu_laguna_graph_backend"
    for platform in (
        _PlatformStandIn("cpu"),
        _EmulatingPlatformStandIn("cpu", None),
    ):
        with pytest.raises(BreakableGraphConfigError, match="XPU or CUDA"):
            configure_breakable_graph(_config_stand_in(), platform)
    emulating = _EmulatingPlatformStandIn("cpu", recording_backend())
    cfg = _config_stand_in()
    assert configure_breakable_graph(cfg, emulating)
    assert "RecordingGraph" in device_graph_backend(cfg, emulating).graph_class_name
    # the platform is asked with the config of the engine the graphs are for
    assert emulating.asked_with == [cfg, cfg]


def test_the_test_side_platform_emulates_only_for_a_config_that_asks() -> None:
    """The CPU runtime's test-side platform names the recording graph for
    an engine whose config asks for emulation, and none for another engine
    of the same process (negative control: the CPU has no device graphs, so
    the series refuses its breakable graphs)."""
    from xpu_laguna_standins import emulation_entry
    from xpu_laguna_standins.standin_platform import StandInCpuPlatform

    asking = _config_stand_in()
    asking.additional_config = {**asking.additional_config, **emulation_entry()}
    other = _config_stand_in()
    backend = StandInCpuPlatform.xpu_laguna_graph_backend(asking)
    assert backend is not None and backend.name == "emulated"
    assert "RecordingGraph" in backend.graph_class_name
    assert StandInCpuPlatform.xpu_laguna_graph_backend(other) is None
    assert StandInCpuPlatform.xpu_laguna_graph_backend(asking) is not None


@pytest.mark.parametrize(
    "architecture,configured",
    [("LlamaForCausalLM", False), ("LagunaForCausalLM", True)],
)
def test_breakable_graphs_configure_only_a_laguna_target(
    monkeypatch, architecture, configured
) -> None:
    """The option set explicitly (as the XPU recipe does) leaves another
    model's configuration as upstream resolves it; the Laguna row is the
    control (the same call configures the graphs)."""
    from vllm.xpu_laguna.graphs.config import configure_breakable_graph

    cfg = _config_stand_in(architecture=architecture)
    assert configure_breakable_graph(cfg, XPU) is configured
    sizes = cfg.compilation_config.prefill_cudagraph_capture_token_sizes
    assert (sizes == [8]) is configured
    assert (cfg.compilation_config.use_breakable_cudagraph is True) is configured
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH" not in os.environ


@pytest.mark.parametrize("leaked", [False, True])
def test_a_later_config_in_the_process_resolves_its_own_graph_path(
    monkeypatch, tmp_path, leaked
) -> None:
    """The series' graph configuration of one engine (a Laguna config,
    platform given as XPU) does not reach the next config this process
    builds: another model's VllmConfig resolves upstream's breakable path
    off, as its own settings say. Control (``leaked``): the switch the
    series used to write into ``os.environ`` turns it on for that model."""
    from laguna_model_testlib import write_tiny_llama

    from vllm.engine.arg_utils import EngineArgs
    from vllm.xpu_laguna.graphs.config import configure_breakable_graph

    laguna = _config_stand_in()
    assert configure_breakable_graph(laguna, XPU)
    assert laguna.compilation_config.use_breakable_cudagraph is True
    if leaked:
        monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    llama = EngineArgs(
        model=str(write_tiny_llama(tmp_path / "llama")),
        max_model_len=128,
        skip_tokenizer_init=True,
    ).create_engine_config()
    assert llama.compilation_config.use_breakable_cudagraph is leaked
