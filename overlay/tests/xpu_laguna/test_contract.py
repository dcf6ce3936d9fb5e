# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The series' configuration contract (vllm/xpu_laguna/contract.py,
hooked into ``VllmConfig.__post_init__`` by patch 0012), on CPU, in-process,
no engine.

Each rule is reached through vLLM's own ``EngineArgs.create_engine_config``
with a real ``VllmConfig`` of tiny config-only Laguna checkpoints (a target
and DFlash drafters written here with transformers' ``LagunaConfig``; the
folders hold no weights at all, so every refusal happens before anything
could load them), with its message asserted, and next to it the same
configuration with the rule's setting fixed, which passes. The series is
switched on by the configuration's options,
``additional_config={"xpu_laguna": {"prebuilt_metadata": true}}``
(``contract_testlib.SERIES_ON``; on CPU a switch must be set true
explicitly, on XPU a Laguna target always gets the series). The options are
validated for every configuration, and a ``VLLM_XPU_LAGUNA_*`` variable
still set is refused, each in one line naming the option.

Where a real configuration cannot reach a rule on CPU the test says so:
the Ray backend cannot be configured without Ray installed (an executor
class that uses Ray, and a real config switched to "ray", stand in); the
INT4 target is a synthetic compressed-tensors config (4-bit integer
weights, group 32, an FP8 ``kv_cache_scheme``), the layout the lab's notes
describe for Laguna-S-2.1-INT4, not a copy of its config.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
from contract_testlib import (
    COMPILE_LINE,
    OPTIONS,
    SERIES_OFF,
    SERIES_ON,
    RayLikeExecutor,
    additional_config,
    error_line,
    make_config,
    refused_line,
)
from drafter_testlib import (
    BF16_REPO,
    BF16_REV,
    CASES,
    MATCHED_REPO,
    MATCHED_REV,
    record,
)
from laguna_model_testlib import VOCAB, write_tiny_llama

from vllm.config import CompilationMode, CUDAGraphMode

# the fixtures (models, series_environment, log_lines); no conftest in the
# patch tests
pytest_plugins = ("contract_testlib",)


# every test here runs without a VLLM_XPU_LAGUNA_* variable and offline
pytestmark = pytest.mark.usefixtures("series_environment")


# ------------------------------------------------------------------- rules


def test_the_baseline_passes_and_the_series_sets_its_one_safe_values(
    models, log_lines
) -> None:
    cfg = make_config(models)  # async scheduling and prefix caching left unset
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.compilation_config.mode == CompilationMode.NONE
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert log_lines == [
        "XPU Laguna series: async scheduling off (DFlash on the exact path needs "
        "--no-async-scheduling)",
        "XPU Laguna series: prefix caching off on the exact path (a cached prefix "
        "was computed in another request's step shape)",
        COMPILE_LINE,
    ]


def test_unset_async_scheduling_is_turned_off(models) -> None:
    """The CPU platform turns async scheduling off later on its own, so the
    contract is called on a real config with the setting unset again."""
    from vllm.xpu_laguna.contract import check_series_contract

    cfg = make_config(models)
    cfg.scheduler_config.async_scheduling = None
    check_series_contract(cfg)
    assert cfg.scheduler_config.async_scheduling is False
    # negative control: the same config with the series off, left to upstream
    cfg.additional_config = additional_config(SERIES_OFF)
    cfg.scheduler_config.async_scheduling = None
    check_series_contract(cfg)
    assert cfg.scheduler_config.async_scheduling is None


def test_series_off_the_contract_is_a_no_op(models, log_lines) -> None:
    """Negative control of the hook: every switch off, the settings the
    contract refuses are accepted and prefix caching stays on."""
    cfg = make_config(
        models,
        options=SERIES_OFF,
        async_scheduling=True,
        spec={"num_speculative_tokens": 8},
    )
    assert cfg.speculative_config.num_speculative_tokens == 8
    assert cfg.cache_config.enable_prefix_caching is True
    assert make_config(
        models, options=SERIES_OFF, target="int4", draft="draft", kv_cache_dtype="auto"
    )
    assert make_config(
        models,
        options=SERIES_OFF,
        kv_cache_dtype="fp8",
        tensor_parallel_size=4,
        enable_expert_parallel=True,
    )
    assert make_config(models, options=None)  # no options at all: the same
    assert log_lines == []


