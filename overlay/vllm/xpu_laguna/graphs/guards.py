# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Static identity of tensors: what captured segments read (model inputs,
KV-cache slot mapping, eager-break results), the cheap every-replay probe
of their addresses and the full structural comparison."""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Callable
from typing import Any

import torch

from vllm.forward_context import get_forward_context, is_forward_context_available

TensorIdentity = tuple[
    str, int, int, tuple[int, ...], tuple[int, ...], torch.dtype, torch.device
]


def _identity(path: str, t: torch.Tensor) -> TensorIdentity:
    return (
        path,
        t.data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
    )


def reachable_tensor_identities(
    obj: Any,
    root: str = "",
    max_depth: int = 8,
) -> list[TensorIdentity]:
    """Identity (pointer, storage offset, shape, stride, dtype, device) of
    every tensor reachable from ``obj`` through containers, dataclasses and
    objects holding a ``tensors`` dict, in a stable order. An object reached
    twice is reported once, at its first path."""
    out: list[TensorIdentity] = []
    seen: set[int] = set()

    def walk(x: Any, path: str, depth: int) -> None:
        if x is None or isinstance(x, (bool, int, float, str, bytes, enum.Enum)):
            return
        if depth > max_depth or id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            out.append(_identity(path, x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]", depth + 1)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name, None), f"{path}.{f.name}", depth + 1)
        elif isinstance(getattr(x, "tensors", None), dict):
            walk(x.tensors, f"{path}.tensors", depth + 1)

    walk(obj, root, 0)
    return out


def static_input_identities(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[TensorIdentity]:
    """Model inputs and the per-layer KV-cache slot mapping (the cache write
    is captured inside a graph segment: it must see the captured buffer)."""
    ids = reachable_tensor_identities(args, "args") + reachable_tensor_identities(
        kwargs, "kwargs"
    )
    if is_forward_context_available():
        ids += reachable_tensor_identities(
            get_forward_context().slot_mapping, "slot_mapping"
        )
    return ids


def slot_mapping_representatives(slot_mapping: object) -> tuple[str, ...]:
    """One layer name per distinct slot-mapping buffer: the runner builds one
    slot mapping per KV-cache group and hands it to all the group's layers."""
    if not isinstance(slot_mapping, dict):
        return ()
    first: dict[int, str] = {}
    for name, tensor in slot_mapping.items():
        if isinstance(tensor, torch.Tensor):
            first.setdefault(tensor.data_ptr(), name)
    return tuple(first.values())


_data_ptr = torch.Tensor.data_ptr
# What a probe returns when the call's structure differs from the capture's:
# never equal to a tuple of addresses, so the full check runs and names it.
_MOVED: tuple[int, ...] = (-1,)

StaticInputProbe = Callable[[tuple[Any, ...], dict[str, Any], object], tuple[int, ...]]


def static_input_pointers(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    slot_mapping: object,
    slot_names: tuple[str, ...],
) -> list[int]:
    """Every-replay form of :func:`static_input_identities`: the addresses
    of the top-level tensor arguments and of the slot mapping of one layer
    per KV-cache group (``slot_names``, taken at capture; every layer's is
    compared in debug mode). Any calling convention; replays of the model
    runner's use :func:`static_input_probe`'s faster form."""
    ptrs = [_data_ptr(a) for a in args if isinstance(a, torch.Tensor)] if args else []
    for value in kwargs.values():
        if isinstance(value, torch.Tensor):
            ptrs.append(_data_ptr(value))
    if isinstance(slot_mapping, dict):
        for tensor in map(slot_mapping.get, slot_names):
            ptrs.append(_data_ptr(tensor) if tensor is not None else -1)
        ptrs.append(len(slot_mapping))
    elif isinstance(slot_mapping, torch.Tensor):
        ptrs.append(_data_ptr(slot_mapping))
    return ptrs


def static_input_probe(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    slot_mapping: object,
    slot_names: tuple[str, ...],
) -> StaticInputProbe:
    """The replay guard's probe, built at capture: ``probe(args, kwargs,
    slot_mapping)`` returns a tuple that equals the capture's as long as the
    tensor arguments and the slot mapping of each KV-cache group are at the
    captured addresses and the call has the captured structure (the
    keywords that carry a value, the number of slot-mapping layers, the
    non-tensor keywords still None or absent); else another tuple
    (``_MOVED`` when the structure differs).

    For the model runner's calling convention (keyword arguments only, the
    non-tensor ones None, a slot-mapping dict) the probe is a closure over
    the captured names: a dict lookup and a ``data_ptr()`` per tensor, what
    every replay pays (the host time per step is what
    ``scripts/bench/graph_host_overhead.py`` measures against upstream's
    wrapper). Other conventions fall back to :func:`static_input_pointers`.
    """
    others = tuple(k for k, v in kwargs.items() if not isinstance(v, torch.Tensor))
    if (
        args
        or not isinstance(slot_mapping, dict)
        or any(kwargs[k] is not None for k in others)
    ):
        return lambda a, k, sm: tuple(static_input_pointers(a, k, sm, slot_names))
    tensors = tuple(k for k in kwargs if k not in others)
    layers = len(slot_mapping)
    read_inputs = _getter(tensors)
    read_slots = _getter(slot_names)
    data_ptr = torch.Tensor.data_ptr

    def probe(
        args: tuple[Any, ...], kwargs: dict[str, Any], slot_mapping: Any
    ) -> tuple[Any, ...]:
        try:
            # a keyword passed as None equals one not passed (Model Runner V2
            # passes inputs_embeds=None on real steps, not at capture)
            if (
                args
                or sum(v is not None for v in kwargs.values()) != len(tensors)
                or len(slot_mapping) != layers
            ):
                return _MOVED
            for name in others:
                if kwargs.get(name) is not None:
                    return _MOVED
            return (
                *map(data_ptr, read_inputs(kwargs)),
                *map(data_ptr, read_slots(slot_mapping)),
            )
        except (KeyError, AttributeError, TypeError):
            return _MOVED

    return probe


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """``d -> (d[name] for name in names)`` as a tuple, in C (``itemgetter``
    returns a bare value for one name, so that case is wrapped)."""
    if len(names) == 1:
        (name,) = names
        return lambda d: (d[name],)
    if not names:
        return lambda d: ()
    return operator.itemgetter(*names)


def first_difference(
    captured: list[TensorIdentity], current: list[TensorIdentity]
) -> str | None:
    """One line naming the first difference, or None when equal."""
    for a, b in zip(captured, current):
        if a != b:
            return f"{a[0]}: captured {a[1:]}, now {b[1:]}"
    if len(captured) != len(current):
        extra = current[len(captured) :] or captured[len(current) :]
        return (
            f"{len(captured)} tensors captured, {len(current)} now "
            f"(first unmatched: {extra[0][0]})"
        )
    return None


def _result_pointers(result: Any) -> list[TensorIdentity]:
    return reachable_tensor_identities(result, "result")
