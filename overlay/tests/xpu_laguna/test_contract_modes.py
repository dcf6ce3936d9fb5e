# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The configuration contract's rules for compilation and graph modes,
settings that break exactness, and the Laguna-only scope (see
test_contract.py for how a configuration is built; shared parts in
contract_testlib.py)."""

from __future__ import annotations

import pytest
from contract_testlib import (
    COMPILE_LINE,
    SERIES_TOGGLE,
    make_config,
    refused_line,
)
from laguna_model_testlib import write_tiny_llama

from vllm.config import CompilationMode, CUDAGraphMode

# the fixtures (models, series_on, log_lines); no conftest in the patch tests
pytest_plugins = ("contract_testlib",)


# every test here starts from the series state of ``series_on``
pytestmark = pytest.mark.usefixtures("series_on")


# ------------------------------------------------ compilation and graph modes


@pytest.mark.parametrize("level", ["0", "1", "2", "3"])
def test_optimization_levels_end_in_mode_none(models, level) -> None:
    """Whatever -O level (they only fill unset fields), the final config,
    after the CPU platform hook, has no compilation and no graphs. Without
    the rule the CPU hook turns the levels' VLLM_COMPILE into
    DYNAMO_TRACE_ONCE (negative control below)."""
    cfg = make_config(models, optimization_level=level)
    assert cfg.compilation_config.mode == CompilationMode.NONE
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.NONE


def test_without_the_rule_the_default_compiles(models, monkeypatch) -> None:
    """Negative control: the same config with the exact verify off compiles
    (upstream's default on CPU: VLLM_COMPILE lowered to DYNAMO_TRACE_ONCE)."""
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "0")
    cfg = make_config(models)
    assert cfg.compilation_config.mode == CompilationMode.DYNAMO_TRACE_ONCE


def test_an_explicit_compilation_mode_is_refused(models) -> None:
    assert refused_line(models, compilation_config={"mode": 3}) == (
        "XPU Laguna series: compilation mode VLLM_COMPILE on the exact path "
        "(Inductor fuses the norms and gates into its own reductions: verify rows "
        "and the decode then run different arithmetic); use -cc.mode=NONE (or "
        "--enforce-eager), or VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1 for graphs"
    )
    cfg = make_config(models, compilation_config={"mode": 0})
    assert cfg.compilation_config.mode == CompilationMode.NONE


def test_an_explicit_graph_mode_is_refused(models) -> None:
    assert refused_line(
        models, compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"}
    ) == (
        "XPU Laguna series: cudagraph_mode FULL_AND_PIECEWISE on the exact path "
        "(graphs bake the attention split counts at capture time); use "
        "-cc.cudagraph_mode=NONE (or --enforce-eager), or "
        "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1 for the series' breakable graphs"
    )
    assert make_config(models, compilation_config={"cudagraph_mode": "NONE"})
    assert make_config(models, enforce_eager=True)


def test_unset_graph_mode_is_set_to_none_before_the_level_defaults(
    models, monkeypatch, log_lines
) -> None:
    """The CPU platform sets cudagraph_mode NONE on its own, so the rule is
    reached on a real config with both modes unset again (as they are when
    the contract runs, before the -O level fills them: FULL_AND_PIECEWISE
    at O2, the XPU default)."""
    from vllm.config.xpu_laguna_contract import check_series_contract

    cfg = make_config(models)
    log_lines.clear()
    for exact, expect in (("1", CUDAGraphMode.NONE), ("0", None)):
        monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", exact)
        cfg.compilation_config.mode = None
        cfg.compilation_config.cudagraph_mode = None
        check_series_contract(cfg)
        assert cfg.compilation_config.cudagraph_mode == expect  # "0": control
    assert log_lines.count(COMPILE_LINE) == 1


def test_breakable_graphs_keep_their_own_modes(models, monkeypatch) -> None:
    """With the series' breakable-graph toggle 0007 sets the modes (NONE,
    PIECEWISE); the contract leaves them to it (on CPU 0007 refuses for lack
    of device graphs: its refusal, not the contract's, is the proof)."""
    monkeypatch.setenv("VLLM_XPU_LAGUNA_BREAKABLE_GRAPH", "1")
    with pytest.raises(ValueError, match="VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1: needs"):
        make_config(models)


