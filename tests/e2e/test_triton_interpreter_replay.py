"""The CPU runtime's Triton interpreter fast path (``scripts/cpu_triton/xpu_laguna_triton_cpu/
fast_launch.py``) against the stock interpreter, in this runtime.

Every kernel a tiny DFlash run launches (input preparation, block tables, staged writes,
sampling, logprobs, rejection sampling, the DFlash proposer's inputs) is recorded from a real
engine run (``VXL_TRITON_RECORD``) and replayed through both, storages compared byte for byte;
so are kernels written here in the shape of V2's (pointer tables read through a ``@triton.jit``
helper, reductions over a row with a NaN, two views of one storage, a callable grid, an int64
scalar). Negative controls: a fast path that hands the programs copies and skips the copy-back
(what the cut would do where host and device storage were not the same) is reported; the
comparison tells NaN payloads apart; a wrapped tensor takes the stock path; the dead int32
overflow check is cut only while the builder's ``debug`` option is off.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("xpu_laguna_triton_cpu")
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from xpu_laguna_triton_cpu import fast_launch, record, replay  # noqa: E402

# What the run must launch: one kernel of every kind the CPU runs launch.
KINDS = {
    "input preparation": "vllm.v1.worker.gpu.input_batch:_prepare_pos_seq_lens_kernel",
    "block tables (pointer tables)": "vllm.v1.worker.gpu.block_table:_gather_block_tables_kernel",
    "staged writes": "vllm.v1.worker.gpu.buffer_utils:_apply_write_kernel",
    "sampling": "vllm.v1.worker.gpu.sample.gumbel:_gumbel_sample_kernel",
    "logprobs": "vllm.v1.worker.gpu.sample.logprob:_topk_log_softmax_kernel",
    "prompt logprobs": "vllm.v1.worker.gpu.sample.prompt_logprob:_prompt_logprobs_token_ids_kernel",
    "rejection sampling": "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils:_rejection_kernel",
    "DFlash proposer": "vllm.v1.worker.gpu.spec_decode.dflash.speculator:_prepare_dflash_inputs_kernel",
}


@triton.jit
def _load_ptr(ptr_to_ptr, elem_dtype):
    ptr = tl.load(ptr_to_ptr)
    ptr = tl.cast(ptr, tl.pointer_type(elem_dtype))
    return tl.multiple_of(ptr, 16)


@triton.jit
def _gather_rows_kernel(src_ptrs, dst_ptrs, idx_ptr, num_rows, stride, BLOCK: tl.constexpr):
    group = tl.program_id(0)
    row = tl.program_id(1)
    src = _load_ptr(src_ptrs + group, tl.int32)
    dst = _load_ptr(dst_ptrs + group, tl.int32)
    offs = tl.arange(0, BLOCK)
    if row >= num_rows:
        tl.store(dst + row * stride + offs, 0, mask=offs < stride)
        return
    r = tl.load(idx_ptr + row)
    vals = tl.load(src + r * stride + offs, mask=offs < stride, other=0)
    tl.store(dst + row * stride + offs, vals + 1, mask=offs < stride)


@triton.jit
def _row_stats_kernel(x_ptr, stride, n, max_ptr, lse_ptr, arg_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + offs, mask=offs < n, other=float("-inf"))
    mx = tl.max(x, axis=0)
    tl.store(max_ptr + row, mx)
    tl.store(lse_ptr + row, mx + tl.log(tl.sum(tl.exp(x - mx), axis=0)))
    tl.store(arg_ptr + row, tl.argmax(x, axis=0))


@triton.jit
def _shift_kernel(src_ptr, dst_ptr, n, big, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask) + big % 7, mask=mask)


def launch_all() -> list[torch.Tensor]:
    """Each kernel above once on fixed inputs; every tensor it wrote."""
    gen = torch.Generator().manual_seed(0)
    tables = [torch.randint(0, 100, (4, 8), generator=gen, dtype=torch.int32) for _ in range(2)]
    outs = [torch.full((6, 8), -1, dtype=torch.int32) for _ in range(2)]
    src_ptrs = torch.tensor([t.data_ptr() for t in tables], dtype=torch.uint64)
    dst_ptrs = torch.tensor([t.data_ptr() for t in outs], dtype=torch.uint64)
    idx = torch.tensor([3, 0, 2, 1], dtype=torch.int32)
    _gather_rows_kernel[(2, 6)](src_ptrs, dst_ptrs, idx, 4, 8, BLOCK=8)

    x = torch.randn(3, 40, generator=gen)
    x[1, 5] = float("nan")
    mx, lse, arg = torch.empty(3), torch.empty(3), torch.empty(3, dtype=torch.int32)
    _row_stats_kernel[(3,)](x, x.stride(0), 40, mx, lse, arg, BLOCK=64)

    buf = torch.arange(100, dtype=torch.int64)
    n = 99
    _shift_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](buf[1:], buf[:-1], n, 2**40 + 3, BLOCK=16)
    return [*outs, mx, lse, arg, buf]


def _bytes_equal(left: list[torch.Tensor], right: list[torch.Tensor]) -> bool:
    return (
        replay.differing(
            [t.contiguous().view(torch.uint8) for t in left], [t.contiguous().view(torch.uint8) for t in right]
        )
        == []
    )


def _fast() -> Any:
    fast = fast_launch.installed()
    assert fast is not None and fast.enabled, "the runtime's .pth did not install the fast path"
    return fast


def test_fast_and_stock_launches_write_the_same_bytes() -> None:
    fast = _fast()
    with fast_launch.stock():
        assert not fast.enabled
        expected = launch_all()
    assert fast.enabled
    assert _bytes_equal(launch_all(), expected)
    assert torch.isnan(expected[3][1]) and expected[0][4:].eq(0).all()  # the NaN row, the padded rows


def test_the_language_stays_patched_only_while_interpreting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut 1: after a launch the fast path leaves ``tl.load`` wrapped; stock restores it (the
    negative control), and so does the fast path once TRITON_INTERPRET is off."""
    _fast()
    launch_all()
    assert not tl.core.is_builtin(tl.load), "the fast path restored the language after a launch"
    with fast_launch.stock():
        launch_all()
        assert tl.core.is_builtin(tl.load), "stock left the language patched"
    expected = launch_all()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    got = launch_all()
    assert tl.core.is_builtin(tl.load), "the language stayed patched with TRITON_INTERPRET off"
    assert _bytes_equal(got, expected)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launch_all()
    assert not tl.core.is_builtin(tl.load)


