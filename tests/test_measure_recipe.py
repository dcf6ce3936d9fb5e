"""``crossover --recipe FILE``: the servers' options from a serving recipe instead of ``--server-args``.

Refusals are one line before anything starts; the legs' environments carry the recipe's env file and
their options the recipe's ``additional-config`` (``xpu_laguna``), with ``--env`` and the treated
variables and options winning; each leg's server gets ``--config FILE`` and then its options as
``--additional-config`` (the teacher without speculation); the record names the recipe's path and the
sha256 of both files, and ``verify-record`` checks them against the run's copies.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _measure_run import manifest_for

from _measure_synth import clean_legs, teacher
from scripts import REPO_ROOT
from scripts.digest import sha256_file
from scripts.errors import ToolError
from scripts.measure.artifacts import RECORD_FILE, finish_run, write_rows
from scripts.measure.crossover import leg_argv, leg_inputs, parser
from scripts.measure.gates import load_gates
from scripts.measure.leg_recipe import NO_SPECULATION, load_recipe
from scripts.measure.record import Prior, RecordMeta
from scripts.measure.server import serve_argv
from scripts.measure.verify_record import load_record, verify

TREATED = "xpu_laguna.prebuilt_metadata"
RECIPE_OPTIONS = {"prebuilt_metadata": True, "exact_verify": True}
"""The series' options of the test recipe (``additional-config``, as ``scripts.recipe render`` writes it)."""


def write_recipe(
    folder: Path, *, max_model_len: int = 1024, env: str | None = None, extra: dict[str, Any] | None = None
) -> Path:
    """A recipe of two local model folders, as ``scripts.recipe render`` writes them (JSON after ``key: ``)."""
    for name in ("target", "draft"):
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    spec = {"method": "dflash", "model": str(folder / "draft"), "num_speculative_tokens": 7}
    lines = [
        "# a test recipe",
        f"model: {json.dumps(str(folder / 'target'))}",
        f"max-model-len: {max_model_len}",
        "no-enable-prefix-caching: true",
        f"speculative-config: {json.dumps(spec)}",
        f"additional-config: {json.dumps({'xpu_laguna': RECIPE_OPTIONS, **(extra or {})})}",
    ]
    path = folder / "r.yaml"
    path.write_text("\n".join(lines) + "\n")
    (folder / "r.env").write_text(env if env is not None else "# env\nHF_HUB_OFFLINE=1\n")
    return path


def crossover(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "scripts.measure", "crossover", *argv]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)


SIZES = ("--prompts", "3", "--max-tokens", "32", "--window", "32", "--prompt-tokens", "16", "--rollover-at", "32")
LONG = ("--long-prompt-tokens", "200")


def test_a_recipe_passes_the_checks(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path)
    done = crossover("--recipe", str(recipe), "--treatment", f"{TREATED}=false", *SIZES, *LONG, "--check-only")
    assert done.returncode == 0, done.stderr
    assert "crossover: options OK" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ("--server-args", "--max-model-len 2048"),
            "--recipe and --server-args both set the servers' options; give the recipe alone "
            "(render a private one: python -m scripts.recipe render --out DIR) or leave out --recipe",
        ),
        (("--model", "m"), "--recipe and --model both set the servers' options;"),
        (("--speculative-config", "{}"), "--recipe and --speculative-config both set the servers' options;"),
        (("--num-speculative-tokens", "3"), "--recipe and --num-speculative-tokens both set the servers' options;"),
    ],
)
def test_recipe_with_options_it_replaces_is_one_line_error(
    tmp_path: Path, extra: tuple[str, ...], message: str
) -> None:
    recipe = write_recipe(tmp_path)
    done = crossover("--recipe", str(recipe), "--treatment", f"{TREATED}=false", *SIZES, *LONG, *extra, "--check-only")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"crossover: error: {message}"), done.stderr


def test_negative_control_the_same_server_args_without_a_recipe_are_accepted(tmp_path: Path) -> None:
    write_recipe(tmp_path)
    server_args = ("--server-args", "--max-model-len 2048")
    done = crossover(
        "--model", str(tmp_path / "target"), "--treatment", "X=1", *SIZES, *LONG, *server_args, "--check-only"
    )
    assert done.returncode == 0, done.stderr


