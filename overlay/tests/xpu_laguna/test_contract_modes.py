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
    OPTIONS,
    SERIES_ON,
    additional_config,
    error_line,
    make_config,
    refused_line,
)
from laguna_model_testlib import write_tiny_llama

from vllm.config import CompilationMode, CUDAGraphMode

# the fixtures (models, series_environment, log_lines); no conftest in the
# patch tests
pytest_plugins = ("contract_testlib",)


# every test here runs without a VLLM_XPU_LAGUNA_* variable and offline;
# make_config gives the series' options SERIES_ON unless a test gives others
pytestmark = pytest.mark.usefixtures("series_environment")

EXACT_OFF = {**SERIES_ON, "exact_verify": False}


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


def test_without_the_rule_the_default_compiles(models) -> None:
    """Negative control: the same config with the exact verify off compiles
    (upstream's default on CPU: VLLM_COMPILE lowered to DYNAMO_TRACE_ONCE)."""
    cfg = make_config(models, options=EXACT_OFF)
    assert cfg.compilation_config.mode == CompilationMode.DYNAMO_TRACE_ONCE


def test_an_explicit_compilation_mode_is_refused(models) -> None:
    assert refused_line(models, compilation_config={"mode": 3}) == (
        "XPU Laguna series: compilation mode VLLM_COMPILE on the exact path "
        "(Inductor fuses the norms and gates into its own reductions: verify rows "
        "and the decode then run different arithmetic); use -cc.mode=NONE (or "
        "--enforce-eager), or xpu_laguna.breakable_graph true for graphs"
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
        "xpu_laguna.breakable_graph true for the series' breakable graphs"
    )
    assert make_config(models, compilation_config={"cudagraph_mode": "NONE"})
    assert make_config(models, enforce_eager=True)


def test_unset_graph_mode_is_set_to_none_before_the_level_defaults(
    models, log_lines
) -> None:
    """The CPU platform sets cudagraph_mode NONE on its own, so the rule is
    reached on a real config with both modes unset again (as they are when
    the contract runs, before the -O level fills them: FULL_AND_PIECEWISE
    at O2, the XPU default)."""
    from vllm.xpu_laguna.contract import check_series_contract

    cfg = make_config(models)
    log_lines.clear()
    for exact, expect in ((True, CUDAGraphMode.NONE), (False, None)):
        cfg.additional_config = additional_config({**SERIES_ON, "exact_verify": exact})
        cfg.compilation_config.mode = None
        cfg.compilation_config.cudagraph_mode = None
        check_series_contract(cfg)
        assert cfg.compilation_config.cudagraph_mode == expect  # False: control
    assert log_lines.count(COMPILE_LINE) == 1


def test_breakable_graphs_keep_their_own_modes(models) -> None:
    """With the series' breakable-graph option 0007 sets the modes (NONE,
    PIECEWISE); the contract leaves them to it (on CPU 0007 refuses for lack
    of device graphs: its refusal, not the contract's, is the proof)."""
    options = {**SERIES_ON, "breakable_graph": True}
    assert refused_line(models, "xpu_laguna.breakable_graph: ", options=options) == (
        "xpu_laguna.breakable_graph: needs an XPU or CUDA device, not 'cpu'"
    )


# -------------------------------------------- settings that break exactness


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "row_invariant_qk_norm",
            "off",
            "XPU Laguna series: xpu_laguna.row_invariant_qk_norm off on the exact "
            "path (the q/k norm kernel reduces verify rows in another order than "
            "the decode); set xpu_laguna.row_invariant_qk_norm to pad (or tokens)",
        ),
        (
            "row_invariant_linears",
            "none",
            "XPU Laguna series: xpu_laguna.row_invariant_linears leaves "
            "qkv_proj,o_proj,g_proj,dense_mlp,shared_expert,router,lm_head without "
            "a row-invariant form on the exact path; set "
            "xpu_laguna.row_invariant_linears to all",
        ),
        (
            "row_invariant_linears",
            "qkv_proj,o_proj,g_proj,dense_mlp,shared_expert,router",
            "XPU Laguna series: xpu_laguna.row_invariant_linears leaves lm_head "
            "without a row-invariant form on the exact path; set "
            "xpu_laguna.row_invariant_linears to all",
        ),
        (
            "row_invariant_int4",
            False,
            "XPU Laguna series: xpu_laguna.row_invariant_int4 false on the exact "
            "path (the INT4 GEMM primitive is built per row count); set "
            "xpu_laguna.row_invariant_int4 true",
        ),
    ],
)
def test_forms_off_are_refused(models, key, value, message) -> None:
    assert refused_line(models, options={**SERIES_ON, key: value}) == message
    # control: the same option with the exact verify off
    assert make_config(models, options={**EXACT_OFF, key: value})


def test_a_bad_row_invariant_value_fails_at_config_time(models) -> None:
    options = {**SERIES_ON, "row_invariant_linears": "qkv,bogus"}
    assert refused_line(models, options=options).startswith(
        "XPU Laguna series: xpu_laguna.row_invariant_linears: unknown kind(s)"
    )


