"""The recipes against vLLM 0.32.0's own ``vllm serve`` parser, in the CPU runtime, in-process, no engine.

Every key of each ``recipes/*.yaml`` must be a ``vllm serve`` option as written and must arrive with
its value through ``vllm serve --config`` (parsed the way ``vllm``'s main does: the top-level parser
pulls the file in, the serve subparser parses it), the series' options (``additional-config``) among
them. The CPU recipe, with its env file loaded by a shell (``set -a; . FILE``), must also build a
``VllmConfig`` of the tiny models that the series' contract accepts, the options in its
``additional_config``; with a verify width below the recipe's drafted tokens (an ``--additional-config``
after the file, as the crossover gives one) the same build is refused, and so is a series variable
left in the environment.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from scripts import REPO_ROOT
from scripts.layout import Layout
from scripts.recipe import RECIPE_DIR, VERIFY_WIDTH, Recipe, cpu_tiny_recipe, recipes, shell_env
from scripts.series_options import ENV_PREFIX, OPTIONS_KEY, server_args
from scripts.tiny_laguna import generate


def _serve_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, Any]:
    """The top-level ``vllm`` parser with the serve subcommand, built as ``vllm``'s main builds it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    sub = top.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    serve = command.subparser_init(sub)
    return top, serve, command


def key_problems(serve: argparse.ArgumentParser, path: Path) -> list[str]:
    """Keys of a ``--config`` file that ``vllm serve`` does not take as written, one line each
    (stricter than argparse, which also takes a unique prefix of an option)."""
    import yaml

    problems = []
    for key, value in yaml.safe_load(path.read_text(encoding="utf-8")).items():
        if f"--{key}" not in serve._option_string_actions:
            problems.append(f"{path.name}: {key}: not a vllm serve option")
        elif value is False:
            problems.append(f"{path.name}: {key}: false is dropped by vllm serve --config")
    return problems


def _expected(recipe: Recipe) -> dict[str, Any]:
    """namespace attribute -> value, as the recipe means it."""
    out = {}
    for s in recipe.serve:
        if s.key.startswith("no-") and s.value is True:
            out[s.key[3:].replace("-", "_")] = False
        else:
            out[s.key.replace("-", "_")] = s.value
    out["additional_config"] = recipe.additional_config  # the series' options
    return out


@pytest.mark.parametrize("recipe", recipes(), ids=lambda r: r.name)
def test_every_key_is_a_vllm_serve_option_and_arrives(recipe: Recipe) -> None:
    top, serve, command = _serve_parser()
    path = RECIPE_DIR / recipe.yaml_name
    assert key_problems(serve, path) == []
    assert recipe.additional_config[OPTIONS_KEY]["exact_verify"] is True
    args = top.parse_args(["serve", "--config", str(path)])
    command.validate(args)
    for dest, value in _expected(recipe).items():
        got = getattr(args, dest)
        if dest in ("compilation_config", "kernel_config"):
            got = {k: getattr(got, k, None) if not isinstance(got, dict) else got.get(k) for k in value}
            got = {k: getattr(v, "name", v) for k, v in got.items()}
        assert got == value, dest


def test_negative_control_misspelled_and_false_keys(tmp_path: Path) -> None:
    top, serve, _ = _serve_parser()
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: m\nmax-num-sequences: 1\nenable-prefix-caching: false\n", encoding="utf-8")
    assert key_problems(serve, bad) == [
        "bad.yaml: max-num-sequences: not a vllm serve option",
        "bad.yaml: enable-prefix-caching: false is dropped by vllm serve --config",
    ]
    with pytest.raises(SystemExit):
        top.parse_args(["serve", "--config", str(bad)])  # argparse: unrecognized arguments
    dropped = tmp_path / "dropped.yaml"
    dropped.write_text("model: m\nenable-prefix-caching: false\n", encoding="utf-8")
    args = top.parse_args(["serve", "--config", str(dropped)])
    assert args.enable_prefix_caching is None  # the upstream trap the recipes avoid (no-KEY: true)


