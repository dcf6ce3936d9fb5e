# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Pre-flight checks of a machine that serves Laguna-S-2.1-INT4 + DFlash with
the XPU Laguna series.

``python -m vllm.xpu_laguna.doctor [--model DIR] [--draft DIR]
[--additional-config JSON]`` prints one
line per check, ``ok`` / ``warn`` / ``fail``, its name and what it found, and
exits 1 if any check failed (2 for bad options). Nothing runs on the device:
the kernel check reads the installed signature and op schema.

Checked: the installed vLLM against the provenance record in its wheel;
torch and vllm_xpu_kernels against the pins the record carries; the XPU
devices (count, names, the Xe-core count the KV split plan reads); that vLLM
forwards ``num_splits_kv`` (patch 0008) and the kernel accepts it; the
oneAPI / oneCCL variables of the serving recipe (:data:`RECIPE_DEVICE_ENV`)
and the series' options as the server will get them (``--additional-config``:
validated, debug options warn, a ``VLLM_XPU_LAGUNA_*`` variable fails); with
``--model`` the target's quantization and what ``--kv-cache-dtype auto``
resolves to; with ``--draft`` a DFlash drafter that fits the target and
which drafter it is, told by content as the configuration contract tells it
(:mod:`vllm.xpu_laguna.drafter`).

