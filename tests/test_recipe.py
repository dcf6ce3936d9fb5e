"""scripts.recipe: the checked-in recipes are the rendered ones, every derived number comes from one width,
the series' options are vLLM config (``additional-config``) and the env files carry none of them, the env
files read the same in a shell and in systemd, and the docs name every setting."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import synthetic
from scripts import REPO_ROOT
from scripts.errors import ToolError
from scripts.pins import load_pins, parse_pins
from scripts.recipe import (
    RECIPE_DIR,
    TENSOR_PARALLEL,
    VERIFY_WIDTH,
    Recipe,
    Setting,
    check,
    cpu_tiny_recipe,
    main,
    recipes,
    render_env,
    render_yaml,
    rendered,
    xpu_recipe,
)
from scripts.series_options import DEFAULTS, ENV_PREFIX, OPTIONS_KEY


def _yaml_values(text: str) -> dict[str, object]:
    """The recipe YAML is JSON values after `key: ` (a subset of YAML); read it without PyYAML."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.split(": ", 1)
            out[key] = json.loads(value)
    return out


def test_checked_in_recipes_are_the_rendered_ones() -> None:
    files = rendered(recipes())
    assert sorted(files) == sorted(p.name for p in RECIPE_DIR.iterdir())
    assert check(RECIPE_DIR, files) == []
    assert main(["render", "--check"]) == 0


