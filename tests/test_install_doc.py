"""docs/install-xpu.md installs the wheel's XPU runtime from pins.toml: its commands, run as a shell
runs them (``pip`` recorded, not run), ask for exactly the pinned versions from the pinned indexes,
and its prose names the same versions; a stale figure in the page fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from scripts import REPO_ROOT
from scripts.pins import Pins, load_pins

PAGE = REPO_ROOT / "docs" / "install-xpu.md"


def install_block(text: str) -> str:
    """The first ```bash block of the page's "Installing the wheel" section."""
    section = text.split("## Installing the wheel", 1)[1]
    match = re.search(r"```bash\n(.*?)\n```", section, re.DOTALL)
    assert match is not None, "no ```bash block under 'Installing the wheel'"
    return match.group(1)


def resolved_pip_commands(block: str, root: Path) -> list[list[str]]:
    """Each ``pip install`` line of ``block`` with its ``$(pin KEY)`` expanded by bash in ``root``
    (the block's own ``pin`` function reading ``root/pins.toml``); nothing is installed."""
    lines = block.splitlines()
    (pin_line,) = [line for line in lines if line.startswith("pin()")]
    pips = [line.split("#")[0].strip() for line in lines if line.startswith("pip install")]
    script = "\n".join([pin_line, *(f"printf '%s\\0' {p[len('pip install ') :]}; echo" for p in pips)])
    out = subprocess.run(["bash", "-c", script], cwd=root, capture_output=True, text=True, check=True).stdout
    return [[arg for arg in line.split("\0") if arg] for line in out.splitlines()]


def problems(text: str, pins: Pins, root: Path) -> list[str]:
    """What in the page disagrees with ``pins``, one line each."""
    xpu = pins.xpu_runtime
    found = []
    expected = [
        [f"torch=={xpu.torch}", "--index-url", xpu.torch_index_url],
        [f"triton=={xpu.triton}", "--extra-index-url", xpu.triton_index_url],
        [f"vllm_xpu_kernels=={xpu.vllm_xpu_kernels}", "--extra-index-url", xpu.vllm_xpu_kernels_url],
        [f"dist/vllm-{pins.vllm.version}+xpu.*.whl"],
    ]
    commands = resolved_pip_commands(install_block(text), root)
    if commands != expected:
        found.append(f"pip commands {commands} != {expected}")
    prose = text.split("```bash", 1)[0]
    for name, version in (("torch", xpu.torch), ("triton", xpu.triton), ("vllm_xpu_kernels", xpu.vllm_xpu_kernels)):
        named = re.findall(rf"`{name}==([^`]+)`", prose)
        if named != [version]:
            found.append(f"the prose names {name} {named}, pins.toml {version}")
    return found


def test_the_install_commands_and_prose_are_the_pins() -> None:
    assert problems(PAGE.read_text(encoding="utf-8"), load_pins(), REPO_ROOT) == []


def test_a_stale_version_in_the_page_or_in_the_pins_is_found(tmp_path: Path) -> None:
    text = PAGE.read_text(encoding="utf-8")
    pins = load_pins()
    stale = text.replace(f"`torch=={pins.xpu_runtime.torch}`", "`torch==2.14.0`", 1)
    assert problems(stale, pins, REPO_ROOT) == [f"the prose names torch ['2.14.0'], pins.toml {pins.xpu_runtime.torch}"]
    # pins.toml moved (a rebase) and the page's commands follow it, through pin(); the prose does not
    moved = (
        (REPO_ROOT / "pins.toml")
        .read_text(encoding="utf-8")
        .replace(f'vllm_xpu_kernels = "{pins.xpu_runtime.vllm_xpu_kernels}"', 'vllm_xpu_kernels = "9.9.9"')
    )
    (tmp_path / "pins.toml").write_text(moved, encoding="utf-8")
    moved_pins = load_pins(tmp_path / "pins.toml")
    assert moved_pins.xpu_runtime.vllm_xpu_kernels == "9.9.9"
    assert problems(text, moved_pins, tmp_path) == [
        f"the prose names vllm_xpu_kernels ['{pins.xpu_runtime.vllm_xpu_kernels}'], pins.toml 9.9.9"
    ]
