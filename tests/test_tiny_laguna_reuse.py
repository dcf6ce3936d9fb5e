"""The tiny pair is generated once per folder and reused after (scripts.tiny_laguna.ensure_models):
the matrix driver and the CPU runtime reuse a current pair (stamp of this generator, seed and
variant) and regenerate a stale or partial one; runs at once generate it once."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from scripts import tiny_laguna


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, int, str]]:
    """A stand-in for generate() (which needs torch and takes 16 s): the files ensure_models
    looks at, with the real stamp, and a record of each call."""
    made: list[tuple[Path, int, str]] = []

    def fake_generate(out_dir: Path, seed: int = 0, variant: str = "default") -> Any:
        made.append((Path(out_dir), seed, variant))
        time.sleep(0.2)  # long enough for a second thread to arrive while the first generates
        for sub in ("target", "draft"):
            (out_dir / sub).mkdir(parents=True, exist_ok=True)
            (out_dir / sub / "config.json").write_text("{}")
        stamp = {"generator": tiny_laguna.generator_digest(seed, variant)}
        (out_dir / tiny_laguna.STAMP).write_text(json.dumps(stamp))

    monkeypatch.setattr(tiny_laguna, "generate", fake_generate)
    return made


def test_generated_once_then_reused(tmp_path: Path, calls: list[tuple[Path, int, str]]) -> None:
    out = tmp_path / "tiny"
    assert tiny_laguna.ensure_models(out) == (out / "target", out / "draft")
    assert tiny_laguna.ensure_models(out) == (out / "target", out / "draft")
    assert len(calls) == 1 and tiny_laguna.models_current(out)


def test_stale_or_partial_pairs_are_regenerated(tmp_path: Path, calls: list[tuple[Path, int, str]]) -> None:
    out = tmp_path / "tiny"
    tiny_laguna.ensure_models(out)
    tiny_laguna.ensure_models(out, seed=1)  # another seed: another stamp
    assert [c[1] for c in calls] == [0, 1] and not tiny_laguna.models_current(out, seed=0)
    (out / "draft" / "config.json").unlink()
    tiny_laguna.ensure_models(out, seed=1)
    (out / tiny_laguna.STAMP).write_text("not json")
    tiny_laguna.ensure_models(out, seed=1)
    assert len(calls) == 4


def test_runs_at_once_generate_once(tmp_path: Path, calls: list[tuple[Path, int, str]]) -> None:
    out = tmp_path / "tiny"
    threads = [threading.Thread(target=tiny_laguna.ensure_models, args=(out,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
