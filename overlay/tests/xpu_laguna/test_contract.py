# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The series' configuration contract (vllm/config/xpu_laguna_contract.py,
hooked into ``VllmConfig.__post_init__`` by patch 0012), on CPU, in-process,
no engine.

Each rule is reached through vLLM's own ``EngineArgs.create_engine_config``
with a real ``VllmConfig`` of tiny config-only Laguna checkpoints (a target
and DFlash drafters written here with transformers' ``LagunaConfig``; the
folders hold no weights at all, so every refusal happens before anything
could load them), with its message asserted, and next to it the same
configuration with the rule's setting fixed, which passes. The series is
switched on with ``VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA=1`` (the
exact verify alone activates it on XPU only).

Where a real configuration cannot reach a rule on CPU the test says so:
the Ray backend cannot be configured without Ray installed (the rule is
reached through the real hook with an executor class that uses Ray, and by
calling the contract on a real config switched to "ray"); the INT4 target
is a synthetic compressed-tensors config (4-bit integer weights, group 32,
an FP8 ``kv_cache_scheme``), the layout the lab's notes describe for
Laguna-S-2.1-INT4, not a copy of its config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from drafter_testlib import (
    BF16_REPO,
    BF16_REV,
    CASES,
    MATCHED_REPO,
    MATCHED_REV,
    record,
)
from laguna_model_testlib import VOCAB, tiny_laguna_config

from vllm.config import CompilationMode, CUDAGraphMode
from vllm.v1.executor.abstract import Executor

SERIES_TOGGLE = "VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA"
COMPILE_LINE = (
    "XPU Laguna series: compilation mode NONE and cudagraph_mode NONE on the "
    "exact path (Inductor's fused reductions and device graphs' captured split "
    "counts would make verify rows differ from the decode; "
    "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1 for graphs)"
)
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


