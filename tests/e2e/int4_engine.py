"""One greedy offline run of a tiny (INT4 or reference) Laguna in a process of its own, for the INT4
tests: ``python tests/e2e/int4_engine.py OUT.json [--no-speculation] ENGINE_ARGS...``.

ENGINE_ARGS are what ``vllm serve`` takes (``--config RECIPE.yaml`` among them), parsed by vLLM's
own server parser and turned into the engine's arguments the way the server turns them
(``EngineArgs.from_cli_args``), so an offline run and a served one build the same engine;
``--no-speculation`` drops a speculative config the arguments name (the teacher of a served DFlash
run). Writes each prompt's tokens and chosen-token logprobs. Its own process: the INT4 stand-in
(``VXL_XPU_INT4_EXPERTS=1``, xpu_laguna_standins.int4_experts) is installed by the runtime plugin
when vLLM loads plugins, once per process, and must not stay in a test worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PROMPTS = ("The lagoon is calm in the morning", "A small model learns to repeat the word lagoon lagoon")
MAX_TOKENS = 24
NO_SPECULATION = "--no-speculation"
TIMEOUT_S = 600


def run(
    out: Path, args: list[str], *, stand_in: bool, tp: int = 1, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    """This script with ``args`` (vLLM's server arguments) in a process of its own on a leased CPU
    slot: (process, rows). Its environment is ``env`` (a server's, say) or else this process's, the
    lease's core binding and the INT4 stand-in's switch (``stand_in``) over it."""
    from xpu_laguna_standins import int4_experts

    from scripts.cpu_slots import cpu_lease

    with cpu_lease("int4 engine") as lease:
        merged = {k: v for k, v in (os.environ if env is None else env).items() if k != int4_experts.ENV}
        merged.update(lease.env(tp))  # its ranks on the lease's cores, its thread count the lease's
        if stand_in:
            merged[int4_experts.ENV] = "1"
        proc = subprocess.run(
            [sys.executable, __file__, str(out), *args],
            env=merged,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    rows = json.loads(out.read_text()) if proc.returncode == 0 else []
    return proc, rows


def main(out: str, *argv: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args([a for a in argv if a != NO_SPECULATION])
    engine_args = EngineArgs.from_cli_args(args)
    if NO_SPECULATION in argv:
        engine_args.speculative_config = None
    llm = LLM.from_engine_args(engine_args)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    rows = []
    for output in llm.generate(list(PROMPTS), params, use_tqdm=False):
        done = output.outputs[0]
        rows.append(
            {
                "tokens": list(done.token_ids),
                "logprobs": [step[token].logprob for step, token in zip(done.logprobs or [], done.token_ids)],
            }
        )
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(rows, handle)


if __name__ == "__main__":
    main(*sys.argv[1:])