Without an XPU every device check says ``no XPU device: ...``. A serving
machine needs one, so those lines fail; ``--no-device`` (checking a wheel or
model directories elsewhere) makes them warnings.
"""

import argparse
import ast
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from vllm.xpu_laguna import drafter

OK, WARN, FAIL = "ok", "warn", "fail"
NO_XPU = "no XPU device: "

# Device variables of the serving recipe (TP 4 on 4x Arc Pro B70); the doctor
# says whether each is set, the values are the recipe's. Which GPUs the
# ranks see, and oneCCL's transport and LL256 all-reduce knobs behind XCCL
# (vLLM's XPU worker defaults CCL_ATL_TRANSPORT to "ofi"; oneCCL's defaults
# pick the LL256 ring for Laguna's message sizes, and pinning them keeps the
# reduction order fixed across oneCCL builds).
RECIPE_DEVICE_ENV: dict[str, str] = {
    "ONEAPI_DEVICE_SELECTOR": "which Level Zero GPUs SYCL exposes",
    "ZE_AFFINITY_MASK": "which devices Level Zero exposes to the ranks",
    "CCL_ATL_TRANSPORT": "oneCCL transport between the ranks",
    "CCL_TOPO_P2P_ACCESS": "oneCCL peer-to-peer access between the cards",
}
# Settings a third-party 4x B70 note saw corrupt all-reduce results.
BAD_DEVICE_ENV: dict[str, str] = {"CCL_SYCL_ALLREDUCE_ARC": "1"}
DEFAULT_TENSOR_PARALLEL_SIZE = 4

# The target checkpoint's weight scheme (compressed-tensors, routed experts).
TARGET_WEIGHTS = {
    "num_bits": 4,
    "type": "int",
    "symmetric": True,
    "strategy": "group",
    "group_size": 32,
}
TARGET_ARCHITECTURE = "LagunaForCausalLM"
_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})/")


@dataclasses.dataclass(frozen=True)
class Check:
    status: str
    name: str
    detail: str

    def line(self, width: int = 20) -> str:
        return f"{self.status:<4}  {self.name:<{width}}  {self.detail}"


# ------------------------------------------------------------- installation


def _dist_version(*names: str) -> tuple[str, str] | None:
    """(distribution, version) of the first of ``names`` that is installed."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_provenance(
    record: dict[str, Any] | None,
    installed: tuple[str, str] | None,
    package_dir: Path,
) -> Check:
    """The installed vLLM against the record its wheel carries."""
    from vllm.xpu_laguna.provenance import PROVENANCE_FILE, SCHEMA

    name = "provenance"
    if record is None:
        why = "this vLLM was not installed from a wheel of the XPU Laguna series"
        return Check(FAIL, name, f"no {PROVENANCE_FILE} in {package_dir}: {why}")
    if record.get("schema") != SCHEMA:
        got = record.get("schema")
        return Check(FAIL, name, f"record schema {got!r}, expected {SCHEMA!r}")
    want = record.get("version")
    if installed is None or installed[1] != want:
        got = "no vllm distribution" if installed is None else "=".join(installed)
        return Check(FAIL, name, f"installed {got}, the record says vllm=={want}")
    problems = []
    shipped = [o for o in record.get("overlay", []) if o["path"].startswith("vllm/")]
    for item in shipped:
        path = package_dir.parent / item["path"]
        if not path.is_file():
            problems.append(f"{item['path']} is missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != item["sha256"]:
            problems.append(f"{item['path']} differs from the record")
    if problems:
        first = f"{len(problems)} overlay file(s) changed since install, first"
        return Check(FAIL, name, f"{first}: {problems[0]}")
    tool = record.get("tool", {})
    revision = str(tool.get("revision"))[:12] + (
        " (dirty)" if tool.get("dirty") else ""
    )
    patches = len(record.get("patches", []))
    return Check(
        OK,
        name,
        f"vllm {want}: {patches} patches, {len(shipped)} overlay files match, "
        f"tool revision {revision}",
    )


def check_pins(
    record: dict[str, Any] | None,
    torch_version: tuple[str, str] | None,
    kernels_version: tuple[str, str] | None,
    device_status: str,
    have_xpu: bool,
) -> list[Check]:
    """Installed torch and vllm_xpu_kernels against the wheel's runtime pins.
    The kernel package belongs to the device stack: missing, it is
    ``device_status``."""
    pins = (record or {}).get("pins", {}).get("xpu_runtime", {})
    out = []
    for name, got in (("torch", torch_version), ("vllm_xpu_kernels", kernels_version)):
        want = pins.get(name)
        if got is None and name == "torch":
            out.append(Check(FAIL, name, "not installed"))
        elif got is None:
            prefix = "" if have_xpu else NO_XPU
            out.append(Check(device_status, name, f"{prefix}not installed"))
        elif want is None:
            detail = f"{got[1]} installed; no provenance record, no pin to compare"
            out.append(Check(WARN, name, detail))
        elif got[1].split("+", 1)[0] != want:
            detail = f"{got[1]} installed, the wheel pins {name}=={want}"
            out.append(Check(FAIL, name, detail))
        elif name == "torch" and "+" in got[1] and not got[1].endswith("+xpu"):
            detail = f"{got[1]} installed: not the XPU build of torch=={want}"
            out.append(Check(FAIL, name, detail))
        else:
            out.append(Check(OK, name, f"{got[1]} (pinned {want})"))
    return out


def check_triton_pin(
    record: dict[str, Any] | None,
    triton_version: tuple[str, str] | None,
    device_status: str,
    have_xpu: bool,
) -> Check:
    """The installed Triton against the wheel's XPU Triton pin (``3.9.0+xpu``:
    the XPU build, from its own index). A Triton without the pin's local label
    is another build (PyPI's CUDA/CPU Triton): it cannot compile for an XPU."""
    want = (record or {}).get("pins", {}).get("xpu_runtime", {}).get("triton")
    if triton_version is None:
        prefix = "" if have_xpu else NO_XPU
        return Check(device_status, "triton", f"{prefix}not installed")
    dist, got = triton_version
    if want is None:
        detail = f"{dist} {got} installed; no provenance record, no pin to compare"
        return Check(WARN, "triton", detail)
    if got.split("+", 1)[0] != want.split("+", 1)[0]:
        return Check(FAIL, "triton", f"{dist} {got} installed, the wheel pins {want}")
    if "+" in want and got.partition("+")[2] != want.partition("+")[2]:
        detail = f"{dist} {got} installed: not the XPU build the wheel pins ({want})"
        return Check(FAIL, "triton", detail)
    return Check(OK, "triton", f"{dist} {got} (pinned {want})")


def check_xpu_stack(xpu: Any, torch_module: Any) -> Check:
    """The oneAPI runtime torch was built with and device 0's driver, where
    readable: reported, not pinned (pins.toml pins the Python packages)."""
    if not _xpu_available(xpu):
        return Check(WARN, "xpu-stack", f"{NO_XPU}driver not read")
    oneapi = getattr(getattr(torch_module, "version", None), "xpu", None) or "unknown"
    try:
        driver = getattr(xpu.get_device_properties(0), "driver_version", "unknown")
    except RuntimeError as exc:
        driver = f"not readable ({exc})"
    return Check(OK, "xpu-stack", f"oneAPI {oneapi}; device 0 driver {driver}")


# ------------------------------------------------------------------- device


def _xpu() -> Any:
    """``torch.xpu``, or None when torch has no XPU support."""
    import torch

    return getattr(torch, "xpu", None)


def _xpu_available(xpu: Any) -> bool:
    try:
        return bool(xpu is not None and xpu.is_available())
    except Exception:
        return False


def check_devices(xpu: Any, tensor_parallel_size: int, no_xpu: str) -> list[Check]:
    """Device count and names, and each device's Xe-core count as the split
    plan reads it (:func:`split_plan.device_xe_cores`)."""
    from vllm.xpu_laguna.attention import split_plan

    if not _xpu_available(xpu):
        modelled = split_plan.REFERENCE_XE_CORES
        return [
            Check(no_xpu, "xpu-devices", f"{NO_XPU}torch.xpu is not available"),
            Check(
                no_xpu,
                "xpu-xe-cores",
                f"{NO_XPU}the KV split plan's Xe-core count was not read (the "
                f"CPU reference models {modelled})",
            ),
        ]
    count = int(xpu.device_count())
    listed = ", ".join(f"{i}: {xpu.get_device_name(i)}" for i in range(count))
    if count < tensor_parallel_size:
        need = f"tensor parallel {tensor_parallel_size} needs one per rank"
        devices = Check(FAIL, "xpu-devices", f"{count} visible ({listed}); {need}")
    else:
        devices = Check(OK, "xpu-devices", f"{count} visible ({listed})")
    cores = []
    for i in range(count):
        try:
            cores.append(split_plan.device_xe_cores(i))
        except RuntimeError as exc:
            return [devices, Check(FAIL, "xpu-xe-cores", f"device {i}: {exc}")]
    if len(set(cores)) > 1:
        why = "the split plan reads device 0 in every rank"
        xe = Check(FAIL, "xpu-xe-cores", f"devices differ ({cores}); {why}")
    else:
        what = "gpu_slices x gpu_subslices_per_slice, as the split plan reads it"
        xe = Check(OK, "xpu-xe-cores", f"{cores[0] if cores else '-'} ({what})")
    return [devices, xe]


def _forwards(tree: ast.Module, cls: str, func: str, arg: str) -> bool:
    """Whether ``cls.func`` takes the keyword ``arg`` and passes it on as
    ``arg=arg`` in a call."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for item in node.body:
            if not (isinstance(item, ast.FunctionDef) and item.name == func):
                continue
            names = [a.arg for a in item.args.args + item.args.kwonlyargs]
            calls = [c for c in ast.walk(item) if isinstance(c, ast.Call)]
            passed = any(
                k.arg == arg and isinstance(k.value, ast.Name) and k.value.id == arg
                for c in calls
                for k in c.keywords
            )
            return arg in names and passed
    return False


def check_vllm_forwards_split_count(xpu_ops_source: Path | None) -> Check:
    """Patch 0008: ``_xpu_ops.xpu_ops.flash_attn_varlen_func`` forwards
    ``num_splits_kv``. Read from the source: importing ``vllm._xpu_ops``
    needs the kernel package."""
    name = "vllm-num-splits-kv"
    if xpu_ops_source is None or not xpu_ops_source.is_file():
        return Check(FAIL, name, "vllm/_xpu_ops.py not found in the installed vllm")
    tree = ast.parse(xpu_ops_source.read_text(encoding="utf-8"))
    func = "_xpu_ops.flash_attn_varlen_func"
    if _forwards(tree, "xpu_ops", "flash_attn_varlen_func", "num_splits_kv"):
        return Check(OK, name, f"{func} forwards num_splits_kv (patch 0008)")
    return Check(
        FAIL,
        name,
        f"{func} does not forward num_splits_kv: patch 0008 is not in effect, "
        "the exact path's split plan never reaches the kernel",
    )


def _kernel_interface() -> tuple[Any, Any]:
    """The kernel's Python entry point and its C++ op (imported, not run)."""
    import torch
    from vllm_xpu_kernels import flash_attn_interface

    op = torch.ops._vllm_fa2_C.varlen_fwd.default
    return flash_attn_interface.flash_attn_varlen_func, op


def check_kernel_split_count(load: Any, have_xpu: bool, kernels_status: str) -> Check:
    """The installed kernel takes an explicit KV split count: the Python
    wrapper's ``num_splits_kv`` keyword, passed on as the op's ``num_splits``
    argument (signature and schema only)."""
    name = "kernel-num-splits-kv"
    try:
        func, op = load()
    except Exception as exc:  # ImportError, or the op library failing to load
        prefix = "" if have_xpu else NO_XPU
        error = f"{type(exc).__name__}: {str(exc)[:120]}"
        detail = f"{prefix}vllm_xpu_kernels flash attention not loadable ({error})"
        return Check(kernels_status, name, detail)
    schema_args = [a.name for a in op._schema.arguments]
    if "num_splits_kv" not in inspect.signature(func).parameters:
        why = "the kernel picks the split count, verify rows past ~2K tokens differ"
        return Check(
            FAIL, name, f"flash_attn_varlen_func takes no num_splits_kv: {why}"
        )
    if "num_splits" not in schema_args:
        args = ", ".join(schema_args)
        detail = f"op {op._schema.name} has no num_splits argument ({args})"
        return Check(FAIL, name, detail)
    detail = f"flash_attn_varlen_func(num_splits_kv=) -> {op._schema.name}(num_splits)"
    return Check(OK, name, detail)


# -------------------------------------------------------------- environment


def check_environment(environ: dict[str, str]) -> list[Check]:
    """The recipe's device variables: set or not (not their values)."""
    out = []
    for var, what in RECIPE_DEVICE_ENV.items():
        if var in environ:
            out.append(Check(OK, var, f"{environ[var]!r} ({what})"))
        else:
            out.append(Check(WARN, var, f"unset; the serving recipe sets it ({what})"))
    for var, bad in BAD_DEVICE_ENV.items():
        if environ.get(var) == bad:
            why = "a third-party 4x B70 note saw it corrupt all-reduce results"
            out.append(Check(WARN, var, f"={bad}: {why}"))
    return out


def check_options(
    additional_config: dict[str, Any], environ: dict[str, str]
) -> list[Check]:
    """The series' options as the server will get them (``--additional-config``)
    and no ``VLLM_XPU_LAGUNA_*`` variable (the series refuses one); debug
    options warn."""
    from vllm.xpu_laguna.options import (
        ADDITIONAL_CONFIG_KEY,
        XpuLagunaOptions,
        XpuLagunaOptionsError,
        refuse_environment,
    )

    out = []
    try:
        refuse_environment(environ)
    except XpuLagunaOptionsError as err:
        out.append(Check(FAIL, "series-environment", str(err)))
    raw = additional_config.get(ADDITIONAL_CONFIG_KEY)
    try:
        options = (
            XpuLagunaOptions() if raw is None else XpuLagunaOptions.from_mapping(raw)
        )
    except XpuLagunaOptionsError as err:
        return [*out, Check(FAIL, "series-options", str(err))]
    values = (
        f"exact verify {options.exact_verify}, width {options.verify_width}, "
        f"prebuilt metadata {options.prebuilt_metadata}, breakable graph "
        f"{options.breakable_graph}"
    )
    out.append(Check(OK, "series-options", values))
    for name in (
        "debug_no_split_plan",
        "debug_prebuilt_full_guard",
        "debug_xccl_standin",
    ):
        if getattr(options, name):
            out.append(Check(WARN, name, "on: a debug option, not for serving"))
    return out


def _config(directory: Path) -> tuple[dict[str, Any] | None, str]:
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path}: no such file"
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"{path}: not readable JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"{path}: not a JSON object"
    return data, ""


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _weight_scheme_problem(quant: dict[str, Any]) -> str | None:
    if quant.get("quant_method") != "compressed-tensors":
        return f"quant_method is {quant.get('quant_method')!r}, not compressed-tensors"
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return "quantization_config has no config_groups"
    for group_name, group in groups.items():
        weights = group.get("weights") or {}
        wrong = {
            k: weights.get(k) for k, v in TARGET_WEIGHTS.items() if weights.get(k) != v
        }
        if wrong:
            return f"group {group_name}: weights {wrong}, expected {TARGET_WEIGHTS}"
        if group.get("input_activations") is not None:
            return f"group {group_name}: quantized activations (not W4A16)"
    return None


