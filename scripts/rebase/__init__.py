"""Move the series onto a newer upstream vLLM with real 3-way merges, and say what happened.

The new upstream is acquired exactly like ``apply`` acquires the pinned one (sdist from pip's
configured index, cached by sha256, or git) and fetched into the same work repository as a
second base, so every patch commit keeps its old pre-image blobs as the merge base. Each patch is
replayed with ``git cherry-pick`` (merge-ort) in series order and classified:

* ``clean``            the patch's diff is unchanged apart from blob ids;
* ``merged``           the merge resolved it, but hunks moved or their context changed (shown);
* ``conflict``         files, hunks, conflict-marker lines and the upstream change under them;
* ``already-upstream`` the replay is empty: upstream absorbed it (proposed for retirement);
* ``resolved``         a conflict the user resolved before ``--continue``.

After the replay: overlay files whose upstream twin appeared/changed/vanished, a compile check
of every Python file the series touches, and each patch's ``Effect-Check`` run in the new tree.
The first conflict stops the replay with a resumable state (``build/rebase-state.json``); a
failed check stops before anything is written. Only a fully successful rebase refreshes
``patches/`` (deterministic export) and rewrites ``pins.toml``'s [vllm] and [xpu_runtime]
values in place. Every outcome writes a JSON report (schema ``vxl-rebase-report/1``).

Modules: ``target`` (where to go), ``hunks`` (pure hunk comparison), ``evidence`` (what upstream
did, from git), ``pins_update`` (pins.toml), ``state`` (typed resumable state), ``replay`` (the
state machine), ``checks`` (the replayed tree), ``report``, ``run`` (start / continue / abort).
"""

from __future__ import annotations

from scripts.rebase.hunks import compare_hunks
from scripts.rebase.pins_update import parse_xpu_requirements, rewrite_pins
from scripts.rebase.report import REPORT_SCHEMA
from scripts.rebase.run import rebase

__all__ = ["rebase", "rewrite_pins", "parse_xpu_requirements", "compare_hunks", "REPORT_SCHEMA"]
