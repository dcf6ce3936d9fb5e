"""One greedy run of a tiny (INT4 or reference) Laguna target in a process of its own, for
test_int4_checkpoint.py: ``python tests/e2e/int4_engine.py MODEL OUT.json``
writes each prompt's tokens and chosen-token logprobs (``[KV_CACHE_DTYPE [TP]]``: TP ranks through
vLLM's multiprocessing executor). Its own process: the INT4 stand-in
(``VXL_XPU_INT4_EXPERTS=1``, xpu_laguna_standins.int4_experts) is installed by the runtime plugin
when vLLM loads plugins, once per process, and must not stay in a test worker."""

from __future__ import annotations

import json
import sys

PROMPTS = ("The lagoon is calm in the morning", "A small model learns to repeat the word lagoon lagoon")
MAX_TOKENS = 24


def main(model: str, out: str, kv_cache_dtype: str = "auto", tp: str = "1") -> None:
    from vllm import LLM, SamplingParams

    ranks = int(tp)
    llm = LLM(
        tensor_parallel_size=ranks,
        distributed_executor_backend="mp" if ranks > 1 else None,
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        kv_cache_memory_bytes=64 << 20,
        kv_cache_dtype=kv_cache_dtype,
        seed=0,
        max_num_seqs=1,
        enable_prefix_caching=False,
    )
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