def check_target(directory: Path) -> tuple[list[Check], dict[str, Any] | None]:
    """The target's architecture and weight quantization, and what
    ``--kv-cache-dtype auto`` resolves to for it (FP8 when the checkpoint
    declares a ``kv_cache_scheme``: the attention layer's rule)."""
    config, error = _config(directory)
    if config is None:
        return [Check(FAIL, "target-model", error)], None
    archs = config.get("architectures") or []
    quant = config.get("quantization_config")
    if TARGET_ARCHITECTURE not in archs:
        problem = f"architectures {archs}, not {TARGET_ARCHITECTURE}"
    elif not isinstance(quant, dict):
        problem = "no quantization_config: not the INT4 checkpoint"
    else:
        problem = _weight_scheme_problem(quant)
    layers = _text_config(config).get("num_hidden_layers")
    scheme = "compressed-tensors W4A16 (symmetric INT4, group 32)"
    model = Check(
        FAIL if problem else OK,
        "target-model",
        problem or f"{TARGET_ARCHITECTURE}, {scheme}, {layers} layers",
    )
    kv_scheme = quant.get("kv_cache_scheme") if isinstance(quant, dict) else None
    if kv_scheme is not None:
        kv = Check(
            WARN,
            "kv-cache-dtype",
            f"auto resolves to fp8 (the checkpoint declares kv_cache_scheme "
            f"{kv_scheme}); the recipe must pass --kv-cache-dtype bfloat16 "
            "(FP8 KV is not token-exact)",
        )
    else:
        dtype = _text_config(config).get("torch_dtype") or config.get("dtype")
        detail = f"auto resolves to the model dtype ({dtype}; no kv_cache_scheme)"
        kv = Check(OK, "kv-cache-dtype", detail)
    return [model, kv], config


