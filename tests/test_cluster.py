"""The engine on a real Spark standalone cluster: one master and two workers on loopback, started
from pyspark's own `bin/spark-class`, each in its own process group.

The session-wide local SparkSession of conftest.py lives in this process and a second
SparkContext cannot, so every pipeline run here is a `python -m dpone_dagster.cli run` subprocess
(the driver) pointed at the cluster with DPONE_SPARK_MASTER. Assertions cover what reached the
sink topic, the stored offsets, and evidence from the workers themselves that they ran the tasks.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from confluent_kafka import Consumer, TopicPartition
from conftest import consume_all, create_topic, produce_json, unique_topic, write_manifest

from dpone_dagster.cli import main as dpone_main
from dpone_dagster.embedded_broker import free_port
from dpone_dagster.spark import cluster as spark_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

SPARK_HOME = Path(pyspark.__file__).resolve().parent
KAFKA_ENV_PREFIXES = ("KAFKA_CLUSTER_", "DPONE_CONN_KAFKA_CLUSTER_")
RETRY = re.compile(r"Running task (\d+\.[1-9]\d* in stage \d+\.\d+)")

# What the driver asks the cluster for: one 1-core executor per worker, and no task before both
# executors registered (so tasks visibly spread over the two workers).
CLUSTER_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.cores.max": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
}


# --------------------------------------------------------------------------- the cluster


class StandaloneCluster:
    """A Spark standalone master and workers on 127.0.0.1, each in its own process group."""

    def __init__(self, root: Path, workers: int = 2):
        self.root = root
        self.port, self.webui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.n_workers = workers
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.worker_ports = {i: free_port() for i in range(workers)}
        # The REST submission server (default port 6066) would collide with other clusters.
        self.properties = root / "spark-daemon.conf"
        self.properties.write_text("spark.master.rest.enabled false\nspark.worker.cleanup.enabled false\n")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            SPARK_HOME=str(SPARK_HOME),
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY="256m",
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            return subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args, "--properties-file", str(self.properties)],
                env=self.env(),
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def work_dir(self, i: int) -> Path:
        return self.root / f"worker{i}"

    def start(self, timeout_s: float = 180) -> StandaloneCluster:
        self.master = self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port),
        )  # fmt: skip
        self._wait(lambda: self.state() is not None, timeout_s, "master web UI")
        for i in range(self.n_workers):
            self.start_worker(i)
        self.wait_alive(self.n_workers, timeout_s)
        return self

    def start_worker(self, i: int) -> None:
        self.work_dir(i).mkdir(exist_ok=True)
        self.workers[i] = self._spawn(
            f"worker{i}",
            "org.apache.spark.deploy.worker.Worker", self.url,
            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--webui-port", str(self.worker_ports[i]), "--work-dir", str(self.work_dir(i)),
        )  # fmt: skip

    def state(self) -> dict[str, Any] | None:
        """The master's JSON status page, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as response:
                return json.load(response)
        except OSError:
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        state = self.state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def wait_alive(self, count: int, timeout_s: float = 180) -> None:
        self._wait(lambda: len(self.alive_workers()) >= count, timeout_s, f"{count} ALIVE workers")

    def ensure_workers(self) -> None:
        """Restart workers an earlier test killed."""
        for i, process in list(self.workers.items()):
            if process.poll() is not None:
                self.start_worker(i)
        self.wait_alive(self.n_workers)

    def kill_worker(self, i: int) -> None:
        """SIGKILL the worker's process group: the Worker JVM and the executor JVM it launched."""
        os.killpg(self.workers[i].pid, signal.SIGKILL)
        self.workers[i].wait(30)

    def kill_executors(self, i: int) -> int:
        """SIGKILL only the executor JVMs worker `i` launched (the worker stays and may start a
        replacement); returns how many were killed."""
        killed = 0
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == self.workers[i].pid and b"CoarseGrainedExecutorBackend" in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed += 1
            except (OSError, ValueError, IndexError):
                continue
        return killed

    def apps(self) -> list[dict[str, Any]]:
        state = self.state() or {}
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def executor_logs(self, app_id: str) -> dict[int, dict[str, str]]:
        """worker index -> {executor id: executor stderr} for one application."""
        logs: dict[int, dict[str, str]] = {}
        for i in range(self.n_workers):
            for stderr in sorted((self.work_dir(i) / app_id).glob("*/stderr")):
                logs.setdefault(i, {})[stderr.parent.name] = stderr.read_text(errors="replace")
        return logs

    def _wait(self, ready: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            if self.master is not None and self.master.poll() is not None:
                raise RuntimeError(f"spark master exited ({self.master.returncode}); see {self.root}/master.log")
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}; logs in {self.root}")

    def stop(self) -> None:
        processes = [p for p in [*self.workers.values(), self.master] if p is not None]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def cluster(standalone) -> StandaloneCluster:
    standalone.ensure_workers()
    return standalone


