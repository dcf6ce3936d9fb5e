"""``scripts.series_options``: the tooling's one view of the series' options, the overlay's own
definitions (``overlay/vllm/xpu_laguna/options.py``, loaded without vLLM), and the forms the
tooling hands an engine: ``--additional-config JSON`` for a server, ``additional_config`` for ``LLM``."""

from __future__ import annotations

import ast
import json

import pytest

from scripts import REPO_ROOT
from scripts.errors import ToolError
from scripts.series_options import (
    ADDITIONAL_CONFIG_ARG,
    DEFAULTS,
    ENV_REPLACED_BY,
    OPTIONS_FILE,
    OPTIONS_KEY,
    additional_config,
    checked,
    option_key,
    option_name,
    option_value,
    options_from_json,
    refuse_series_env,
    server_args,
)


def _overlay_constant(name: str) -> object:
    tree = ast.parse((REPO_ROOT / "overlay" / OPTIONS_FILE).read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(getattr(t, "id", None) == name for t in targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found")


def test_the_definitions_are_the_overlays() -> None:
    assert OPTIONS_KEY == _overlay_constant("ADDITIONAL_CONFIG_KEY") == "xpu_laguna"
    assert ENV_REPLACED_BY["VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA"] == "prebuilt_metadata"
    assert ENV_REPLACED_BY["VLLM_XPU_LAGUNA_BREAKABLE_GRAPH"] == "breakable_graph"
    assert set(ENV_REPLACED_BY.values()) == set(DEFAULTS)
    assert DEFAULTS["exact_verify"] is True and DEFAULTS["verify_width"] == 8 and DEFAULTS["breakable_graph"] is False


def test_server_args_carry_the_options_as_one_json_argument() -> None:
    assert server_args({}) == []  # nothing to say: no argument
    args = server_args({"breakable_graph": True, "verify_width": 4})
    assert args[0] == ADDITIONAL_CONFIG_ARG == "--additional-config"
    assert json.loads(args[1]) == {"xpu_laguna": {"breakable_graph": True, "verify_width": 4}}
    # after a --config file the argument replaces the file's whole additional-config: its other entries stay
    earlier = {"xpu_laguna": {"exact_verify": True}, "other": {"x": 1}}
    assert json.loads(server_args({"exact_verify": False}, replaces=earlier)[1]) == {
        "xpu_laguna": {"exact_verify": False},
        "other": {"x": 1},
    }
    # the file named series options and the leg has none left: the argument still replaces them
    assert json.loads(server_args({}, replaces=earlier)[1]) == {"xpu_laguna": {}, "other": {"x": 1}}
    assert server_args({}, replaces={"other": {"x": 1}}) == []
    assert additional_config({"exact_verify": True}) == {"xpu_laguna": {"exact_verify": True}}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"verify_width": 17}, "w: additional_config['xpu_laguna']['verify_width']: must be 1..16, not 17"),
        ({"breakable_graph": "1"}, "must be true or false, not '1'"),
        ({"row_invariant_moe": "per-row"}, "must be one of rows, off"),
        ({"breakable_graphs": True}, "unknown option 'breakable_graphs'"),
    ],
)
def test_options_are_checked_with_the_engines_words(options: dict[str, object], message: str) -> None:
    with pytest.raises(ToolError, match=message.replace("[", r"\[").replace("]", r"\]")):
        checked(options, "w")
    with pytest.raises(ToolError):
        server_args(options)


def test_command_line_forms() -> None:
    assert option_name("exact_verify") == "xpu_laguna.exact_verify"
    assert option_key("xpu_laguna.exact_verify") == "exact_verify"
    assert option_key("exact_verify") is None and option_key("other.exact_verify") is None
    assert (option_value("false"), option_value("8"), option_value("null"), option_value("pad")) == (
        False,
        8,
        None,
        "pad",
    )
    assert options_from_json('{"exact_verify": false}', "o") == {"exact_verify": False}
    for text, message in (("[1]", "o: must be a JSON object"), ("{", "o: not JSON"), ('{"x": 1}', "unknown option")):
        with pytest.raises(ToolError, match=message):
            options_from_json(text, "o")


def test_a_series_variable_is_refused_naming_its_option() -> None:
    refuse_series_env({"HF_HUB_OFFLINE": "1", "VLLM_OTHER": "1"}, "env")  # others pass
    with pytest.raises(
        ToolError,
        match="env: VLLM_XPU_LAGUNA_VERIFY_WIDTH is no longer read by the series; "
        "set the option xpu_laguna.verify_width instead",
    ):
        refuse_series_env({"VLLM_XPU_LAGUNA_VERIFY_WIDTH": "8"}, "env")
    with pytest.raises(ToolError, match="VLLM_XPU_LAGUNA_NEW is no longer read by the series; the series reads no"):
        refuse_series_env({"VLLM_XPU_LAGUNA_NEW": "1"}, "env")
