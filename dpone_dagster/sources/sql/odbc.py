"""export_mode pyodbc: a cursor on the Spark DRIVER fetches batch_size rows at a time into Arrow
and builds the DataFrame from them: meant for small tables."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from dpone_dagster.errors import ConfigError
from dpone_dagster.sources.sql import text as T
from dpone_dagster.sources.sql.boundary import SqlBoundary
from dpone_dagster.sources.sql.jdbc import DEFAULT_PORTS, JdbcTable

Log = Callable[[str], None]

ODBC_DRIVERS = {
    "mssql": "ODBC Driver 18 for SQL Server",
    "postgres": "PostgreSQL Unicode",
    "mysql": "MariaDB ODBC 3.1 Driver",
}


def read_pyodbc(source: JdbcTable, spark: SparkSession, boundary: SqlBoundary, log: Log) -> DataFrame:
    """The boundary's rows fetched through an ODBC cursor on the driver, as a DataFrame."""
    try:
        import pyodbc  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigError(
            "source.options.export_mode: pyodbc needs the pyodbc package and an ODBC driver. Fix: pip install "
            "pyodbc and install the driver (msodbcsql18 for SQL Server, odbc-postgresql, odbc-mariadb), or use "
            "export_mode: jdbc."
        ) from None
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    probe = source.load(source.reader(spark).option("query", boundary.query), "read the result schema")
    schema = probe.schema  # resolved with WHERE 1=0: no data is read here
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    converters = [_arrow_converter(f.dataType.simpleString()) for f in schema.fields]
    names = schema.fieldNames()
    try:
        connection = pyodbc.connect(odbc_connection_string(source))
    except Exception as exc:  # noqa: BLE001 - classified below
        raise source.jdbc_error(exc, "connect through ODBC") from None
    batches = []
    try:
        cursor = connection.cursor()
        cursor.execute(boundary.query)
        while True:
            rows = cursor.fetchmany(source.options.batch_size)
            if not rows:
                break
            columns = [[convert(row[i]) for row in rows] for i, convert in enumerate(converters)]
            batches.append(
                pa.RecordBatch.from_arrays(
                    [pa.array(values, type=arrow_schema.field(i).type) for i, values in enumerate(columns)],
                    schema=arrow_schema,
                )
            )
            log(f"extract: fetched {sum(b.num_rows for b in batches)} rows through pyodbc")
    finally:
        connection.close()
    table = pa.Table.from_batches(batches, schema=arrow_schema)
    return spark.createDataFrame(table).toDF(*names)


def odbc_connection_string(source: JdbcTable) -> str:
    """An ODBC connection string for pyodbc (holds the password: never log it)."""
    c = source.connection
    driver = c.properties.get("odbc_driver") or ODBC_DRIVERS[source.dialect]
    parts = {"DRIVER": driver}
    port = c.port or DEFAULT_PORTS[source.dialect]
    if source.dialect == "mssql":
        parts["SERVER"] = f"tcp:{c.host},{port}"
    else:
        parts["SERVER"] = c.host or ""
        parts["PORT"] = str(port)
    if c.database:
        parts["DATABASE"] = c.database
    if c.user:
        parts["UID"] = c.user
    if c.password is not None:
        parts["PWD"] = c.password.get_secret_value()
    if source.dialect == "mysql":
        parts["INITSTMT"] = f"SET {T.MYSQL_UTC_SESSION}"  # the UTC session the plan's bounds were made in
    return ";".join(f"{k}={{{v.replace('}', '}}')}}}" for k, v in parts.items())


def _arrow_converter(type_name: str) -> Callable[[Any], Any]:
    if type_name == "string":
        return lambda v: v if v is None or isinstance(v, str) else str(v)
    if type_name == "binary":
        return lambda v: bytes(v) if isinstance(v, memoryview | bytearray) else v
    if type_name.startswith("decimal"):
        return lambda v: v if v is None or isinstance(v, Decimal) else Decimal(str(v))
    return lambda v: v