# --------------------------------------------------------------------------- driver runs


def driver_env(cluster: StandaloneCluster, bootstrap: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith((*KAFKA_ENV_PREFIXES, "PYSPARK_", "SPARK_"))}
    env.update(
        DPONE_SPARK_MASTER=cluster.url,
        DPONE_SPARK_CONF=json.dumps(CLUSTER_CONF),
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        KAFKA_CLUSTER_BOOTSTRAP_SERVERS=bootstrap,
    )
    env.update(extra)
    return env


def start_run(manifest: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """`dpone run M --format json` as the driver; output goes to files next to the manifest (a
    pipe nobody reads while the test polls could fill up and stall the driver)."""
    with open(manifest.parent / "driver.out", "w") as out, open(manifest.parent / "driver.log", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "dpone_dagster.cli", "run", str(manifest), "--format", "json"],
            env=env,
            cwd=manifest.parent,
            stdout=out,
            stderr=err,
            text=True,
        )


def finish_run(process: subprocess.Popen[str], folder: Path, timeout_s: float = 600) -> tuple[int, dict[str, Any], str]:
    """(exit code, the JSON summary, the driver's output: Spark's log and stderr)."""
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"dpone run did not finish in {timeout_s}s; driver output in {folder}")
    out = (folder / "driver.out").read_text(errors="replace")  # the JSON summary
    err = (folder / "driver.log").read_text(errors="replace")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no JSON summary (exit {process.returncode}); output tail:\n{(out + err)[-3000:]}"
    return process.returncode, json.loads(lines[-1]), out + err


def stored_state(manifest: Path) -> dict[str, Any]:
    """`dpone state show M --format json` (no Spark involved, so in-process)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert dpone_main(["state", "show", str(manifest), "--format", "json"]) == 0
    return json.loads(buffer.getvalue())


def set_offsets(manifest: Path, offsets: dict[int, int]) -> None:
    args = [arg for p, o in offsets.items() for arg in ("--offset", f"{p}={o}")]
    with contextlib.redirect_stdout(io.StringIO()):
        assert dpone_main(["state", "reset", str(manifest), *args, "--yes"]) == 0


def manifest_text(name: str, src: str, dst: str, state: Path, records_per_task: int) -> str:
    return f"""
name: {name}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options: {{group_id: g_{src}, records_per_task: {records_per_task}, batch_size: 5000}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}}
  options: {{create_topic: {{enabled: true, partitions: 2}}}}