def _cpu_config(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> Any:
    """The CPU recipe's ``VllmConfig``: its YAML through ``vllm serve --config``, then (``options``) an
    ``--additional-config`` with the recipe's options and ``options`` over them, as the crossover's
    legs give one; its env file (and ``env``) in the environment, no series variable otherwise."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    recipe = cpu_tiny_recipe()
    recipe_env = shell_env(RECIPE_DIR / recipe.env_name)
    assert recipe_env == {s.key: s.value for s in recipe.env}
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in {**recipe_env, **(env or {})}.items():
        monkeypatch.setenv(key, value)
    tiny = Layout(REPO_ROOT, build_dir=REPO_ROOT / "build").tiny_models
    if not (tiny / "target" / "config.json").is_file() or not (tiny / "draft" / "config.json").is_file():
        generate(tiny)  # what `nox -s cpu_runtime` makes there
    monkeypatch.chdir(REPO_ROOT)  # the recipe's model paths are relative to the repository root
    top, _, command = _serve_parser()
    extra = [] if options is None else server_args({**recipe.additional_config[OPTIONS_KEY], **options})
    args = top.parse_args(["serve", "--config", str(RECIPE_DIR / recipe.yaml_name), *extra])
    command.validate(args)
    return AsyncEngineArgs.from_cli_args(args).create_engine_config()


def test_cpu_recipe_builds_a_config_the_contract_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.xpu_laguna.contract import series_active

    cfg = _cpu_config(monkeypatch)
    assert series_active(cfg)
    assert cfg.additional_config[OPTIONS_KEY] == cpu_tiny_recipe().additional_config[OPTIONS_KEY]
    assert cfg.speculative_config.num_speculative_tokens == VERIFY_WIDTH - 1
    assert cfg.speculative_config.method == "dflash"
    assert cfg.scheduler_config.async_scheduling is False
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.scheduler_config.max_num_seqs == 1
    assert cfg.parallel_config.tensor_parallel_size == 1
    assert cfg.additional_config[OPTIONS_KEY]["verify_width"] == VERIFY_WIDTH
    assert not any(k.startswith(ENV_PREFIX) for k in os.environ)  # the options came in the config


def test_negative_control_a_narrower_width_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=f"exceeds xpu_laguna.verify_width {VERIFY_WIDTH - 1}"):
        _cpu_config(monkeypatch, {"verify_width": VERIFY_WIDTH - 1})
    cfg = _cpu_config(monkeypatch, {"verify_width": VERIFY_WIDTH})  # the same route, the recipe's width: accepted
    assert cfg.additional_config[OPTIONS_KEY]["verify_width"] == VERIFY_WIDTH


def test_negative_control_a_series_variable_left_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="VLLM_XPU_LAGUNA_VERIFY_WIDTH is no longer read"):
        _cpu_config(monkeypatch, env={"VLLM_XPU_LAGUNA_VERIFY_WIDTH": str(VERIFY_WIDTH)})


def _api_server_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m vllm.entrypoints.openai.api_server`` (what the tooling starts), built as
    its ``main`` builds it."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))


def test_the_crossover_teacher_turns_the_recipe_speculation_off() -> None:
    """``crossover --recipe``: every leg serves the recipe with ``--config``; the teacher adds
    ``NO_SPECULATION``, which must win over the file's ``speculative-config``."""
    from scripts.measure.leg_recipe import NO_SPECULATION

    parser = _api_server_parser()
    config = str(RECIPE_DIR / "cpu-tiny.yaml")
    served = parser.parse_args(["--config", config, "--max-num-seqs", "4"])
    assert served.speculative_config["method"] == "dflash"  # negative control: the file's value arrives
    assert served.max_num_seqs == 4  # a command-line option wins over the file
    assert parser.parse_args(["--config", config, *NO_SPECULATION]).speculative_config is None


def test_a_legs_additional_config_wins_over_the_recipes() -> None:
    """``crossover --recipe``: a leg's options go after the file as one ``--additional-config``
    (:func:`scripts.measure.crossover.leg_argv`), which must replace the file's."""
    parser = _api_server_parser()
    config = str(RECIPE_DIR / "cpu-tiny.yaml")
    recipe = cpu_tiny_recipe().additional_config
    assert parser.parse_args(["--config", config]).additional_config == recipe  # negative control: the file's
    leg = {**recipe[OPTIONS_KEY], "prebuilt_metadata": False}
    served = parser.parse_args(["--config", config, *server_args(leg, replaces=recipe)])
    assert served.additional_config == {OPTIONS_KEY: leg}
    assert json.loads(server_args(leg)[1]) == served.additional_config
