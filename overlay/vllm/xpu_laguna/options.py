# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Options of the XPU Laguna series, read from vLLM's own configuration.

They live under one key of ``VllmConfig.additional_config`` (the engine
argument ``--additional-config``), so every worker receives them with its
``VllmConfig`` whatever the executor, and two engines in one process each
see their own::

    vllm serve ... --additional-config '{"xpu_laguna": {"breakable_graph": true}}'
    LLM(..., additional_config={"xpu_laguna": {"verify_width": 8}})

:meth:`XpuLagunaOptions.from_config` parses and validates them: an unknown
key, a wrong type or a value out of range is one ``ValueError`` line naming
the key. The series reads no environment variable; a ``VLLM_XPU_LAGUNA_*``
variable still set is refused in one line naming the key that replaced it
(:func:`refuse_environment`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig

ADDITIONAL_CONFIG_KEY = "xpu_laguna"
"""The key of ``VllmConfig.additional_config`` that holds the options."""

ENV_PREFIX = "VLLM_XPU_LAGUNA_"

_QK_NORM_FORMS = ("off", "tokens", "pad")
_LINEAR_FORMS = ("batch_invariant", "rows", "plain")
_MOE_FORMS = ("rows", "off")
_MAX_VERIFY_WIDTH = 16


class XpuLagunaOptionsError(ValueError):
    """An option of the series that cannot be used (one line)."""


@dataclass(frozen=True)
class XpuLagunaOptions:
    """The series' options (defaults: the served configuration's)."""

    exact_verify: bool = True
    """Verify rows as one-token decode pseudo-sequences (exact decoding)."""
    verify_width: int = 8
    """Largest verify width (drafted tokens + 1) on the exact path, 1..16."""
    prebuilt_metadata: bool = False
    """Fixed-address exact-verify metadata owned by the builder."""
    breakable_graph: bool = False
    """Device graphs split at attention and TP collectives (mode NONE,
    PIECEWISE, capture size = verify width)."""
    exact_tp_reduce: bool = True
    """TP all-reduce as all-gather + fixed rank-order sum on the exact path."""
    row_invariant_qk_norm: str = "pad"
    """q/k RMSNorm form: ``pad`` | ``tokens`` | ``off``."""
    row_invariant_linears: str = "all"
    """BF16 target linears that take a form: ``all``, ``none`` or a comma
    list (see ``vllm.xpu_laguna.row_dispatch``)."""
    row_invariant_linear_form: str | None = None
    """``batch_invariant`` | ``rows`` | ``plain``; None: batch_invariant on
    XPU, rows elsewhere."""
    row_invariant_int4: bool = True
    """INT4 dense target linears: one GEMM call per row."""
    row_invariant_moe: str = "rows"
    """Routed experts: ``rows`` (one experts call per verify row) | ``off``."""
    debug_xccl_standin: bool = False
    """Debug, CPU only: the plain TP all-reduce follows XCCL's ring order
    (a test-side stand-in must be registered)."""
    debug_no_split_plan: bool = False
    """Debug: the exact path drops the planned KV split count (the negative
    control of the long-context tests)."""
    debug_prebuilt_full_guard: bool = False
    """Debug: the prebuilt metadata fingerprints every view on every refresh."""
    given: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)
    """The keys the configuration named explicitly."""

    @property
    def asks_for_series(self) -> bool:
        """Whether the configuration explicitly turns on one of the series'
        switches (exact verify, prebuilt metadata, breakable graphs): how a
        CPU run asks for the series (on XPU a Laguna target always gets it)."""
        return any(
            name in self.given and getattr(self, name) for name in SERIES_SWITCHES
        )

    @property
    def any_switch_on(self) -> bool:
        """Whether one of the series' switches is on (explicit or default)."""
        return any(getattr(self, name) for name in SERIES_SWITCHES)

    @classmethod
    def from_mapping(cls, raw: object) -> XpuLagunaOptions:
        """Validated options from the mapping under
        :data:`ADDITIONAL_CONFIG_KEY` (one line per problem)."""
        where = f"additional_config[{ADDITIONAL_CONFIG_KEY!r}]"
        if not isinstance(raw, Mapping):
            raise XpuLagunaOptionsError(
                f"{where} must be a mapping of option to value, not "
                f"{type(raw).__name__}"
            )
        known = {f.name: f for f in dataclasses.fields(cls) if f.name != "given"}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                raise XpuLagunaOptionsError(
                    f"{where}: unknown option {key!r} (known: "
                    f"{', '.join(sorted(known))})"
                )
            values[key] = _checked(where, key, value, known[key].default)
        return cls(**values, given=frozenset(values))

    @classmethod
    def from_config(cls, vllm_config: VllmConfig | None) -> XpuLagunaOptions:
        """The options of ``vllm_config`` (defaults when it names none).
        Parsed once per distinct mapping (a pure memo: the same mapping
        always gives the same options), since the attention builders ask
        on every step."""
        extra = getattr(vllm_config, "additional_config", None) or {}
        raw = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, Mapping) else None
        if raw is None:
            return _DEFAULT
        try:
            # typed: True == 1 and hash(True) == hash(1), but only one of them is valid
            items = tuple(sorted((k, type(v).__name__, v) for k, v in raw.items()))
            hash(items)
        except (AttributeError, TypeError):
            return cls.from_mapping(raw)  # not a mapping of plain values: one line
        return _parsed(items)

    def as_config(self) -> dict[str, dict[str, Any]]:
        """The ``additional_config`` entry that gives these options back."""
        return {
            ADDITIONAL_CONFIG_KEY: {
                name: getattr(self, name) for name in sorted(self.given)
            }
        }


