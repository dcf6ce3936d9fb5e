"""The matrix's preloaded leg start (scripts/matrix/preloaded.py): a fork of the forkserver gets
the leg's environment, the PYTHONPATH entries a fresh interpreter would have on sys.path, its own
log and its own exit code. The forks here come from a forkserver that imports nothing
(``preload=()``), not vLLM (the default), so these tests need no vLLM and no 11 s import. (That the
legs' numerics are those of a fresh interpreter is what the e2e matrix tests show: every leg there
starts preloaded and is gated bitwise against its teacher, and the diagnostic legs, set up only
through their environment, must differ.)"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from scripts.matrix.preloaded import leg_start, run_preloaded

PROBE = textwrap.dedent(
    """
    import json, os, sys

    def main(argv):
        print("to stdout")
        print("to stderr", file=sys.stderr)
        with open(argv[0], "w") as f:
            json.dump({"toggle": os.environ.get("VXL_PROBE_TOGGLE"), "path": sys.path, "pid": os.getpid()}, f)
        if argv[1] == "crash":
            os.abort()
        return int(argv[1])
    """
)


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    folder = tmp_path / "probe_dir"
    folder.mkdir()
    (folder / "matrix_probe.py").write_text(PROBE)
    return folder


def test_auto_is_preloaded_on_cpu_only() -> None:
    assert [leg_start("auto", d) for d in ("cpu", "xpu", "cuda")] == ["preloaded", "fresh", "fresh"]
    assert leg_start("fresh", "cpu") == "fresh" and leg_start("preloaded", "cpu") == "preloaded"


def test_preloaded_on_a_device_is_refused() -> None:
    with pytest.raises(ValueError, match="for CPU runs; on xpu every leg starts fresh"):
        leg_start("preloaded", "xpu")


def test_fork_gets_the_leg_environment_path_log_and_exit_code(tmp_path: Path, probe: Path) -> None:
    log, out = tmp_path / "leg.log", tmp_path / "out.json"
    env = {"VXL_PROBE_TOGGLE": "1", "PYTHONPATH": str(probe)}
    done = run_preloaded([str(out), "3"], env, log, entry="matrix_probe:main", timeout_s=60, preload=())
    assert done.returncode == 3 and not done.timed_out
    seen = json.loads(out.read_text())
    assert seen["toggle"] == "1"
    assert str(probe) in seen["path"] and seen["path"].index(str(probe)) == 1  # where PYTHONPATH goes
    text = log.read_text()
    assert "to stdout" in text and "to stderr" in text and "a fork of the preloaded interpreter" in text
    # the next fork starts from the forkserver again: the first fork's environment is not there
    code = run_preloaded(
        [str(out), "0"], {"PYTHONPATH": str(probe)}, log, entry="matrix_probe:main", timeout_s=60, preload=()
    ).returncode
    again = json.loads(out.read_text())
    assert code == 0 and again["toggle"] is None and again["pid"] != seen["pid"]


def test_a_crashed_fork_is_a_nonzero_exit(tmp_path: Path, probe: Path) -> None:
    out = tmp_path / "out.json"
    done = run_preloaded(
        [str(out), "crash"],
        {"PYTHONPATH": str(probe)},
        tmp_path / "leg.log",
        entry="matrix_probe:main",
        timeout_s=60,
        preload=(),
    )
    assert done.returncode != 0 and not done.timed_out and out.exists()