state: {{type: local, path: {state}}}
"""


def seed(bootstrap: str, topic: str, per_partition: int) -> list[int]:
    """Orders 0..2*per_partition-1, the first half in partition 0, the second in partition 1."""
    create_topic(bootstrap, topic, 2)
    for p in (0, 1):
        ids = range(p * per_partition, (p + 1) * per_partition)
        rows = [{"order_id": i, "amount": i / 2, "p": p} for i in ids]
        produce_json(bootstrap, topic, rows, partition=p, key=lambda r: r["order_id"], linger_ms=20)
    return list(range(2 * per_partition))


def new_app(cluster: StandaloneCluster, before: set[str]) -> dict[str, Any]:
    apps = [a for a in cluster.apps() if a["id"] not in before]
    assert len(apps) == 1, f"expected one new application on the master, got {apps}"
    return apps[0]


def sink_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in (0, 1))
    except Exception:  # the sink topic may not exist yet
        return 0
    finally:
        consumer.close()


def finished_tasks(logs: dict[str, str]) -> int:
    return sum(text.count("Finished task") for text in logs.values())


def assert_executor_ids(result: dict[str, Any], executor_ids: set[str]) -> None:
    """RunResult.executors names the executors that produced, as `<host>:<executor id>`."""
    reported = result["executors"]
    assert reported, result
    ids = {e.rsplit(":", 1)[1] for e in reported}
    assert "driver" not in ids, reported
    assert ids <= executor_ids, (reported, executor_ids)


# --------------------------------------------------------------------------- tests


def test_pipeline_runs_on_two_standalone_workers(cluster, broker, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("csrc"), unique_topic("cdst")
    ids = seed(bs, src, 5_000)
    manifest = write_manifest(tmp_path / "m.yaml", manifest_text("cluster_run", src, dst, tmp_path / "state", 1_000))
    before = {a["id"] for a in cluster.apps()}

    started = time.monotonic()
    code, result, err = finish_run(start_run(manifest, driver_env(cluster, bs)), tmp_path)
    print(f"cluster run: {time.monotonic() - started:.1f}s, timings {result.get('timings')}")
    assert code == 0, (result, err[-3000:])
    assert result["status"] == "success"
    assert result["rows_extracted"] == result["messages_produced"] == len(ids)

    # The sink: exactly one message per order, keyed by order_id, values intact.
    out = consume_all(bs, dst, timeout_s=60)
    assert sorted(int(r["key"]) for r in out) == ids
    assert all(r["value"]["order_id"] == int(r["key"]) and r["value"]["amount"] == int(r["key"]) / 2 for r in out)

    # Stored offsets: the end of both source partitions.
    state = stored_state(manifest)
    assert state["offsets"] == {"0": 5_000, "1": 5_000}
    assert result["committed_offsets"] == {"0": 5_000, "1": 5_000}
    assert state["last_runs"][0]["status"] == "success"

    # The application ran on the cluster with the requested executors, and both workers ran tasks.
    app = new_app(cluster, before)
    assert app["name"] == "dpone_dagster" and app["state"] == "FINISHED", app
    assert app["cores"] == 2 and app.get("memoryperexecutor", app.get("memoryperslave")) == 512, app
    logs = cluster.executor_logs(app["id"])
    assert sorted(logs) == [0, 1], f"executors per worker: {logs.keys()}"
    for worker, executors in logs.items():
        assert finished_tasks(executors) > 0, f"worker {worker} ran no task"
    assert_executor_ids(result, {e for executors in logs.values() for e in executors})


@pytest.mark.parametrize("target", ["worker", pytest.param("executor", marks=pytest.mark.slow)])
def test_lost_executor_mid_run_never_advances_offsets_past_delivery(cluster, broker, tmp_path, target):
    """SIGKILL one worker's process group (the Worker and its executor JVM), or only the executor
    JVM, while the run produces to the sink.

    Whatever Spark makes of it, the run either succeeds with every record in the sink (at least
    once: a producing task that died after sending part of its slice is sent again in full), or
    fails cleanly with the stored offsets at most at the end of what was delivered without a gap. docs/spark-cluster.md records what happened."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("ksrc"), unique_topic("kdst")
    per_partition = 15_000
    ids = seed(bs, src, per_partition)
    manifest = write_manifest(tmp_path / "m.yaml", manifest_text("cluster_kill", src, dst, tmp_path / "state", 2_000))
    # Offsets stored before the run: the first 100 records of each partition are behind them.
    start = {0: 100, 1: 100}
    set_offsets(manifest, start)
    expected = {i for i in ids if i % per_partition >= 100}
    before = {a["id"] for a in cluster.apps()}

    victim = 1
    # The driver's Spark log is in driver.out in the test's folder (DPONE_TEST_CLUSTER_LOG_LEVEL=INFO for detail).
    env = driver_env(cluster, bs, DPONE_SPARK_LOG_LEVEL=os.environ.get("DPONE_TEST_CLUSTER_LOG_LEVEL", "ERROR"))
    started = time.monotonic()
    process = start_run(manifest, env)
    # Kill once the sink has received part of the batch: producing tasks are in flight.
    deadline = time.monotonic() + 500
    while process.poll() is None and time.monotonic() < deadline and sink_watermark(bs, dst) == 0:
        time.sleep(0.1)
    killed_while_running = process.poll() is None
    delivered_at_kill = sink_watermark(bs, dst)
    if target == "worker":
        cluster.kill_worker(victim)
    else:
        assert cluster.kill_executors(victim) == 1
    killed_at = time.monotonic() - started
    code, result, err = finish_run(process, tmp_path)
    print(
        f"{target} of worker {victim} killed at {killed_at:.1f}s with {delivered_at_kill} message(s) in the sink; "
        f"run ended after {time.monotonic() - started:.1f}s: exit {code}, status {result['status']}"
    )
    for line in err.splitlines():
        if any(word in line for word in ("Lost executor", "Lost task", "aborted", "Resubmitting", "towards the maximum")):
            print("  driver:", line[:300])
    assert killed_while_running, f"the run ended before the kill: {result}"
    assert 0 < delivered_at_kill < len(expected), delivered_at_kill

    out = consume_all(bs, dst, timeout_s=60)
    keys = [int(r["key"]) for r in out]
    assert set(keys) <= expected, "records behind the stored offsets were read"
    state = stored_state(manifest)
    print(f"  sink: {len(keys)} message(s), {len(set(keys))} distinct key(s), {len(expected)} expected")
    if code == 0:
        assert result["status"] == "success"
        assert set(keys) == expected, f"{len(expected - set(keys))} record(s) missing from the sink"
        assert state["offsets"] == {"0": per_partition, "1": per_partition}
        assert result["messages_produced"] == len(expected)
    else:
        assert code == 1, (code, err[-3000:])
        assert result["status"] == "failed" and result["error"], result
        assert state["last_runs"][0]["status"] == "failed"
        # The direct path stores a partition's offset as its slices are delivered without a gap
        # (README, Stored offset): a failed run may keep that progress, never more.
        delivered = set(keys)
        for p, first in start.items():
            stored = state["offsets"][str(p)]
            assert first <= stored <= per_partition, (p, stored)
            behind = {p * per_partition + o for o in range(first, stored)}
            assert behind <= delivered, f"partition {p}: {len(behind - delivered)} record(s) behind the stored offset are not in the sink"

    logs = cluster.executor_logs(new_app(cluster, before)["id"])
    assert victim in logs, f"the killed worker never ran an executor of the run: {sorted(logs)}"
    retried = sorted({m for text in logs.get(1 - victim, {}).values() for m in RETRY.findall(text)})
    print(f"  task attempts > 0 on the surviving worker: {retried or 'none'}")