def test_async_scheduling_with_dflash_is_refused(models) -> None:
    assert refused_line(models, async_scheduling=True) == (
        "XPU Laguna series: --async-scheduling with DFlash on the exact path "
        "(DFlash state leaks across requests: the next request's first tokens "
        "can differ); use --no-async-scheduling"
    )
    assert make_config(models, async_scheduling=False)


def test_async_scheduling_is_free_with_the_exact_verify_off(models) -> None:
    options = {**SERIES_ON, "exact_verify": False}
    assert make_config(models, options=options, async_scheduling=True)


def test_width_above_the_verify_width_is_refused(models) -> None:
    assert refused_line(models, spec={"num_speculative_tokens": 8}) == (
        "XPU Laguna series: speculative width num_speculative_tokens + 1 = 9 "
        "exceeds xpu_laguna.verify_width 8 (wider verify steps leave the "
        "exact path); set num_speculative_tokens <= 7 in --speculative-config or "
        "raise xpu_laguna.verify_width"
    )
    options = {**SERIES_ON, "verify_width": 9}
    assert make_config(models, options=options, spec={"num_speculative_tokens": 8})


def test_kv_cache_dtype_other_than_the_model_dtype_is_refused(models) -> None:
    assert refused_line(models, kv_cache_dtype="fp8") == (
        "XPU Laguna series: --kv-cache-dtype fp8 differs from the model dtype "
        "float32 on the exact path (the exact path is proven with a KV cache in "
        "the model dtype only; FP8 KV is not token-exact); set --kv-cache-dtype "
        "auto (the model dtype)"
    )
    # vLLM 0.34.0 itself refuses a float KV dtype other than the model's
    # before the contract runs
    with pytest.raises(ValueError, match="is incompatible with dtype"):
        make_config(models, kv_cache_dtype="bfloat16")
    assert make_config(models, kv_cache_dtype="auto").cache_config.cache_dtype == "auto"


def test_auto_kv_resolving_to_the_checkpoints_fp8_is_refused(models) -> None:
    assert refused_line(
        models, target="int4", draft="draft_int4_name", kv_cache_dtype="auto"
    ) == (
        "XPU Laguna series: --kv-cache-dtype auto resolves to fp8 from the "
        "checkpoint's kv_cache_scheme on the exact path (the exact path is proven "
        "with a KV cache in the model dtype only; FP8 KV is not token-exact); set "
        "--kv-cache-dtype bfloat16 (the model dtype)"
    )
    cfg = make_config(
        models, target="int4", draft="draft_int4_name", kv_cache_dtype="bfloat16"
    )
    assert cfg.quant_config.kv_cache_scheme is not None  # the FP8 scheme is there
    assert cfg.cache_config.cache_dtype == "bfloat16"


def test_a_drafter_kv_override_is_held_to_the_same_rule(models) -> None:
    """DFlash's proposer rebuilds the config with the drafter's KV dtype in
    every worker (and the contract runs again there)."""
    assert refused_line(models, spec={"kv_cache_dtype": "fp8"}).startswith(
        "XPU Laguna series: --speculative-config kv_cache_dtype fp8 differs from "
        "the model dtype float32 on the exact path"
    )
    assert make_config(models, spec={"kv_cache_dtype": "auto"})


def test_drafter_of_another_width_is_refused(models) -> None:
    message = refused_line(models, draft="draft_wide")
    assert message == (
        f"XPU Laguna series: drafter {models['draft_wide']} has hidden_size 128, "
        "the target 64 (DFlash shares the target's embeddings and lm_head); use "
        "the DFlash drafter trained for this target"
    )


