"""The matrix's TP legs, their teachers and the mutation leg (pure: no vLLM needed)."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from scripts import cpu_standins
from scripts.cpu_slots import OMP_BIND_ENV
from scripts.cpu_standins import standin_module
from scripts.matrix.cli import main
from scripts.matrix.engine import engine_kwargs
from scripts.matrix.evaluate import evaluate
from scripts.matrix.legs import (
    EQUAL_BY_ARITHMETIC,
    LEGS,
    STANDIN_OPTION,
    TP4_LEGS,
    TP_REDUCE_OPTION,
)
from scripts.matrix.runner import leg_environment
from scripts.measure.emulation import PLUGIN_DIR
from scripts.series_options import ENV_PREFIX, additional_config
from tests.fake_vllm import PLATFORM_MODULE, run_probe, write_fake_vllm
from tests.test_matrix_logprobs import TEACHER, _out

LEG = {leg.name: leg for leg in LEGS}
REPO = Path(__file__).resolve().parents[1]


def test_tp2_legs_carry_the_reduction_options_and_no_fixed_cpu_binding() -> None:
    options = LEG["dflash-graph0-meta1-tp2"].options()
    assert (options[TP_REDUCE_OPTION], options[STANDIN_OPTION]) == (True, True)
    assert LEG["dflash-ring-tp2-diagnostic"].options()[TP_REDUCE_OPTION] is False
    assert TP_REDUCE_OPTION not in LEG["dflash-graph0-meta0"].options()  # TP 1 legs unchanged
    # the cores come from the leg's CPU slots (runner), not the leg; no series variable either
    env = leg_environment(LEG["dflash-graph0-meta1-tp2"], 1, "cpu", {})
    assert OMP_BIND_ENV not in env and not [k for k in env if k.startswith(ENV_PREFIX)]


def test_tp_legs_install_the_series_attention_hook_in_their_workers() -> None:
    env = leg_environment(LEG["dflash-graph1-meta1-tp2"], 1, "cpu", {"PYTHONPATH": "/x"})
    assert env["XPU_LAGUNA_CPU_SERIES_ATTENTION"] == "1"
    assert env["PYTHONPATH"].endswith(":/x") and "series_attention" in env["PYTHONPATH"]
    assert "XPU_LAGUNA_CPU_SERIES_ATTENTION" not in leg_environment(LEG["teacher"], 1, "cpu", {})
    # the graph emulation is no environment hook: a graph leg asks in its engine's config
    assert not [k for k in env if "EMULATED" in k]


def _engine_config(name: str, emulate_graphs: bool) -> dict[str, object]:
    leg = LEG[name]
    return {
        "leg": asdict(leg),
        "target": "target",
        "draft": "draft",
        "method": "dflash",
        "dtype": "float32",
        "tp": leg.tp_size(1),
        "options": leg.options(),
        "max_model_len": 64,
        "emulate_graphs": emulate_graphs,
    }


def test_a_graph_leg_asks_for_emulated_graphs_in_its_engine_config() -> None:
    ask = standin_module().emulation_entry()
    graph = engine_kwargs(_engine_config("dflash-graph1-meta1-tp2", True))
    assert graph["additional_config"] == {**additional_config(LEG["dflash-graph1-meta1-tp2"].options()), **ask}
    assert graph["distributed_executor_backend"] == "mp"  # the ranks get it with the config
    # negative controls: an eager leg, and a graph leg on a device, do not ask
    eager = engine_kwargs(_engine_config("dflash-graph0-meta1-tp2", True))
    device = engine_kwargs(_engine_config("dflash-graph1-meta1-tp2", False))
    for kwargs in (eager, device):
        assert not set(ask) & set(kwargs["additional_config"])


# A stand-in vllm package for the plugin probe (tests/fake_vllm.py: the platform is CPU unless
# FAKE_PLATFORM says otherwise, and upstream's CPU plugin detects it then): the kernel registry the
# general plugin fills, stub CPU platform and communicator bases and graph break, and the overlay's real
# vllm.xpu_laguna.collectives (the modes and the mixin the runtime's communicator builds on).
FAKE_VLLM = {
    "envs.py": "",
    "logger.py": "import logging\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "platforms/__init__.py": PLATFORM_MODULE
    + "def cpu_platform_plugin():\n    return 'cpu' if current_platform.is_cpu() else None\n",
    "platforms/cpu.py": "class CpuPlatform:\n    pass\n",
    "distributed/device_communicators/cpu_communicator.py": "class CpuCommunicator:\n    pass\n",
    "xpu_laguna/graphs/collectives.py": ("def breakable_all_reduce(input_, group, eager):\n    return eager(input_)\n"),
    "xpu_laguna/attention/kernels.py": (
        "class AttentionKernels:\n"
        "    def __init__(self, **kw):\n        self.__dict__.update(kw)\n"
        "class _R:\n    def register(self, kernels):\n        self.kernels = kernels\n"
        "registry = _R()\n"
    ),
    "xpu_laguna/attention/split_plan.py": "",  # imported by the reference kernels' module
    "xpu_laguna/collectives.py": (REPO / "overlay/vllm/xpu_laguna/collectives.py").read_text(),
}

# What vLLM does in every process: ask each vllm.platform_plugins entry point for its platform (the
# out-of-tree one wins), then build the platform's device communicator for each group. The probe
# reports what each plugin answers and the modes the chosen platform's communicator runs.
PLUGIN_PROBE = """
import importlib, json
from importlib.metadata import entry_points
def load(qualname):
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)
active = {p.name: p.load()() for p in entry_points(group="vllm.platform_plugins")}
out = {"platforms": active, "modes": None}
chosen = active.get("xpu_laguna_standins")
if chosen:
    communicator = load(load(chosen).get_device_communicator_cls())
    out["modes"] = sorted(m.value for m in communicator.reduce_modes)
