"""Equivalence matrix: every optimisation toggle must leave greedy tokens unchanged.

Legs (each a fresh engine in its own process, prefix caching off, no warm-up generation):
teacher (no speculation, eager) and DFlash M8 with graph {off, on} x prebuilt metadata
{off, on}. Every leg must equal the teacher token for token (teacher-exact) and the other legs
(cross-leg); cached tokens must be zero. Graph legs need device graphs: on a machine without
an XPU or CUDA device they run through the recording stand-in graph (emulated device graphs,
the test-side ``xpu_laguna_standins.emulated_graphs``) and pass as "passed (emulated graphs)",
never as plain "passed" (``--no-emulated-graphs``: reported as "not run"). Every graph leg must
show, from the wrappers' own accounting, target and drafter captured with the graphs and breaks
that the models' layer counts and the TP size imply, and enough replays.

Logprob gate: every leg requests the logprobs of the sampled token and the top-k; they are
compared with the teacher's bitwise (``float.hex``) per position. On CPU every leg with the
exact verify path on must be bitwise equal at every position; the diagnostic leg
``dflash-exact0-diagnostic`` (exact verify off) must NOT be (negative control: if it ever is,
the gate cannot tell exact from non-exact verify and the run fails), nor may
``dflash-noplan-diagnostic`` (exact verify without the KV split plan, a debug switch): only the
long-context prompt separates that one from the exact legs. The TP 4 legs (opt-in, ``TP4_LEGS``)
add the fixed rank order's negative control: ``dflash-ring-tp4-diagnostic`` (fixed order off)
must NOT be bitwise equal to its ring teacher ``teacher-ring-tp4``. On a device the counts are
reported, not gated. One prompt of at least ``--long-prompt-tokens`` tokens crosses the KV
split-count divergence of the global layer; it is gated like the others and its counts are also
reported on their own. Every leg gets the same token budget (``--max-num-batched-tokens``,
default ``--max-model-len``: every prompt prefilled in one chunk; a chunked prefill of that prompt
leaves a last-bit logprob difference, see the README). The longest context per leg is reported.

Each leg's engine gets the series' options in its config, ``additional_config["xpu_laguna"]``
(:meth:`.legs.Leg.options`: the leg's switches, named explicitly; ``--series-options`` adds others),
never in its environment: a ``VLLM_XPU_LAGUNA_*`` variable is refused before any leg starts.

``python -m scripts.matrix run ...`` is the driver (it needs vLLM importable, i.e. the CPU
runtime on this machine); ``python -m scripts.matrix leg CONFIG`` runs one leg. On CPU a leg's
process is a fork of one interpreter that imported vLLM once (:mod:`.preloaded`).

Modules: :mod:`.legs` (legs, prompts, constants), :mod:`.engine` (one leg in its own process),
:mod:`.logprobs` (the logprob gate), :mod:`.graphs` (graph-leg accounting checks),
:mod:`.evaluate` (verdicts per leg), :mod:`.report` (table and report file), :mod:`.driver` (runs
the legs), :mod:`.runner` and :mod:`.preloaded` (the legs' processes), :mod:`.cli` (options and
their checks). Every module imports without torch or vLLM; only :mod:`.engine` uses vLLM, inside
its functions.
"""

from __future__ import annotations