def test_drafter_of_another_vocabulary_is_refused(models) -> None:
    assert refused_line(models, draft="draft_vocab") == (
        f"XPU Laguna series: drafter {models['draft_vocab']} has draft_vocab_size "
        f"512, the target vocabulary {VOCAB} (DFlash shares the target's lm_head); "
        "use the DFlash drafter trained for this target"
    )


def test_drafter_reading_layers_the_target_lacks_is_refused(models) -> None:
    assert refused_line(models, draft="draft_layers") == (
        f"XPU Laguna series: drafter {models['draft_layers']} reads target layers "
        "[4] (dflash_config.target_layer_ids), the target has layers 0..3; use the "
        "DFlash drafter trained for this target"
    )
    assert make_config(models, draft="draft")  # ids [0, 2]: inside


OUTCOMES = {
    "matched": ("passes", "ok"),
    "bf16": ("refused", "fail"),
    "unknown": ("warned", "warn"),
}
UNIDENTIFIED = "is not identified as the INT4-matched DFlash drafter"


def _drafter_case(models, tmp_path, monkeypatch, layout, pins) -> tuple[dict, dict]:
    """``models`` with the case's drafter folder as ``case``, and the
    provenance record (its pins) the contract is made to read."""
    from vllm.xpu_laguna import provenance as xpu_laguna_provenance

    config = json.loads((models["draft"] / "config.json").read_text())
    rec = record(pins, tmp_path)
    monkeypatch.setattr(xpu_laguna_provenance, "load", lambda: rec)
    return {**models, "case": layout(tmp_path / "case", config)}, rec


def _contract_outcome(models, log_lines, target="int4") -> str:
    try:
        make_config(models, target=target, draft="case")
    except ValueError as err:
        assert "is the BF16 DFlash drafter" in str(err), err
        return "refused"
    return "warned" if any(UNIDENTIFIED in line for line in log_lines) else "passes"


@pytest.mark.parametrize(
    "layout, pins, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_contract_and_doctor_tell_the_drafter_alike(
    models, tmp_path, monkeypatch, log_lines, layout, pins, expected
) -> None:
    """One table (drafter_testlib.CASES) through both: by content, never by
    the folder's name; symlinks followed both ways."""
    from vllm.xpu_laguna.doctor import check_draft_identity
    from vllm.xpu_laguna.drafter import KnownDrafters

    models, rec = _drafter_case(models, tmp_path, monkeypatch, layout, pins)
    doctor = check_draft_identity(models["case"], KnownDrafters.from_record(rec))
    assert (_contract_outcome(models, log_lines), doctor.status) == OUTCOMES[expected]


def test_the_bf16_drafter_of_the_int4_target_is_refused(
    models, tmp_path, monkeypatch, log_lines
) -> None:
    layout = dict((c[0], c[1]) for c in CASES)["bf16-copy-named-int4"]
    models, _ = _drafter_case(models, tmp_path, monkeypatch, layout, "fingerprints")
    message = refused_line(models, target="int4", draft="case")
    assert message.startswith(
        f"XPU Laguna series: drafter {models['case']} is the BF16 DFlash drafter "
        "(content fingerprint "
    )
    assert message.endswith(
        "), not the INT4-matched one this compressed-tensors INT4 target needs "
        "(it accepts ~0% of its proposals: the INT4 target's residual stream is "
        "rotated); use poolside/Laguna-S-2.1-DFlash-INT4 at revision "
        "5e07c246915c (pins.toml [models.draft])"
    )
    # negative control: the rule is about the INT4 target; the plain target
    # takes any fitting drafter, silently
    assert _contract_outcome(models, log_lines, target="target") == "passes"


