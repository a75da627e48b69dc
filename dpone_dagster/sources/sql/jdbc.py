"""JDBC access to one source table: connection settings, the driver check, small queries through
Spark JDBC, the catalog, and the column lookups every plan shares.

Time zones: Spark converts JDBC timestamps through the JVM default zone; the engine's session is
UTC, and the JVMs should run with `-Duser.timezone=UTC` so wall-clock types arrive unchanged.
MySQL/MariaDB render TIMESTAMP values in the session's time zone, so every connection to them sets
it to UTC (`sessionVariables`) and a run checks that it took (`check_utc_session`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from dpone_dagster.connections import JdbcConnection
from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import Manifest, SqlSource
from dpone_dagster.redact import redact_text
from dpone_dagster.sources.sql import jdbc_errors
from dpone_dagster.sources.sql import text as T

DEFAULT_DRIVERS = {
    "mssql": "net.sourceforge.jtds.jdbc.Driver",
    "postgres": "org.postgresql.Driver",
    "mysql": "org.mariadb.jdbc.Driver",
}
MSSQL_MICROSOFT_DRIVER = "com.microsoft.sqlserver.jdbc.SQLServerDriver"
DEFAULT_PORTS = {"mssql": 1433, "postgres": 5432, "mysql": 3306}
DEBIAN_JARS = {
    "net.sourceforge.jtds.jdbc.Driver": ("/usr/share/java/jtds.jar", "libjtds-java"),
    "org.postgresql.Driver": ("/usr/share/java/postgresql.jar", "libpostgresql-jdbc-java"),
    "org.mariadb.jdbc.Driver": ("/usr/share/java/mariadb-java-client.jar", "libmariadb-java"),
}


class JdbcTable:
    """One table of an SQL database, reached through Spark JDBC."""

    def __init__(self, manifest: Manifest, connection: JdbcConnection):
        if not isinstance(manifest.source, SqlSource):
            raise ConfigError(f"SqlBatchSource needs an SQL source, got source.type: {manifest.source.type}")
        self.manifest = manifest
        self.source: SqlSource = manifest.source
        self.options = manifest.source.options
        self.dialect: str = manifest.source.type
        self.connection = connection
        self.strategy = manifest.sink.strategy
        self.table = table_of(self.source)
        self._catalog: tuple[T.ColumnInfo, ...] | None = None

    # ----------------------------------------------------------------------- connection

    def driver_class(self) -> str:
        return self.options.jdbc_driver or self.connection.driver or DEFAULT_DRIVERS[self.dialect]

    def jdbc_url(self) -> str:
        if self.connection.jdbc_url:
            return self.connection.jdbc_url
        host = self.connection.host or ""
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6
        port = self.connection.port or DEFAULT_PORTS[self.dialect]
        database = self.connection.database or ""
        driver = self.driver_class()
        if self.dialect == "mssql":
            if driver == MSSQL_MICROSOFT_DRIVER:
                return f"jdbc:sqlserver://{host}:{port}" + (f";databaseName={database}" if database else "")
            return f"jdbc:jtds:sqlserver://{host}:{port}/{database}"
        if self.dialect == "postgres":
            return f"jdbc:postgresql://{host}:{port}/{database}"
        # Spark applies its MySQL dialect (backtick quoting, type mapping) to jdbc:mysql URLs only;
        # MariaDB Connector/J 3 accepts that scheme with permitMysqlScheme (2.x ignores the flag).
        url = f"jdbc:mysql://{host}:{port}/{database}"
        return url + "?permitMysqlScheme" if driver == DEFAULT_DRIVERS["mysql"] else url

    def properties(self) -> dict[str, str]:
        """JDBC connection properties, including the password: never log this (see describe())."""
        props = {k: v for k, v in self.connection.properties.items() if k != "odbc_driver"}
        if self.connection.user:
            props["user"] = self.connection.user
        if self.connection.password is not None:
            props["password"] = self.connection.password.get_secret_value()
        props["fetchsize"] = str(self.options.batch_size)
        if self.dialect == "mysql":
            props["sessionVariables"] = T.mysql_session_variables(props.get("sessionVariables"))[0]
        return props

    def configured_time_zone(self) -> str | None:
        """MySQL/MariaDB: the session time zone the connection's own sessionVariables name (the
        engine replaces it with UTC; an earlier version read TIMESTAMP watermarks in it)."""
        return T.mysql_session_variables(self.connection.properties.get("sessionVariables"))[1]

    def describe(self) -> dict[str, Any]:
        """Safe for plans, logs and artifacts: secrets masked."""
        connection = self.connection.describe()
        return {
            "type": self.dialect,
            "table": T.qualified_name(self.dialect, self.table),
            "url": redact_text(self.jdbc_url()),
            "driver": self.driver_class(),
            "user": connection.get("user"),
            "password": connection.get("password"),
            "properties": connection.get("properties", {}),
            "export_mode": self.options.export_mode,
            "fetchsize": self.options.batch_size,
            "incremental_column": self.options.incremental_column,
            "partition_column": self.options.partition_column,
            "num_partitions": self.options.num_partitions,
        }

    # ----------------------------------------------------------------------- plan
    # ----------------------------------------------------------------------- JDBC plumbing

    def check_driver(self, spark: SparkSession) -> None:
        """The JDBC driver class must be loadable by the Spark driver (jars are fixed at session start)."""
        name = self.driver_class()
        jvm = getattr(spark, "_jvm", None)
        if jvm is None:  # Spark Connect: the server resolves drivers; errors surface on the first read
            return
        try:
            jvm.org.apache.spark.util.Utils.classForName(name, True, False)
        except Exception:  # noqa: BLE001 - any failure means the class cannot be loaded
            raise ConfigError(self._driver_fix(name)) from None

    def check_utc_session(self, spark: SparkSession) -> None:
        """MySQL/MariaDB: the session must be on UTC, or TIMESTAMP values and their watermark shift
        by the server's offset. A jdbc_url's sessionVariables win over the connection properties,
        and a driver may ignore them: both are caught here, before anything is read."""
        if self.dialect != "mysql":
            return
        rows = self.run_query(spark, T.MYSQL_SESSION_ZONE_QUERY, "read the session time zone")
        zone, system_zone = (str(rows[0][0]), str(rows[0][1])) if rows else (None, None)
        if T.mysql_is_utc_session(zone, system_zone):
            return
        raise ConfigError(
            f"the MySQL/MariaDB session time zone is {zone}, not UTC: TIMESTAMP values would arrive shifted "
            "by its offset. The engine sets time_zone='+00:00' through the connection property "
            "sessionVariables, keeping any other variables the connection's properties set. Fix: move "
            "sessionVariables from the connection's jdbc_url into its properties (in the URL they override the "
            "engine's), or use a driver that honours sessionVariables (source.options.jdbc_driver)."
        )

    def _driver_fix(self, name: str) -> str:
        jar = self.options.jdbc_jar
        jar_hint, package = DEBIAN_JARS.get(name, (None, None))
        suggested = jar or jar_hint or "/path/to/driver.jar"
        parts = [
            f"JDBC driver class {name} is not on the Spark classpath.",
            "Fix: start the Spark session with the driver jar in spark.jars (jars cannot be added to a running "
            f'driver), e.g. DPONE_SPARK_CONF=\'{{"spark.jars": "{suggested}"}}\'',
        ]
        if jar:
            exists = "exists" if os.path.exists(jar) else "does NOT exist"
            parts.append(
                f"(source.options.jdbc_jar {jar} {exists} but was not in spark.jars when the session started)"
            )
        elif package:
            parts.append(f"(Debian: apt-get install {package}; or set source.options.jdbc_jar)")
        else:
            parts.append("(or set source.options.jdbc_jar to the jar)")
        if self.options.jdbc_driver:
            parts.append("; check source.options.jdbc_driver for typos")
        return " ".join(parts) + "."

    def reader(self, spark: SparkSession):
        reader = (
            spark.read.format("jdbc").option("url", self.jdbc_url()).option("driver", self.driver_class())
        )
        for key, value in self.properties().items():
            reader = reader.option(key, value)
        return reader

    def load(self, reader: Any, what: str) -> DataFrame:
        try:
            return reader.load()
        except Exception as exc:  # noqa: BLE001 - classified below
            raise self.jdbc_error(exc, what) from None

    def run_query(self, spark: SparkSession, sql: str, what: str) -> list[Any]:
        """Rows of a small query through Spark JDBC (`query` option)."""
        df = self.load(self.reader(spark).option("query", sql), what)
        try:
            return df.collect()
        except Exception as exc:  # noqa: BLE001 - classified below
            raise self.jdbc_error(exc, what) from None

    def catalog(self, spark: SparkSession) -> tuple[T.ColumnInfo, ...]:
        """The table's columns (INFORMATION_SCHEMA); ConfigError when the table does not exist."""
        if self._catalog is None:
            rows = self.run_query(
                spark, T.columns_query(self.dialect, self.table), "read the table's columns"
            )
            if not rows:
                where = self.connection.database or "the connection's database"
                raise ConfigError(
                    f"table {T.qualified_name(self.dialect, self.table)} does not exist in {where} (or the user "
                    f"'{self.connection.user}' cannot see it). Fix: correct source.table.schema / source.table.name "
                    "(quoted identifiers are case-sensitive) or grant access."
                )
            self._catalog = tuple(
                T.ColumnInfo(
                    name=str(r[0]),
                    data_type=str(r[1]).lower(),
                    precision=int(r[2]) if r[2] is not None else None,
                    scale=int(r[3]) if r[3] is not None else None,
                    column_type=str(r[4]).lower() if r[4] is not None else None,
                )
                for r in rows
            )
        return self._catalog

    def jdbc_error(self, exc: BaseException, what: str) -> Exception:
        """The ConfigError/RunFailed to raise for a failure while trying to `what`."""
        target = f"{redact_text(self.jdbc_url())} (connection '{self.source.connection_id}')"
        return jdbc_errors.classify(exc, what, target, lambda: self._driver_fix(self.driver_class()))

    # ----------------------------------------------------------------------- helpers

    def payload_columns(self, catalog: Sequence[T.ColumnInfo]) -> list[T.ColumnInfo]:
        for key in self.strategy.unique_key_columns:
            self.find_column(catalog, key, "sink.strategy.unique_key")
        if self.options.partition_column:
            self.find_column(catalog, self.options.partition_column, "source.options.partition_column")
        if not self.options.columns:
            return list(catalog)
        chosen = [self.find_column(catalog, name, "source.options.columns") for name in self.options.columns]
        if len({c.name for c in chosen}) != len(chosen):
            raise ConfigError("source.options.columns lists a column twice. Fix: list each column once.")
        return chosen

    def extra_columns(
        self, catalog: Sequence[T.ColumnInfo], payload: list[T.ColumnInfo], column: str | None
    ) -> list[T.ColumnInfo]:
        names = {c.name for c in payload}
        extras = []
        for name in (column, self.options.partition_column):
            if name and name not in names:
                extras.append(self.find_column(catalog, name, "source.options"))
                names.add(name)
        return extras

    def find_column(self, catalog: Sequence[T.ColumnInfo], name: str, where: str) -> T.ColumnInfo:
        for col in catalog:
            if col.name == name:
                return col
        folded = [c for c in catalog if c.name.lower() == name.lower()]
        hint = f" (did you mean '{folded[0].name}'? names are case-sensitive)" if folded else ""
        raise ConfigError(
            f"{where}: column '{name}' does not exist in {T.qualified_name(self.dialect, self.table)}{hint}. "
            f"Columns: {', '.join(c.name for c in catalog)}. Fix: use one of these columns."
        )

    def expressions(self, columns: Sequence[T.ColumnInfo]) -> dict[str, str]:
        out = {}
        for col in columns:
            expression = T.read_expression(self.dialect, col)
            if expression:
                out[col.name] = expression
        return out

    def select_sql(
        self,
        columns: Sequence[T.ColumnInfo],
        predicate: str | None,
        column: str | None = None,
        lower: Any = None,
        upper: Any = None,
        kind: str | None = None,
        upper_inclusive: bool = True,
    ) -> str:
        return T.select_query(
            self.dialect,
            self.table,
            [c.name for c in columns],
            predicate,
            column,
            lower,
            True,
            upper,
            kind=kind,
            expressions=self.expressions(columns),
            upper_inclusive=upper_inclusive,
        )


def table_of(source: SqlSource) -> T.Table:
    """The manifest table; a schema left at its default means the dialect's default schema.

    TableRef defaults schema to dbo (MSSQL); for postgres that means the current schema (public) and
    for mysql the connection's database.
    """
    schema: str | None = source.table.schema_
    if "schema_" not in source.table.model_fields_set and source.type != "mssql":
        schema = None
    return T.Table(schema, source.table.name)
