"""A long-lived local Spark Connect server, started from the pyspark package's own scripts.

A run in a fresh process pays for starting Spark (a JVM, its JIT, the Python workers) every
time; a run against a server that is already up pays only for its own work. `dpone spark-server
start` launches `sbin/start-connect-server.sh` of the installed pyspark (its jars hold the Connect
server) with the engine's server-side settings, and `DPONE_SPARK_REMOTE=sc://127.0.0.1:<port>`
points `dpone run` and the Dagster Spark resource at it.

Server-side settings (task retries, JVM options, JDBC jars, the executors' Python) belong to the
server: a Connect client cannot change them. Its pid and log files live under `state_dir`
(default .dpone/spark-connect), so `stop` and `status` find the server a `start` launched.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone_dagster.child_env import child_environ
from dpone_dagster.errors import ConfigError

DEFAULT_PORT = 15002
DEFAULT_STATE_DIR = ".dpone/spark-connect"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    pid: int | None
    port: int
    log: str | None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def server_args(port: int, master: str, conf: dict[str, Any]) -> list[str]:
    """The start script's arguments: master, port, and every server-side setting."""
    args = ["--master", master, "--conf", f"spark.connect.grpc.binding.port={port}"]
    for key, value in conf.items():
        if key not in ("spark.master", "spark.remote"):
            args += ["--conf", f"{key}={value}"]
    return args


def _environment(state_dir: Path) -> dict[str, str]:
    env = child_environ()  # credentials stay in this process (child_env.py)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_PID_DIR=str(state_dir),
        SPARK_LOG_DIR=str(state_dir),
        SPARK_IDENT_STRING="dpone",
        # The server's Python workers run the engine: this interpreter has it installed.
        PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
    )
    return env


def _pid_file(state_dir: Path) -> Path:
    return state_dir / f"spark-dpone-{CONNECT_CLASS}-1.pid"


def _port_file(state_dir: Path) -> Path:
    return state_dir / "port"


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def status(state_dir: str | Path = DEFAULT_STATE_DIR) -> ServerStatus:
    state = Path(state_dir)
    port = int(_port_file(state).read_text()) if _port_file(state).exists() else DEFAULT_PORT
    pid = int(_pid_file(state).read_text().strip()) if _pid_file(state).exists() else None
    alive = pid is not None and Path(f"/proc/{pid}").exists()
    logs = sorted(state.glob("spark-dpone-*.out"))
    return ServerStatus(alive and _port_open(port), pid if alive else None, port, str(logs[-1]) if logs else None)


def start(
    port: int = DEFAULT_PORT,
    master: str | None = None,
    conf: dict[str, Any] | None = None,
    state_dir: str | Path = DEFAULT_STATE_DIR,
    timeout_s: float = 120.0,
) -> ServerStatus:
    """Start the server (or return the one already running) and wait until it accepts clients."""
    from dpone_dagster.spark.session import default_spark_conf

    state = Path(state_dir).resolve()
    current = status(state)
    if current.running:
        return current
    if _port_open(port):
        raise ConfigError(f"port {port} is in use by another process; pass --port")
    state.mkdir(parents=True, exist_ok=True)
    _port_file(state).write_text(str(port))
    # Sessions of this server upload no artifacts of their own; without isolation they share the
    # Python workers (and their imports) instead of starting new ones per session: a warm
    # 1,000-message `dpone run` took 3.9 s instead of 6.4 s (bench/small_runs.py). dpone's runs
    # share one session (session.shared_session), which an idle hour must not close.
    settings = {
        **default_spark_conf(),
        "spark.sql.artifact.isolation.enabled": "false",
        "spark.connect.session.manager.defaultSessionTimeout": "30d",
        # A run's local checkpoint (the SQL direct path on a cluster master) is freed when the
        # server's JVM collects the frame its client dropped: at most this long after the run.
        "spark.cleaner.periodicGC.interval": "5min",
        **(conf or {}),
    }
    master = master or str(settings.get("spark.master", "local[*]"))
    script = spark_home() / "sbin" / "start-connect-server.sh"
    subprocess.run(
        ["bash", str(script), *server_args(port, master, settings)],
        env=_environment(state),
        check=True,
        capture_output=True,
        text=True,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = status(state)
        if current.running:
            return current
        if current.pid is None and _pid_file(state).exists():
            break  # the process is gone
        time.sleep(0.5)
    log = status(state).log
    tail = Path(log).read_text()[-2000:] if log else "(no log)"
    raise ConfigError(f"the Spark Connect server did not start within {timeout_s:.0f}s; its log ends:\n{tail}")


def stop(state_dir: str | Path = DEFAULT_STATE_DIR, timeout_s: float = 60.0) -> bool:
    """Stop the server `start` launched; False when none was running."""
    state = Path(state_dir).resolve()
    if status(state).pid is None:
        return False
    script = spark_home() / "sbin" / "stop-connect-server.sh"
    subprocess.run(["bash", str(script)], env=_environment(state), check=False, capture_output=True, text=True)
    deadline = time.monotonic() + timeout_s
    while status(state).pid is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    return True