def check_draft(directory: Path, target: dict[str, Any] | None) -> Check:
    """A DFlash drafter that fits the target: architecture ``DFlash*``, no
    quantization config, ``dflash_config.target_layer_ids`` (where vLLM's
    ``laguna_dflash`` reads them) inside the target, the target's hidden
    size and vocabulary (it shares the target's lm_head). Which drafter it
    is (the BF16 target's has the same shapes and config) is
    :func:`check_draft_identity`'s question."""
    name = "draft-model"
    config, error = _config(directory)
    if config is None:
        return Check(FAIL, name, error)
    archs = config.get("architectures") or []
    if not any(str(a).startswith("DFlash") for a in archs):
        return Check(FAIL, name, f"architectures {archs}: not a DFlash drafter")
    if config.get("quantization_config") is not None:
        why = "the INT4-matched DFlash drafter is BF16"
        return Check(FAIL, name, f"has a quantization_config; {why}")
    nested = config.get("dflash_config")
    ids = nested.get("target_layer_ids") if isinstance(nested, dict) else None
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) for i in ids)
        or len(set(ids)) != len(ids)
    ):
        what = "not a non-empty list of distinct ints"
        return Check(FAIL, name, f"dflash_config.target_layer_ids {ids!r}: {what}")
    if target is None:
        detail = f"{archs[0]}, target layers {ids}; no target to match (pass --model)"
        return Check(WARN, name, detail)
    text = _text_config(target)
    layers = text.get("num_hidden_layers")
    for key, target_key in (
        ("hidden_size", "hidden_size"),
        ("draft_vocab_size", "vocab_size"),
    ):
        want, got = text.get(target_key), config.get(key)
        if got != want:
            detail = f"{key} {got}, the target's {target_key} is {want}"
            return Check(FAIL, name, detail)
    if isinstance(layers, int) and not all(0 <= i < layers for i in ids):
        detail = f"target_layer_ids {ids} outside the target's {layers} layers"
        return Check(FAIL, name, detail)
    dtype = config.get("torch_dtype") or config.get("dtype")
    return Check(
        OK,
        name,
        f"{archs[0]}, {dtype} (no quantization_config), hidden "
        f"{config.get('hidden_size')}, target layers {ids} of {layers}",
    )