print(json.dumps(out))
"""


def _probe_plugins(tmp_path: Path, **env: str) -> dict[str, object]:
    """:data:`PLUGIN_PROBE` in a fresh interpreter whose site folder holds what ``cpu_runtime sync``
    lays there (:func:`scripts.cpu_standins.lay`) next to the stand-in vllm package."""
    site = tmp_path / "site"
    if not site.exists():
        site.mkdir()
        cpu_standins.lay(site)
        write_fake_vllm(site, FAKE_VLLM)
    done = run_probe(PLUGIN_PROBE, [site], drop=("VLLM_PLUGINS",), **env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ring_legs_get_the_xccl_standin_from_the_runtime_platform(tmp_path: Path) -> None:
    """The ring stand-in is the runtime's test-side package (scripts/cpu_standins, laid by sync):
    its platform plugin makes the platform of every process on CPU (the TP legs' mp-executor
    workers among them) the stand-in CPU platform, whose communicator runs the ring mode, so a leg
    only sets the option and adds no path. Negative control: off CPU the plugin names no platform
    (upstream's is chosen, whose communicator has no ring)."""
    ring_leg = LEG["dflash-ring-tp2-diagnostic"]
    ring = leg_environment(ring_leg, 1, "cpu", {})
    plain = leg_environment(replace(ring_leg, xccl_standin=False), 1, "cpu", {})
    assert ring_leg.options()[STANDIN_OPTION] is True and ring_leg.options()[TP_REDUCE_OPTION] is False
    assert ring == plain  # the switch is the engine's option only: the same environment either way
    assert "xccl" not in (next(PLUGIN_DIR.glob("*.dist-info")) / "entry_points.txt").read_text()
    assert (cpu_standins.HERE / cpu_standins.PACKAGE / "xccl_ring.py").is_file()
    platform = f"{cpu_standins.PACKAGE}.standin_platform.StandInCpuPlatform"
    on_cpu = _probe_plugins(tmp_path)
    assert on_cpu == {"platforms": {cpu_standins.PACKAGE: platform}, "modes": ["rank-order", "xccl-standin"]}
    off_cpu = _probe_plugins(tmp_path, FAKE_PLATFORM="xpu")
    assert off_cpu == {"platforms": {cpu_standins.PACKAGE: None}, "modes": None}


def test_each_leg_is_gated_against_its_own_teacher() -> None:
    differs = copy.deepcopy(TEACHER)
    differs[1][0][1] = (-0.1251).hex()
    names = ("teacher", "teacher-tp2", "dflash-graph0-meta1-tp2", "dflash-lastrow-mutation")
    outputs = {
        "teacher": _out(differs),  # TP 1 teacher: other bits than TP 2's
        "teacher-tp2": _out(TEACHER),
        "dflash-graph0-meta1-tp2": _out(copy.deepcopy(TEACHER)),
        "dflash-lastrow-mutation": _out(copy.deepcopy(differs)),
    }
    results = {r.name: r for r in evaluate(outputs, tuple(LEG[n] for n in names), 2, require_bitwise=True)}
    assert results["dflash-graph0-meta1-tp2"].status == "passed"
    assert (results["dflash-graph0-meta1-tp2"].teacher, results["dflash-graph0-meta1-tp2"].tp) == ("teacher-tp2", 2)
    # the mutation leg is a negative control: equal to its teacher means the gate missed the fault
    assert results["dflash-lastrow-mutation"].status == "failed"
    assert results["dflash-lastrow-mutation"].logprobs["verdict"] == "negative control FAILED"
    outputs["dflash-lastrow-mutation"] = _out(copy.deepcopy(TEACHER))
    results = {r.name: r for r in evaluate(outputs, tuple(LEG[n] for n in names), 2, require_bitwise=True)}
    assert results["dflash-lastrow-mutation"].status == "passed"


def test_fixed_order_off_at_two_ranks_must_still_be_equal() -> None:
    differs = copy.deepcopy(TEACHER)
    differs[0][0][1] = (-0.2501).hex()
    legs = (LEG["teacher-tp2"], LEG["dflash-ring-tp2-diagnostic"])
    outputs = {"teacher-tp2": _out(TEACHER), "dflash-ring-tp2-diagnostic": _out(copy.deepcopy(TEACHER))}
    result = evaluate(outputs, legs, 2, require_bitwise=True)[1]
    assert result.status == "passed" and result.logprobs["verdict"] == EQUAL_BY_ARITHMETIC
    outputs["dflash-ring-tp2-diagnostic"] = _out(differs)
    assert evaluate(outputs, legs, 2, require_bitwise=True)[1].status == "failed"


def test_run_refuses_a_leg_without_its_teacher(capsys: object) -> None:
    assert (
        main(["run", "--tiny", "/tmp/nowhere-tiny", "--legs", "teacher,dflash-graph0-meta1-tp2", "--check-only"]) == 2
    )


# ---------------------------------------------------------------- TP 4

TP4 = {leg.name: leg for leg in TP4_LEGS}


def test_tp4_legs_are_opt_in_and_named_by_the_cli() -> None:
    assert not {leg.name for leg in TP4_LEGS} & set(LEG)  # not in the default run
    assert all(leg.tp == 4 and leg.xccl_standin for leg in TP4_LEGS)
    options = TP4["dflash-graph0-meta1-tp4"].options()
    assert (options[TP_REDUCE_OPTION], options[STANDIN_OPTION]) == (True, True)
    assert TP4["teacher-ring-tp4"].options()[TP_REDUCE_OPTION] is False
    assert TP4["dflash-ring-tp4-diagnostic"].teacher == "teacher-ring-tp4"
    assert main(["run", "--tiny", "/tmp/nowhere-tiny", "--legs", ",".join(TP4), "--check-only"]) == 0


def test_the_tp4_ring_leg_is_a_negative_control_not_equal_by_arithmetic() -> None:
    """At 4 ranks the fixed order off must change bits: the ring leg fails when equal."""
    differs = copy.deepcopy(TEACHER)
    differs[0][1][1] = (-0.5001).hex()
    legs = (TP4["teacher-ring-tp4"], TP4["dflash-ring-tp4-diagnostic"])
    outputs = {"teacher-ring-tp4": _out(TEACHER), "dflash-ring-tp4-diagnostic": _out(differs)}
    result = evaluate(outputs, legs, 2, require_bitwise=True)[1]
    assert result.status == "passed" and result.logprobs["verdict"].startswith("negative control holds"), result
    outputs["dflash-ring-tp4-diagnostic"] = _out(copy.deepcopy(TEACHER))
    result = evaluate(outputs, legs, 2, require_bitwise=True)[1]
    assert result.status == "failed" and result.logprobs["verdict"] == "negative control FAILED"


def test_tp4_legs_are_refused_where_the_model_cannot_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_attention_heads_per_layer": [4, 4, 4, 2]}
    (model / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 2}))
    argv = ["run", "--model-dir", str(model), "--draft-dir", str(model), "--check-only", "--legs"]
    assert main([*argv, "teacher-tp4,dflash-graph0-meta1-tp4"]) == 2
    assert "runs at TP 4, which the model cannot" in capsys.readouterr().err
    assert main([*argv, "teacher-tp2,dflash-graph0-meta1-tp2"]) == 0  # the same model splits at TP 2
    assert main(["run", "--tiny", str(tmp_path / "tiny"), "--tp", "3", "--legs", "teacher", "--check-only"]) == 2
    assert "no tiny Laguna variant runs at TP 3" in capsys.readouterr().err
