"""export_mode bcp (MSSQL): `bcp "<select>" queryout` to a local file, read back with Spark's CSV
reader using the escaping scheme documented in `text.bcp` (lossless, NULL vs empty string kept).
The file lives on the driver's filesystem (DPONE_BCP_DIR): with a cluster master it must be a
shared path.

The file is a plaintext copy of the rows: it is removed as soon as Spark holds them, whether the
export or the read succeeded, failed or was interrupted; what a killed process left is removed by
the next bcp export under the same directory (`sweep_stale_exports`).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence

from pyspark import StorageLevel
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
    """Export the boundary's rows with bcp into a file of its own, read them into Spark and remove
    the file, whatever happens (the rows are kept in Spark, so nothing reads the file later)."""
    executable = _bcp_executable(source, boundary)
    columns = list(boundary.columns + boundary.extra_columns)
    query, specs = T.bcp_select(source.table, columns, boundary.conditions)
    root = export_root()
    swept = sweep_stale_exports(root)
    if swept:
        log(f"extract: removed {swept} bcp export(s) left by runs that ended without removing them")
    directory, lock = make_export_directory(root)
    try:
        path = os.path.join(directory, "export.dat")
        _export(source, query, path, executable, log)
        return _keep_rows(read_bcp_file(spark, path, specs))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        os.close(lock)  # held until the export is gone: a sweep never takes a live export
        log("extract: bcp export removed" if not os.path.exists(directory) else f"extract: could not remove the bcp export {directory}")


def _bcp_executable(source: JdbcTable, boundary: SqlBoundary) -> str:
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
    return executable


def _export(source: JdbcTable, query: str, path: str, executable: str, log: Log) -> None:
    """Run `bcp queryout` into `path`; RunFailed when it fails or is killed."""
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


def _keep_rows(frame: DataFrame) -> DataFrame:
    """The decoded rows, computed now and kept by Spark (the file is about to go; a lost executor's
    part then fails the run instead of reading a file that no longer exists)."""
    try:
        return frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)
    except Exception as exc:  # noqa: BLE001 - reported by its Spark error classes only
        raise RunFailed(
            f"the bcp export could not be read back ({_error_classes(exc)}). Fix: check that the bcp on PATH "
            "writes character mode (-c) with the terminators of the command line."
        ) from None


def _error_classes(exc: BaseException) -> str:
    """Spark's error classes in `exc` (MALFORMED_CSV_RECORD, ...): Spark's message quotes the
    malformed record, which holds row data."""
    classes = dict.fromkeys(re.findall(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)?)\]", str(exc)))
    return ", ".join(classes) or type(exc).__name__


# --------------------------------------------------------------------------- export files
#
# Each export has a directory of its own holding a lock file that its run keeps locked (flock)
# until the directory is gone: a later run tells the leftovers of a killed process (the lock is
# free: removed) from a live export (locked: kept), on any host that shares the directory's locks.

EXPORT_PREFIX = "dpone_bcp."
LEGACY_PREFIX = "dpone_bcp_"  # exports of versions that never removed them
LOCK_FILE = ".lock"
STALE_EXPORT_S = 6 * 3600  # leftovers without a lock file (an older version), by their newest file


def export_root() -> str:
    """Where exports are written: DPONE_BCP_DIR (a shared path with a cluster master), else the
    system's temporary directory."""
    return os.environ.get("DPONE_BCP_DIR") or tempfile.gettempdir()


def make_export_directory(root: str) -> tuple[str, int]:
    """A new directory for one export, readable by this user only, and the descriptor of its lock
    file, locked (close it once the directory is removed)."""
    path = os.path.join(root, f"{EXPORT_PREFIX}{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex}")
    os.mkdir(path, 0o700)
    lock = os.open(os.path.join(path, LOCK_FILE), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return path, lock


def sweep_stale_exports(root: str, now: float | None = None) -> int:
    """Remove the exports that runs killed mid-read left under `root`; returns how many went."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    removed = 0
    for name in names:
        if not (name.startswith(EXPORT_PREFIX) or name.startswith(LEGACY_PREFIX)):
            continue  # not an export
        path = os.path.join(root, name)
        if _stale(path, now):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def _stale(path: str, now: float) -> bool:
    try:
        lock = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR)
    except FileNotFoundError:
        return _untouched_for(path, now) >= STALE_EXPORT_S  # an older version's, or half made
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # its run holds the lock: live
    finally:
        os.close(lock)
    return True


def _untouched_for(path: str, now: float) -> float:
    """Seconds since anything in `path` was last written."""
    try:
        stamps = [os.stat(path).st_mtime, *(os.stat(os.path.join(path, n)).st_mtime for n in os.listdir(path))]
    except OSError:
        return 0.0
    return now - max(stamps)


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
