"""Per-module row invariance: verify rows of DFlash M8 vs the teacher's decode of the same token.

Runs the teacher (no speculation) and DFlash M8 one after the other in this process (in-process
engine, one request at a time) with forward hooks on every module of the target model. Each
hook records, per token position, the bytes of that position's output row. A row of a verify
forward whose input token and position equal the teacher's (same prefix: the run is
teacher-exact up to there) was computed from the same inputs as the teacher's decode of that
token, so every module's output row should be bitwise equal. The script prints, per module (in
forward order), the rows compared and the rows bitwise equal, and per differing row the first
module that differs in execution order (a module finishes after its children, so the first is
the most specific one): the op that is not row-invariant.

Both engines get the series' options of ``--series-options`` in their config
(``additional_config["xpu_laguna"]``; the day-one run passes the recipe's); on CPU an engine runs the
series only when they turn one of its switches on (``{"exact_verify": true}``), and
``{"exact_verify": false}`` is the negative control: the attention is then the first module that
differs.

On CPU (``--tiny DIR``) it runs the FlashAttention backend on the reference kernels, like the
matrix. On an XPU/CUDA machine (``--model-dir``/``--draft-dir``) it measures whether the
device's GEMM, MoE, attention and elementwise kernels are row-invariant there: device results
only come from a device run.

    python -m scripts.device.row_invariance_check --tiny build/tiny-laguna --series-options '{"exact_verify": true}'
    python -m scripts.device.row_invariance_check --model-dir M --draft-dir D --dtype bfloat16
"""

from __future__ import annotations

import gc
import hashlib
import os
import sys
from collections import defaultdict
from typing import Any

WIDTH = 8
# (position, input token) -> module name -> digest of the output row, per run
Records = dict[tuple[int, int], dict[str, str]]
_CURRENT: dict[str, Any] = {}


