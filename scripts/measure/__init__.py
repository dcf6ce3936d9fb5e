"""Measurement harness: A/B crossover runs, an analyzer over raw rows, audited record files.

Pure parts (importable without vLLM, torch or matplotlib): :mod:`.metrics`, :mod:`.analyze`,
:mod:`.gates`, :mod:`.record`, :mod:`.verify_record`, :mod:`.schema`. The driver
(:mod:`.crossover`) talks to ``vllm serve`` over loopback HTTP with the standard library only;
:mod:`.plot` needs matplotlib.

Entry points for ``noxfile.py``: :func:`scripts.measure.cli.crossover` and
:func:`scripts.measure.cli.verify_record`, each taking the argument list (``session.posargs``)
and returning an exit status.
"""

from __future__ import annotations
