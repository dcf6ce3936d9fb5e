# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Exact tensor-parallel all-reduce (0010, ``vllm.xpu_laguna.collectives``).

Real multi-process gloo groups on CPU (2 and 4 ranks, forked from this
process so that torch and vLLM are imported once). A verify step all-reduces
an 8-row message, the teacher's decode of the same token a 1-row message; a
row is exact when its bits are the same in both. The XCCL ring stand-in
(``xpu_laguna_standins.xccl_ring``, the CPU runtime's test-side stand-in,
registered in the ranks) must show rows
that are not (at 4 ranks: this is the device's behaviour the fix exists for),
the fixed rank-order sum none. The production forms of the rank-order sum
(adds into the output; each rank's slice summed on that rank, then gathered)
must give the bits of the form before them (:func:`reference_rank_order`, kept
here) at every size, layout and buffer the callers use.

Expected values are computed here from the inputs with plain torch adds in
the order the test names, or written down by hand (the ring-order case), never
by the module under test.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import socket
import traceback
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
from laguna_model_testlib import config_stand_in, series_options
from xpu_laguna_standins import standin_communicator as standin_communicator
from xpu_laguna_standins import xccl_ring as standin

import vllm._custom_ops  # noqa: F401  (loads the CPU SHM ops before the fork)
from vllm.config import set_current_vllm_config
from vllm.distributed.device_communicators.xpu_communicator import XpuCommunicator
from vllm.xpu_laguna import collectives as xc

ROWS = 8  # the verify width M
HIDDEN = (3072, 40)  # Laguna-S hidden size; a small odd-sized message
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SEEDS = (0, 1)
WORLDS = (2, 4)
INT_VIEW = {torch.bfloat16: torch.int16, torch.float32: torch.int32}
# The series' options of the communicators the hook check builds (a Laguna
# config of a CPU run that asks for the series).
HOOK_OPTIONS = {
    "defaults": {},
    "exact_off": {"exact_tp_reduce": False},
    "standin": {"exact_tp_reduce": False, "debug_xccl_standin": True},
}


def _bits(t: torch.Tensor) -> np.ndarray:
    """The tensor's bit patterns (tells -0.0 from +0.0, unlike ==)."""
    return t.contiguous().view(INT_VIEW[t.dtype]).numpy().copy()


def _inputs(seed: int, rank: int, dtype: torch.dtype, hidden: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(ROWS, hidden, generator=gen).to(dtype)


def _embedding_inputs(
    rank: int, world: int, dtype: torch.dtype, hidden: int, owners: int
) -> torch.Tensor:
    """Row i is non-zero on ``owners`` ranks (1: a vocab-parallel embedding,
    whose other ranks masked the token to +0.0); the owner's row holds some
    -0.0 values."""
    gen = torch.Generator().manual_seed(77 + rank)
    x = torch.randn(ROWS, hidden, generator=gen).to(dtype)
    x[:, ::7] = -0.0
    for row in range(ROWS):
        if (rank - row) % world >= owners:
            x[row] = 0.0
    return x


def _plain(x: torch.Tensor, group) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out, group=group)
    return out


def reference_rank_order(x: torch.Tensor, group) -> torch.Tensor:
    """The rank-order sum as 0010 first shipped it (kept as the reference of
    the cheaper forms): all-gather, clone rank 0's copy, add the others in
    place in rank order, copy out."""
    world = dist.get_world_size(group)
    flat = x.contiguous().view(-1)
    gathered = torch.empty(world * flat.numel(), dtype=x.dtype)
    dist.all_gather_single(gathered, flat, group=group)
    rows = gathered.view(world, -1)
    acc = rows[0].clone()
    for rank in range(1, world):
        acc.add_(rows[rank])
    out = torch.empty_like(x)
    out.copy_(acc.view(x.shape))
    return out


METHODS = {
    "standin": standin.xccl_ring_all_reduce,
    "rank_order": xc.rank_order_all_reduce,
    "plain": _plain,
}


def _row_check(fn, x: torch.Tensor, group) -> dict:
    """All-reduce the 8-row message and each row alone; compare row bits."""
    full = fn(x, group)
    single = torch.cat([fn(x[i : i + 1].clone(), group) for i in range(ROWS)])
    a, b = _bits(full), _bits(single)
    return {
        "full": a,
        "rows_differ": int((a != b).any(axis=1).sum()),
        "elems_differ": int((a != b).sum()),
        "digest": hashlib.sha256(a.tobytes() + b.tobytes()).hexdigest(),
    }


def _scenarios(rank: int, world: int, group) -> dict:
    out: dict = {}
    for dname, dtype in DTYPES.items():
        for hidden in HIDDEN:
            for seed in SEEDS:
                x = _inputs(seed, rank, dtype, hidden)
                for name, fn in METHODS.items():
                    out[("random", name, dname, hidden, seed)] = _row_check(
                        fn, x, group
                    )
                upstream = XpuCommunicator._fixed_rank_sum(
                    SimpleNamespace(world_size=world, device_group=group), x
                )
                out[("upstream", dname, hidden, seed)] = _bits(upstream)
            for owners in (1, 3):
                x = _embedding_inputs(rank, world, dtype, hidden, owners)
                for name, fn in METHODS.items():
                    out[("embedding", owners, name, dname, hidden)] = _row_check(
                        fn, x, group
                    )
    # The ring order by hand: rank 0 holds 1.0, ranks 1 and 2 hold 2**-8, the
    # rest 0. In bf16 1 + 2**-8 is a tie and rounds to 1, but 2**-8 + 2**-8
    # is exact, so a sum that starts at rank 1 ends at 1 + 2**-7.
    values = [1.0, 2.0**-8, 2.0**-8] + [0.0] * (world - 3)
    for rows in (1, ROWS):
        x = torch.full((rows, 3072), values[rank], dtype=torch.bfloat16)
        for name in ("standin", "rank_order"):
            out[("ring_order", name, rows)] = METHODS[name](x, group).float().numpy()
    out["hook"] = _hook_through_cpu_communicator(x, group)
    out.update(_forms(rank, world, group))
    return out


# Message sizes of the form checks: decode and verify rows, a size no world
# divides (3 x 1023), a tiny one with empty slices at 4 ranks (9: slices
# 3, 3, 3, 0), and messages at and over the scatter threshold, even and odd.
_BIG_ROWS = -(-xc.RANK_ORDER_SCATTER_MIN_BYTES // (3072 * 2)) + 1
FORM_SIZES = {
    "bf16": [
        (1, 3072),
        (8, 3072),
        (3, 1023),
        (1, 9),
        (_BIG_ROWS, 3072),
        (1, xc.RANK_ORDER_SCATTER_MIN_BYTES // 2 + 3),
    ],
    "fp32": [
        (1, 3072),
        (8, 3072),
        (3, 1023),
        (1, 9),
        (1, xc.RANK_ORDER_SCATTER_MIN_BYTES // 4),
    ],
}


def _form_input(seed: int, rank: int, dtype: torch.dtype, shape) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5000 + 97 * seed + rank)
    # spread exponents, so that adds round and the order shows in the bits
    x = torch.randn(*shape, generator=gen) * torch.exp2(
        torch.randint(-6, 7, shape, generator=gen).float()
    )
    return x.to(dtype)


def _forced(form: str, x: torch.Tensor, group) -> torch.Tensor:
    world = dist.get_world_size(group)
    out = torch.empty_like(x)
    fn = xc._gather_sum if form == "gather" else xc._scatter_sum
    fn(x.contiguous().view(-1), group, world, out, None)
    return out


class _NoAllocation:
    """torch.empty / empty_like raise inside (what a replayed graph break
    must not do: its buffers are the capture's)."""

    def __enter__(self):
        self.saved = (torch.empty, torch.empty_like)

        def refuse(*args, **kwargs):
            raise AssertionError("allocated inside a break with its buffers")

        torch.empty = torch.empty_like = refuse

    def __exit__(self, *exc):
        torch.empty, torch.empty_like = self.saved


def _forms(rank: int, world: int, group) -> dict:
    out: dict = {}
    calls = {"all_to_all": 0}
    real_a2a = dist.all_to_all_single

    def counting_a2a(*args, **kwargs):
        calls["all_to_all"] += 1
        return real_a2a(*args, **kwargs)

    for dname, sizes in FORM_SIZES.items():
        dtype = DTYPES[dname]
        for shape in sizes:
            x = _form_input(0, rank, dtype, shape)
            results = {
                "reference": reference_rank_order(x, group),
                "gather": _forced("gather", x, group),
                "scatter": _forced("scatter", x, group),
            }
            dist.all_to_all_single = counting_a2a
            try:
                calls["all_to_all"] = 0
                results["auto"] = xc.rank_order_all_reduce(x, group)
                out[("auto_scatter", dname, shape)] = calls["all_to_all"] == 1
            finally:
                dist.all_to_all_single = real_a2a
            # a strided output (the transpose of a buffer), and in place
            if len(shape) == 2:
                strided = torch.empty(shape[1], shape[0], dtype=dtype).t()
                results["strided_out"] = xc.rank_order_all_reduce(x, group, strided)
            y = x.clone()
            results["in_place"] = xc.rank_order_all_reduce(y, group, y)
            out[("in_place_same_tensor", dname, shape)] = results["in_place"] is y
            # the graph break's way: its output and scratch, nothing allocated
            slot = torch.empty(shape, dtype=dtype)
            scratch = torch.full((world * x.numel(),), float("nan"), dtype=dtype)
            with _NoAllocation():
                got = xc.rank_order_all_reduce(x, group, slot, scratch)
            results["buffers"] = got
            out[("buffers_same_tensor", dname, shape)] = got is slot
            for form, value in results.items():
                out[("form", form, dname, shape)] = _bits(value)
    return out


def _hook_through_cpu_communicator(x: torch.Tensor, group) -> dict:
    """Real stand-in CPU communicators of a tp group (upstream's
    CpuCommunicator with the series' modes, SHM transport where the CPU ops
    have it), one built under each config of :data:`HOOK_OPTIONS` (a
    communicator decides its mode when it is built, under the current
    config): which path each one's all_reduce takes."""
    os.environ["VLLM_DIST_IDENT"] = f"test-tp-collectives-{os.getppid()}"
    names = iter(f"tp:{i}" for i in range(8))  # one SHM group per communicator
    communicator_cls = standin_communicator.StandInCpuCommunicator

    def build(options: dict) -> standin_communicator.StandInCpuCommunicator:
        with set_current_vllm_config(config_stand_in(series_options(**options))):
            return communicator_cls(
                cpu_group=group, device_group=group, unique_name=next(names)
            )

    calls: list[str] = []
    real = {
        "rank_order": xc.rank_order_all_reduce,
        "standin": standin.xccl_ring_all_reduce,
    }

    def spy(name):
        def call(*args, **kwargs):
            calls.append(name)
            return real[name](*args, **kwargs)

        return call

    def reduce(comm: standin_communicator.StandInCpuCommunicator) -> tuple:
        calls.clear()
        y = x.clone()
        result = comm.all_reduce(y)
        return (list(calls), _bits(result), result.data_ptr() == y.data_ptr())

    xc.rank_order_all_reduce = spy("rank_order")
    standin_communicator.xccl_ring_all_reduce = spy("standin")
    seen: dict = {}
    try:
        comms = {label: build(options) for label, options in HOOK_OPTIONS.items()}
        seen["transport"] = type(comms["defaults"].dist_module).__name__
        for label, comm in comms.items():
            seen[label] = reduce(comm)
            seen[f"mode/{label}"] = comm.xpu_laguna_mode.value
        # each keeps the mode it was built with, whatever config is current
        with set_current_vllm_config(
            config_stand_in(series_options(**HOOK_OPTIONS["standin"]))
        ):
            seen["defaults_again"] = reduce(comms["defaults"])
    finally:
        xc.rank_order_all_reduce = real["rank_order"]
        standin_communicator.xccl_ring_all_reduce = real["standin"]
    return seen


def _worker(rank: int, world: int, port: int, results) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        results.put((rank, _scenarios(rank, world, dist.group.WORLD)))
        dist.destroy_process_group()
    except BaseException:
        results.put((rank, traceback.format_exc()))


def _run(world: int) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # fork: the children reuse this process's imports (spawn would import
    # torch and vLLM once per rank); they set one intra-op thread first.
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(rank, world, port, results))
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    got: dict[int, object] = {}
    try:
        for _ in range(world):
            rank, value = results.get(timeout=240)
            got[rank] = value
    except queue.Empty:
        pytest.fail(f"{world}-rank gloo run timed out; got ranks {sorted(got)}")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    for rank, value in got.items():
        assert isinstance(value, dict), f"rank {rank} failed:\n{value}"
    return [got[rank] for rank in range(world)]


@pytest.fixture(scope="module")
def runs() -> dict[int, list[dict]]:
    return {world: _run(world) for world in WORLDS}


def _counts(runs, world, kind) -> dict:
    return {
        key[1:]: value
        for key, value in runs[world][0].items()
        if isinstance(key, tuple) and key[0] == kind
    }


# -- the XCCL ring stand-in -------------------------------------------------


def test_standin_rows_depend_on_message_size_at_4_ranks(runs):
    """The device behaviour the fix is for: at TP 4 some rows of an 8-row
    message get other bits than the same row all-reduced alone."""
    counts, elems = (
        {
            (dname, hidden): sum(
                runs[4][0][("random", "standin", dname, hidden, seed)][field]
                for seed in SEEDS
            )
            for dname in DTYPES
            for hidden in HIDDEN
        }
        for field in ("rows_differ", "elems_differ")
    )
    print(f"stand-in, 4 ranks, rows (of {ROWS * len(SEEDS)}) differing M=1 vs M=8:")
    print(f"  {counts}; elements differing: {elems}")
    for key, count in counts.items():
        assert count > 0, key


def test_standin_at_2_ranks_is_one_add_and_message_size_independent(runs):
    """With two ranks the ring adds once; IEEE addition is commutative, so
    ownership does not matter (a prediction for TP 2 on the device)."""
    for (name, dname, hidden, seed), check in _counts(runs, 2, "random").items():
        if name == "standin":
            assert check["rows_differ"] == 0, (dname, hidden, seed)


def test_standin_follows_the_ring_order_by_hand(runs):
    """Chunk c is summed from rank c: only rank 1's chunk starts with the two
    2**-8 values and ends at 1 + 2**-7. One row: elements 768..1535 are rank
    1's quarter; eight rows: rows 2-3 are."""
    high = 1.0 + 2.0**-7
    one_row = np.ones((1, 3072), dtype=np.float32)
    one_row[0, 768:1536] = high
    eight_rows = np.ones((ROWS, 3072), dtype=np.float32)
    eight_rows[2:4] = high
    for rank_result in runs[4]:
        assert np.array_equal(rank_result[("ring_order", "standin", 1)], one_row)
        assert np.array_equal(rank_result[("ring_order", "standin", ROWS)], eight_rows)
        for rows in (1, ROWS):
            ordered = rank_result[("ring_order", "rank_order", rows)]
            assert np.array_equal(ordered, np.ones((rows, 3072), dtype=np.float32))


def test_standin_identical_on_all_ranks(runs):
    for world in WORLDS:
        for key, check in runs[world][0].items():
            if isinstance(key, tuple) and key[0] == "random" and key[1] == "standin":
                assert {r[key]["digest"] for r in runs[world]} == {check["digest"]}


# -- the fixed rank-order sum -----------------------------------------------


def test_rank_order_is_message_size_independent_and_the_same_on_all_ranks(runs):
    for world in WORLDS:
        for key, check in runs[world][0].items():
            if isinstance(key, tuple) and key[:2] == ("random", "rank_order"):
                assert check["rows_differ"] == 0, (world, key)
                assert {r[key]["digest"] for r in runs[world]} == {check["digest"]}


def test_rank_order_is_the_sum_in_rank_order(runs):
    """Against ((x_0 + x_1) + x_2) + ... from the regenerated inputs, and
    against upstream's XpuCommunicator._fixed_rank_sum (VLLM_BATCH_INVARIANT)."""
    for world in WORLDS:
        for dname, dtype in DTYPES.items():
            for hidden in HIDDEN:
                for seed in SEEDS:
                    acc = _inputs(seed, 0, dtype, hidden)
                    for rank in range(1, world):
                        acc = acc + _inputs(seed, rank, dtype, hidden)
                    got = runs[world][0][("random", "rank_order", dname, hidden, seed)]
                    assert np.array_equal(got["full"], _bits(acc))
                    upstream = runs[world][0][("upstream", dname, hidden, seed)]
                    assert np.array_equal(got["full"], upstream)


def test_plain_gloo_counts_for_the_record(runs):
    """Not a gate: how gloo's own all-reduce behaves (printed)."""
    for world in WORLDS:
        rows = {
            key: check["rows_differ"]
            for key, check in _counts(runs, world, "random").items()
            if key[0] == "plain"
        }
        print(f"plain gloo, {world} ranks, rows differing M=1 vs M=8: {rows}")


# -- embedding-style reductions ---------------------------------------------


def test_embedding_rows_are_exact_on_every_path(runs):
    """One non-zero contributor per row (VocabParallelEmbedding): x + 0 + ...
    is exact in any order, -0.0 included (-0.0 + +0.0 is +0.0), so the
    embedding all-reduce needs no fixed order: plain, stand-in, rank order
    all give the owner's row, at both message sizes."""
    for world in WORLDS:
        for dname, dtype in DTYPES.items():
            for hidden in HIDDEN:
                owner_rows = torch.zeros(ROWS, hidden, dtype=dtype)
                for rank in range(world):
                    x = _embedding_inputs(rank, world, dtype, hidden, owners=1)
                    owned = (rank - torch.arange(ROWS)) % world < 1
                    owner_rows[owned] = x[owned]
                expected = _bits(owner_rows + 0.0)  # -0.0 -> +0.0
                for name in METHODS:
                    check = runs[world][0][("embedding", 1, name, dname, hidden)]
                    assert check["rows_differ"] == 0, (world, name, dname, hidden)
                    assert np.array_equal(check["full"], expected), (world, name)


def test_negative_control_three_contributors_are_not_exact_under_the_standin(runs):
    """The embedding's exactness comes from the single owner: with three
    non-zero ranks per row the stand-in's rows depend on the message size."""
    differing = {
        (dname, hidden): runs[4][0][("embedding", 3, "standin", dname, hidden)][
            "rows_differ"
        ]
        for dname in DTYPES
        for hidden in HIDDEN
    }
    print(f"stand-in, 4 ranks, 3 contributors per row, rows differing: {differing}")
    assert differing[("bf16", 3072)] > 0
    assert sum(differing.values()) > 0


def test_negative_control_the_bit_comparison_sees_signed_zero_and_one_ulp():
    a = torch.tensor([0.0, 1.0], dtype=torch.bfloat16)
    b = torch.tensor([-0.0, 1.0], dtype=torch.bfloat16)
    c = torch.tensor([0.0, 1.0078125], dtype=torch.bfloat16)
    assert torch.equal(a, b)  # what == would miss
    assert (_bits(a) != _bits(b)).sum() == 1
    assert (_bits(a) != _bits(c)).sum() == 1


# -- the hook on a real CpuCommunicator (SHM transport) in the gloo runs ---


def test_real_cpu_communicator_takes_the_hook(runs):
    """TP 2 and 4 on CPU: the runtime's stand-in communicator (vLLM's
    CpuCommunicator with the series' modes, SHM transport when the CPU ops
    provide it), built under a Laguna config, reaches the rank-order path
    with the defaults, the stand-in with the debug option, and its own
    transport otherwise; in place, like the plain CPU path. Communicators
    built under three configs in one process each keep their own mode."""
    for world in WORLDS:
        for rank_result in runs[world]:
            hook = rank_result["hook"]
            print(f"{world} ranks: CpuCommunicator transport {hook['transport']}")
            assert hook["defaults"][0] == ["rank_order"]
            assert hook["exact_off"][0] == []
            assert hook["standin"][0] == ["standin"]
            assert [hook[f"mode/{label}"] for label in HOOK_OPTIONS] == [
                "rank-order",
                "plain",
                "xccl-standin",
            ]
            # built under the defaults, reduced under another current config
            assert hook["defaults_again"][0] == ["rank_order"]
            assert np.array_equal(hook["defaults_again"][1], hook["defaults"][1])
            assert all(hook[label][2] for label in HOOK_OPTIONS)
    # at 4 ranks the paths give different bits for the same input
    four = runs[4][0]["hook"]
    assert not np.array_equal(four["defaults"][1], four["standin"][1])


# -- the cheaper forms of the rank-order sum (same bits) --------------------


def _regenerated_sum(world: int, dname: str, shape) -> np.ndarray:
    """((x_0 + x_1) + ...) from the regenerated inputs, out-of-place adds."""
    dtype = DTYPES[dname]
    acc = _form_input(0, 0, dtype, shape)
    for rank in range(1, world):
        acc = acc + _form_input(0, rank, dtype, shape)
    return _bits(acc)


def test_forms_give_the_reference_bits(runs):
    """Adds into the output (gather form), each rank's slice summed on that
    rank (scatter form), the automatic choice, a strided output, in place and
    into a graph break's own buffers (nothing allocated): the bits of the
    form before them and of hand-ordered adds, on every rank, at TP 2 and 4,
    for 1 and 8 rows, sizes no world divides, empty slices, and messages over
    the scatter threshold."""
    for world in WORLDS:
        for dname, sizes in FORM_SIZES.items():
            for shape in sizes:
                expected = _regenerated_sum(world, dname, shape)
                for rank_result in runs[world]:
                    forms = {
                        key[1]: value
                        for key, value in rank_result.items()
                        if isinstance(key, tuple)
                        and key[0] == "form"
                        and key[2:] == (dname, shape)
                    }
                    assert set(forms) >= {"reference", "gather", "scatter", "auto"}
                    assert np.array_equal(forms["reference"], expected), (world, shape)
                    for form, got in forms.items():
                        assert np.array_equal(got, expected), (
                            world,
                            dname,
                            shape,
                            form,
                        )
                    for check in ("in_place_same_tensor", "buffers_same_tensor"):
                        assert rank_result[(check, dname, shape)], (check, shape)


def test_the_threshold_picks_the_scatter_form(runs):
    """Messages of RANK_ORDER_SCATTER_MIN_BYTES or more run the all-to-all,
    smaller ones do not (the choice the byte counts of the bench assume)."""
    for world in WORLDS:
        for dname, sizes in FORM_SIZES.items():
            for shape in sizes:
                nbytes = int(np.prod(shape)) * DTYPES[dname].itemsize
                big = nbytes >= xc.RANK_ORDER_SCATTER_MIN_BYTES
                assert runs[world][0][("auto_scatter", dname, shape)] is big
    assert any(
        int(np.prod(shape)) * DTYPES[d].itemsize >= xc.RANK_ORDER_SCATTER_MIN_BYTES
        for d, sizes in FORM_SIZES.items()
        for shape in sizes
    )


def test_negative_control_other_orders_and_one_rounding_give_other_bits():
    """The bit comparison tells the rank order from other arithmetic: on
    crafted bf16 inputs (1, 2**-8, 2**-8, 0) the reverse order and a sum
    accumulated in fp32 and rounded once both give 1 + 2**-7, the rank order
    1 (1 + 2**-8 is a tie that rounds to 1)."""
    xs = [
        torch.full((4,), v, dtype=torch.bfloat16) for v in (1.0, 2.0**-8, 2.0**-8, 0.0)
    ]
    rank_order = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    reverse = ((xs[3] + xs[2]) + xs[1]) + xs[0]
    once = sum(x.float() for x in xs).to(torch.bfloat16)
    assert rank_order.tolist() == [1.0] * 4
    assert (_bits(rank_order) != _bits(reverse)).all()
    assert (_bits(rank_order) != _bits(once)).all()


def test_a_bf16_add_into_an_output_is_the_in_place_add():
    """``torch.add(a, b, out=c)`` (the new forms) and ``a.clone().add_(b)``
    (the form before) are the same kernel: both compute a + b in fp32 and
    round once to bf16, on random pairs of spread exponents and on ties."""
    gen = torch.Generator().manual_seed(3)
    a = (
        torch.randn(1 << 16, generator=gen)
        * torch.exp2(torch.randint(-20, 21, (1 << 16,), generator=gen).float())
    ).bfloat16()
    b = (
        torch.randn(1 << 16, generator=gen)
        * torch.exp2(torch.randint(-20, 21, (1 << 16,), generator=gen).float())
    ).bfloat16()
    ties = torch.tensor([1.0, 1.0, 3.0, -1.0], dtype=torch.bfloat16)
    tie_b = torch.tensor(
        [2.0**-8, 3 * 2.0**-8, 2.0**-7, -(2.0**-8)], dtype=torch.bfloat16
    )
    for x, y in ((a, b), (ties, tie_b)):
        out = torch.empty_like(x)
        torch.add(x, y, out=out)
        assert np.array_equal(_bits(out), _bits(x.clone().add_(y)))
        assert np.array_equal(_bits(out), _bits((x.float() + y.float()).bfloat16()))


# -- no stand-in in vLLM ------------------------------------------------------


def test_vllm_ships_no_xccl_standin():
    """The ring stand-in is test code: the production modules have none and
    no registration point; only the runtime's own communicator runs it."""
    import vllm

    for name in ("xccl_ring_standin_all_reduce", "ring_chunk_bounds", "cpu_stand_ins"):
        assert not hasattr(xc, name)
    root = os.path.dirname(vllm.__file__)
    for folder, _, files in os.walk(os.path.join(root, "distributed")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    text = f.read()
                    assert "ring_chunk_bounds" not in text, name
                    assert "xccl_ring" not in text, name


def test_the_runtime_platform_builds_the_standin_communicator(monkeypatch):
    """``xpu_laguna_standins.platform_plugin`` (the CPU runtime's platform
    plugin) names the stand-in platform on CPU, whose communicator is the
    stand-in one; where upstream detects no CPU platform it names none
    (negative control)."""
    import xpu_laguna_standins
    from xpu_laguna_standins.standin_platform import StandInCpuPlatform

    import vllm.platforms

    assert xpu_laguna_standins.platform_plugin() == xpu_laguna_standins.PLATFORM
    assert StandInCpuPlatform.get_device_communicator_cls() == (
        "xpu_laguna_standins.standin_communicator.StandInCpuCommunicator"
    )
    monkeypatch.setattr(vllm.platforms, "cpu_platform_plugin", lambda: None)
    assert xpu_laguna_standins.platform_plugin() is None