def test_an_unidentified_drafter_of_the_int4_target_gets_one_warning(
    models, tmp_path, monkeypatch, log_lines
) -> None:
    layout = dict((c[0], c[1]) for c in CASES)["renamed-matched-copy"]
    models, _ = _drafter_case(models, tmp_path, monkeypatch, layout, "revisions")
    assert make_config(models, target="int4", draft="case")
    assert (
        log_lines.count(
            f"XPU Laguna series: drafter {models['case']} {UNIDENTIFIED} (not a hub "
            "snapshot; not a drafter this build's pins name): acceptance may "
            "collapse (the BF16 drafter accepted 0 of 8,449 proposals against the "
            "INT4 target), exactness does not change; use "
            "poolside/Laguna-S-2.1-DFlash-INT4 at revision 5e07c246915c, a hub "
            "snapshot of it or a copy whose fingerprint (python -m "
            "vllm.xpu_laguna.drafter DIR) pins.toml records"
        )
        == 1
    )


def test_a_hub_repo_id_is_told_by_its_revision(
    models, tmp_path, monkeypatch, log_lines
) -> None:
    """A hub drafter stays a repo id in vLLM's config; the revision asked for tells
    it (the repo's name does not: the matched repo without a revision is the
    default branch, which moves)."""
    from vllm.xpu_laguna.contract import (
        SeriesConfigError,
        check_series_contract,
    )

    layout = dict((c[0], c[1]) for c in CASES)["matched-snapshot"]
    models, _ = _drafter_case(models, tmp_path, monkeypatch, layout, "revisions")
    cfg = make_config(models, target="int4", draft="case")
    dc = cfg.speculative_config.draft_model_config
    dc.model = MATCHED_REPO
    for revision, outcome in ((MATCHED_REV, "passes"), (None, "warned")):
        log_lines.clear()
        dc.revision = cfg.speculative_config.revision = revision
        check_series_contract(cfg)
        warned = any(UNIDENTIFIED in line for line in log_lines)
        assert ("warned" if warned else "passes") == outcome, revision
    dc.model = BF16_REPO
    dc.revision = cfg.speculative_config.revision = BF16_REV
    with pytest.raises(SeriesConfigError, match="is the BF16 DFlash drafter"):
        check_series_contract(cfg)


def test_non_standard_rejection_is_refused(models) -> None:
    assert refused_line(models, spec={"rejection_sample_method": "block"}) == (
        "XPU Laguna series: rejection_sample_method 'block' on the exact path "
        "(only standard rejection keeps the output the target's own tokens); "
        '"rejection_sample_method": "standard" in --speculative-config, or '
        "xpu_laguna.exact_verify false"
    )
    assert make_config(models, spec={"rejection_sample_method": "standard"})


def test_expert_parallelism_at_tp4_is_refused(models) -> None:
    assert refused_line(
        models, tensor_parallel_size=4, enable_expert_parallel=True
    ) == (
        "XPU Laguna series: --enable-expert-parallel at tensor_parallel_size 4 on "
        "the exact path (expert outputs are then combined by "
        "all-to-all/reduce-scatter, not by the all-reduce the series makes "
        "fixed-rank-order); drop --enable-expert-parallel (the supported topology "
        "is tensor parallelism without expert parallelism)"
    )
    cfg = make_config(models, tensor_parallel_size=4)  # TP 4 without EP
    assert cfg.parallel_config.tensor_parallel_size == 4


def test_data_parallelism_of_a_moe_target_is_refused(models) -> None:
    assert refused_line(models, data_parallel_size=2) == (
        "XPU Laguna series: --data-parallel-size 2 on the exact path (the MoE "
        "layers then combine tokens of every data-parallel rank in one step); use "
        "--data-parallel-size 1 with tensor parallelism"
    )


def test_more_than_one_sequence_is_allowed_with_one_warning(models, log_lines) -> None:
    assert make_config(models, max_num_seqs=3).scheduler_config.max_num_seqs == 3
    warning = (
        "XPU Laguna series: max_num_seqs 3 > 1: steps with more than one request "
        "run upstream numerics (not bitwise equal to a single-request run); use "
        "--max-num-seqs 1 for exact serving"
    )
    assert log_lines.count(warning) == 1
    log_lines.clear()
    make_config(models, max_num_seqs=1)
    assert not any("max_num_seqs" in line for line in log_lines)


# ------------------------------------------------------------------ options


