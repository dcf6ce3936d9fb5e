"""A serving recipe as the crossover's server configuration (``crossover --recipe FILE``).

A recipe is a ``vllm serve --config`` YAML file and, next to it, an env file of the same name
ending in ``.env`` (``recipes/``, rendered by ``python -m scripts.recipe render``). The YAML goes to
every leg's server as ``--config FILE`` as it is; the env file is read the way docs/serving.md tells
a shell to read it (``set -a; . FILE``) and its variables go into every leg's environment, where
``--env`` and the treated variables win. The series' options are the YAML's ``additional-config``
mapping under ``xpu_laguna`` (:mod:`scripts.series_options`): every leg starts from them, ``--env``
and the treated options (``xpu_laguna.KEY=VALUE``) win, and each server gets its leg's whole mapping
as ``--additional-config`` after the file (the command line wins over the file). A treated variable
or option the recipe sets keeps the recipe's value in the control legs unless ``--control`` names
another. An env file that still sets a ``VLLM_XPU_LAGUNA_*`` variable (rendered before the options
moved into the config) is refused: the servers would refuse it. The recipe also names the model
(``model:``) and the speculative configuration (``speculative-config:``), so the crossover takes
them from it; the teacher leg turns speculation off with ``--speculative-config None`` (a
command-line option wins over the file). Both files are copied into the run folder as raw
artifacts, and the record names the recipe's path and the sha256 of both files.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.digest import sha256_file
from scripts.errors import ToolError
from scripts.measure.artifacts import RECIPE_ARTIFACT, RECIPE_ENV_ARTIFACT
from scripts.recipe import shell_env
from scripts.series_options import CONFIG_FILE_KEY, OPTIONS_KEY, checked, refuse_series_env

NO_SPECULATION = ["--speculative-config", "None"]
"""What the teacher leg adds: vLLM's optional JSON options read ``None`` as unset."""
CONFLICTS = ("--server-args", "--model", "--draft", "--speculative-config", "--num-speculative-tokens")


@dataclass(frozen=True)
class LegRecipe:
    path: Path
    env_path: Path
    options: dict[str, Any]
    env: dict[str, str]
    sha256: str
    env_sha256: str

    @property
    def model(self) -> str | None:
        value = self.options.get("model")
        return None if value is None else str(value)

    @property
    def revision(self) -> str | None:
        value = self.options.get("revision")
        return None if value is None else str(value)

    @property
    def speculative(self) -> dict[str, Any] | None:
        value = self.options.get("speculative-config")
        return value if isinstance(value, dict) else None

    @property
    def additional_config(self) -> dict[str, Any]:
        """The file's ``additional-config`` (empty when it has none)."""
        value = self.options.get(CONFIG_FILE_KEY)
        return dict(value) if isinstance(value, dict) else {}

    @property
    def series_options(self) -> dict[str, Any]:
        """The series' options the file serves with (``additional-config`` under ``xpu_laguna``)."""
        value = self.additional_config.get(OPTIONS_KEY)
        return dict(value) if isinstance(value, dict) else {}

    @property
    def max_model_len(self) -> int | None:
        value = self.options.get("max-model-len")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def record(self) -> dict[str, str]:
        """The record's ``recipe`` section."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "env_path": str(self.env_path),
            "env_sha256": self.env_sha256,
        }

    def check_unchanged(self) -> None:
        """The files must still be the ones the run started with (each leg serves the file itself)."""
        for path, digest in ((self.path, self.sha256), (self.env_path, self.env_sha256)):
            if sha256_file(path) != digest:
                raise ToolError(f"--recipe: {path} changed during the run")

    def copy_into(self, out: Path) -> dict[str, str]:
        """Copy both files into the run folder; artifact name -> path relative to ``out``."""
        names = {RECIPE_ARTIFACT: f"recipe{self.path.suffix}", RECIPE_ENV_ARTIFACT: "recipe.env"}
        shutil.copyfile(self.path, out / names[RECIPE_ARTIFACT])
        shutil.copyfile(self.env_path, out / names[RECIPE_ENV_ARTIFACT])
        return names


def given_conflicts(argv_options: dict[str, object]) -> list[str]:
    """The options of :data:`CONFLICTS` given (not None, not empty) alongside ``--recipe``."""
    return [option for option in CONFLICTS if argv_options.get(option) not in (None, "")]


def load_recipe(text: str) -> LegRecipe:
    """Read ``--recipe FILE`` and its env file; one-line errors."""
    import yaml

    path = Path(text)
    if path.suffix not in (".yaml", ".yml"):
        raise ToolError(f"--recipe {text}: not a .yaml/.yml file (vllm serve --config reads only those)")
    if not path.is_file():
        raise ToolError(f"--recipe {text}: no such file")
    env_path = path.with_suffix(".env")
    if not env_path.is_file():
        raise ToolError(f"--recipe {text}: no env file {env_path} next to it")
    try:
        options = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ToolError(f"--recipe {text}: not readable YAML ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ToolError(f"--recipe {text}: not a mapping of vllm serve options")
    if options.get("model") is None:
        raise ToolError(f"--recipe {text}: names no model (model:)")
    spec = options.get("speculative-config")
    if spec is not None and (not isinstance(spec, dict) or "num_speculative_tokens" not in spec):
        raise ToolError(f"--recipe {text}: speculative-config must be a mapping with num_speculative_tokens")
    extra = options.get(CONFIG_FILE_KEY)
    if extra is not None and not (isinstance(extra, dict) and isinstance(extra.get(OPTIONS_KEY, {}), dict)):
        raise ToolError(f"--recipe {text}: {CONFIG_FILE_KEY} must be a mapping, its {OPTIONS_KEY} one too")
    recipe = LegRecipe(
        path=path,
        env_path=env_path,
        options=options,
        env=shell_env(env_path),
        sha256=sha256_file(path),
        env_sha256=sha256_file(env_path),
    )
    refuse_series_env(recipe.env, f"--recipe {text}: {env_path}")
    checked(recipe.series_options, f"--recipe {text}: {CONFIG_FILE_KEY} {OPTIONS_KEY}")
    return recipe
