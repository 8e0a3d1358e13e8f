"""A real ``mlflow server`` on loopback, for tests and benchmarks that track against one.

Started in its own process group (sqlite store and artifacts in a folder it is given) so a test
can kill it outright, as a crash would, and start it again on the same port and store.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, whatever the proxy settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(uri: str) -> bool:
    try:
        with NO_PROXY.open(uri.rstrip("/") + "/health", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


class MlflowServer:
    """`mlflow server` on loopback in its own process group; ``log_path`` holds what it printed."""

    def __init__(self, root: str, port: int | None = None):
        self.root = root
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(self.root, f"server-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 90.0) -> MlflowServer:
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", MLFLOW_DISABLE_TELEMETRY="true",
                   MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no huey job runners to leave behind
        command = [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db",
            "--artifacts-destination", f"{self.root}/artifacts",
        ]
        with open(self.log_path, "a") as log:  # the child keeps its own copy of the handle
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited early; see {self.log_path}")
            if healthy(self.uri):
                return self
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"mlflow server not ready within {timeout_s} s; see {self.log_path}")

    def kill(self) -> None:
        """SIGKILL the server and its uvicorn worker (its own process group), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None


@contextmanager
def running_mlflow_server() -> Iterator[MlflowServer]:
    """A started server in a fresh folder; killed, and the folder removed, when the block ends."""
    root = tempfile.mkdtemp(prefix="mlflow-server-")
    server = MlflowServer(root)
    try:
        yield server.start()
    finally:
        server.kill()
        shutil.rmtree(root, ignore_errors=True)