@pytest.mark.parametrize(
    ("name", "value", "fix"),
    [
        (
            "VLLM_XPU_LAGUNA_VERIFY_WIDTH",
            "6",
            "set xpu_laguna.verify_width in --additional-config "
            "(additional_config={'xpu_laguna': {'verify_width': ...}})",
        ),
        (
            "VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA",
            "1",
            "set xpu_laguna.prebuilt_metadata in --additional-config "
            "(additional_config={'xpu_laguna': {'prebuilt_metadata': ...}})",
        ),
        (
            "VLLM_XPU_LAGUNA_EXACT_VERIFY",
            "0",
            "set xpu_laguna.exact_verify in --additional-config "
            "(additional_config={'xpu_laguna': {'exact_verify': ...}})",
        ),
        (
            "VLLM_XPU_LAGUNA_SOMETHING_ELSE",
            "1",
            None,
        ),
    ],
)
def test_a_series_variable_still_set_is_refused_naming_its_option(
    models, tmp_path, monkeypatch, name, value, fix
) -> None:
    """The series reads no environment variable: one still set (an old
    recipe's), whatever its value, refuses every configuration in one line
    naming the option that replaced it: with the series on, off, or for
    another model."""
    monkeypatch.setenv(name, value)
    line = (
        f"XPU Laguna series: {name} is no longer read; unset it and {fix}"
        if fix is not None
        else f"XPU Laguna series: {name} is not an option of the series (it "
        "reads its options from additional_config['xpu_laguna'] only); unset it"
    )
    assert refused_line(models) == line
    assert refused_line(models, options=None, draft=None) == line
    from vllm.engine.arg_utils import EngineArgs

    llama = EngineArgs(
        model=str(write_tiny_llama(tmp_path / "tiny-llama")),
        max_model_len=256,
        skip_tokenizer_init=True,
    )
    with pytest.raises(ValueError) as err:
        llama.create_engine_config()
    assert error_line(str(err.value)) == line
    monkeypatch.delenv(name)  # negative control: unset, the same configs pass
    assert make_config(models)
    assert llama.create_engine_config()


def test_the_server_flag_carries_the_options(models) -> None:
    """``vllm serve ... --additional-config JSON``: vLLM's own argument
    parser turns the one JSON argument into the configuration's options."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.xpu_laguna.options import XpuLagunaOptions

    def config(extra: str):
        argv = ["--model", str(models["target"]), "--max-model-len", "512"]
        argv += ["--skip-tokenizer-init", "--dtype", "float32", "--max-num-seqs", "1"]
        argv += ["--additional-config", extra]
        args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv)
        return EngineArgs.from_cli_args(args).create_engine_config()

    cfg = config('{"xpu_laguna": {"prebuilt_metadata": true, "verify_width": 6}}')
    options = XpuLagunaOptions.from_config(cfg)
    assert (options.prebuilt_metadata, options.verify_width) == (True, 6)
    assert cfg.cache_config.enable_prefix_caching is False  # the series acted
    # negative control: JSON without the series' key, upstream's configuration
    assert config('{"other": 1}').cache_config.enable_prefix_caching is True
    # the old variables' spelling ("1") is not a boolean: one line
    with pytest.raises(ValueError) as err:
        config('{"xpu_laguna": {"prebuilt_metadata": "1"}}')
    assert error_line(str(err.value), OPTIONS) == (
        "additional_config['xpu_laguna']['prebuilt_metadata']: must be true or "
        "false, not '1'"
    )


# ---------------------------------------------------------------- executors


def test_an_executor_that_uses_ray_gets_the_options_with_its_config(
    models,
) -> None:
    """No executor is refused any more (the Ray refusal was for variables a
    Ray worker might not have): the options are part of the VllmConfig that
    every executor hands its workers."""
    from vllm.xpu_laguna.contract import check_series_contract
    from vllm.xpu_laguna.options import XpuLagunaOptions

    backend = f"{RayLikeExecutor.__module__}.RayLikeExecutor"
    cfg = make_config(models, distributed_executor_backend=backend)
    assert XpuLagunaOptions.from_config(cfg).prebuilt_metadata
    assert cfg.cache_config.enable_prefix_caching is False  # the series acted
    # Ray is not installed in the CPU runtime, so ParallelConfig refuses
    # "ray" itself; the contract is called on a real config switched to it
    object.__setattr__(cfg.parallel_config, "distributed_executor_backend", "ray")
    assert cfg.parallel_config.use_ray
    check_series_contract(cfg)


def _what_a_worker_sees(configs) -> list[dict]:
    """What the series' worker-side predicates decide for each config."""
    from vllm.xpu_laguna.attention.exact import exact_verify_width
    from vllm.xpu_laguna.collectives import tp_reduce_mode
    from vllm.xpu_laguna.contract import series_active
    from vllm.xpu_laguna.options import XpuLagunaOptions

    seen = []
    for cfg in configs:
        options = XpuLagunaOptions.from_config(cfg)
        seen.append(
            {
                "given": sorted(options.given),
                "width": options.verify_width,
                "series_active": series_active(cfg),
                "exact_width": exact_verify_width(cfg),
                "tp_reduce": tp_reduce_mode("tp:0", 2, cfg).name,
            }
        )
    return seen