def sql_manifest(name: str, dst: str, state: Path, strategy: str) -> str:
    """PostgreSQL → Kafka, the read in two partitions by order_id (one task per worker)."""
    return f"""
name: {name}
source:
  type: postgres
  connection_id: sql_db
  table: {{schema: public, name: orders}}
  options: {{incremental_column: updated_at, partition_column: order_id, num_partitions: 2, lower_bound: 1, upper_bound: 40000}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {strategy}
  options: {{create_topic: {{enabled: true, partitions: 2}}}}
state: {{type: local, path: {state}}}
"""


def stored_watermark(state: Path, pipeline: str) -> str | None:
    from dpone_dagster.state.local import LocalStateStore

    stored = LocalStateStore(str(state)).load_watermark(pipeline)
    return None if stored is None else str(stored["value"]).replace("T", " ")


@contextlib.contextmanager
def orders_table(rows: int) -> Iterator[dict[str, str]]:
    """A fresh PostgreSQL database with `rows` orders (customer c<id % 1000>, updated_at rising
    with the id); yields the SQL_DB_* variables of the manifests' connection."""
    import psycopg2
    from conftest import fresh_pg_database

    with fresh_pg_database("dpone_cluster") as db:
        with psycopg2.connect(**db) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE orders (order_id integer primary key, customer text, amount numeric(12,2), updated_at timestamp not null)")
            cur.execute(
                "INSERT INTO orders SELECT i, 'c' || (i % 1000), i / 4.0, '2026-01-01'::timestamp + i * interval '1 second' "
                f"FROM generate_series(1, {rows}) i"
            )
        yield {"SQL_DB_HOST": db["host"], "SQL_DB_PORT": str(db["port"]), "SQL_DB_USER": db["user"], "SQL_DB_DATABASE": db["dbname"]}


