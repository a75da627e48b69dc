"""State in PostgreSQL: offsets, time windows' offset ranges, watermarks and run rows written in
one transaction per commit."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
from psycopg2 import sql

from dpone_dagster.state.base import (
    RunRecord,
    StateConflict,
    StateStoreLost,
    check_offsets,
    check_windows,
    dumps,
    finished,
)

log = logging.getLogger(__name__)

QualifiedName = tuple[str, str]

# Concurrent CREATE ... IF NOT EXISTS can still collide on the catalog's unique indexes; the
# loser retries and then sees the winner's objects.
_DDL_RACE_ERRORS = (
    psycopg2.errors.UniqueViolation,
    psycopg2.errors.DuplicateTable,
    psycopg2.errors.DuplicateObject,
    psycopg2.errors.DuplicateSchema,
)
_DDL_ATTEMPTS = 5

WINDOWS_TABLE = "etl_kafka_window_offsets"

_RUN_COLUMNS = "run_id, pipeline, status, started_at, finished_at, boundary, counts, timings, error"


def lock_key(pipeline: str) -> int:
    """Stable signed 64-bit advisory-lock key (Python's hash() changes per process)."""
    digest = hashlib.sha256(f"dpone-pipeline:{pipeline}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def connection_summary(connect_kwargs: dict[str, Any]) -> dict[str, Any]:
    """host/port/dbname/user from kwargs or a DSN, without the password."""
    params = dict(connect_kwargs)
    dsn = params.pop("dsn", None)
    if dsn:
        try:
            params = {**psycopg2.extensions.parse_dsn(dsn), **params}
        except psycopg2.ProgrammingError:
            pass  # an unparsable DSN fails at connect with its own message
    return {
        "host": params.get("host") or "localhost",
        "port": int(params.get("port") or 5432),
        "dbname": params.get("dbname") or params.get("database"),
        "user": params.get("user"),
    }


def _ident(name: QualifiedName) -> sql.Identifier:
    return sql.Identifier(*name)


def _index_name(table: str, suffix: str) -> sql.Identifier:
    # Postgres truncates names at 63 bytes; a hash keeps truncated names of long tables distinct.
    tag = hashlib.sha1(table.encode()).hexdigest()[:8]
    return sql.Identifier(f"{table[:40]}_{tag}_{suffix}")


def _json(value: Any) -> psycopg2.extras.Json:
    return psycopg2.extras.Json(value, dumps=dumps)


class PostgresStateStore:
    def __init__(
        self,
        connect_kwargs: dict[str, Any],
        runs_table: QualifiedName,
        offsets_table: QualifiedName,
        watermarks_table: QualifiedName = ("etl_state", "etl_watermarks"),
        windows_table: QualifiedName | None = None,
    ) -> None:
        self._summary = connection_summary(connect_kwargs)
        self._runs = runs_table
        self._offsets = offsets_table
        self._watermarks = watermarks_table
        # Time windows' offset ranges: next to the offsets table unless named.
        self._windows = windows_table or (offsets_table[0], WINDOWS_TABLE)
        self._connect_kwargs = {"connect_timeout": 10, "application_name": "dpone-state", **connect_kwargs}
        self._conn = psycopg2.connect(**self._connect_kwargs)
        self._mutex = threading.RLock()  # one connection = one transaction at a time
        self._held: set[str] = set()
        try:
            self._create_tables()
        except BaseException:
            self._conn.close()
            raise

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _tx(self) -> Iterator[psycopg2.extensions.cursor]:
        """One transaction: committed on success, rolled back on any exception. A connection
        lost on the way (server restart, terminated backend, network) is reported as such:
        nothing of the transaction was committed."""
        try:
            with self._mutex, self._conn, self._conn.cursor() as cur:
                yield cur
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            if not self._conn.closed:
                raise
            self._held.clear()  # the server released the session's advisory locks with it
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StateStoreLost(
                f"the state store connection to {self._summary['host']}:{self._summary['port']}/"
                f"{self._summary['dbname']} was lost ({detail}); the transaction did not commit, so the "
                "stored offsets and watermarks are unchanged: rerun once PostgreSQL is reachable"
            ) from exc

    def _tables_exist(self) -> bool:
        names = [
            sql.Identifier(*t).as_string(self._conn) for t in (self._runs, self._offsets, self._watermarks, self._windows)
        ]
        with self._tx() as cur:
            cur.execute(
                "SELECT bool_and(to_regclass(name) IS NOT NULL) FROM unnest(%s::text[]) AS name", (names,)
            )
            return bool(cur.fetchone()[0])

    def _create_tables(self) -> None:
        # Pre-created tables need no DDL, so a state user without CREATE privilege works too.
        if self._tables_exist():
            return
        for attempt in range(1, _DDL_ATTEMPTS + 1):
            try:
                with self._tx() as cur:
                    # Serialise dpone processes creating tables at once; the except below still
                    # covers anyone else creating the same objects.
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("dpone-state-ddl"),))
                    for statement in self._ddl():
                        cur.execute(statement)
                return
            except _DDL_RACE_ERRORS:
                if attempt == _DDL_ATTEMPTS:
                    raise
                log.debug("state tables created concurrently by another process; retrying")

    def _ddl(self) -> list[sql.Composed]:
        runs, offsets, marks = _ident(self._runs), _ident(self._offsets), _ident(self._watermarks)
        schemas = sorted({self._runs[0], self._offsets[0], self._watermarks[0], self._windows[0]})
        return [
            *(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(s)) for s in schemas),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " run_id text PRIMARY KEY,"
                " pipeline text NOT NULL,"
                " status text NOT NULL CHECK (status IN ('running', 'success', 'failed')),"
                " started_at timestamptz NOT NULL,"
                " finished_at timestamptz,"
                " boundary jsonb NOT NULL DEFAULT '{{}}',"
                " counts jsonb NOT NULL DEFAULT '{{}}',"
                " timings jsonb NOT NULL DEFAULT '{{}}',"
                " error text)"
            ).format(runs),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (pipeline, started_at DESC)").format(
                _index_name(self._runs[1], "pipeline_idx"), runs
            ),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " group_id text NOT NULL,"
                " topic text NOT NULL,"
                ' "partition" integer NOT NULL CHECK ("partition" >= 0),'
                ' "offset" bigint NOT NULL CHECK ("offset" >= 0),'
                " run_id text,"
                " updated_at timestamptz NOT NULL DEFAULT now(),"
                ' PRIMARY KEY (group_id, topic, "partition"))'
            ).format(offsets),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " pipeline text PRIMARY KEY,"
                " watermark jsonb NOT NULL,"
                " run_id text,"
                " updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(marks),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " group_id text NOT NULL,"
                " topic text NOT NULL,"
                " window_start timestamptz NOT NULL,"
                " window_end timestamptz NOT NULL,"
                ' "partition" integer NOT NULL CHECK ("partition" >= 0),'
                " start_offset bigint NOT NULL CHECK (start_offset >= 0),"
                " end_offset bigint NOT NULL CHECK (end_offset >= start_offset),"
                " run_id text,"
                " updated_at timestamptz NOT NULL DEFAULT now(),"
                ' PRIMARY KEY (group_id, topic, window_start, "partition"))'
            ).format(_ident(self._windows)),
        ]

    # ------------------------------------------------------------------ offsets

    def load_offsets(self, topic: str, group_id: str) -> dict[int, int]:
        query = sql.SQL('SELECT "partition", "offset" FROM {} WHERE group_id = %s AND topic = %s')
        with self._tx() as cur:
            cur.execute(query.format(_ident(self._offsets)), (group_id, topic))
            return {int(p): int(o) for p, o in cur.fetchall()}

    def _write_offsets(
        self, cur: Any, topic: str, group_id: str, offsets: dict[int, int], run_id: str | None
    ) -> None:
        query = sql.SQL(
            'INSERT INTO {} (group_id, topic, "partition", "offset", run_id, updated_at)'
            " VALUES (%s, %s, %s, %s, %s, now())"
            ' ON CONFLICT (group_id, topic, "partition") DO UPDATE'
            ' SET "offset" = EXCLUDED."offset", run_id = EXCLUDED.run_id, updated_at = now()'
        ).format(_ident(self._offsets))
        rows = [(group_id, topic, int(p), int(o), run_id) for p, o in sorted(offsets.items())]
        cur.executemany(query, rows)

    def reset_offsets(self, topic: str, group_id: str, offsets: dict[int, int] | None) -> None:
        check_offsets(topic, group_id, offsets)
        delete = sql.SQL("DELETE FROM {} WHERE group_id = %s AND topic = %s")
        with self._tx() as cur:
            cur.execute(delete.format(_ident(self._offsets)), (group_id, topic))
            if offsets:
                self._write_offsets(cur, topic, group_id, offsets, run_id=None)

    # ------------------------------------------------------------------ watermarks

    def load_watermark(self, pipeline: str) -> dict[str, Any] | None:
        query = sql.SQL("SELECT watermark FROM {} WHERE pipeline = %s").format(_ident(self._watermarks))
        with self._tx() as cur:
            cur.execute(query, (pipeline,))
            row = cur.fetchone()
        return row[0] if row else None

    def _write_watermark(self, cur: Any, pipeline: str, watermark: dict[str, Any], run_id: str) -> None:
        query = sql.SQL(
            "INSERT INTO {} (pipeline, watermark, run_id, updated_at) VALUES (%s, %s, %s, now())"
            " ON CONFLICT (pipeline) DO UPDATE"
            " SET watermark = EXCLUDED.watermark, run_id = EXCLUDED.run_id, updated_at = now()"
        ).format(_ident(self._watermarks))
        cur.execute(query, (pipeline, _json(watermark), run_id))

    # ------------------------------------------------------------------ time windows

    def load_windows(self, topic: str, group_id: str) -> dict[str, dict[str, Any]]:
        query = sql.SQL(
            'SELECT window_start, window_end, "partition", start_offset, end_offset, run_id FROM {}'
            " WHERE group_id = %s AND topic = %s"
        ).format(_ident(self._windows))
        with self._tx() as cur:
            cur.execute(query, (group_id, topic))
            rows = cur.fetchall()
        windows: dict[str, dict[str, Any]] = {}
        for start, end, partition, first, last, run_id in rows:
            key = start.astimezone(UTC).isoformat()
            entry = windows.setdefault(key, {"start": key, "end": end.astimezone(UTC).isoformat(), "partitions": {}, "run_id": run_id})
            entry["partitions"][str(partition)] = [int(first), int(last)]
        return windows

    def _add_windows(self, cur: Any, topic: str, group_id: str, windows: dict[str, dict[str, Any]], run_id: str) -> None:
        # DO NOTHING: the first run's ranges stay, reruns read them.
        query = sql.SQL(
            'INSERT INTO {} (group_id, topic, window_start, window_end, "partition", start_offset, end_offset, run_id)'
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            ' ON CONFLICT (group_id, topic, window_start, "partition") DO NOTHING'
        ).format(_ident(self._windows))
        rows = [
            (group_id, topic, datetime.fromisoformat(entry["start"]), datetime.fromisoformat(entry["end"]), int(p), int(r[0]), int(r[1]), run_id)
            for entry in windows.values()
            for p, r in sorted(entry["partitions"].items())
        ]
        cur.executemany(query, rows)

    # ------------------------------------------------------------------ runs

    def _run_values(self, record: RunRecord) -> tuple[Any, ...]:
        return (
            record.run_id,
            record.pipeline,
            record.status,
            record.started_at,
            record.finished_at,
            _json(record.boundary),
            _json(record.counts),
            _json(record.timings),
            record.error,
        )

    def _upsert_run(self, cur: Any, record: RunRecord, only_if: str) -> bool:
        """Insert the run, or overwrite it when the stored row matches `only_if`; True if written."""
        query = sql.SQL(
            "INSERT INTO {table} (" + _RUN_COLUMNS + ") VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (run_id) DO UPDATE SET status = EXCLUDED.status,"
            " finished_at = EXCLUDED.finished_at, boundary = EXCLUDED.boundary,"
            " counts = EXCLUDED.counts, timings = EXCLUDED.timings, error = EXCLUDED.error"
            " WHERE {table}.{only_if}"
        ).format(table=_ident(self._runs), only_if=sql.SQL(only_if))
        cur.execute(query, self._run_values(record))
        return cur.rowcount == 1

    def start_run(self, record: RunRecord) -> None:
        query = sql.SQL(
            "INSERT INTO {} (" + _RUN_COLUMNS + ") VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (run_id) DO NOTHING"
        ).format(_ident(self._runs))
        running = replace(record, status="running", finished_at=None, error=None)
        with self._tx() as cur:
            cur.execute(query, self._run_values(running))
            if cur.rowcount != 1:
                raise StateConflict(f"run {record.run_id} already exists in the state store")

    def _mark_success(self, cur: Any, record: RunRecord) -> None:
        if not self._upsert_run(cur, finished(record, "success"), only_if="status = 'running'"):
            raise StateConflict(
                f"run {record.run_id} already finished; refusing to commit its offsets/watermark again"
            )

    def finish_run_success(
        self,
        record: RunRecord,
        topic: str | None,
        group_id: str | None,
        offsets: dict[int, int] | None,
        watermark: dict[str, Any] | None = None,
        windows: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        check_offsets(topic, group_id, offsets)
        check_windows(topic, group_id, windows)
        with self._tx() as cur:
            if offsets:
                self._write_offsets(cur, topic, group_id, offsets, record.run_id)  # type: ignore[arg-type]
            if windows:
                self._add_windows(cur, topic, group_id, windows, record.run_id)  # type: ignore[arg-type]
            if watermark is not None:
                self._write_watermark(cur, record.pipeline, watermark, record.run_id)
            # Last on purpose: any failure up to here (or here) rolls the offsets back with it.
            self._mark_success(cur, record)

    def advance_offsets(self, record: RunRecord, topic: str, group_id: str, offsets: dict[int, int]) -> None:
        check_offsets(topic, group_id, offsets)
        running = sql.SQL("SELECT 1 FROM {} WHERE run_id = %s AND status = 'running' FOR UPDATE").format(_ident(self._runs))
        forward = sql.SQL(
            'INSERT INTO {table} (group_id, topic, "partition", "offset", run_id, updated_at)'
            " VALUES (%s, %s, %s, %s, %s, now())"
            ' ON CONFLICT (group_id, topic, "partition") DO UPDATE'
            ' SET "offset" = EXCLUDED."offset", run_id = EXCLUDED.run_id, updated_at = now()'
            ' WHERE {table}."offset" < EXCLUDED."offset"'
        ).format(table=_ident(self._offsets))
        with self._tx() as cur:
            cur.execute(running, (record.run_id,))
            if cur.fetchone() is None:
                raise StateConflict(f"run {record.run_id} is not running; refusing to advance its offsets")
            cur.executemany(forward, [(group_id, topic, int(p), int(o), record.run_id) for p, o in sorted(offsets.items())])

    def finish_run_failed(self, record: RunRecord) -> None:
        if self._conn.closed:
            # The failure may be the lost connection itself: record it on a new one.
            self._conn = psycopg2.connect(**self._connect_kwargs)
        with self._tx() as cur:
            written = self._upsert_run(cur, finished(record, "failed"), only_if="status <> 'success'")
        if not written:
            log.warning("run %s already committed as success; not marking it failed", record.run_id)

    def list_runs(self, pipeline: str, limit: int = 20) -> list[RunRecord]:
        query = sql.SQL(
            "SELECT " + _RUN_COLUMNS + " FROM {} WHERE pipeline = %s"
            " ORDER BY started_at DESC, run_id DESC LIMIT %s"
        ).format(_ident(self._runs))
        with self._tx() as cur:
            cur.execute(query, (pipeline, limit))
            rows = cur.fetchall()
        return [_run_from_row(row) for row in rows]

    # ------------------------------------------------------------------ locks

    def try_lock(self, pipeline: str) -> bool:
        if pipeline in self._held:
            return True  # session locks stack; keep one level so that one unlock releases
        with self._tx() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(pipeline),))
            taken = bool(cur.fetchone()[0])
        if taken:
            self._held.add(pipeline)
        return taken

    def unlock(self, pipeline: str) -> None:
        if pipeline not in self._held:
            return
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", (lock_key(pipeline),))
        self._held.discard(pipeline)

    # ------------------------------------------------------------------ misc

    def describe(self) -> dict[str, Any]:
        return {
            "type": "postgres",
            **self._summary,
            "runs_table": ".".join(self._runs),
            "offsets_table": ".".join(self._offsets),
            "watermarks_table": ".".join(self._watermarks),
        }

    def close(self) -> None:
        # Closing the session releases its advisory locks too.
        self._held.clear()
        if not self._conn.closed:
            self._conn.close()


def _run_from_row(row: tuple[Any, ...]) -> RunRecord:
    run_id, pipeline, status, started_at, finished_at, boundary, counts, timings, error = row
    return RunRecord(
        run_id=run_id,
        pipeline=pipeline,
        status=status,
        started_at=started_at,
        finished_at=finished_at,
        boundary=boundary or {},
        counts=counts or {},
        timings=timings or {},
        error=error,
    )