# -------------------------------------------- settings that break exactness


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "VLLM_XPU_LAGUNA_ROW_INVARIANT_QK_NORM",
            "off",
            "XPU Laguna series: VLLM_XPU_LAGUNA_ROW_INVARIANT_QK_NORM=off on the "
            "exact path (the q/k norm kernel reduces verify rows in another order "
            "than the decode); set VLLM_XPU_LAGUNA_ROW_INVARIANT_QK_NORM=pad (or "
            "tokens)",
        ),
        (
            "VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS",
            "none",
            "XPU Laguna series: VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS leaves "
            "qkv_proj,o_proj,g_proj,dense_mlp,shared_expert,router,lm_head without "
            "a row-invariant form on the exact path; set "
            "VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS=all",
        ),
        (
            "VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS",
            "qkv_proj,o_proj,g_proj,dense_mlp,shared_expert,router",
            "XPU Laguna series: VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS leaves "
            "lm_head without a row-invariant form on the exact path; set "
            "VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS=all",
        ),
        (
            "VLLM_XPU_LAGUNA_ROW_INVARIANT_INT4",
            "0",
            "XPU Laguna series: VLLM_XPU_LAGUNA_ROW_INVARIANT_INT4=0 on the exact "
            "path (the INT4 GEMM primitive is built per row count); set "
            "VLLM_XPU_LAGUNA_ROW_INVARIANT_INT4=1",
        ),
    ],
)
def test_forms_off_are_refused(models, monkeypatch, name, value, message) -> None:
    monkeypatch.setenv(name, value)
    assert refused_line(models) == message
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "0")  # control: exact off
    assert make_config(models)


def test_a_bad_row_invariant_value_fails_at_config_time(models, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS", "qkv,bogus")
    assert refused_line(models).startswith(
        "XPU Laguna series: VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS: unknown kind(s)"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VLLM_XPU_LAGUNA_EXACT_TP_REDUCE", "yes"),
        ("VLLM_XPU_LAGUNA_VERIFY_WIDTH", "17"),
        ("VLLM_XPU_LAGUNA_DEBUG_NO_SPLIT_PLAN", "on"),
        ("VLLM_XPU_LAGUNA_ROW_INVARIANT_MOE", "lanes"),
    ],
)
def test_a_bad_series_value_fails_at_config_time(
    models, monkeypatch, name, value
) -> None:
    monkeypatch.setenv(name, value)
    message = refused_line(models)
    assert message.startswith(
        f"XPU Laguna series: {name}='{value}' is not a valid value ("
    ), message
    assert message.endswith(
        f"; set {name} to one of its documented values (vllm/envs.py)"
    )


def test_a_bad_series_value_is_not_checked_for_another_model(
    tmp_path, monkeypatch
) -> None:
    """Negative control of the value check: not a Laguna target, upstream's
    behaviour (the series' variables are not read)."""
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_TP_REDUCE", "yes")
    target = write_tiny_llama(tmp_path / "tiny-llama")
    from vllm.engine.arg_utils import EngineArgs

    assert EngineArgs(
        model=str(target), max_model_len=256, skip_tokenizer_init=True
    ).create_engine_config()


TP_REDUCE_MESSAGE = (
    "XPU Laguna series: VLLM_XPU_LAGUNA_EXACT_TP_REDUCE=0 at tensor_parallel_size 2 "
    "on the exact path (the backend's all-reduce sums in an order set by the "
    "message size); set VLLM_XPU_LAGUNA_EXACT_TP_REDUCE=1 (a diagnostic run of "
    "the ring sets VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN=1 as well)"
)