def check_draft_identity(directory: Path, known: drafter.KnownDrafters) -> Check:
    """Which drafter the directory holds, told by content as the contract
    tells it (:func:`vllm.xpu_laguna.drafter.identify`): the INT4-matched
    one passes, the BF16 one fails, any other warns (acceptance may collapse;
    exactness does not change)."""
    name = "draft-identity"
    identity = drafter.identify(directory, None, known)
    use = drafter.pinned_drafter(known)
    if identity.kind == drafter.MATCHED:
        return Check(OK, name, f"the INT4-matched drafter ({identity.evidence})")
    if identity.kind == drafter.BF16:
        detail = f"the BF16 drafter ({identity.evidence}): it accepts ~0% against INT4"
        return Check(FAIL, name, f"{detail}; use {use}")
    return Check(
        WARN,
        name,
        f"not identified as the INT4-matched drafter ({identity.evidence}): "
        f"acceptance may collapse; use {use}",
    )


def check_revision(name: str, directory: Path, pinned: str | None) -> Check:
    """A hub snapshot directory names its revision; compare it with the pin."""
    found = _SNAPSHOT.search(directory.resolve().as_posix() + "/")
    pin = pinned or "nothing (no provenance record)"
    if found is None:
        where = "not told by the files (not a hub snapshot directory)"
        return Check(WARN, name, f"revision {where}; pinned {pin}")
    if pinned is not None and found.group(1) != pinned:
        return Check(WARN, name, f"snapshot {found.group(1)}, pinned {pin}")
    return Check(OK, name, f"snapshot {found.group(1)} (pinned {pin})")