def test_a_launch_the_cut_does_not_cover_takes_the_stock_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``TensorWrapper`` (``triton.reinterpret``) is not a plain CPU tensor: stock's host view
    and copy-back run for it; plain launches never reach them."""
    fast = _fast()
    calls: list[int] = []
    stock_call = fast.stock_executor.__call__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        stock_call(self, *args, **kwargs)

    monkeypatch.setattr(fast.stock_executor, "__call__", spy)
    launch_all()
    assert calls == []
    x = torch.arange(64, dtype=torch.float32)
    dst = torch.zeros(64, dtype=torch.int32)
    _shift_kernel[(4,)](triton.reinterpret(x, tl.int32), dst, 64, 0, BLOCK=16)
    assert calls == [1]
    assert torch.equal(dst, x.view(torch.int32))


@triton.jit
def _wrap_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + offs, x * 3 + x - 7, mask=offs < n)


def test_overflow_checks_are_cut_only_while_they_are_dead() -> None:
    """Cut 5: the int32 overflow check feeds only a debug assert; an overflowing kernel gives the
    same wrapped bits without it, and stock's options come back with the stock interpreter."""
    fast = _fast()
    builder = fast.module.interpreter_builder
    x = torch.tensor([2**31 - 1, -(2**31), 5, 2**30], dtype=torch.int32)
    got = {}
    for name, scope in (("stock", fast_launch.stock()), ("fast", contextlib.nullcontext())):
        with scope:
            got[name] = (builder.options.sanitize_overflow, torch.full_like(x, -1))
            _wrap_kernel[(1,)](x, got[name][1], 4, BLOCK=4)
    assert not builder.options.debug
    assert got["stock"][0] is True and got["fast"][0] is False
    assert torch.equal(got["stock"][1], got["fast"][1])
    assert got["fast"][1][2].item() == 5 * 3 + 5 - 7  # in range: the plain value
    assert got["fast"][1][0].item() != (2**31 - 1) * 4 - 7  # out of range: wrapped, as compiled