@pytest.mark.parametrize("strategy", ["keep_last", "append"])
def test_a_sql_source_takes_the_direct_path_on_two_standalone_workers(cluster, broker, tmp_path, strategy):
    """PostgreSQL → Kafka on the cluster: each worker scans one partition of the read, the
    messages are kept in Spark's storage (a local checkpoint: a produce task may run on the other
    worker), the driver judges them, then the tasks produce. Every customer orders in both
    partitions: keep_last publishes each one's last order by updated_at; an append with the
    customer as its key publishes every order, each customer's in source order."""
    bs = broker.bootstrap_servers
    dst = unique_topic(f"csql_{strategy}")
    rows = 4_000
    declared = "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}" if strategy == "keep_last" else "{mode: incremental_append, unique_key: customer}"
    with orders_table(rows) as sql_env:
        manifest = write_manifest(tmp_path / "m.yaml", sql_manifest(f"cluster_sql_{strategy}", dst, tmp_path / "state", declared))
        before = {a["id"] for a in cluster.apps()}
        code, result, err = finish_run(start_run(manifest, driver_env(cluster, bs, **sql_env)), tmp_path)
    assert code == 0, (result, err[-3000:])
    assert result["execution_path"] == "direct" and result["rows_extracted"] == rows, result
    out = consume_all(bs, dst, timeout_s=60)
    orders_of: dict[str, list[int]] = {}
    for record in sorted(out, key=lambda r: (r["partition"], r["offset"])):
        assert record["value"]["customer"] == record["key"]
        orders_of.setdefault(record["key"], []).append(record["value"]["order_id"])
    assert sorted(orders_of) == sorted(f"c{i}" for i in range(1000))
    if strategy == "keep_last":
        assert result["duplicates_removed"] == 3_000 and len(out) == 1_000
        assert all(ids == [max(i for i in range(1, rows + 1) if i % 1000 == int(c[1:]))] for c, ids in orders_of.items())
    else:
        assert len(out) == rows
        assert all(ids == sorted(ids) and len(ids) == 4 for ids in orders_of.values())
    assert stored_watermark(tmp_path / "state", f"cluster_sql_{strategy}").startswith("2026-01-01 01:06:40")
    logs = cluster.executor_logs(new_app(cluster, before)["id"])
    assert sorted(logs) == [0, 1] and all(finished_tasks(executors) > 0 for executors in logs.values()), logs.keys()