SERIES_SWITCHES = ("exact_verify", "prebuilt_metadata", "breakable_graph")
"""The options that switch the series on."""

_DEFAULT = XpuLagunaOptions()


@functools.lru_cache(maxsize=64)
def _parsed(items: tuple[tuple[str, str, Any], ...]) -> XpuLagunaOptions:
    return XpuLagunaOptions.from_mapping({key: value for key, _, value in items})


def _checked(where: str, key: str, value: object, default: object) -> object:
    def fail(why: str) -> XpuLagunaOptionsError:
        return XpuLagunaOptionsError(f"{where}[{key!r}]: {why}, not {value!r}")

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise fail("must be true or false")
        return value
    if key == "verify_width":
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("must be an integer")
        if not 1 <= value <= _MAX_VERIFY_WIDTH:
            raise fail(f"must be 1..{_MAX_VERIFY_WIDTH}")
        return value
    choices = {
        "row_invariant_qk_norm": _QK_NORM_FORMS,
        "row_invariant_linear_form": _LINEAR_FORMS,
        "row_invariant_moe": _MOE_FORMS,
    }.get(key)
    if key == "row_invariant_linear_form" and value is None:
        return None
    if not isinstance(value, str):
        raise fail("must be a string")
    if choices is not None:
        if value.lower() not in choices:
            raise fail(f"must be one of {', '.join(choices)}")
        return value.lower()
    return value


def _env_name(key: str) -> str:
    if key == "prebuilt_metadata":
        return f"{ENV_PREFIX}M8_PREBUILT_EXACT_ATTN_METADATA"
    return ENV_PREFIX + key.upper()


ENV_REPLACED_BY = {
    _env_name(f.name): f.name
    for f in dataclasses.fields(XpuLagunaOptions)
    if f.name != "given"
}
"""Each environment variable the series used to read, and its option."""


def refuse_environment(environ: Mapping[str, str]) -> None:
    """One line for the first ``VLLM_XPU_LAGUNA_*`` variable set in
    ``environ``: the series reads its options from the configuration only."""
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        key = ENV_REPLACED_BY.get(name)
        if key is None:
            raise XpuLagunaOptionsError(
                f"XPU Laguna series: {name} is not an option of the series (it "
                f"reads its options from additional_config[{ADDITIONAL_CONFIG_KEY!r}] "
                "only); unset it"
            )
        raise XpuLagunaOptionsError(
            f"XPU Laguna series: {name} is no longer read; unset it and set "
            f"{ADDITIONAL_CONFIG_KEY}.{key} in --additional-config "
            f"(additional_config={{{ADDITIONAL_CONFIG_KEY!r}: {{{key!r}: ...}}}})"
        )
