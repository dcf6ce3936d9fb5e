# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The serving doctor's check of the series' options (``check_options`` and
``--additional-config``): the options as the server will get them, debug
options warn, a bad option or a ``VLLM_XPU_LAGUNA_*`` variable still set
fails in one line. The expected lines are written out here."""

import pytest

from vllm.xpu_laguna import doctor

DEFAULTS = "exact verify True, width 8, prebuilt metadata False, breakable graph False"


def test_series_options_are_shown_as_the_server_gets_them():
    assert doctor.check_options({}, {}) == [
        doctor.Check("ok", "series-options", DEFAULTS)
    ]
    config = {
        "xpu_laguna": {"verify_width": 6, "prebuilt_metadata": True},
        "other": {"ignored": 1},  # another key of --additional-config
    }
    assert doctor.check_options(config, {}) == [
        doctor.Check(
            "ok",
            "series-options",
            "exact verify True, width 6, prebuilt metadata True, breakable graph False",
        )
    ]


def test_debug_option_warns():
    checks = doctor.check_options({"xpu_laguna": {"debug_no_split_plan": True}}, {})
    assert [(c.status, c.name) for c in checks] == [
        ("ok", "series-options"),
        ("warn", "debug_no_split_plan"),
    ]
    assert checks[1].detail == "on: a debug option, not for serving"
    # negative control: the same option given false
    checks = doctor.check_options({"xpu_laguna": {"debug_no_split_plan": False}}, {})
    assert [(c.status, c.name) for c in checks] == [("ok", "series-options")]


@pytest.mark.parametrize(
    "options, line",
    [
        (
            {"verify_width": 17},
            "additional_config['xpu_laguna']['verify_width']: must be 1..16, not 17",
        ),
        (
            {"breakable_graph": "1"},
            "additional_config['xpu_laguna']['breakable_graph']: must be true or "
            "false, not '1'",
        ),
        (
            {"exact_verfy": True},
            "additional_config['xpu_laguna']: unknown option 'exact_verfy' (known: "
            "breakable_graph, debug_no_split_plan, debug_prebuilt_full_guard, "
            "debug_xccl_standin, exact_tp_reduce, exact_verify, prebuilt_metadata, "
            "row_invariant_int4, row_invariant_linear_form, row_invariant_linears, "
            "row_invariant_moe, row_invariant_qk_norm, verify_width)",
        ),
    ],
    ids=["out_of_range", "wrong_type", "unknown_key"],
)
def test_a_bad_option_fails_in_one_line_naming_it(options, line):
    checks = doctor.check_options({"xpu_laguna": options}, {})
    assert checks == [doctor.Check("fail", "series-options", line)]


def test_a_series_variable_still_set_fails_naming_its_option():
    environ = {"VLLM_XPU_LAGUNA_BREAKABLE_GRAPH": "1", "PATH": "/usr/bin"}
    checks = doctor.check_options({}, environ)
    assert checks == [
        doctor.Check(
            "fail",
            "series-environment",
            "XPU Laguna series: VLLM_XPU_LAGUNA_BREAKABLE_GRAPH is no longer read; "
            "unset it and set xpu_laguna.breakable_graph in --additional-config "
            "(additional_config={'xpu_laguna': {'breakable_graph': ...}})",
        ),
        doctor.Check("ok", "series-options", DEFAULTS),
    ]
    # negative control: other variables are not the series'
    assert doctor.check_options({}, {"VLLM_LOGGING_LEVEL": "DEBUG"}) == [
        doctor.Check("ok", "series-options", DEFAULTS)
    ]


def test_the_additional_config_flag_reaches_the_option_check(monkeypatch, capsys):
    """``--additional-config`` takes the server's JSON as it is; the doctor
    checks its ``xpu_laguna`` options and the environment it runs in."""
    for name in [n for n in doctor.os.environ if n.startswith("VLLM_XPU_LAGUNA_")]:
        monkeypatch.delenv(name)

    def series_lines(argv: list[str]) -> list[tuple[str, str]]:
        doctor.main(["--no-device", "--additional-config", *argv])
        out = capsys.readouterr().out.splitlines()
        lines = [ln.split()[:2] for ln in out if len(ln.split()) >= 2]
        return [
            (status, name)
            for status, name in lines
            if name.startswith(("series-", "debug_"))
        ]

    assert series_lines(['{"xpu_laguna": {"debug_no_split_plan": true}}']) == [
        ("ok", "series-options"),
        ("warn", "debug_no_split_plan"),
    ]
    monkeypatch.setenv("VLLM_XPU_LAGUNA_VERIFY_WIDTH", "6")
    assert series_lines(['{"xpu_laguna": {"verify_width": 0}}']) == [
        ("fail", "series-environment"),
        ("fail", "series-options"),
    ]


@pytest.mark.parametrize(
    "value, words",
    [("{not json", "not JSON"), ("[1, 2]", "must be a JSON object")],
)
def test_additional_config_that_is_not_a_json_object_exits_two(value, words, capsys):
    with pytest.raises(SystemExit) as exc:
        doctor.main(["--additional-config", value])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--additional-config" in last and words in last, last
