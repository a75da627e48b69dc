"""The Spark session used by the engine: local[*] by default, any master through configuration,
or a Spark Connect server (`spark.remote`, DPONE_SPARK_REMOTE or SPARK_REMOTE: sc://host:port)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from pyspark.sql import SparkSession

from dpone_dagster.child_env import withheld_from_children
from dpone_dagster.sinks.json_encode import OFFSET_FREE_ZONES


def default_spark_conf() -> dict[str, Any]:
    """Embedded defaults; DPONE_SPARK_MASTER points the engine at a cluster."""
    return {
        "spark.master": os.environ.get("DPONE_SPARK_MASTER", "local[*]"),
        "spark.app.name": "dpone_dagster",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        # The batch is kept once per run; compressing the cache cost more CPU than the whole
        # decode for ~10% less memory (docs/performance.md).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # A failed task fails the run instead of being retried. (A lost worker is not counted as
        # a task failure: Spark re-runs its tasks elsewhere, which may duplicate some messages —
        # at-least-once; state still advances only after every delivery succeeded.)
        "spark.task.maxFailures": "1",
        # Wall-clock database timestamps are read in UTC on every JVM. The throughput collector
        # suits short batch jobs: ~10% less JVM CPU than G1 in bench/k2k.py.
        "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN -Duser.timezone=UTC -XX:+UseParallelGC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC -XX:+UseParallelGC",
    }


def spark_config_from_env() -> dict[str, Any]:
    """Defaults plus DPONE_SPARK_CONF (a JSON object of extra Spark settings)."""
    extra = json.loads(os.environ.get("DPONE_SPARK_CONF", "{}") or "{}")
    return {**default_spark_conf(), **extra}


REMOTE_ENV = "DPONE_SPARK_REMOTE"


def remote_url(conf: dict[str, Any] | None = None) -> str | None:
    """The Spark Connect server to use, if any: `spark.remote`, else DPONE_SPARK_REMOTE or SPARK_REMOTE."""
    return (conf or {}).get("spark.remote") or os.environ.get(REMOTE_ENV) or os.environ.get("SPARK_REMOTE") or None


def offset_free(time_zone: str) -> bool:
    return time_zone in OFFSET_FREE_ZONES


def session_time_zone(spark: SparkSession) -> str:
    """The zone Spark reads zone-less timestamp text in and writes timestamp text in."""
    return spark.conf.get("spark.sql.session.timeZone") or "UTC"


def iso_times(spark: SparkSession) -> bool:
    """Whether Spark reads and writes date and timestamp text as ISO-8601 in UTC, as the direct
    path's tasks do: a session time zone without an offset and the proleptic calendar (not
    spark.sql.legacy.timeParserPolicy LEGACY, whose parser and calendar differ)."""
    legacy = (spark.conf.get("spark.sql.legacy.timeParserPolicy", "CORRECTED") or "").upper() == "LEGACY"
    return offset_free(session_time_zone(spark)) and not legacy


def is_connect(spark: SparkSession) -> bool:
    """A Spark Connect session (no SparkContext, no RDDs in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def client_conf(conf: dict[str, Any]) -> dict[str, Any]:
    """What a session may set. On Spark Connect only runtime SQL settings travel with the session;
    the master, JVM options, task retries and jars belong to the server (`dpone spark-server`)."""
    url = remote_url(conf)
    if url is None:
        return conf
    return {"spark.remote": shared_session(url), **{k: v for k, v in conf.items() if k.startswith("spark.sql.")}}


def shared_session(url: str, session_id: str | None = None) -> str:
    """`url` naming one server-side session for every dpone process of that server (unless the URL
    names its own). A Connect server starts a Python worker daemon per session (~1.1 s before a
    run's first task, and one more daemon left running per run); runs that share the session
    share its workers."""
    if "session_id=" in url:
        return url
    session_id = session_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"dpone:{url.rstrip('/')}"))
    return f"{url};session_id={session_id}" if "/;" in url else f"{url.rstrip('/')}/;session_id={session_id}"


def session_closed(exc: BaseException) -> bool:
    """The server closed the named session (idle timeout, or a client stopped it): use another."""
    return "SESSION_CLOSED" in str(exc)


# JDBC drivers as Debian installs them (libpostgresql-jdbc-java, libmariadb-java, libjtds-java).
DEBIAN_JDBC_JARS = {
    "postgres": "/usr/share/java/postgresql.jar",
    "mysql": "/usr/share/java/mariadb-java-client.jar",
    "mssql": "/usr/share/java/jtds.jar",
}


def jdbc_jars(manifests: Iterable[Any]) -> list[str]:
    """Driver jars the SQL sources need on `spark.jars` (jars cannot join a running session):
    each source's `jdbc_jar`, else Debian's jar for its dialect when it is installed."""
    jars: list[str] = []
    for manifest in manifests:
        source = manifest.source
        if getattr(source, "type", "kafka") == "kafka":
            continue
        jar = source.options.jdbc_jar or DEBIAN_JDBC_JARS.get(source.type)
        if jar and os.path.exists(jar) and jar not in jars:
            jars.append(jar)
    return jars


def with_jars(conf: dict[str, Any], jars: list[str]) -> dict[str, Any]:
    existing = [j for j in str(conf.get("spark.jars", "")).split(",") if j]
    merged = existing + [j for j in jars if j not in existing]
    return {**conf, "spark.jars": ",".join(merged)} if merged else conf


def ensure_executor_python() -> None:
    """Executors must run the interpreter that has pyarrow and confluent-kafka installed."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_spark(conf: dict[str, Any] | None = None) -> SparkSession:
    """A classic session (a JVM started by this process), or a Spark Connect session when a
    remote server is configured (no JVM here; the server runs the work)."""
    ensure_executor_python()
    settings = client_conf({**default_spark_conf(), **(conf or {})})
    session = open_session(settings, _build)
    if "spark.remote" not in settings:  # a Connect session has no SparkContext
        session.sparkContext.setLogLevel(os.environ.get("DPONE_SPARK_LOG_LEVEL", "ERROR"))
    return session


def open_session(settings: dict[str, Any], build: Callable[[dict[str, Any]], SparkSession]) -> SparkSession:
    """`build(settings)`; on Spark Connect, when the server closed the shared session, build again
    on a session of this run's own."""
    try:
        return build(settings)
    except Exception as exc:
        remote = settings.get("spark.remote")
        if remote is None or not session_closed(exc):
            raise
        forget_connect_session()
        return build({**settings, "spark.remote": fresh_session(remote)})


def fresh_session(url: str) -> str:
    """`url` with a new session of its own instead of the shared one."""
    base = url.split(";session_id=")[0].rstrip("/;")
    return shared_session(base, str(uuid.uuid4()))


def forget_connect_session() -> None:
    """Drop the client's handle of a closed session, which PySpark keeps as this process's default
    session even though it could not be set up."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    stale = ConnectSession.getActiveSession()
    if stale is not None:
        try:
            stale.stop()
        except Exception:  # noqa: BLE001 - the server closed it already
            pass


def _build(settings: dict[str, Any]) -> SparkSession:
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    # The JVM and its Python workers copy this process's environment: credentials stay here.
    with withheld_from_children():
        return builder.getOrCreate()


def speculates(spark: SparkSession) -> bool:
    """Spark runs a second copy of a slow task (`spark.speculation`): two attempts of one task may
    then both keep what they computed."""
    try:
        value = spark.conf.get("spark.speculation", "false")
    except Exception:  # noqa: BLE001 - a server that does not say runs Spark's default (off)
        return False
    return str(value).strip().lower() == "true"