def test_negative_control_an_edited_or_missing_file_is_reported(tmp_path: Path, capsys) -> None:
    out = tmp_path / "recipes"
    shutil.copytree(RECIPE_DIR, out)
    yaml = out / "laguna-s-int4-dflash-tp4.yaml"
    yaml.write_text(yaml.read_text().replace("max-num-seqs: 1", "max-num-seqs: 4"))
    (out / "cpu-tiny.env").unlink()
    assert check(out, rendered(recipes())) == [
        f"{out / 'cpu-tiny.env'}: missing",
        f"{yaml}: differs from the rendered recipe",
    ]
    assert main(["render", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "laguna-s-int4-dflash-tp4.yaml: differs" in err and "cpu-tiny.env: missing" in err
    assert main(["render", "--out", str(out)]) == 0  # rewrite, then they match
    assert main(["render", "--check", "--out", str(out)]) == 0


@pytest.mark.parametrize("width", [4, VERIFY_WIDTH, 12])
def test_width_tokens_and_capture_size_follow_from_one_number(width: int) -> None:
    pins = load_pins()
    for recipe in (xpu_recipe(pins, width=width), cpu_tiny_recipe(width=width)):
        serve = _yaml_values(render_yaml(recipe))
        assert serve["speculative-config"]["num_speculative_tokens"] == width - 1
        assert serve["additional-config"][OPTIONS_KEY]["verify_width"] == width
        if recipe.name != "cpu-tiny":
            assert serve["compilation-config"]["cudagraph_capture_sizes"] == [width]
            assert serve["compilation-config"]["max_cudagraph_capture_size"] == width


def test_the_record_values_and_the_pinned_revisions() -> None:
    pins = load_pins()
    serve = _yaml_values((RECIPE_DIR / "laguna-s-int4-dflash-tp4.yaml").read_text())
    spec = serve["speculative-config"]
    assert (serve["model"], serve["revision"]) == (pins.target.repo, pins.target.revision)
    assert (spec["model"], spec["revision"]) == (pins.draft.repo, pins.draft.revision)
    assert (spec["method"], spec["num_speculative_tokens"]) == ("dflash", 7)
    assert serve["compilation-config"] == {
        "mode": "NONE",
        "cudagraph_mode": "PIECEWISE",
        "cudagraph_capture_sizes": [8],
        "max_cudagraph_capture_size": 8,
    }
    assert serve["tensor-parallel-size"] == 4 and "enable-expert-parallel" not in serve
    assert serve["kv-cache-dtype"] == "bfloat16" and serve["max-num-seqs"] == 1
    assert serve["no-async-scheduling"] is True and serve["no-enable-prefix-caching"] is True
    assert (serve["max-model-len"], serve["block-size"]) == (8192, 64)


def test_the_series_options_are_vllm_config_and_the_env_files_hold_none() -> None:
    """The series reads ``additional_config["xpu_laguna"]`` only: the YAML carries every option the old
    env files set, typed, with the same values; the env files keep only the platform's variables."""
    for name, graphs in (("laguna-s-int4-dflash-tp4", True), ("cpu-tiny", False)):
        serve = _yaml_values((RECIPE_DIR / f"{name}.yaml").read_text())
        assert set(serve["additional-config"]) == {OPTIONS_KEY}
        options = serve["additional-config"][OPTIONS_KEY]
        assert options == {
            "exact_verify": True,
            "verify_width": VERIFY_WIDTH,
            "prebuilt_metadata": True,
            "breakable_graph": graphs,
            "exact_tp_reduce": True,
            "row_invariant_qk_norm": "pad",
            "row_invariant_linears": "all",
            "debug_xccl_standin": False,
            "debug_no_split_plan": False,
            "debug_prebuilt_full_guard": False,
        }
        assert set(options) <= set(DEFAULTS)  # every key one the engine knows
        recipe = next(r for r in recipes() if r.name == name)
        assert recipe.additional_config == serve["additional-config"]
        env = (RECIPE_DIR / f"{name}.env").read_text()
        assert ENV_PREFIX not in env and not any(s.key.startswith(ENV_PREFIX) for s in recipe.env)
    # on CPU the series engages only when asked explicitly: the CPU recipe names exact_verify itself
    assert cpu_tiny_recipe().additional_config[OPTIONS_KEY]["exact_verify"] is True
    assert xpu_recipe(load_pins()).additional_config[OPTIONS_KEY]["breakable_graph"] is True
    assert TENSOR_PARALLEL > 1 and xpu_recipe(load_pins()).additional_config[OPTIONS_KEY]["exact_tp_reduce"] is True


def test_negative_control_a_series_variable_in_an_env_file_is_refused() -> None:
    recipe = Recipe("x", "x", (), (Setting("VLLM_XPU_LAGUNA_BREAKABLE_GRAPH", "1", "n"),))
    with pytest.raises(
        ToolError,
        match=r"x\.env: VLLM_XPU_LAGUNA_BREAKABLE_GRAPH is no longer read by the series; "
        r"set the option xpu_laguna\.breakable_graph instead",
    ):
        render_env(recipe)


def test_negative_control_an_option_the_engine_would_refuse_is_refused_at_render() -> None:
    for bad, why in (
        (Setting("verify_width", 32, "n"), "must be 1..16"),
        (Setting("breakable_graph", "1", "n"), "must be true or false"),
        (Setting("exact_verfy", True, "n"), "unknown option 'exact_verfy'"),
    ):
        with pytest.raises(ToolError, match=why):
            render_yaml(Recipe("x", "x", (), (), (bad,)))
    assert "additional-config" not in render_yaml(Recipe("x", "x", (), ()))  # no options: no key


def test_local_copies_render_without_editing() -> None:
    recipe = xpu_recipe(load_pins(), model="/models/target", draft="/models/Laguna-S-2.1-DFlash-INT4")
    serve = _yaml_values(render_yaml(recipe))
    assert serve["model"] == "/models/target"
    assert serve["speculative-config"]["model"] == "/models/Laguna-S-2.1-DFlash-INT4"
    assert main(["render", "--check", "--model", "/m"]) == 1


def test_false_is_refused_because_vllm_serve_drops_it() -> None:
    recipe = Recipe("x", "x", (Setting("enable-prefix-caching", False, "n"),), ())
    with pytest.raises(ToolError, match="use no-enable-prefix-caching: true"):
        render_yaml(recipe)


def _systemd_environment_file(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= rules for the lines the renderer allows: '#' comments and blank lines
    skipped, KEY=VALUE split at the first '=', no quotes, escapes or spaces to interpret."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, value = line.split("=", 1)
        assert not set(value) & set("\"'\\ $`"), line  # nothing either reader would interpret
        out[key] = value
    return out


@pytest.mark.parametrize("name", ["laguna-s-int4-dflash-tp4.env", "cpu-tiny.env"])
def test_env_files_read_the_same_in_a_shell_and_in_systemd(name: str) -> None:
    path = RECIPE_DIR / name
    shell = subprocess.run(
        ["env", "-i", "bash", "--noprofile", "--norc", "-c", 'set -a; . "$1"; env -0', "_", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = dict(item.split("=", 1) for item in shell.split("\0") if item)
    for own in ("PWD", "SHLVL", "_", "OLDPWD"):
        exported.pop(own, None)
    recipe = next(r for r in recipes() if r.env_name == name)
    assert exported == _systemd_environment_file(path.read_text()) == {s.key: s.value for s in recipe.env}


def test_negative_control_an_env_value_a_shell_would_split_is_refused() -> None:
    recipe = Recipe("x", "x", (), (Setting("CCL_ATL_TRANSPORT", "ofi mpi", "n"),))
    with pytest.raises(ToolError, match="not a plain KEY=VALUE"):
        render_env(recipe)


def _overlay_constant(name: str, module: str = "vllm/xpu_laguna/contract.py") -> object:
    tree = ast.parse((REPO_ROOT / "overlay" / module).read_text())
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(getattr(t, "id", None) == name for t in targets) and node.value is not None:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found")


def test_the_doctor_checks_the_device_variables_the_recipe_sets() -> None:
    """The doctor ships in the wheel (it cannot import the tooling): its list must be the recipe's."""
    doctor = _overlay_constant("RECIPE_DEVICE_ENV", "vllm/xpu_laguna/doctor.py")
    assert isinstance(doctor, dict)
    recipe = {s.key for s in xpu_recipe(load_pins()).env if not s.key.startswith("VLLM_")}
    assert set(doctor) == recipe


def _drafter_identity_module() -> types.ModuleType:
    """overlay/vllm/xpu_laguna/drafter.py, which ships in the wheel (standard library only at import)."""
    name = "xpu_laguna_drafter_under_test"
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "overlay/vllm/xpu_laguna/drafter.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_the_wheels_drafter_identity_reads_the_pins_as_the_record_carries_them(tmp_path: Path) -> None:
    """pins.toml is the one definition: the provenance record carries ``Pins.as_dict()`` into the wheel,
    where the contract and the doctor read the drafters from it."""
    module = _drafter_identity_module()
    pins = load_pins()
    known = module.KnownDrafters.from_pins(pins.as_dict())
    assert (known.matched.repo, known.matched.revision) == (pins.draft.repo, pins.draft.revision)
    assert known.matched.fingerprint == pins.draft.fingerprint
    bf16 = pins.draft_bf16
    assert (known.bf16.revision, known.bf16.fingerprint) == ((bf16.revision, bf16.fingerprint) if bf16 else ("", ""))
    assert module.identify(pins.draft.repo, pins.draft.revision, known).kind == "matched"
    snapshot = tmp_path / "models--x--y" / "snapshots" / pins.draft.revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert module.identify(snapshot, None, known).kind == "matched"
    assert module.identify(snapshot.parent, None, known).kind == "unknown"
    # the optional tables and keys reach it too
    text = synthetic.pins_text("0" * 64).replace(
        'revision = "5e07c246915c86dc6920fead03d019989224f2ba"\n',
        'revision = "5e07c246915c86dc6920fead03d019989224f2ba"\nfingerprint = "' + "a" * 64 + '"\n\n'
        '[models.draft_bf16]\nrevision = "' + "b" * 40 + '"\nfingerprint = "' + "c" * 64 + '"\n',
    )
    known = module.KnownDrafters.from_pins(parse_pins(text, Path("pins.toml")).as_dict())
    assert known.matched.fingerprint == "a" * 64
    assert (known.bf16.revision, known.bf16.fingerprint) == ("b" * 40, "c" * 64)
    assert module.identify_repo("b" * 40, known).kind == "bf16"


def test_docs_name_every_setting() -> None:
    docs = (REPO_ROOT / "docs/serving.md").read_text()
    assert "`additional-config`" in docs
    for recipe in recipes():
        for s in recipe.serve + recipe.options + recipe.env:
            assert f"`{s.key}`" in docs, f"docs/serving.md does not explain {s.key}"
        assert f"recipes/{recipe.yaml_name}" in docs and f"recipes/{recipe.env_name}" in docs