@pytest.fixture(autouse=True)
def series_on(monkeypatch):
    """A known series state: prebuilt metadata on (series active on CPU),
    exact verify on, width 8, graphs off."""
    for name in (
        "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH",
        "VLLM_XPU_LAGUNA_VERIFY_WIDTH",
        "VLLM_XPU_LAGUNA_EXACT_VERIFY",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(SERIES_TOGGLE, "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from vllm.compilation.xpu_breakable_graph.config import reset_series_scope

    yield
    reset_series_scope()


@pytest.fixture
def log_lines(monkeypatch):
    """The contract's log lines. vLLM's logging setup (run again by every
    ``create_engine_config``) drops handlers of its child loggers, so the
    contract's logger is replaced by a recorder of its once-only methods."""
    from vllm.config import xpu_laguna_contract

    lines: list[str] = []

    class _Recorder:
        def info_once(self, msg: str, *args) -> None:
            lines.append(msg % args)

        warning_once = info_once

    monkeypatch.setattr(xpu_laguna_contract, "logger", _Recorder())
    return lines


def _config(models, target="target", draft="draft", spec=None, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

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
        speculative_config=speculative if draft else None,
        **kwargs,
    )
    return args.create_engine_config()


def _refused(models, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        _config(models, **kwargs)
    text = str(err.value)
    assert "XPU Laguna series: " in text, text
    # pydantic wraps the error; the contract's own message is one line
    (line,) = [ln for ln in text.splitlines() if "XPU Laguna series: " in ln]
    return line.split("Value error, ", 1)[-1].split(" [type=value_error", 1)[0]


# ------------------------------------------------------------------- rules


def test_the_baseline_passes_and_the_series_sets_its_one_safe_values(
    models, log_lines
) -> None:
    cfg = _config(models)  # async scheduling and prefix caching left unset
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


def test_unset_async_scheduling_is_turned_off(models, monkeypatch) -> None:
    """The CPU platform turns async scheduling off later on its own, so the
    contract is called on a real config with the setting unset again."""
    from vllm.config.xpu_laguna_contract import check_series_contract

    cfg = _config(models)
    cfg.scheduler_config.async_scheduling = None
    check_series_contract(cfg)
    assert cfg.scheduler_config.async_scheduling is False
    monkeypatch.setenv(SERIES_TOGGLE, "0")  # negative control: left to upstream
    cfg.scheduler_config.async_scheduling = None
    check_series_contract(cfg)
    assert cfg.scheduler_config.async_scheduling is None


def test_series_off_the_contract_is_a_no_op(models, monkeypatch, log_lines) -> None:
    """Negative control of the hook: every toggle off, the settings the
    contract refuses are accepted and prefix caching stays on."""
    monkeypatch.setenv(SERIES_TOGGLE, "0")
    cfg = _config(models, async_scheduling=True, spec={"num_speculative_tokens": 8})
    assert cfg.speculative_config.num_speculative_tokens == 8
    assert cfg.cache_config.enable_prefix_caching is True
    assert _config(models, target="int4", draft="draft", kv_cache_dtype="auto")
    assert _config(
        models,
        kv_cache_dtype="fp8",
        tensor_parallel_size=4,
        enable_expert_parallel=True,
    )
    assert log_lines == []


def test_async_scheduling_with_dflash_is_refused(models) -> None:
    assert _refused(models, async_scheduling=True) == (
        "XPU Laguna series: --async-scheduling with DFlash on the exact path "
        "(DFlash state leaks across requests: the next request's first tokens "
        "can differ); use --no-async-scheduling"
    )
    assert _config(models, async_scheduling=False)


def test_async_scheduling_is_free_with_the_exact_verify_off(
    models, monkeypatch
) -> None:
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "0")
    assert _config(models, async_scheduling=True)


def test_width_above_the_verify_width_is_refused(models, monkeypatch) -> None:
    assert _refused(models, spec={"num_speculative_tokens": 8}) == (
        "XPU Laguna series: speculative width num_speculative_tokens + 1 = 9 "
        "exceeds VLLM_XPU_LAGUNA_VERIFY_WIDTH=8 (wider verify steps leave the "
        "exact path); set num_speculative_tokens <= 7 in --speculative-config or "
        "raise VLLM_XPU_LAGUNA_VERIFY_WIDTH"
    )
    monkeypatch.setenv("VLLM_XPU_LAGUNA_VERIFY_WIDTH", "9")
    assert _config(models, spec={"num_speculative_tokens": 8})


def test_kv_cache_dtype_other_than_the_model_dtype_is_refused(models) -> None:
    assert _refused(models, kv_cache_dtype="fp8") == (
        "XPU Laguna series: --kv-cache-dtype fp8 differs from the model dtype "
        "float32 on the exact path (the exact path is proven with a KV cache in "
        "the model dtype only; FP8 KV is not token-exact); set --kv-cache-dtype "
        "auto (the model dtype)"
    )
    # vLLM 0.34.0 itself refuses a float KV dtype other than the model's
    # before the contract runs
    with pytest.raises(ValueError, match="is incompatible with dtype"):
        _config(models, kv_cache_dtype="bfloat16")
    assert _config(models, kv_cache_dtype="auto").cache_config.cache_dtype == "auto"


def test_auto_kv_resolving_to_the_checkpoints_fp8_is_refused(models) -> None:
    assert _refused(
        models, target="int4", draft="draft_int4_name", kv_cache_dtype="auto"
    ) == (
        "XPU Laguna series: --kv-cache-dtype auto resolves to fp8 from the "
        "checkpoint's kv_cache_scheme on the exact path (the exact path is proven "
        "with a KV cache in the model dtype only; FP8 KV is not token-exact); set "
        "--kv-cache-dtype bfloat16 (the model dtype)"
    )
    cfg = _config(
        models, target="int4", draft="draft_int4_name", kv_cache_dtype="bfloat16"
    )
    assert cfg.quant_config.kv_cache_scheme is not None  # the FP8 scheme is there
    assert cfg.cache_config.cache_dtype == "bfloat16"


def test_a_drafter_kv_override_is_held_to_the_same_rule(models) -> None:
    """DFlash's proposer rebuilds the config with the drafter's KV dtype in
    every worker (and the contract runs again there)."""
    assert _refused(models, spec={"kv_cache_dtype": "fp8"}).startswith(
        "XPU Laguna series: --speculative-config kv_cache_dtype fp8 differs from "
        "the model dtype float32 on the exact path"
    )
    assert _config(models, spec={"kv_cache_dtype": "auto"})


def test_drafter_of_another_width_is_refused(models) -> None:
    message = _refused(models, draft="draft_wide")
    assert message == (
        f"XPU Laguna series: drafter {models['draft_wide']} has hidden_size 128, "
        "the target 64 (DFlash shares the target's embeddings and lm_head); use "
        "the DFlash drafter trained for this target"
    )


def test_drafter_of_another_vocabulary_is_refused(models) -> None:
    assert _refused(models, draft="draft_vocab") == (
        f"XPU Laguna series: drafter {models['draft_vocab']} has draft_vocab_size "
        f"512, the target vocabulary {VOCAB} (DFlash shares the target's lm_head); "
        "use the DFlash drafter trained for this target"
    )


def test_drafter_reading_layers_the_target_lacks_is_refused(models) -> None:
    assert _refused(models, draft="draft_layers") == (
        f"XPU Laguna series: drafter {models['draft_layers']} reads target layers "
        "[4] (dflash_config.target_layer_ids), the target has layers 0..3; use the "
        "DFlash drafter trained for this target"
    )
    assert _config(models, draft="draft")  # ids [0, 2]: inside


OUTCOMES = {
    "matched": ("passes", "ok"),
    "bf16": ("refused", "fail"),
    "unknown": ("warned", "warn"),
}
UNIDENTIFIED = "is not identified as the INT4-matched DFlash drafter"


def _drafter_case(models, tmp_path, monkeypatch, layout, pins) -> tuple[dict, dict]:
    """``models`` with the case's drafter folder as ``case``, and the
    provenance record (its pins) the contract is made to read."""
    from vllm import xpu_laguna_provenance

    config = json.loads((models["draft"] / "config.json").read_text())
    rec = record(pins, tmp_path)
    monkeypatch.setattr(xpu_laguna_provenance, "load", lambda: rec)
    return {**models, "case": layout(tmp_path / "case", config)}, rec


def _contract_outcome(models, log_lines, target="int4") -> str:
    try:
        _config(models, target=target, draft="case")
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
    from vllm.xpu_laguna_doctor import check_draft_identity
    from vllm.xpu_laguna_drafter import KnownDrafters

    models, rec = _drafter_case(models, tmp_path, monkeypatch, layout, pins)
    doctor = check_draft_identity(models["case"], KnownDrafters.from_record(rec))
    assert (_contract_outcome(models, log_lines), doctor.status) == OUTCOMES[expected]


def test_the_bf16_drafter_of_the_int4_target_is_refused(
    models, tmp_path, monkeypatch, log_lines
) -> None:
    layout = dict((c[0], c[1]) for c in CASES)["bf16-copy-named-int4"]
    models, _ = _drafter_case(models, tmp_path, monkeypatch, layout, "fingerprints")
    message = _refused(models, target="int4", draft="case")
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
    assert _config(models, target="int4", draft="case")
    assert (
        log_lines.count(
            f"XPU Laguna series: drafter {models['case']} {UNIDENTIFIED} (not a hub "
            "snapshot; not a drafter this build's pins name): acceptance may "
            "collapse (the BF16 drafter accepted 0 of 8,449 proposals against the "
            "INT4 target), exactness does not change; use "
            "poolside/Laguna-S-2.1-DFlash-INT4 at revision 5e07c246915c, a hub "
            "snapshot of it or a copy whose fingerprint (python -m "
            "vllm.xpu_laguna_drafter DIR) pins.toml records"
        )
        == 1
    )


def test_a_hub_repo_id_is_told_by_its_revision(
    models, tmp_path, monkeypatch, log_lines
) -> None:
    """A hub drafter stays a repo id in vLLM's config; the revision asked for tells
    it (the repo's name does not: the matched repo without a revision is the
    default branch, which moves)."""
    from vllm.config.xpu_laguna_contract import (
        SeriesConfigError,
        check_series_contract,
    )

    layout = dict((c[0], c[1]) for c in CASES)["matched-snapshot"]
    models, _ = _drafter_case(models, tmp_path, monkeypatch, layout, "revisions")
    cfg = _config(models, target="int4", draft="case")
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
    assert _refused(models, spec={"rejection_sample_method": "block"}) == (
        "XPU Laguna series: rejection_sample_method 'block' on the exact path "
        "(only standard rejection keeps the output the target's own tokens); "
        '"rejection_sample_method": "standard" in --speculative-config, or '
        "VLLM_XPU_LAGUNA_EXACT_VERIFY=0"
    )
    assert _config(models, spec={"rejection_sample_method": "standard"})


def test_expert_parallelism_at_tp4_is_refused(models) -> None:
    assert _refused(models, tensor_parallel_size=4, enable_expert_parallel=True) == (
        "XPU Laguna series: --enable-expert-parallel at tensor_parallel_size 4 on "
        "the exact path (expert outputs are then combined by "
        "all-to-all/reduce-scatter, not by the all-reduce the series makes "
        "fixed-rank-order); drop --enable-expert-parallel (the supported topology "
        "is tensor parallelism without expert parallelism)"
    )
    cfg = _config(models, tensor_parallel_size=4)  # TP 4 without EP
    assert cfg.parallel_config.tensor_parallel_size == 4


def test_data_parallelism_of_a_moe_target_is_refused(models) -> None:
    assert _refused(models, data_parallel_size=2) == (
        "XPU Laguna series: --data-parallel-size 2 on the exact path (the MoE "
        "layers then combine tokens of every data-parallel rank in one step); use "
        "--data-parallel-size 1 with tensor parallelism"
    )


def test_more_than_one_sequence_is_allowed_with_one_warning(models, log_lines) -> None:
    assert _config(models, max_num_seqs=3).scheduler_config.max_num_seqs == 3
    warning = (
        "XPU Laguna series: max_num_seqs 3 > 1: steps with more than one request "
        "run upstream numerics (not bitwise equal to a single-request run); use "
        "--max-num-seqs 1 for exact serving"
    )
    assert log_lines.count(warning) == 1
    log_lines.clear()
    _config(models, max_num_seqs=1)
    assert not any("max_num_seqs" in line for line in log_lines)


# ---------------------------------------------------------------- executors


RAY_MESSAGE = (
    "XPU Laguna series: the Ray executor is refused while a series toggle is on "
    "(Ray workers may not run with the VLLM_XPU_LAGUNA_* values checked here); "
    "use --distributed-executor-backend mp"
)


def test_an_executor_that_uses_ray_is_refused(models) -> None:
    backend = f"{__name__}.RayLikeExecutor"
    assert _refused(models, distributed_executor_backend=backend) == RAY_MESSAGE
    assert _config(models, distributed_executor_backend="mp")
    assert _config(models, distributed_executor_backend="uni")


def test_the_ray_backend_is_refused(models) -> None:
    """Ray is not installed in the CPU runtime, so ParallelConfig refuses
    "ray" itself; the contract is called on a real config switched to it."""
    from vllm.config.xpu_laguna_contract import SeriesConfigError, check_series_contract

    cfg = _config(models)
    object.__setattr__(cfg.parallel_config, "distributed_executor_backend", "ray")
    assert cfg.parallel_config.use_ray
    with pytest.raises(SeriesConfigError) as err:
        check_series_contract(cfg)
    assert str(err.value) == RAY_MESSAGE
    object.__setattr__(cfg.parallel_config, "distributed_executor_backend", "mp")
    check_series_contract(cfg)


def _child_toggles(queue) -> None:
    import vllm.envs as envs
    from vllm.config.xpu_laguna_contract import series_active

    queue.put(
        {
            "width": envs.VLLM_XPU_LAGUNA_VERIFY_WIDTH,
            "prebuilt": envs.VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA,
            "series_active": series_active(),
        }
    )


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_multiprocessing_workers_inherit_the_toggles(monkeypatch, method) -> None:
    """The multiprocessing context of vLLM (engine core, MultiprocExecutor
    workers) passes no environment of its own: a child started either way
    sees the toggles as this process has them, set after import included."""
    from vllm.utils.system_utils import get_mp_context

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", method)
    monkeypatch.setenv("VLLM_XPU_LAGUNA_VERIFY_WIDTH", "6")
    ctx = get_mp_context()
    assert ctx.get_start_method() == method
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_toggles, args=(queue,))
    proc.start()
    seen = queue.get(timeout=300)
    proc.join(timeout=60)
    assert seen == {"width": 6, "prebuilt": True, "series_active": True}


def test_a_child_with_its_own_environment_does_not_see_them() -> None:
    """Negative control of the inheritance check: a process started with an
    explicit environment (what a Ray actor's runtime env is) lacks them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_XPU_LAGUNA")}
    code = "import os; print(os.environ.get('" + SERIES_TOGGLE + "'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "None"


# ------------------------------------------------ compilation and graph modes


@pytest.mark.parametrize("level", ["0", "1", "2", "3"])
def test_optimization_levels_end_in_mode_none(models, level) -> None:
    """Whatever -O level (they only fill unset fields), the final config,
    after the CPU platform hook, has no compilation and no graphs. Without
    the rule the CPU hook turns the levels' VLLM_COMPILE into
    DYNAMO_TRACE_ONCE (negative control below)."""
    cfg = _config(models, optimization_level=level)
    assert cfg.compilation_config.mode == CompilationMode.NONE
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.NONE


def test_without_the_rule_the_default_compiles(models, monkeypatch) -> None:
    """Negative control: the same config with the exact verify off compiles
    (upstream's default on CPU: VLLM_COMPILE lowered to DYNAMO_TRACE_ONCE)."""
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "0")
    cfg = _config(models)
    assert cfg.compilation_config.mode == CompilationMode.DYNAMO_TRACE_ONCE


def test_an_explicit_compilation_mode_is_refused(models) -> None:
    assert _refused(models, compilation_config={"mode": 3}) == (
        "XPU Laguna series: compilation mode VLLM_COMPILE on the exact path "
        "(Inductor fuses the norms and gates into its own reductions: verify rows "
        "and the decode then run different arithmetic); use -cc.mode=NONE (or "
        "--enforce-eager), or VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1 for graphs"
    )
    cfg = _config(models, compilation_config={"mode": 0})
    assert cfg.compilation_config.mode == CompilationMode.NONE


def test_an_explicit_graph_mode_is_refused(models) -> None:
    assert _refused(
        models, compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"}
    ) == (
        "XPU Laguna series: cudagraph_mode FULL_AND_PIECEWISE on the exact path "
        "(graphs bake the attention split counts at capture time); use "
        "-cc.cudagraph_mode=NONE (or --enforce-eager), or "
        "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1 for the series' breakable graphs"
    )
    assert _config(models, compilation_config={"cudagraph_mode": "NONE"})
    assert _config(models, enforce_eager=True)


def test_unset_graph_mode_is_set_to_none_before_the_level_defaults(
    models, monkeypatch, log_lines
) -> None:
    """The CPU platform sets cudagraph_mode NONE on its own, so the rule is
    reached on a real config with both modes unset again (as they are when
    the contract runs, before the -O level fills them: FULL_AND_PIECEWISE
    at O2, the XPU default)."""
    from vllm.config.xpu_laguna_contract import check_series_contract

    cfg = _config(models)
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
        _config(models)


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
    assert _refused(models) == message
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "0")  # control: exact off
    assert _config(models)