def test_the_comparison_tells_nan_payloads_apart() -> None:
    quiet = torch.tensor([float("nan")])
    other = quiet.view(torch.int32).bitwise_or(1).view(torch.float32)
    assert torch.isnan(other).all()
    same = [quiet.clone().view(torch.uint8)]
    assert replay.differing(same, [quiet.clone().view(torch.uint8)]) == []
    assert replay.differing(same, [other.view(torch.uint8)]) == [0]


def _copies_without_copy_back(fast: Any) -> Any:
    """The broken cut: the programs get copies of the tensors, and nothing is copied back."""

    def host_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        def copy(value: Any) -> Any:
            return value.clone() if isinstance(value, torch.Tensor) else value

        return tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}

    return host_args


def test_recorded_launches_replay_equal_and_a_broken_fast_path_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _fast()
    with record.recording(tmp_path):
        launch_all()
    launches = replay.load(tmp_path)
    assert [launch.kernel.rsplit(":", 1)[1] for launch in launches] == [
        "_gather_rows_kernel",
        "_row_stats_kernel",
        "_shift_kernel",
    ]
    assert launches[0].args[0]["pointers"] and launches[2].grid == (7,)
    assert launches[2].args[0]["storage"] == launches[2].args[1]["storage"]  # two views, one storage
    result = replay.compare(launches)
    assert result.line() == "3 kernels, 3 launches compared" and result.differ == []
    monkeypatch.setattr(fast, "host_args", _copies_without_copy_back(fast))
    broken = replay.compare(launches)
    # _gather_rows_kernel writes through its pointer table (the replay's own storages): unaffected
    assert [launch.kernel.rsplit(":", 1)[1] for launch, _ in broken.differ] == ["_row_stats_kernel", "_shift_kernel"]


def test_the_bench_prints_stock_and_fast_per_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scripts.bench import triton_interpreter as bench

    with record.recording(tmp_path):
        launch_all()
    assert bench.main([str(tmp_path), "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| test_")]
    assert sorted(r[0].strip().split(":")[1] for r in rows) == [
        "_gather_rows_kernel",
        "_row_stats_kernel",
        "_shift_kernel",
    ]
    for row in rows:
        cells = [c.strip() for c in row]
        assert cells[1] == "1" and cells[2] == "1", row  # replayed, launches of the recorded run
    assert "3 kernels, 3 launches replayed" in out
    assert bench.main([str(tmp_path / "absent")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


@pytest.fixture(scope="module")
def dflash_recording(tmp_path_factory: pytest.TempPathFactory, tiny_models: Any, vllm_greedy: Any) -> Path:
    """One tiny DFlash engine run with logprobs and prompt logprobs, its launches recorded."""
    directory = tmp_path_factory.mktemp("triton_launches")
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(pytest.MonkeyPatch.context())
        env.setenv(record.RECORD_ENV, str(directory))
        vllm_greedy(
            tiny_models.target,
            ("The lagoon is calm in the morning", "A small model learns to repeat the word lagoon lagoon lagoon"),
            12,
            logprobs=5,
            speculative_config={"method": "dflash", "model": str(tiny_models.draft), "num_speculative_tokens": 7},
        )
    return directory


def test_every_kernel_a_dflash_run_launches_replays_bitwise_equal(
    dflash_recording: Path, monkeypatch: pytest.MonkeyPatch, e2e: Any
) -> None:
    fast = _fast()
    counts = replay.counts(dflash_recording)
    missing = {kind: name for kind, name in KINDS.items() if name not in counts}
    assert not missing, f"the run launched no kernel of these kinds: {missing}"
    unsaved = {name: c for name, c in counts.items() if c["not_saved"] or not c["saved"]}
    assert not unsaved, f"launches the recording could not keep: {unsaved}"
    launches = replay.load(dflash_recording)
    result = replay.compare(launches)
    line = f"{result.line()} ({sum(c['launches'] for c in counts.values())} launches in the run)"
    print(line)
    e2e.measured["Triton interpreter replay, stock vs fast"] = line
    assert result.kernels == len(counts)
    assert result.differ == [], [(launch.path.name, launch.kernel, bad) for launch, bad in result.differ]

    first = list({launch.kernel: launch for launch in reversed(launches)}.values())  # one launch per kernel
    monkeypatch.setattr(fast, "host_args", _copies_without_copy_back(fast))
    broken = replay.compare(first)
    print(f"negative control: {len(broken.differ)} of {broken.launches} launches differ")
    assert broken.differ, "a fast path that loses the kernels' writes went unnoticed"
