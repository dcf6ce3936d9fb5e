"""Upstream's requirement files read as pip reads them (scripts/requirements_file.py) and the rebase's
``[xpu_runtime]`` update read from requirements/xpu.txt (scripts/rebase/pins_update.py).

tests/fixtures/vllm-0.32.0/ and vllm-0.34.0/ hold requirements/xpu.txt, requirements/common.txt and
pyproject.toml copied unchanged from the real sdists (sha256 d2c957d5…f2ad and fcad848b…0113)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.errors import ToolError
from scripts.pins import parse_pins
from scripts.rebase.pins_update import parse_xpu_requirements, rewrite_pins
from scripts.requirements_file import logical_lines, read_requirements

FIXTURES = Path(__file__).parent / "fixtures"
TORCH_INDEX = "https://download.pytorch.org/whl/xpu"


def upstream(version: str, path: str) -> str:
    return (FIXTURES / f"vllm-{version}" / path).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- the real files


# What each real release's requirements/xpu.txt gives. 0.34.0 names three extra indexes (triton's,
# torch's, the kernels' own): a dry run onto it once kept 0.32.0's kernels index, because the old
# parser only chose when one was not torch's.
RELEASE_RUNTIMES = {
    "0.32.0": {
        "torch": "2.14.0",
        "torch_index_url": TORCH_INDEX,
        "vllm_xpu_kernels": "0.1.15.4",
        "vllm_xpu_kernels_url": "https://wheels.vllm.ai/xpu/",
        "triton": "3.8.0+xpu",
        "triton_index_url": "https://wheels.vllm.ai/xpu/",
    },
    "0.34.0": {
        "torch": "2.15.0",
        "torch_index_url": TORCH_INDEX,
        "vllm_xpu_kernels": "0.1.17",
        "vllm_xpu_kernels_url": "https://vllm-project.github.io/vllm-xpu-kernels/whl/",
        "triton": "3.9.0+xpu",
        "triton_index_url": "https://wheels.vllm.ai/xpu/",
    },
}


@pytest.mark.parametrize("version", sorted(RELEASE_RUNTIMES))
def test_real_xpu_requirements_give_the_release_runtime(version: str) -> None:
    assert parse_xpu_requirements(upstream(version, "requirements/xpu.txt")) == RELEASE_RUNTIMES[version]


def test_pins_toml_holds_what_the_rebase_reads_from_the_pinned_release() -> None:
    found = RELEASE_RUNTIMES["0.34.0"]
    pins = (FIXTURES.parent.parent / "pins.toml").read_text(encoding="utf-8")
    moved = parse_pins(rewrite_pins(pins, {"xpu_runtime": found}))  # pins.toml accepts what the rebase writes
    assert moved.xpu_runtime.vllm_xpu_kernels_url == found["vllm_xpu_kernels_url"]
    # what pins.toml pins today is what the tool reads from the pinned release
    assert parse_pins(pins).vllm.version == "0.34.0"
    assert {key: getattr(parse_pins(pins).xpu_runtime, key) for key in found} == found


def test_real_files_read_as_pip_reads_them() -> None:
    xpu = read_requirements(upstream("0.34.0", "requirements/xpu.txt"), "requirements/xpu.txt")
    assert xpu.requirement_files == ["common.txt"]
    assert xpu.extra_index_urls == [
        "https://wheels.vllm.ai/xpu/",
        TORCH_INDEX,
        "https://vllm-project.github.io/vllm-xpu-kernels/whl",
    ]
    triton = xpu.named("triton")[0]
    assert str(triton.requirement.specifier) == "==3.9.0+xpu" and triton.number == 4
    numba = xpu.named("numba")[0]  # a trailing comment is no part of the requirement
    assert numba.text == "numba == 0.65.0" and str(numba.requirement) == "numba==0.65.0"
    assert [line.name for line in xpu.named("vllm_xpu_kernels")] == ["vllm-xpu-kernels"]
    for version in ("0.32.0", "0.34.0"):  # every line of common.txt is one packaging reads
        common = read_requirements(upstream(version, "requirements/common.txt"), "requirements/common.txt")
        assert len(common.requirements) > 40 and not common.extra_index_urls


# --------------------------------------------------------------------------- the forms pip accepts


@pytest.mark.parametrize(
    "option",
    [
        "--extra-index-url={url}",
        "--extra-index-url {url}",
        "--extra-index-url   {url}   # torch's",
        "--index-url={url}",
        "-i {url}",
        "-i{url}",
        "--extra-index-url \\\n  {url}",
    ],
)
def test_index_lines_in_every_form(option: str) -> None:
    text = (
        "# XPU\n"
        + option.format(url=TORCH_INDEX)
        + "\nvllm-xpu-kernels == 0.1.17  # by version\n"
        + "--extra-index-url='https://kernels.example.invalid/simple'\n"
        + "Torch==2.15.0+xpu ; platform_machine == 'x86_64'\n"
    )
    assert parse_xpu_requirements(text) == {
        "torch": "2.15.0",
        "torch_index_url": TORCH_INDEX,
        "vllm_xpu_kernels": "0.1.17",
        "vllm_xpu_kernels_url": "https://kernels.example.invalid/simple/",
    }


def test_indexes_are_told_apart_by_url_not_by_line_order() -> None:
    """torch after the kernels' index, the kernels' index before torch's, triton's first: the same answer."""
    text = (
        "--extra-index-url https://vllm-project.github.io/vllm-xpu-kernels/whl\n"
        "torch==2.15.0\n"
        "--extra-index-url https://wheels.vllm.ai/xpu/\n"
        "vllm_xpu_kernels==0.1.17\n"
        f"--extra-index-url {TORCH_INDEX}\n"
        "triton==3.9.0+xpu\n"
    )
    found = parse_xpu_requirements(text)
    assert found["torch_index_url"] == TORCH_INDEX
    assert found["vllm_xpu_kernels_url"] == "https://vllm-project.github.io/vllm-xpu-kernels/whl/"


def test_markers_choose_the_line_for_the_xpu_machine() -> None:
    text = (
        f"--extra-index-url {TORCH_INDEX}\n--find-links /wheels\n-f/more\n-c constraints.txt\n"
        "torch==2.15.0; platform_machine == 'x86_64'\n"
        "torch==2.14.0; platform_machine == 'aarch64'\n"
        "torch==2.13.0; sys_platform == 'win32'\n"
    )
    assert parse_xpu_requirements(text) == {"torch": "2.15.0", "torch_index_url": TORCH_INDEX}
    parsed = read_requirements(text)
    assert parsed.find_links == ["/wheels", "/more"] and parsed.constraint_files == ["constraints.txt"]


def test_wheel_url_requirement_gives_the_kernels_url_and_version() -> None:
    url = "https://example.invalid/v0.1.11.1/vllm_xpu_kernels-0.1.11.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    found = parse_xpu_requirements(f"vllm-xpu-kernels @ {url} ; sys_platform == 'linux'\n")
    assert found == {"vllm_xpu_kernels": "0.1.11.1", "vllm_xpu_kernels_url": url}


def test_continuations_and_comments_as_pip_joins_them() -> None:
    text = "a \\\n  >= 1 # one\n# comment \\\nb==2 \\\n# ends the continuation\nc\n   # indented comment\n"
    assert logical_lines(text) == [(1, "a   >= 1"), (4, "b==2"), (6, "c")]
    assert [str(line.requirement) for line in read_requirements(text).requirements] == ["a>=1", "b==2", "c"]


# --------------------------------------------------------------------------- refusals, one line each


def _refusal(text: str) -> str:
    with pytest.raises(ToolError) as info:
        parse_xpu_requirements(text)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_line_packaging_rejects_is_named() -> None:
    message = _refusal(f"--extra-index-url {TORCH_INDEX}\n\ntorch===\n")
    assert (
        message.startswith("requirements/xpu.txt:3: not a requirement packaging can read") and "'torch==='" in message
    )
    assert "requirements/xpu.txt:1: option --extra-index-urls" in _refusal("--extra-index-urls x\n")
    assert "lacks its value" in _refusal("torch==2.15.0\n--extra-index-url\n")
    assert "cannot follow a requirement" in _refusal("torch==2.15.0 --no-deps\n")


def test_unknown_index_roles_are_refused() -> None:
    # no index whose path is torch's XPU wheel family
    message = _refusal("--extra-index-url https://example.invalid/simple\ntorch==2.15.0\n")
    assert "cannot tell which index serves torch" in message
    # two indexes besides torch's, neither naming the kernels
    message = _refusal(
        f"--extra-index-url {TORCH_INDEX}\n--extra-index-url https://a.invalid/\n--extra-index-url https://b.invalid/\n"
        "torch==2.15.0\nvllm_xpu_kernels==0.1.17\n"
    )
    assert "cannot tell which index serves vllm_xpu_kernels" in message
    # pinned to no single release
    assert "pins no single release" in _refusal(f"--extra-index-url {TORCH_INDEX}\ntorch>=2.14\n")
    # two torch lines for the same machine
    assert "2 requirements of torch apply" in _refusal(f"-i {TORCH_INDEX}\ntorch==2.15.0\ntorch==2.14.0\n")


def test_a_file_without_torch_or_kernels_leaves_them_to_the_caller() -> None:
    assert parse_xpu_requirements("-r common.txt\nray>=2.9\n") == {}