def test_bad_recipes_are_one_line_errors(tmp_path: Path) -> None:
    no_env = write_recipe(tmp_path / "a")
    (tmp_path / "a" / "r.env").unlink()
    no_model = write_recipe(tmp_path / "b")
    (tmp_path / "b" / "target" / "config.json").unlink()
    not_yaml = tmp_path / "c.toml"
    not_yaml.write_text("")
    listed = tmp_path / "d.yaml"
    listed.write_text("- model\n")
    (tmp_path / "d.env").write_text("")
    old_env = write_recipe(tmp_path / "e", env="VLLM_XPU_LAGUNA_EXACT_VERIFY=1\n")
    bad_option = write_recipe(tmp_path / "f", extra={"xpu_laguna": {"verify_width": 40}})
    cases = [
        (no_env, f"--recipe {no_env}: no env file {tmp_path / 'a' / 'r.env'} next to it"),
        (no_model, f"--recipe {no_model}: model {tmp_path / 'b' / 'target'}: no config.json (not a model directory)"),
        (not_yaml, f"--recipe {not_yaml}: not a .yaml/.yml file (vllm serve --config reads only those)"),
        (listed, f"--recipe {listed}: not a mapping of vllm serve options"),
        (
            old_env,
            f"--recipe {old_env}: {tmp_path / 'e' / 'r.env'}: VLLM_XPU_LAGUNA_EXACT_VERIFY is no longer read by "
            "the series; set the option xpu_laguna.exact_verify instead",
        ),
        (
            bad_option,
            f"--recipe {bad_option}: additional-config xpu_laguna: "
            "additional_config['xpu_laguna']['verify_width']: must be 1..16, not 40",
        ),
    ]
    for path, message in cases:
        done = crossover("--recipe", str(path), "--treatment", f"{TREATED}=false", *SIZES, *LONG, "--check-only")
        assert done.returncode == 1, path
        assert done.stderr.strip().splitlines() == [f"crossover: error: {message}"], done.stderr


def test_the_recipe_max_model_len_bounds_the_prompts(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, max_model_len=1024)
    done = crossover("--recipe", str(recipe), "--treatment", f"{TREATED}=false", *SIZES, "--check-only")
    assert done.returncode == 1
    assert f"> 1024 (max-model-len in --recipe {recipe})" in done.stderr  # default long prompt 1024 + 32


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    return parser().parse_args(["--recipe", str(write_recipe(tmp_path)), *argv])


def test_leg_settings_take_the_recipe_and_the_treatment_wins(tmp_path: Path) -> None:
    args = _args(
        tmp_path,
        "--treatment",
        f"{TREATED}=false",
        "--env",
        "xpu_laguna.exact_verify=false",
        "--env",
        "HF_HUB_OFFLINE=0",
    )
    legs, treatment, control = leg_inputs(args, load_recipe(args.recipe))
    assert treatment == {TREATED: False} and control == {TREATED: True}  # the recipe's value is the control
    assert legs["A1"].options["prebuilt_metadata"] is legs["A2"].options["prebuilt_metadata"] is True
    assert legs["teacher"].options["prebuilt_metadata"] is True
    assert legs["B1"].options["prebuilt_metadata"] is legs["B2"].options["prebuilt_metadata"] is False
    assert all(setup.options["exact_verify"] is False for setup in legs.values())  # --env wins over the file
    assert all(setup.env["HF_HUB_OFFLINE"] == "0" for setup in legs.values())
    assert not any(k.startswith("VLLM_XPU_LAGUNA_") for setup in legs.values() for k in setup.env)
    assert legs["A1"].env == legs["B1"].env  # the option is the only difference
    args = _args(tmp_path, "--treatment", "xpu_laguna.verify_width=4", "--control", "xpu_laguna.verify_width=6")
    legs, _, control = leg_inputs(args, load_recipe(args.recipe))
    assert control == {"xpu_laguna.verify_width": 6} and legs["A1"].options["verify_width"] == 6
    assert legs["B1"].options["verify_width"] == 4 and legs["B1"].options["prebuilt_metadata"] is True
    # a treatment equal to the recipe's value changes nothing: refused
    args = _args(tmp_path, "--treatment", f"{TREATED}=true")
    with pytest.raises(ToolError, match="treatment must change"):
        leg_inputs(args, load_recipe(args.recipe))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--treatment", "VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA=0"),
            "--treatment: VLLM_XPU_LAGUNA_M8_PREBUILT_EXACT_ATTN_METADATA is no longer read by the series; "
            "set the option xpu_laguna.prebuilt_metadata instead",
        ),
        (
            ("--treatment", f"{TREATED}=false", "--env", "VLLM_XPU_LAGUNA_BREAKABLE_GRAPH=1"),
            "--env: VLLM_XPU_LAGUNA_BREAKABLE_GRAPH is no longer read by the series; "
            "set the option xpu_laguna.breakable_graph instead",
        ),
        (
            ("--treatment", "xpu_laguna.verify_width=40"),
            "leg B1: xpu_laguna: additional_config['xpu_laguna']['verify_width']: must be 1..16, not 40",
        ),
        (
            ("--treatment", "xpu_laguna.breakable_graph=1"),
            "leg B1: xpu_laguna: additional_config['xpu_laguna']['breakable_graph']: must be true or false, not 1",
        ),
        (("--treatment", "xpu_laguna.=1"), "--treatment expects NAME=VALUE or xpu_laguna.KEY=VALUE"),
    ],
)
def test_series_variables_and_bad_options_are_refused_before_a_server_starts(
    tmp_path: Path, argv: tuple[str, ...], message: str
) -> None:
    args = _args(tmp_path, *argv)
    with pytest.raises(ToolError) as caught:
        leg_inputs(args, load_recipe(args.recipe))
    assert str(caught.value).startswith(message), caught.value
    done = crossover("--recipe", args.recipe, *argv, *SIZES, *LONG, "--check-only")  # the same on the command line
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [f"crossover: error: {caught.value}"]


