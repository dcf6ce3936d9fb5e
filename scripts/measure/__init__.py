"""Measurement harness: A/B crossover runs, an analyzer over raw rows, audited record files.

Commands (``python -m scripts.measure ...``; nox sessions call :func:`cli.crossover` and
:func:`cli.verify_record` with ``session.posargs``):

``crossover --treatment NAME=VALUE [--control NAME=VALUE] --model DIR [--draft DIR] ...``
    legs A1 (control), B1, B2 (candidate), A2 (control), then a non-speculative teacher; each a
    fresh OpenAI-compatible vLLM server on 127.0.0.1 (free port) with a clean environment and the
    series' options (``--additional-config``), of which only the treatment differs (a variable
    ``ENV=VALUE`` or an option ``xpu_laguna.KEY=VALUE``). Writes a run directory: ``rows-<leg>.jsonl`` (raw rows),
    ``server-<leg>.log``, ``prompts.json``, ``run.json`` (manifest), ``full-analysis.json``,
    ``all-vs-teacher.json``, ``cross-leg.json``, ``crossover.png`` and ``record.json`` (with the
    sha256 of every other file). ``--python PY`` runs the servers with another interpreter
    (an installed XPU build); the driver itself needs only the standard library (+ matplotlib
    for the plot).
``verify-record FILE [--prior FILE]``
    re-derives every number from the raw artifacts when they are next to the record (or at its
    ``run_root``), else checks the record's internal consistency; exit 1 naming each field.
``analyze RUN_DIR``
    rebuilds analysis, plot and record of a run directory from its raw rows.

Pure parts (importable without vLLM, torch or matplotlib): :mod:`.metrics`, :mod:`.analyze`,
:mod:`.gates` (thresholds in ``gates.toml``), :mod:`.record`, :mod:`.verify_record`,
:mod:`.rederive`, :mod:`.schema` (raw rows), :mod:`.manifest` (``run.json``), :mod:`.prompts`; every
file of a run is read through :mod:`scripts.typed_data`. Loopback I/O: :mod:`.client`,
:mod:`.server`, :mod:`.crossover`; :mod:`.runtime_probe` asks the runtime's interpreter what it is.
Plot: :mod:`.plot`.
"""

from __future__ import annotations
