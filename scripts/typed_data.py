"""The one strict reader of the files the tooling trusts: a parsed JSON or TOML value checked
against a declared shape, every problem one :class:`ShapeError` line naming the file and the
dotted field path, what was expected and what was found::

    record.json: gates.min_row_win_fraction: expected a number, got string '0.9'
    pins.toml: vllm.commit: missing required field
    rebase-state.json: patches[0].colour: unknown field (allowed: name, subject, ...)

A shape is a dataclass (its fields with their type hints; a field without a default is
required; ``field(metadata={KEY: "from"})`` names the key in the file), or one of ``str``,
``int``, ``float`` (an integer is taken and becomes a float), ``bool``, ``None``, ``Any``,
``list[X]``, ``dict[str, X]`` (any keys), ``Literal[...]`` and unions of these. ``bool`` is
never a number. A JSON Lines file (:func:`read_jsonl`) is read line by line, each problem naming
``file:line``::

    rows-A1.jsonl:3: token_ids[2]: expected an integer, got string '7'
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from scripts.errors import ToolError

T = TypeVar("T")
KEY = "typed_data_key"
"""``field(metadata={KEY: name})``: the field is called ``name`` in the file."""


class ShapeError(ToolError):
    """A value that does not have its declared shape; ``path`` is the dotted field path."""

    def __init__(self, where: str, path: str, problem: str) -> None:
        super().__init__(f"{where}: {path}: {problem}" if path else f"{where}: {problem}")
        self.where = where
        self.path = path
        self.problem = problem


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _found(value: Any) -> str:
    """What a value is, in JSON words: ``string '0.9'``, ``boolean True``, ``an object``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    kind = {str: "string", int: "integer", float: "number"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"


def describe(shape: Any) -> str:
    """The expected kind in words (``a number``, ``a string or null``)."""
    origin = typing.get_origin(shape)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in typing.get_args(shape))
    if origin is Literal:
        return "one of " + ", ".join(repr(arg) for arg in typing.get_args(shape))
    if shape is type(None) or shape is None:
        return "null"
    base = origin or shape
    if dataclasses.is_dataclass(base) or base is dict:
        return "an object"
    words = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list"}
    return words.get(base, getattr(base, "__name__", str(base)))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check(value: Any, shape: Any, where: str, path: str = "") -> Any:
    """``value`` checked against ``shape`` (dataclass shapes come back as instances, floats as
    floats); a :class:`ShapeError` names ``where`` and the first field that does not fit."""
    if shape is Any:
        return value
    if shape is None or shape is type(None):
        if value is None:
            return None
        raise ShapeError(where, path, f"expected null, got {_found(value)}")
    origin = typing.get_origin(shape)
    if origin in (typing.Union, types.UnionType):
        return _check_union(value, typing.get_args(shape), where, path)
    if origin is Literal:
        if any(type(value) is type(arg) and value == arg for arg in typing.get_args(shape)):
            return value
        raise ShapeError(where, path, f"expected {describe(shape)}, got {_found(value)}")
    base = origin or shape
    if dataclasses.is_dataclass(base) and isinstance(base, type):
        return build(base, value, where, path)
    if base is list:
        if not isinstance(value, list):
            raise ShapeError(where, path, f"expected a list, got {_found(value)}")
        (item,) = typing.get_args(shape) or (Any,)
        return [check(v, item, where, f"{path}[{i}]") for i, v in enumerate(value)]
    if base is dict:
        if not isinstance(value, dict):
            raise ShapeError(where, path, f"expected an object, got {_found(value)}")
        _key, item = typing.get_args(shape) or (str, Any)
        return {k: check(v, item, where, _join(path, str(k))) for k, v in value.items()}
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: _is_number(value),
        str: isinstance(value, str),
    }.get(base)
    if ok is None:
        raise TypeError(f"typed_data: unsupported shape {shape!r}")
    if not ok:
        raise ShapeError(where, path, f"expected {describe(shape)}, got {_found(value)}")
    return float(value) if base is float else value


def _check_union(value: Any, options: tuple[Any, ...], where: str, path: str) -> Any:
    # the value's own kind first, so that an int in ``int | float`` stays an int
    for option in sorted(options, key=lambda o: o is not type(value)):
        try:
            return check(value, option, where, path)
        except ShapeError as exc:
            if exc.path != path:  # it had the right kind but something inside is wrong
                raise
    expected = " or ".join(describe(o) for o in options)
    raise ShapeError(where, path, f"expected {expected}, got {_found(value)}")


def file_keys(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """Key in the file -> dataclass field of ``cls``."""
    return {f.metadata.get(KEY, f.name): f for f in dataclasses.fields(cls)}


def fields_of(cls: type, value: Any, where: str, path: str = "") -> dict[str, Any]:
    """Constructor arguments of dataclass ``cls`` from an object, every field checked: unknown
    keys, missing required ones and wrong types are :class:`ShapeError` lines."""
    if not isinstance(value, dict):
        raise ShapeError(where, path, f"expected an object, got {_found(value)}")
    hints = typing.get_type_hints(cls)
    known = file_keys(cls)
    for key in value:
        if key not in known:
            raise ShapeError(where, _join(path, str(key)), f"unknown field (allowed: {', '.join(known)})")
    out: dict[str, Any] = {}
    for key, spec in known.items():
        if key not in value:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise ShapeError(where, _join(path, key), "missing required field")
            continue
        out[spec.name] = check(value[key], hints[spec.name], where, _join(path, key))
    return out


def build(cls: type[T], value: Any, where: str, path: str = "") -> T:
    """An instance of dataclass ``cls`` from a checked object."""
    return cls(**fields_of(cls, value, where, path))


def read_text(path: Path, what: str = "file") -> str:
    """A UTF-8 text file's content; unreadable or not UTF-8 is one line (``what`` names the file's
    kind in it)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ToolError(f"{path}: not UTF-8 text") from None


def read_json(path: Path, what: str = "file") -> Any:
    """A JSON file's value; unreadable or not JSON is one line."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None


def read_jsonl(path: Path, read_line: Callable[[Any, str], T], what: str = "file") -> list[T]:
    """Every non-blank line of a JSON Lines file, each value read by ``read_line(value, where)``
    (``where`` is ``path:line``; e.g. ``lambda v, w: build(Shape, v, w)``); a line that is not JSON
    or does not fit is one line naming ``path:line`` (and the field)."""
    out = []
    for number, line in enumerate(read_text(path, what).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ToolError(f"{path}:{number}: not JSON ({exc.msg})") from None
        out.append(read_line(value, f"{path}:{number}"))
    return out


def parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ToolError(f"{where}: not valid TOML: {exc}") from None


def read_toml(path: Path, what: str = "file") -> dict[str, Any]:
    return parse_toml(read_text(path, what), str(path))