# ---------------------------------------------------------------------- cli


def run(args: argparse.Namespace, environ: dict[str, str]) -> list[Check]:
    from vllm.xpu_laguna import provenance

    device_status = WARN if args.no_device else FAIL
    record = provenance.load()
    checks = [
        check_provenance(record, _dist_version("vllm"), provenance.VLLM_PACKAGE_DIR)
    ]
    xpu = _xpu()
    have_xpu = _xpu_available(xpu)
    kernels = _dist_version("vllm_xpu_kernels", "vllm-xpu-kernels")
    checks += check_pins(
        record, _dist_version("torch"), kernels, device_status, have_xpu
    )
    triton = _dist_version("pytorch-triton-xpu", "triton-xpu", "triton")
    checks.append(check_triton_pin(record, triton, device_status, have_xpu))
    checks += check_devices(xpu, args.tensor_parallel_size, device_status)
    import torch

    checks.append(check_xpu_stack(xpu, torch))
    spec = importlib.util.find_spec("vllm._xpu_ops")
    source = Path(spec.origin) if spec is not None and spec.origin else None
    checks.append(check_vllm_forwards_split_count(source))
    checks.append(check_kernel_split_count(_kernel_interface, have_xpu, device_status))
    checks += check_environment(environ)
    checks += check_options(args.additional_config, environ)
    pins = (record or {}).get("pins", {})
    target = None
    if args.model is None:
        checks.append(Check(WARN, "target-model", "not checked (pass --model DIR)"))
    else:
        target_checks, target = check_target(args.model)
        checks += target_checks
        pinned = pins.get("target", {}).get("revision")
        checks.append(check_revision("target-revision", args.model, pinned))
    if args.draft is None:
        checks.append(Check(WARN, "draft-model", "not checked (pass --draft DIR)"))
    else:
        checks.append(check_draft(args.draft, target))
        known = drafter.KnownDrafters.from_record(record)
        checks.append(check_draft_identity(args.draft, known))
    return checks