def test_servers_get_the_recipe_as_config_then_their_options_and_the_teacher_no_speculation(tmp_path: Path) -> None:
    recipe = load_recipe(str(write_recipe(tmp_path, extra={"other_plugin": {"x": 1}})))
    argv = serve_argv("py", None, 1234, NO_SPECULATION, config=str(recipe.path))
    assert argv[argv.index("--config") + 1] == str(recipe.path)
    assert "--model" not in argv and argv[-2:] == ["--speculative-config", "None"]
    with pytest.raises(ToolError):
        serve_argv("py", None, 1234, [])
    args = _args(tmp_path, "--treatment", f"{TREATED}=false")
    legs, _, _ = leg_inputs(args, recipe)
    for leg, prebuilt in (("A1", True), ("B1", False), ("teacher", True)):
        argv = leg_argv(args, legs[leg], NO_SPECULATION if leg == "teacher" else [], 1234, recipe)
        at = argv.index("--additional-config")
        assert argv.index("--config") < at  # after the file: the command line wins
        assert json.loads(argv[at + 1]) == {
            "xpu_laguna": {"prebuilt_metadata": prebuilt, "exact_verify": True},
            "other_plugin": {"x": 1},  # the file's other entries kept (the argument replaces the file's whole)
        }


def test_without_a_recipe_only_legs_with_options_get_the_argument(tmp_path: Path) -> None:
    write_recipe(tmp_path)
    args = parser().parse_args(["--model", str(tmp_path / "target"), "--treatment", "xpu_laguna.breakable_graph=true"])
    legs, treatment, control = leg_inputs(args, None)
    assert treatment == {"xpu_laguna.breakable_graph": True} and control == {}
    assert "--additional-config" not in leg_argv(args, legs["A1"], [], 1, None)  # control: the option unset
    argv = leg_argv(args, legs["B1"], [], 1, None)
    assert json.loads(argv[argv.index("--additional-config") + 1]) == {"xpu_laguna": {"breakable_graph": True}}


def _write_run(out: Path, recipe: dict[str, str] | None, copies: dict[str, str]) -> dict[str, Any]:
    raw = write_rows(out, clean_legs(), teacher())
    for leg in ("a1", "b1", "b2", "a2", "teacher"):
        (out / f"server-{leg}.log").write_text(f"log of {leg}\n")
        raw[f"{leg}_server_log"] = f"server-{leg}.log"
    raw.update(copies)
    meta = RecordMeta(
        schema="test-record",
        date="2026-11-29",
        run_root=str(out),
        source={"main_tooling_commit": "0" * 40, "vllm_commit": "f2654939e"},
        treatment={"sole_difference": TREATED, "control_value": True, "candidate_value": False},
        speculative={"method": "dflash", "num_speculative_tokens": 3},
        artifacts={},
        sha256={},
        prior=Prior(20.0, "p"),
        recipe=recipe,
    )
    _, record = finish_run(out, manifest_for(meta), raw, meta, load_gates())
    return record


def test_the_record_names_the_recipe_and_verify_record_checks_it(tmp_path: Path) -> None:
    recipe = load_recipe(str(write_recipe(tmp_path / "src")))
    out = tmp_path / "run"
    out.mkdir()
    record = _write_run(out, recipe.record(), recipe.copy_into(out))
    assert record["recipe"] == {
        "path": str(tmp_path / "src" / "r.yaml"),
        "sha256": sha256_file(tmp_path / "src" / "r.yaml"),
        "env_path": str(tmp_path / "src" / "r.env"),
        "env_sha256": sha256_file(tmp_path / "src" / "r.env"),
    }
    assert record["artifacts"]["recipe"] == "recipe.yaml" and record["artifacts"]["recipe_env"] == "recipe.env"
    assert record["sha256"]["recipe"] == record["recipe"]["sha256"]
    stored = load_record(out / RECORD_FILE)
    assert verify(stored, gates=load_gates(), artifacts_root=out).failures == []
    assert verify(stored, gates=load_gates()).failures == []  # internal level
    altered = copy.deepcopy(stored)
    altered["recipe"]["sha256"] = "0" * 64
    fields = {f for failure in verify(altered, gates=load_gates()).failures for f in failure.fields}
    assert fields == {"recipe.sha256", "sha256.recipe"}
    altered = copy.deepcopy(stored)
    altered["recipe"]["env_sha256"] = "not a digest"
    assert "recipe.env_sha256" in {f for x in verify(altered, gates=load_gates()).failures for f in x.fields}
    (out / "recipe.env").write_text("EDITED=1\n")  # the copy no longer is the recipe that ran
    fields = {f for x in verify(stored, gates=load_gates(), artifacts_root=out).failures for f in x.fields}
    assert "sha256.recipe_env" in fields


def test_a_run_without_a_recipe_records_none_and_verifies(tmp_path: Path) -> None:
    record = _write_run(tmp_path, None, {})
    assert record["recipe"] is None and "recipe" not in record["artifacts"]
    assert verify(load_record(tmp_path / RECORD_FILE), gates=load_gates(), artifacts_root=tmp_path).failures == []