def test_a_sql_source_takes_the_direct_path_on_a_connect_server_of_the_cluster(cluster, broker, tmp_path):
    """A Spark Connect server (`dpone spark-server start --master spark://...`) whose executors are
    the two workers: the client cannot see the read's tasks, the messages are kept in Spark's
    storage through the server, keep_last settles the customers that repeat."""
    bs = broker.bootstrap_servers
    dst = unique_topic("csql_connect")
    server_env = {**driver_env(cluster, bs), "DPONE_SPARK_MASTER": cluster.url}
    home = tmp_path / "server"
    home.mkdir()

    def spark_server(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dpone_dagster.cli", "spark-server", *args], env=server_env, cwd=home, capture_output=True, text=True, timeout=300)

    before = {a["id"] for a in cluster.apps()}
    started = spark_server("start", "--port", str(free_port()), "--master", cluster.url)
    assert started.returncode == 0, started.stdout + started.stderr
    url = next(line.split("=", 1)[1] for line in started.stdout.splitlines() if line.startswith("export DPONE_SPARK_REMOTE="))
    try:
        with orders_table(4_000) as sql_env:
            manifest = write_manifest(tmp_path / "m.yaml", sql_manifest("cluster_sql_connect", dst, tmp_path / "state", "{mode: incremental_merge, unique_key: customer, duplicate_policy: keep_last}"))
            env = {k: v for k, v in driver_env(cluster, bs, DPONE_SPARK_REMOTE=url, **sql_env).items() if k != "DPONE_SPARK_MASTER"}
            code, result, err = finish_run(start_run(manifest, env), tmp_path)
    finally:
        assert "stopped" in spark_server("stop").stdout
    assert code == 0, (result, err[-3000:])
    assert result["execution_path"] == "direct" and result["duplicates_removed"] == 3_000, result
    out = consume_all(bs, dst, timeout_s=60)
    assert sorted(r["value"]["order_id"] for r in out) == list(range(3_001, 4_001))
    assert stored_watermark(tmp_path / "state", "cluster_sql_connect").startswith("2026-01-01 01:06:40")
    logs = cluster.executor_logs(new_app(cluster, before)["id"])  # the server's application ran the tasks
    assert sorted(logs) == [0, 1] and all(finished_tasks(executors) > 0 for executors in logs.values()), logs.keys()


def test_a_lost_executor_while_a_sql_batch_is_produced_moves_no_watermark(cluster, broker, tmp_path):
    """SIGKILL one worker's executor while the direct path produces a SQL batch: the messages it
    kept are gone with it, and nothing reads the table again for them, so the run fails, the
    watermark stays, and the next run delivers every row (at least once)."""
    bs = broker.bootstrap_servers
    dst = unique_topic("csql_kill")
    rows = 40_000
    with orders_table(rows) as sql_env:
        manifest = write_manifest(tmp_path / "m.yaml", sql_manifest("cluster_sql_kill", dst, tmp_path / "state", "{mode: incremental_append}"))
        # Tasks are retried: a retry finds the kept messages gone and must not read the table again.
        retried = driver_env(cluster, bs, DPONE_SPARK_CONF=json.dumps({**CLUSTER_CONF, "spark.task.maxFailures": "4"}), **sql_env)
        process = start_run(manifest, retried)
        deadline = time.monotonic() + 500
        while process.poll() is None and time.monotonic() < deadline and sink_watermark(bs, dst) == 0:
            time.sleep(0.05)
        delivered_at_kill = sink_watermark(bs, dst)
        killed = cluster.kill_executors(1)
        code, result, err = finish_run(process, tmp_path)
        print(f"executor killed with {delivered_at_kill} message(s) in the sink: exit {code}, status {result['status']}, error {str(result.get('error'))[:400]}")
        assert killed == 1 and 0 < delivered_at_kill < rows, (killed, delivered_at_kill, result)
        if code != 0:
            assert result["status"] == "failed" and stored_watermark(tmp_path / "state", "cluster_sql_kill") is None, result
            cluster.ensure_workers()
            code, result, err = finish_run(start_run(manifest, driver_env(cluster, bs, **sql_env)), tmp_path)
    assert code == 0, (result, err[-3000:])
    ids = [r["value"]["order_id"] for r in consume_all(bs, dst, timeout_s=60)]
    assert set(ids) == set(range(1, rows + 1)), f"{rows - len(set(ids))} row(s) missing"
    assert stored_watermark(tmp_path / "state", "cluster_sql_kill").startswith("2026-01-01 11:06:40")


def test_executors_take_python_from_a_packed_venv(cluster, broker, tmp_path):
    """spark.archives + PYSPARK_PYTHON=./environment/bin/python: the executors' Python and this
    package come from the archive, not from the driver's venv or source folder.

    The archive is a small overlay venv (a .pth line points at the test venv's site-packages for
    the third-party libraries, which keeps the test fast) with dpone_dagster copied in by
    pack_venv; the editable install's hook is not in it."""
    overlay = tmp_path / "overlay"
    venv.create(overlay, with_pip=False, symlinks=True)
    site = spark_cluster.site_packages(overlay)
    (site / "zz_test_venv.pth").write_text(str(spark_cluster.site_packages(Path(sys.prefix))) + "\n")
    archive = spark_cluster.pack_venv(overlay, tmp_path / "env.tar.gz", packages=[spark_cluster.package_dir()])
    conf, env_extra = spark_cluster.archive_settings(archive.as_uri())

    bs = broker.bootstrap_servers
    src, dst = unique_topic("asrc"), unique_topic("adst")
    ids = seed(bs, src, 500)
    manifest = write_manifest(tmp_path / "m.yaml", manifest_text("cluster_archive", src, dst, tmp_path / "state", 250))
    env = driver_env(cluster, bs, DPONE_SPARK_CONF=json.dumps({**CLUSTER_CONF, **conf}), **env_extra)
    before = {a["id"] for a in cluster.apps()}

    process = start_run(manifest, env)
    daemons: dict[tuple[str, str], dict[str, str]] = {}
    while process.poll() is None:
        daemons.update(python_daemons(cluster.root))
        time.sleep(0.3)
    code, result, err = finish_run(process, tmp_path)
    assert code == 0, (result, err[-3000:])
    assert sorted(int(r["key"]) for r in consume_all(bs, dst, timeout_s=60)) == ids

    app = new_app(cluster, before)
    unpacked = [cluster.work_dir(i) / app["id"] for i in (0, 1)]
    copies = [p for d in unpacked for p in d.glob("*/environment/lib/python3*/site-packages/dpone_dagster/cli.py")]
    assert len(copies) == 2, f"the archive was not unpacked on both executors: {copies}"
    assert daemons, "no executor Python daemon was seen while the run was in progress"
    assert {cmd for cmd, _ in daemons} == {"./environment/bin/python"}, list(daemons)
    # The environment those Python workers got names their executor: the work folder's name
    # (<work dir>/<app id>/<executor id>) is what executor_id() reads from it.
    for (_, cwd), environ in daemons.items():
        assert spark_cluster.executor_id(environ) == f"{socket.gethostname()}:{Path(cwd).name}", environ


def python_daemons(root: Path) -> dict[tuple[str, str], dict[str, str]]:
    """(argv[0], cwd) -> environment of the pyspark.daemon processes working under `root`."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"pyspark.daemon" not in argv:
                continue
            cwd = os.readlink(proc / "cwd")
            if not cwd.startswith(str(root)):
                continue
            pairs = (item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
            found[(argv[0].decode(), cwd)] = {k.decode(): v.decode(errors="replace") for k, v in pairs}
        except OSError:
            continue
    return found


# --------------------------------------------------------------------------- packing (no cluster)


def test_pack_venv_drops_excluded_and_editable_entries_and_adds_packages(tmp_path):
    env = tmp_path / "env"
    venv.create(env, with_pip=False, symlinks=True)
    site = spark_cluster.site_packages(env)
    for name in ("pyspark", "py4j", "keepme"):
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    (site / "pyspark-4.3.0.dist-info").mkdir()
    (site / "keepme-1.0.dist-info").mkdir()
    (site / "__editable__.proj-0.1.pth").write_text("import nowhere\n")
    (site / "keepme" / "__pycache__").mkdir()
    pkg = tmp_path / "src" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")

    archive = spark_cluster.pack_venv(env, tmp_path / "out" / "env.tar.gz", packages=[pkg])
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        python = tar.getmember("bin/python")
    rel = site.relative_to(env)
    assert {"pyvenv.cfg", f"{rel}/keepme/__init__.py", f"{rel}/keepme-1.0.dist-info", f"{rel}/mypkg/__init__.py"} <= names
    assert not [n for n in names if "pyspark" in n or "py4j" in n or "__editable__" in n or "__pycache__" in n]
    assert python.issym()

    # Unpacked under another name and started by a relative path, it is a working environment.
    unpacked = tmp_path / "run"
    (unpacked / "environment").mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked / "environment", filter="tar")
    probe = subprocess.run(
        ["./environment/bin/python", "-c", "import sys, keepme, mypkg; print(sys.prefix, mypkg.VALUE, keepme.NAME)"],
        cwd=unpacked,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert probe.returncode == 0, probe.stderr
    prefix, value, name = probe.stdout.split()
    assert Path(prefix) == unpacked / "environment" and value == "42" and name == "keepme"


def test_pack_venv_refuses_a_folder_that_is_not_a_venv(tmp_path):
    with pytest.raises(ValueError, match="not a virtual environment"):
        spark_cluster.pack_venv(tmp_path, tmp_path / "x.tar.gz")


def test_zip_package_and_archive_settings(tmp_path):
    archive = spark_cluster.zip_package(tmp_path / "dpone.zip")
    import zipfile

    with zipfile.ZipFile(archive) as zf:
        names = zf.namelist()
    assert "dpone_dagster/sinks/kafka.py" in names and "dpone_dagster/cli.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    conf, env = spark_cluster.archive_settings("hdfs:///envs/dpone.tar.gz")
    assert conf == {"spark.archives": "hdfs:///envs/dpone.tar.gz#environment"}
    assert env == {"PYSPARK_PYTHON": "./environment/bin/python"}


def test_executor_id_per_cluster_manager(monkeypatch):
    host = socket.gethostname()
    for key in ("SPARK_EXECUTOR_ID", "SPARK_LOG_URL_STDERR", "CONTAINER_ID"):
        monkeypatch.delenv(key, raising=False)
    assert spark_cluster.executor_id() == f"{host}:driver"  # local mode: the driver's JVM
    standalone = "http://127.0.0.1:18081/logPage/?appId=app-20261121125202-0000&executorId=1&logType=stderr"
    assert spark_cluster.executor_id({"SPARK_LOG_URL_STDERR": standalone}) == f"{host}:1"
    yarn = {
        "SPARK_LOG_URL_STDERR": "http://nm:8042/node/containerlogs/container_1_0001_01_000002/u/stderr?start=-4096",
        "CONTAINER_ID": "container_1_0001_01_000002",
    }
    assert spark_cluster.executor_id(yarn) == f"{host}:container_1_0001_01_000002"
    assert spark_cluster.executor_id({"SPARK_EXECUTOR_ID": "7", **yarn}) == f"{host}:7"  # Kubernetes
    monkeypatch.setenv("SPARK_EXECUTOR_ID", "3")
    assert spark_cluster.executor_id() == f"{host}:3"