KNOWN = (
    "breakable_graph, debug_no_split_plan, debug_prebuilt_full_guard, "
    "debug_xccl_standin, exact_tp_reduce, exact_verify, prebuilt_metadata, "
    "row_invariant_int4, row_invariant_linear_form, row_invariant_linears, "
    "row_invariant_moe, row_invariant_qk_norm, verify_width"
)
BAD_OPTIONS = {
    # id: (the xpu_laguna entry, its one line)
    "unknown_key": (
        {"verify_widht": 8},
        f"additional_config['xpu_laguna']: unknown option 'verify_widht' (known: "
        f"{KNOWN})",
    ),
    "bool_as_string": (
        {"exact_tp_reduce": "yes"},
        "additional_config['xpu_laguna']['exact_tp_reduce']: must be true or "
        "false, not 'yes'",
    ),
    "bool_as_env_spelling": (
        {"debug_no_split_plan": "1"},
        "additional_config['xpu_laguna']['debug_no_split_plan']: must be true or "
        "false, not '1'",
    ),
    "int_as_string": (
        {"verify_width": "8"},
        "additional_config['xpu_laguna']['verify_width']: must be an integer, not '8'",
    ),
    "int_out_of_range": (
        {"verify_width": 17},
        "additional_config['xpu_laguna']['verify_width']: must be 1..16, not 17",
    ),
    "int_as_bool": (
        {"verify_width": True},
        "additional_config['xpu_laguna']['verify_width']: must be an integer, not True",
    ),
    "unknown_choice": (
        {"row_invariant_moe": "lanes"},
        "additional_config['xpu_laguna']['row_invariant_moe']: must be one of "
        "rows, off, not 'lanes'",
    ),
    "string_as_number": (
        {"row_invariant_linear_form": 1},
        "additional_config['xpu_laguna']['row_invariant_linear_form']: must be a "
        "string, not 1",
    ),
    "not_a_mapping": (
        True,
        "additional_config['xpu_laguna'] must be a mapping of option to value, "
        "not bool",
    ),
}


@pytest.mark.parametrize("case", BAD_OPTIONS)
def test_a_bad_option_fails_at_config_time_in_one_line_naming_it(models, case) -> None:
    options, line = BAD_OPTIONS[case]
    assert refused_line(models, OPTIONS, options=options) == line


@pytest.mark.parametrize(
    ("valid", "invalid"),
    [
        ({"exact_verify": True}, {"exact_verify": 1}),
        ({"verify_width": 1}, {"verify_width": True}),
    ],
)
def test_a_value_equal_to_a_valid_one_is_still_refused(valid, invalid) -> None:
    """``from_config`` memoises per mapping; ``True == 1`` (and they hash
    alike), so the memo must not hand the valid value's options to the
    invalid one after the valid one was parsed."""
    from types import SimpleNamespace

    from vllm.xpu_laguna.options import XpuLagunaOptions

    def parse(options):
        return XpuLagunaOptions.from_config(
            SimpleNamespace(additional_config=additional_config(options))
        )

    assert parse(valid).given == frozenset(valid)
    with pytest.raises(ValueError, match="must be"):
        parse(invalid)


def test_a_bad_option_is_refused_for_another_model_too(tmp_path) -> None:
    """The options are validated for every configuration (a typo must not
    wait for the model that uses it); what an option means for the exact
    path is checked only where the series acts (negative control: a list
    of kinds the row-invariant forms do not know passes for a Llama
    target)."""
    from vllm.engine.arg_utils import EngineArgs

    target = write_tiny_llama(tmp_path / "tiny-llama")

    def config(options):
        return EngineArgs(
            model=str(target),
            max_model_len=256,
            skip_tokenizer_init=True,
            additional_config=additional_config(options),
        ).create_engine_config()

    with pytest.raises(ValueError) as err:
        config({"exact_verify": True, "exact_tp_reduce": "yes"})
    assert error_line(str(err.value), OPTIONS) == (
        "additional_config['xpu_laguna']['exact_tp_reduce']: must be true or "
        "false, not 'yes'"
    )
    assert config({"exact_verify": True, "row_invariant_linears": "qkv,bogus"})


TP_REDUCE_MESSAGE = (
    "XPU Laguna series: xpu_laguna.exact_tp_reduce false at tensor_parallel_size 2 "
    "on the exact path (the backend's all-reduce sums in an order set by the "
    "message size); set xpu_laguna.exact_tp_reduce true (a diagnostic run of "
    "the ring sets xpu_laguna.debug_xccl_standin true as well)"
)


def test_the_fixed_rank_order_off_at_tp2_is_refused(models) -> None:
    options = {**SERIES_ON, "exact_tp_reduce": False}
    assert refused_line(models, options=options, tensor_parallel_size=2) == (
        TP_REDUCE_MESSAGE
    )
    # one rank: no reduction
    assert make_config(models, options=options, tensor_parallel_size=1)