def _install_hooks(model: Any) -> None:
    """Hooks on every module (run in the engine's process by ``LLM.apply_model``)."""

    def pre(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        pos = kwargs.get("positions", args[1] if len(args) > 1 else None)
        _CURRENT["keys"] = (
            list(zip(pos.reshape(-1).tolist(), ids.reshape(-1).tolist()))
            if ids is not None and pos is not None
            else None
        )
        _CURRENT["seen"] = set()  # a module shared by several layers records its first call only

    def make(name: str) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            keys = _CURRENT.get("keys")
            out = output[0] if isinstance(output, (tuple, list)) and output else output
            if keys is None or not hasattr(out, "shape") or out.dim() == 0 or out.shape[0] != len(keys):
                return
            if name in _CURRENT["seen"]:
                return
            _CURRENT["seen"].add(name)
            rows = out.detach().reshape(len(keys), -1).contiguous().cpu()
            executed = _CURRENT["executed"]  # completion order: children before parents
            executed.setdefault(name, len(executed))
            sink = _CURRENT["records"]
            for key, row in zip(keys, rows):
                sink.setdefault(key, {})[name] = hashlib.sha1(row.numpy().tobytes()).hexdigest()

        return hook

    def post(_module: Any, _inputs: Any, _output: Any) -> None:
        # modules shared with the drafter (embeddings, rotary) must not record its forwards
        _CURRENT["last_keys"] = _CURRENT.get("keys")
        _CURRENT["keys"] = None

    real_logits = model.compute_logits

    def compute_logits(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        logits = real_logits(hidden_states, *args, **kwargs)
        keys = _CURRENT.get("last_keys") or []
        n = logits.shape[0] if logits is not None else 0
        picked = keys if n == len(keys) else keys[-1:] if n == 1 and keys else None
        if picked:
            rows = logits.detach().reshape(n, -1).contiguous().cpu()
            executed = _CURRENT["executed"]
            executed.setdefault("compute_logits", len(executed) + 10_000)
            for key, row in zip(picked, rows):
                _CURRENT["records"].setdefault(key, {})["compute_logits"] = hashlib.sha1(
                    row.numpy().tobytes()
                ).hexdigest()
        return logits

    model.compute_logits = compute_logits

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post)
    for name, module in model.named_modules():
        if name:
            module.register_forward_hook(make(name))


def _run(
    target: str,
    draft: str | None,
    prompts: list[str],
    max_tokens: int,
    dtype: str,
    cpu: bool,
    options: dict[str, Any],
) -> tuple[Records, list[str], list[list[int]], list[int]]:
    from vllm import LLM, SamplingParams

    from scripts.series_options import additional_config

    records: Records = {}
    _CURRENT.clear()
    _CURRENT["records"] = records
    _CURRENT["executed"] = {}
    kwargs: dict[str, Any] = {
        "model": target,
        "dtype": dtype,
        "seed": 0,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "max_model_len": 8192,
        "max_num_seqs": 1,
        "additional_config": additional_config(options),
    }
    if cpu:
        kwargs["kv_cache_memory_bytes"] = 256 << 20
    if draft:
        kwargs["speculative_config"] = {"method": "dflash", "model": draft, "num_speculative_tokens": WIDTH - 1}
    llm = LLM(**kwargs)
    try:
        llm.apply_model(_install_hooks)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        executed: dict[str, int] = _CURRENT["executed"]
        order = sorted(executed, key=executed.__getitem__)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        prompt_lens = [len(o.prompt_token_ids or []) for o in outs]
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass
        del llm
        gc.collect()
    return records, order, tokens, prompt_lens


def compare(
    teacher: Records, spec: Records, order: list[str], generated: set[tuple[int, int]]
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Per module [compared, equal]; per first differing module, the rows it was first in."""
    per_module: dict[str, list[int]] = {name: [0, 0] for name in order}
    first: dict[str, int] = defaultdict(int)
    for key in sorted(generated):
        want, got = teacher.get(key), spec.get(key)
        if not want or not got:
            continue
        first_bad = None
        for name in order:
            if name in want and name in got:
                per_module[name][0] += 1
                same = want[name] == got[name]
                per_module[name][1] += same
                if not same and first_bad is None:
                    first_bad = name
        if first_bad is not None:
            first[first_bad] += 1
    return per_module, dict(first)


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import ToolParser
    from scripts.series_options import options_argument

    parser = ToolParser(
        prog="python -m scripts.device.row_invariance_check",
        description=__doc__.splitlines()[0],
    )
    models = parser.add_mutually_exclusive_group(required=True)
    models.add_argument("--tiny", metavar="DIR", help="generate (or reuse) the tiny Laguna pair in DIR (CPU)")
    models.add_argument("--model-dir", help="local target model (device run)")
    parser.add_argument("--draft-dir", help="local DFlash drafter (required with --model-dir; default: none)")
    parser.add_argument("--dtype", default=None, help="default: float32 with --tiny, bfloat16 otherwise")
    parser.add_argument("--prompts", type=int, default=3, help="prompts (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per prompt (default: %(default)s)")
    parser.add_argument(
        "--series-options",
        type=options_argument,
        default={},
        metavar="JSON",
        help="the series' options of both engines, a JSON object of additional_config['xpu_laguna'] (default: none)",
    )
    parser.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=0,
        help="add one prompt of at least this many tokens (0: none; default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.model_dir and not args.draft_dir:
        parser.error("--draft-dir is required with --model-dir")
    if args.prompts < 1 or args.max_tokens < 2:
        parser.error("--prompts must be >= 1 and --max-tokens >= 2")
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"error: needs torch and the patched vLLM installed ({e})", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # hooks live in this process
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model with a local function
    from scripts.matrix.engine import route_and_count
    from scripts.matrix.legs import device_kind

    device = device_kind()
    if args.tiny:
        from pathlib import Path

        from scripts.tiny_laguna import ensure_models

        target, draft = (str(path) for path in ensure_models(Path(args.tiny)))
    else:
        target, draft = args.model_dir, args.draft_dir
    dtype = args.dtype or ("float32" if args.tiny else "bfloat16")
    route_and_count(device == "cpu")
    words = "amber basalt cedar delta ember fjord granite harbor iris juniper kestrel lagoon".split()
    prompts = [
        f"row check {i} " + " ".join(words[(i + j) % len(words)] for j in range(8 + 3 * i)) for i in range(args.prompts)
    ]
    if args.long_prompt_tokens > 0:
        from scripts.matrix.logprobs import long_prompt

        prompts.append(long_prompt(target, args.long_prompt_tokens, tuple(words), "rowcheck", 0)[0])
    run = (args.max_tokens, dtype, device == "cpu", args.series_options)
    teacher, order, t_tokens, prompt_lens = _run(target, None, prompts, *run)
    spec, _, s_tokens, _ = _run(target, draft, prompts, *run)
    # generated positions whose whole prefix agrees (teacher-exact up to there)
    generated: set[tuple[int, int]] = set()
    for plen, want, got in zip(prompt_lens, t_tokens, s_tokens):
        for i, tok in enumerate(want[:-1]):  # the input of position plen + i + 1 is generated token i
            if i >= len(got) or got[: i + 1] != want[: i + 1]:
                break
            generated.add((plen + i, tok))
    per_module, first = compare(teacher, spec, order, generated)
    compared = [(n, c, eq) for n, (c, eq) in per_module.items() if c]
    print(
        f"device {device}; {len(prompts)} prompts x {args.max_tokens} tokens; "
        f"{len(generated)} generated positions; modules with rows compared: {len(compared)}"
    )
    differing = [(n, c, eq) for n, c, eq in compared if eq != c]
    for name, rows_compared, rows_equal in differing:
        print(f"  NOT row-invariant: {name}: {rows_equal}/{rows_compared} rows bitwise equal")
    for name, count in sorted(first.items(), key=lambda kv: -kv[1]):
        print(f"  first differing module for {count} row(s): {name}")
    if not compared:
        print("error: no verify row could be matched to a teacher decode (nothing compared)", file=sys.stderr)
        return 1
    rows = max(c for _, c, _ in compared)
    print(
        f"summary: {len(compared) - len(differing)}/{len(compared)} modules bitwise equal on all compared "
        f"rows (up to {rows} rows per module)"
    )
    return 0 if not differing else 1


if __name__ == "__main__":
    raise SystemExit(main())