def _directory(value: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: not a directory")
    return path


def _json_object(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return parsed


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vllm.xpu_laguna.doctor",
        description=(
            "Check a machine that serves Laguna-S-2.1-INT4 + DFlash with the XPU "
            "Laguna series: the installed vLLM against its provenance record, "
            "torch and vllm_xpu_kernels against the wheel's pins, the XPU "
            "devices, the kernel's explicit KV split count, the recipe's device "
            "variables and the model directories. One line per check (ok, "
            "warn, fail); exit status 1 if any check fails, 2 for bad options."
        ),
        epilog=(
            "Without an XPU, every device check (devices, Xe cores, the kernel "
            "package) says 'no XPU device' and fails: a serving machine needs "
            "one. --no-device makes those lines warnings, for checking a wheel "
            "or model directories on a machine without an XPU. Unset recipe "
            "variables are warnings; nothing is launched on the device."
        ),
    )
    p.add_argument(
        "--model",
        type=_directory,
        default=None,
        metavar="DIR",
        help="target checkpoint directory, its config.json is read (default: "
        "not checked)",
    )
    p.add_argument(
        "--draft",
        type=_directory,
        default=None,
        metavar="DIR",
        help="DFlash drafter directory, checked against --model (default: not checked)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=DEFAULT_TENSOR_PARALLEL_SIZE,
        metavar="N",
        help="ranks the server will run, one XPU each (default: "
        f"{DEFAULT_TENSOR_PARALLEL_SIZE}, the recipe's)",
    )
    p.add_argument(
        "--additional-config",
        type=_json_object,
        default={},
        metavar="JSON",
        help="the JSON the server gets as --additional-config; its "
        "'xpu_laguna' options are validated and shown (default: none, the "
        "series' defaults)",
    )
    p.add_argument(
        "--no-device",
        action="store_true",
        help="not the serving machine: a missing XPU or kernel package is a "
        "warning, not a failure (default: failure)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.tensor_parallel_size < 1:
        parser().error("--tensor-parallel-size must be at least 1")
    checks = run(args, dict(os.environ))
    width = max(len(c.name) for c in checks)
    for check in checks:
        print(check.line(width))
    failed = [c.name for c in checks if c.status == FAIL]
    warned = sum(c.status == WARN for c in checks)
    listed = f" (failed: {', '.join(failed)})" if failed else ""
    print(f"{len(checks)} checks: {len(failed)} failed, {warned} warnings{listed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