def _child_sees(queue, configs) -> None:
    queue.put(_what_a_worker_sees(configs))


SEES_ON = {
    "given": ["prebuilt_metadata", "verify_width"],
    "width": 6,
    "series_active": True,
    "exact_width": 6,
    "tp_reduce": "RANK_ORDER",
}
SEES_OFF = {
    "given": ["prebuilt_metadata"],
    "width": 8,
    "series_active": False,
    "exact_width": 0,
    "tp_reduce": "PLAIN",
}


def _two_configs(models):
    """A config with the series on at width 6, and one with it off."""
    on = make_config(
        models,
        options={**SERIES_ON, "verify_width": 6},
        spec={"num_speculative_tokens": 5},
        tensor_parallel_size=2,
    )
    off = make_config(models, options=SERIES_OFF, tensor_parallel_size=2)
    return on, off


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_the_options_reach_the_workers_with_the_config(
    models, monkeypatch, method
) -> None:
    """The multiprocessing context of vLLM (engine core, MultiprocExecutor
    workers) hands each process its VllmConfig: a child started either way
    sees the options of each config it is given and none of another's (the
    series off after on, then on again, in the same child)."""
    from vllm.utils.system_utils import get_mp_context

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", method)
    ctx = get_mp_context()
    assert ctx.get_start_method() == method
    on, off = _two_configs(models)
    assert _what_a_worker_sees([on, off]) == [SEES_ON, SEES_OFF]  # here
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_sees, args=(queue, [on, off, on]))
    proc.start()
    seen = queue.get(timeout=300)
    proc.join(timeout=60)
    assert seen == [SEES_ON, SEES_OFF, SEES_ON]


def test_a_worker_with_an_environment_of_its_own_gets_them(models, tmp_path) -> None:
    """What a Ray actor is: a process started with an environment of its own
    (here without any ``VLLM_*`` variable) gets the options with the config
    it is sent. Negative control: the same config without its ``xpu_laguna``
    entry gets the defaults (on CPU: the series off)."""
    import copy

    on, _ = _two_configs(models)
    bare = copy.copy(on)
    bare.additional_config = {}
    (tmp_path / "configs.pkl").write_bytes(pickle.dumps([on, bare]))
    code = (
        "import json, pickle, sys; from test_contract import _what_a_worker_sees; "
        "configs = pickle.loads(open(sys.argv[1], 'rb').read()); "
        "open(sys.argv[2], 'w').write(json.dumps(_what_a_worker_sees(configs)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))
    subprocess.run(
        [sys.executable, "-c", code, tmp_path / "configs.pkl", tmp_path / "seen.json"],
        env=env,
        check=True,
        timeout=300,
    )
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == [SEES_ON, {**SEES_OFF, "given": []}]
