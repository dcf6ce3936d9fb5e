"""The series' options as the tooling hands them to an engine: ``additional_config["xpu_laguna"]``.

The series reads its options from vLLM's own configuration, not from the environment: a Python
engine takes ``LLM(..., additional_config={"xpu_laguna": {...}})``, a server
``--additional-config '{"xpu_laguna": {...}}'`` (one JSON argument), a ``vllm serve --config`` YAML
file an ``additional-config:`` mapping. Every definition here (the key, the options, their types and
checks, which ``VLLM_XPU_LAGUNA_*`` variable each replaced) is the overlay's own
(``overlay/vllm/xpu_laguna/options.py``), loaded from this repository's file: it needs no
vLLM, so the tooling checks options before any engine starts, with the engine's own words.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from scripts.errors import ToolError
from scripts.layout import Layout

OPTIONS_FILE = "vllm/xpu_laguna/options.py"
"""The overlay module that defines the options (under ``overlay/``)."""
CONFIG_FILE_KEY = "additional-config"
"""The ``vllm serve --config`` YAML key of ``EngineArgs.additional_config``."""
ADDITIONAL_CONFIG_ARG = f"--{CONFIG_FILE_KEY}"
"""The server argument that carries the options (one JSON object)."""


def _load() -> ModuleType:
    path = Layout().overlay / OPTIONS_FILE
    name = "_vxl_series_options"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ToolError(f"{path}: the series' options module is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve the module of the class they process
    spec.loader.exec_module(module)
    return module


_OPTIONS = _load()
OPTIONS_KEY: str = _OPTIONS.ADDITIONAL_CONFIG_KEY
"""The key of ``additional_config`` that holds the series' options."""
ENV_PREFIX: str = _OPTIONS.ENV_PREFIX
ENV_REPLACED_BY: dict[str, str] = dict(_OPTIONS.ENV_REPLACED_BY)
"""Each environment variable the series used to read -> the option that replaced it."""
DEFAULTS: dict[str, Any] = {
    name: getattr(_OPTIONS.XpuLagunaOptions(), name) for name in sorted(set(ENV_REPLACED_BY.values()))
}
"""Every option with its default (the served configuration's)."""


def checked(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``options`` as the engine will read them: an unknown key, a wrong type or a value out of
    range is the engine's own one-line message, prefixed with ``where``."""
    try:
        _OPTIONS.XpuLagunaOptions.from_mapping(dict(options))
    except ValueError as exc:
        raise ToolError(f"{where}: {exc}") from None
    return dict(options)


def additional_config(options: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``additional_config`` of an engine with ``options`` (checked)."""
    return {OPTIONS_KEY: checked(options, OPTIONS_KEY)}


def server_args(options: Mapping[str, Any], replaces: Mapping[str, Any] | None = None) -> list[str]:
    """``--additional-config JSON`` for a server with ``options``; none when there are none and
    ``replaces`` has no entry for the series. A later ``--additional-config`` replaces an earlier
    one, or a ``--config`` file's, whole: ``replaces`` is that earlier ``additional_config``, whose
    other entries the argument keeps."""
    rest = dict(replaces or {})
    if not options and OPTIONS_KEY not in rest:
        return []
    return [ADDITIONAL_CONFIG_ARG, json.dumps({**rest, **additional_config(options)}, sort_keys=True)]


def option_name(key: str) -> str:
    """How the tooling's command lines name an option: ``xpu_laguna.KEY`` (the tail of vLLM's own
    dotted ``--additional-config.xpu_laguna.KEY``)."""
    return f"{OPTIONS_KEY}.{key}"


def option_key(name: str) -> str | None:
    """The option a command-line name ``xpu_laguna.KEY`` stands for (None: not an option name)."""
    head, dot, key = name.partition(".")
    return key if dot and head == OPTIONS_KEY else None


def options_from_json(text: str, where: str) -> dict[str, Any]:
    """A JSON object of the series' options from a command line (``{"exact_verify": false}``),
    checked as the engine checks it; one-line errors prefixed with ``where``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ToolError(f"{where}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ToolError(f"{where}: must be a JSON object of option to value, not {text!r}")
    return checked(value, where)


def options_argument(text: str) -> dict[str, Any]:
    """:func:`options_from_json` as an ``argparse`` type (the parser's one-line usage error)."""
    try:
        return options_from_json(text, OPTIONS_KEY)
    except ToolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def option_value(text: str) -> Any:
    """A command-line value of an option: JSON (``true``, ``8``, ``null``) or else the plain
    string (``pad``), as vLLM reads a dotted ``--additional-config.KEY VALUE``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def refuse_series_env(names: Iterable[str], where: str) -> None:
    """One line for the first ``VLLM_XPU_LAGUNA_*`` name in ``names``: an engine whose
    environment still has one refuses to start, so the tooling refuses to set it."""
    for name in sorted(names):
        if name.startswith(ENV_PREFIX):
            key = ENV_REPLACED_BY.get(name)
            fix = f"set the option {OPTIONS_KEY}.{key} instead" if key else "the series reads no environment variable"
            raise ToolError(f"{where}: {name} is no longer read by the series; {fix}")
