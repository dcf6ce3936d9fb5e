"""Tooling for the vLLM XPU Laguna patch series (apply, export, lint, build, verify, rebase).

Importing this package is cheap: no torch, no vLLM. Each module has one job; errors
are raised as :class:`scripts.errors.ToolError` with a one-line message and turned into
an exit status by :mod:`scripts.cli`.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