def test_the_fixed_rank_order_off_at_tp2_is_refused(models, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_TP_REDUCE", "0")
    assert refused_line(models, tensor_parallel_size=2) == TP_REDUCE_MESSAGE
    assert make_config(models, tensor_parallel_size=1)  # one rank: no reduction


def test_debug_switches_pass_with_a_warning(models, monkeypatch, log_lines) -> None:
    """The matrix's diagnostic legs (ring at TP 2/4, no split plan) set the
    debug switches explicitly: they pass, each with one warning."""
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_TP_REDUCE", "0")
    monkeypatch.setenv("VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN", "1")
    monkeypatch.setenv("VLLM_XPU_LAGUNA_DEBUG_NO_SPLIT_PLAN", "1")
    assert make_config(models, tensor_parallel_size=2)
    for name in ("XCCL_STANDIN", "NO_SPLIT_PLAN"):
        line = (
            f"XPU Laguna series: debug switch VLLM_XPU_LAGUNA_DEBUG_{name}=1 "
            "(diagnostic run, not for serving)"
        )
        assert log_lines.count(line) == 1, log_lines
    assert (
        "XPU Laguna series: VLLM_XPU_LAGUNA_EXACT_TP_REDUCE=0 at "
        "tensor_parallel_size 2 (diagnostic run: not exact, not for serving)"
    ) in log_lines


# ----------------------------------------------------------- Laguna only


def test_a_config_without_a_model_is_left_alone(monkeypatch, log_lines) -> None:
    """A ``VllmConfig()`` built without a model (vLLM's own tests and tools
    do) with the toggles set: the same configuration as with none set, and
    no line (the exact rules used to act on it: prefix caching off, modes
    NONE, the max_num_seqs warning)."""
    from vllm.config import VllmConfig

    def resolved() -> tuple:
        cfg = VllmConfig()
        cc, comp = cfg.cache_config, cfg.compilation_config
        return (
            cc.enable_prefix_caching,
            cc.cache_dtype,
            comp.mode,
            comp.cudagraph_mode,
        )

    monkeypatch.delenv(SERIES_TOGGLE)
    upstream = resolved()
    monkeypatch.setenv(SERIES_TOGGLE, "1")
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "1")
    assert resolved() == upstream
    assert log_lines == []


def test_another_model_keeps_its_configuration(
    tmp_path, monkeypatch, log_lines
) -> None:
    """Series toggles set, a Llama target: prefix caching on, the KV dtype as
    asked, compilation as upstream, no rule, one info line."""
    from vllm.config.xpu_laguna_contract import series_active
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "1")
    target = write_tiny_llama(tmp_path / "tiny-llama")
    cfg = EngineArgs(
        model=str(target),
        max_model_len=256,
        skip_tokenizer_init=True,
        kv_cache_dtype="fp8",
        tensor_parallel_size=2,
        async_scheduling=True,
        max_num_seqs=4,
    ).create_engine_config()
    assert cfg.cache_config.enable_prefix_caching is True
    assert cfg.cache_config.cache_dtype == "fp8"
    assert cfg.compilation_config.mode == CompilationMode.DYNAMO_TRACE_ONCE
    assert not series_active(cfg)
    assert log_lines == [
        "XPU Laguna series: inactive for LlamaForCausalLM (the series acts on "
        "LagunaForCausalLM on XPU, or on CPU when a series toggle is set to 1)"
    ]


def test_laguna_on_cpu_needs_a_toggle_set(models, monkeypatch) -> None:
    """On CPU the series acts only when a run asks (a toggle set to 1 in the
    environment); the defaults alone leave a Laguna target upstream's."""
    monkeypatch.delenv(SERIES_TOGGLE)
    cfg = make_config(models)
    assert cfg.cache_config.enable_prefix_caching is True
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "1")  # control: asked
    assert make_config(models).cache_config.enable_prefix_caching is False


def test_the_scope_reaches_the_worker_predicates(models, tmp_path, monkeypatch) -> None:
    """The predicates a worker calls decide from the current VllmConfig
    (init, load, profile run) and keep that decision for the forward-time
    calls that have none."""
    from vllm.compilation.xpu_breakable_graph.config import reset_series_scope
    from vllm.config import set_current_vllm_config
    from vllm.distributed import xpu_laguna_collectives as coll
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.backends.xpu_laguna_exact import exact_verify_width

    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "1")
    laguna = make_config(models, tensor_parallel_size=2)
    llama = EngineArgs(
        model=str(write_tiny_llama(tmp_path / "tiny-llama")),
        max_model_len=256,
        skip_tokenizer_init=True,
        tensor_parallel_size=2,
    ).create_engine_config()
    for cfg, width, mode in (
        (laguna, 8, coll.TpReduceMode.RANK_ORDER),
        (llama, 0, coll.TpReduceMode.PLAIN),
    ):
        reset_series_scope()
        coll.reset_tp_reduce_mode_cache()
        with set_current_vllm_config(cfg):
            assert coll.tp_reduce_mode("tp:0", 2) is mode
        coll.reset_tp_reduce_mode_cache()
        # outside the context (a forward pass): the decision made under it
        assert coll.tp_reduce_mode("tp:0", 2) is mode
        assert exact_verify_width() == width
    coll.reset_tp_reduce_mode_cache()