def test_debug_switches_pass_with_a_warning(models, log_lines) -> None:
    """The matrix's diagnostic legs (ring at TP 2/4, no split plan) set the
    debug options explicitly: they pass, each with one warning."""
    options = {
        **SERIES_ON,
        "exact_tp_reduce": False,
        "debug_xccl_standin": True,
        "debug_no_split_plan": True,
    }
    assert make_config(models, options=options, tensor_parallel_size=2)
    for name in ("debug_xccl_standin", "debug_no_split_plan"):
        line = (
            f"XPU Laguna series: debug option xpu_laguna.{name} "
            "(diagnostic run, not for serving)"
        )
        assert log_lines.count(line) == 1, log_lines
    assert (
        "XPU Laguna series: xpu_laguna.exact_tp_reduce false at "
        "tensor_parallel_size 2 (diagnostic run: not exact, not for serving)"
    ) in log_lines


# ----------------------------------------------------------- Laguna only


def test_a_config_without_a_model_is_left_alone(log_lines) -> None:
    """A ``VllmConfig()`` built without a model (vLLM's own tests and tools
    do) with the series' switches set: the same configuration as with none
    set, and no line (the exact rules used to act on it: prefix caching off,
    modes NONE, the max_num_seqs warning)."""
    from vllm.config import VllmConfig

    def resolved(options) -> tuple:
        cfg = VllmConfig(additional_config=additional_config(options))
        cc, comp = cfg.cache_config, cfg.compilation_config
        return (
            cc.enable_prefix_caching,
            cc.cache_dtype,
            comp.mode,
            comp.cudagraph_mode,
        )

    upstream = resolved(None)
    assert resolved({**SERIES_ON, "exact_verify": True}) == upstream
    assert log_lines == []


def test_another_model_keeps_its_configuration(tmp_path, log_lines) -> None:
    """Series switches set, a Llama target: prefix caching on, the KV dtype
    as asked, compilation as upstream, no rule, one info line."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.xpu_laguna.contract import series_active

    target = write_tiny_llama(tmp_path / "tiny-llama")
    cfg = EngineArgs(
        model=str(target),
        max_model_len=256,
        skip_tokenizer_init=True,
        kv_cache_dtype="fp8",
        tensor_parallel_size=2,
        async_scheduling=True,
        max_num_seqs=4,
        additional_config=additional_config({"exact_verify": True}),
    ).create_engine_config()
    assert cfg.cache_config.enable_prefix_caching is True
    assert cfg.cache_config.cache_dtype == "fp8"
    assert cfg.compilation_config.mode == CompilationMode.DYNAMO_TRACE_ONCE
    assert not series_active(cfg)
    assert log_lines == [
        "XPU Laguna series: inactive for LlamaForCausalLM (the series acts on "
        "LagunaForCausalLM on XPU, or on CPU when additional_config asks for it)"
    ]


@pytest.mark.parametrize(
    ("options", "asks"),
    [
        (None, False),
        ({"verify_width": 8, "exact_tp_reduce": True}, False),
        ({"exact_verify": False, "breakable_graph": False}, False),
        ({"exact_verify": True}, True),
        ({"prebuilt_metadata": True}, True),
    ],
    ids=["none", "no_switch", "switches_false", "exact_verify", "prebuilt"],
)
def test_laguna_on_cpu_needs_a_switch_set_true(models, options, asks) -> None:
    """On CPU the series acts only when the configuration asks (one of its
    switches set true explicitly); the defaults alone, or switches given
    false, leave a Laguna target upstream's (negative controls)."""
    cfg = make_config(models, options=options)
    assert cfg.cache_config.enable_prefix_caching is not asks


def test_two_configs_in_one_process_each_get_their_own_decision(
    models, tmp_path
) -> None:
    """The predicates a worker calls decide from the VllmConfig they are
    given, never from one decided before (in this process or the current
    one): a Laguna target with the exact verify, the same target asking
    nothing, and a Llama target with the exact verify, alternately."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.xpu_laguna import collectives as coll
    from vllm.xpu_laguna.attention.exact import exact_verify_width

    exact = {"exact_verify": True}
    laguna = make_config(models, options=exact, tensor_parallel_size=2)
    laguna_plain = make_config(models, options=None, tensor_parallel_size=2)
    llama = EngineArgs(
        model=str(write_tiny_llama(tmp_path / "tiny-llama")),
        max_model_len=256,
        skip_tokenizer_init=True,
        tensor_parallel_size=2,
        additional_config=additional_config(exact),
    ).create_engine_config()
    cases = (
        (laguna, 8, coll.TpReduceMode.RANK_ORDER),
        (llama, 0, coll.TpReduceMode.PLAIN),
        (laguna_plain, 0, coll.TpReduceMode.PLAIN),
    )
    for current in (None, laguna, llama):
        for cfg, width, mode in cases + cases:
            with set_current_vllm_config(current or cfg):
                assert coll.tp_reduce_mode("tp:0", 2, cfg) is mode
                assert exact_verify_width(cfg) == width
