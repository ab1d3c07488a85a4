"""A real phasespec server in a subprocess (uvicorn on loopback, real engine): for tests and load runs."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 600.0
ANNOUNCED = re.compile(r"Uvicorn running on https?://[^\s]+:(\d+) ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``python -m proxy.cli`` (or vLLM's own server) with the given flags; phasespec at its default
    log level, which logs the port it bound."""

    def __init__(
        self,
        *flags: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        vllm_server: bool = False,
        tls_ca: Path | None = None,
    ) -> None:
        """``tls_ca``: the server serves https (its flags carry the certificate); trust this CA."""
        self.port = 0
        """Known once started: phasespec binds port 0 and says which port it got; vLLM's own
        server gets a free port found here (a port closed here and bound by the child a moment
        later could be taken in between, by an engine starting beside it)."""
        self._scheme = "https" if tls_ca else "http"
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca else True
        self.log_path = log_path
        self._flags = flags
        self._vllm_server = vllm_server
        self._env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("wb")
        if self._vllm_server:
            self.port = free_port()
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1"]
            cmd += ["--port", str(self.port), *self._flags]
        else:
            self.port = 0
            cmd = [sys.executable, "-m", "proxy.cli", "--server.port", "0", *self._flags]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=self._env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            self.port = self.port or self._announced_port()
            try:
                if self.port and httpx.get(f"{self.base_url}/health", timeout=2, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"server did not become healthy:\n{self.log_tail()}")

    @property
    def base_url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}"

    def _announced_port(self) -> int:
        """The port in phasespec's "Uvicorn running on ...:PORT" line (0: not yet logged)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        found = ANNOUNCED.search(text)
        return int(found.group(1)) if found else 0

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