def test_a_bad_row_invariant_value_fails_at_config_time(models, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS", "qkv,bogus")
    assert _refused(models).startswith(
        "XPU Laguna series: VLLM_XPU_LAGUNA_ROW_INVARIANT_LINEARS: unknown kind(s)"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VLLM_XPU_LAGUNA_EXACT_TP_REDUCE", "yes"),
        ("VLLM_XPU_LAGUNA_VERIFY_WIDTH", "17"),
        ("VLLM_XPU_LAGUNA_DEBUG_NO_SPLIT_PLAN", "on"),
    ],
)
def test_a_bad_series_value_fails_at_config_time(
    models, monkeypatch, name, value
) -> None:
    monkeypatch.setenv(name, value)
    message = _refused(models)
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
    target = _tiny_llama(tmp_path)
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
    assert _refused(models, tensor_parallel_size=2) == TP_REDUCE_MESSAGE
    assert _config(models, tensor_parallel_size=1)  # one rank: no reduction


def test_debug_switches_pass_with_a_warning(models, monkeypatch, log_lines) -> None:
    """The matrix's diagnostic legs (ring at TP 2/4, no split plan) set the
    debug switches explicitly: they pass, each with one warning."""
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_TP_REDUCE", "0")
    monkeypatch.setenv("VLLM_XPU_LAGUNA_DEBUG_XCCL_STANDIN", "1")
    monkeypatch.setenv("VLLM_XPU_LAGUNA_DEBUG_NO_SPLIT_PLAN", "1")
    assert _config(models, tensor_parallel_size=2)
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


def _tiny_llama(root: Path) -> Path:
    from transformers import LlamaConfig

    path = root / "tiny-llama"
    LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    ).save_pretrained(path)
    return path


def test_another_model_keeps_its_configuration(
    tmp_path, monkeypatch, log_lines
) -> None:
    """Series toggles set, a Llama target: prefix caching on, the KV dtype as
    asked, compilation as upstream, no rule, one info line."""
    from vllm.config.xpu_laguna_contract import series_active
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "1")
    target = _tiny_llama(tmp_path)
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


def test_laguna_on_cpu_needs_a_toggle_set(models, monkeypatch) -> None:
    """On CPU the series acts only when a run asks (a toggle set to 1 in the
    environment); the defaults alone leave a Laguna target upstream's."""
    monkeypatch.delenv(SERIES_TOGGLE)
    cfg = _config(models)
    assert cfg.cache_config.enable_prefix_caching is True
    monkeypatch.setenv("VLLM_XPU_LAGUNA_EXACT_VERIFY", "1")  # control: asked
    assert _config(models).cache_config.enable_prefix_caching is False


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
    laguna = _config(models, tensor_parallel_size=2)
    llama = EngineArgs(
        model=str(_tiny_llama(tmp_path)),
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
