"""export_mode bcp (MSSQL): `bcp "<select>" queryout` to a local file, read back with Spark's CSV
reader using the escaping scheme documented in `text.bcp` (lossless, NULL vs empty string kept).
The file lives on the driver's filesystem (DPONE_BCP_DIR): with a cluster master it must be a
shared path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.redact import redact_text
from dpone_dagster.sources.sql import text as T
from dpone_dagster.sources.sql.boundary import SqlBoundary
from dpone_dagster.sources.sql.casts import backquote, cast_column
from dpone_dagster.sources.sql.jdbc import JdbcTable

Log = Callable[[str], None]


def read_bcp(source: JdbcTable, spark: SparkSession, boundary: SqlBoundary, log: Log) -> DataFrame:
    """Export the boundary's rows with bcp into a temporary file and read it back."""
    if source.dialect != "mssql":
        raise ConfigError(
            f"source.options.export_mode: bcp exports from SQL Server only, not {source.dialect}. Fix: use "
            "export_mode: jdbc."
        )
    if boundary.method == "cdc":
        raise ConfigError("cdc reads through JDBC. Fix: use export_mode: jdbc with strategy cdc.")
    executable = shutil.which("bcp") or shutil.which("/opt/mssql-tools18/bin/bcp")
    if executable is None:
        raise ConfigError(
            "source.options.export_mode: bcp needs the `bcp` command, which is not on PATH. Fix: install the "
            "Microsoft SQL Server command-line tools (package mssql-tools18 from packages.microsoft.com; "
            "add /opt/mssql-tools18/bin to PATH), or use export_mode: jdbc."
        )
    columns = list(boundary.columns + boundary.extra_columns)
    query, specs = T.bcp_select(source.table, columns, boundary.conditions)
    directory = tempfile.mkdtemp(prefix="dpone_bcp_", dir=os.environ.get("DPONE_BCP_DIR") or None)
    path = os.path.join(directory, f"{uuid.uuid4().hex}.dat")
    command = T.bcp_command(
        query,
        path,
        server=source.connection.host or "",
        database=source.connection.database,
        user=source.connection.user,
        password=source.connection.password.get_secret_value() if source.connection.password else None,
        port=source.connection.port,
        trust_server_certificate=source.connection.properties.get("trustServerCertificate", "").lower()
        == "true",
        executable=executable,
    )
    log(f"extract: {command.redacted()}")
    result = subprocess.run(
        list(command.argv),
        env={**os.environ, **command.env},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        detail = redact_text((result.stderr or result.stdout or "").strip()[-2000:])
        raise RunFailed(f"bcp exited with {result.returncode}: {detail}")
    return read_bcp_file(spark, path, specs)


def read_bcp_file(
    spark: SparkSession,
    path: str,
    specs: Sequence[T.BcpColumn],
    field_terminator: str = T.BCP_FIELD_TERMINATOR,
    row_terminator: str = T.BCP_ROW_TERMINATOR,
) -> DataFrame:
    """A bcp -c queryout file written with `text.bcp.bcp_select`'s encoding, decoded to its types."""
    schema = StructType([StructField(s.name, StringType(), True) for s in specs])
    raw = (
        spark.read.schema(schema)
        .option("sep", field_terminator)
        .option("lineSep", row_terminator)
        .option("quote", '"')
        .option("escape", '"')
        .option("encoding", "UTF-8")
        .option("mode", "FAILFAST")
        .csv(path)
    )
    esc = T.BCP_ESCAPE
    out = []
    for spec in specs:
        col = F.col(backquote(spec.name))
        if spec.encoding == "text":
            body = F.expr(f"substring({backquote(spec.name)}, 2)")
            pieces = F.transform(
                F.split(body, re.escape(esc + esc), -1),
                lambda piece: F.replace(piece, F.lit(esc + "r"), F.lit(row_terminator)),
            )
            value = F.when(col.isNull(), F.lit(None).cast("string")).otherwise(F.array_join(pieces, esc))
        elif spec.encoding == "hex":
            value = F.unhex(F.expr(f"substring({backquote(spec.name)}, 2)"))
        else:
            value = cast_column(col, "string", spec.target) if spec.target != "string" else col
        out.append(value.alias(spec.name))
    return raw.select(*out)
