"""Fresh, unique prompts for one crossover: the same list is sent to every leg (one server per
leg, so each server sees each prompt once), which is what makes rows pair up across legs.

The plan marks two *long* prompts (each followed by an ordinary one: long-then-next) and one
*rollover* prompt sized so that prompt + output crosses ``rollover_at`` tokens (the sliding
window) during generation.
"""

from __future__ import annotations

import atexit
import json
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from scripts.errors import ToolError
from scripts.measure.schema import RowKind, sha256_text

WORDS = (
    "river stone lantern harbor meadow copper orbit velvet signal garden thunder marble "
    "compass willow ember glacier canyon pepper violin saddle quartz falcon timber beacon "
    "cobalt prairie lagoon summit anchor ribbon cedar tunnel meteor cinder orchard harvest "
    "needle puzzle shelter voyage winter cotton engine feather island jacket kettle ladder "
    "mirror number object pocket rocket silver table umbrella valley window yellow zipper"
).split()

Counter = Callable[[str], int]


@dataclass(frozen=True)
class Prompt:
    index: int
    id: str
    kind: RowKind
    text: str
    target_tokens: int

    @property
    def sha256(self) -> str:
        return sha256_text(self.text)


def plan_kinds(n: int) -> list[RowKind]:
    """Row kinds: two long rows (each with a following row) and one rollover row."""
    if n < 1:
        raise ToolError(f"need at least one prompt per leg, got {n}")
    kinds: list[RowKind] = ["normal"] * n
    rollover = n - 2 if n >= 2 else None
    if rollover is not None:
        kinds[rollover] = "rollover"
    for position in sorted({n // 4, (2 * n) // 3}):
        if position < n - 1 and kinds[position] == "normal":
            kinds[position] = "long"
    return kinds


def _fit(prefix: str, words: list[str], target: int, count: Counter, suffix: str = "") -> str:
    """The longest ``prefix + words[:k] + suffix`` with at most ``target`` tokens."""

    def text(k: int) -> str:
        return prefix + " ".join(words[:k]) + suffix

    low, high = 0, len(words)
    while count(text(high)) < target and high < 64 * target:
        words = words + words
        high = len(words)
    while low < high:
        middle = (low + high + 1) // 2
        if count(text(middle)) <= target:
            low = middle
        else:
            high = middle - 1
    return text(low)


def build_prompts(
    n: int,
    run_tag: str,
    seed: int,
    count: Counter,
    *,
    prompt_tokens: int,
    long_prompt_tokens: int,
    rollover_at: int | None,
    max_tokens: int,
    suffix: str = "",
) -> list[Prompt]:
    rng = random.Random(seed)
    prompts = []
    texts: set[str] = set()
    for index, kind in enumerate(plan_kinds(n)):
        if kind == "long":
            target = long_prompt_tokens
        elif kind == "rollover" and rollover_at is not None:
            target = rollover_at - max(1, max_tokens // 2)
            if target < 8:
                raise ToolError(f"rollover at {rollover_at} tokens needs max_tokens/2 < {rollover_at - 8}")
        else:
            target = prompt_tokens
        prefix = f"Note {run_tag}-{index}: "
        words = [rng.choice(WORDS) for _ in range(max(8, target))]
        text = _fit(prefix, words, target, count, suffix)
        if text in texts:
            raise ToolError(f"prompt {index} is not unique; use more prompt tokens")
        texts.add(text)
        prompts.append(Prompt(index, f"{run_tag}-{index}", kind, text, target))
    return prompts


_COUNT_LOOP = (
    "import json, sys\n"
    "from transformers import AutoTokenizer\n"
    "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
    "for line in sys.stdin:\n"
    "    print(len(tok(json.loads(line))['input_ids']), flush=True)\n"
)


def tokenizer_counter(model_dir: str, python: str | None = None) -> Counter:
    """Token count with the model's own tokenizer: in this process when it has transformers,
    else in a helper process of ``python`` (the vLLM runtime's interpreter)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        if python is None or python == sys.executable:
            raise ToolError("transformers is needed to size prompts (pass --python of the vLLM runtime)") from None
        return _remote_counter(python, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return lambda text: len(tokenizer(text)["input_ids"])


def _remote_counter(python: str, model_dir: str) -> Counter:
    helper = subprocess.Popen(
        [python, "-c", _COUNT_LOOP, model_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    atexit.register(helper.kill)

    def count(text: str) -> int:
        assert helper.stdin is not None and helper.stdout is not None
        helper.stdin.write(json.dumps(text) + "\n")
        helper.stdin.flush()
        line = helper.stdout.readline()
        if not line:
            raise ToolError(f"tokenizer helper of {python} exited (status {helper.poll()})")
        return int(line)

    return count
