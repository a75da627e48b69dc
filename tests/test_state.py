"""State stores against a real PostgreSQL (fresh database per session) and a tmp_path local store.

PostgreSQL settings: DPONE_TEST_PG_HOST/PORT/USER/PASSWORD (default 127.0.0.1:5432, user postgres,
trust auth). When it is unreachable the Postgres half fails under CI and is skipped, with the reason
shown, on a developer's local run (tests/conftest.py `service_missing`).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from conftest import service_missing
from psycopg2 import sql

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.manifest.models import StateConfig
from dpone_dagster.state import (
    LocalStateStore,
    PartitionOffset,
    PostgresStateStore,
    RunRecord,
    StateConflict,
    StateStore,
    open_state_store,
)
from dpone_dagster.state import local as local_module
from dpone_dagster.state.postgres import connection_summary, lock_key

TOPIC, GROUP, PIPELINE = "orders", "dpone-orders", "orders_pipeline"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

ADMIN_KWARGS: dict[str, Any] = {
    "host": os.environ.get("DPONE_TEST_PG_HOST", "127.0.0.1"),
    "port": int(os.environ.get("DPONE_TEST_PG_PORT", "5432")),
    "user": os.environ.get("DPONE_TEST_PG_USER", "postgres"),
    "dbname": "postgres",
    "connect_timeout": 5,
}
if os.environ.get("DPONE_TEST_PG_PASSWORD"):
    ADMIN_KWARGS["password"] = os.environ["DPONE_TEST_PG_PASSWORD"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def pg_kwargs() -> Iterator[dict[str, Any]]:
    """psycopg2 connect kwargs of a database created for this session and dropped afterwards."""
    try:
        admin = psycopg2.connect(**ADMIN_KWARGS)
    except psycopg2.OperationalError as exc:
        service_missing("PostgreSQL", f"{ADMIN_KWARGS['host']}:{ADMIN_KWARGS['port']}: {exc}")
    admin.autocommit = True
    name = f"dpone_test_state_{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield {**ADMIN_KWARGS, "dbname": name}
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.close()


@dataclass
class Backend:
    """Opens stores that share one backing state (same tables / same directory)."""

    kind: str
    opener: Callable[[], StateStore]
    opened: list[StateStore] = field(default_factory=list)

    def open(self) -> StateStore:
        store = self.opener()
        self.opened.append(store)
        return store


def _pg_tables(schema: str) -> dict[str, tuple[str, str]]:
    return {
        "runs_table": (schema, "dpone_state"),
        "offsets_table": (schema, "etl_kafka_offsets"),
        "watermarks_table": (schema, "etl_watermarks"),
    }


@pytest.fixture(params=["postgres", "local"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "postgres":
        kwargs = request.getfixturevalue("pg_kwargs")
        tables = _pg_tables(f"etl_state_{uuid.uuid4().hex[:8]}")  # isolates tests in the shared db
        result = Backend("postgres", lambda: PostgresStateStore(kwargs, **tables))
    else:
        result = Backend("local", lambda: LocalStateStore(tmp_path / "state"))
    yield result
    for store in result.opened:
        store.close()


@pytest.fixture
def store(backend: Backend) -> StateStore:
    return backend.open()


def run(run_id: str, minutes: int = 0, pipeline: str = PIPELINE, **extra: Any) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        pipeline=pipeline,
        status="running",
        started_at=T0 + timedelta(minutes=minutes),
        finished_at=None,
        boundary=extra.pop("boundary", {"end_offsets": {"0": 10}}),
        counts=extra.pop("counts", {"read": 10, "written": 10}),
        timings=extra.pop("timings", {"total_s": 1.5}),
        error=extra.pop("error", None),
    )


def status_of(store: StateStore, run_id: str, pipeline: str = PIPELINE) -> str | None:
    return next((r.status for r in store.list_runs(pipeline, limit=1000) if r.run_id == run_id), None)


# --------------------------------------------------------------------------- common contract


def test_stores_satisfy_protocol(store: StateStore) -> None:
    assert isinstance(store, StateStore)


def test_empty_store(store: StateStore) -> None:
    assert store.load_offsets(TOPIC, GROUP) == {}
    assert store.load_watermark(PIPELINE) is None
    assert store.list_runs(PIPELINE) == []


def test_success_commits_offsets_and_status_together(backend: Backend, store: StateStore) -> None:
    record = run("r1")
    store.start_run(record)
    assert status_of(store, "r1") == "running"
    assert store.load_offsets(TOPIC, GROUP) == {}

    store.finish_run_success(record, TOPIC, GROUP, {0: 10, 1: 5})

    reopened = backend.open()  # what another process sees
    assert reopened.load_offsets(TOPIC, GROUP) == {0: 10, 1: 5}
    assert reopened.load_offsets(TOPIC, "other-group") == {}
    assert reopened.load_offsets("other-topic", GROUP) == {}
    [stored] = reopened.list_runs(PIPELINE)
    assert stored.status == "success"
    assert stored.error is None
    assert stored.started_at == T0 and stored.started_at.tzinfo is not None
    assert stored.finished_at is not None and stored.finished_at.utcoffset() == timedelta(0)
    assert (stored.boundary, stored.counts, stored.timings) == (
        record.boundary,
        record.counts,
        record.timings,
    )


def test_success_upserts_per_partition(store: StateStore) -> None:
    first, second = run("r1"), run("r2", minutes=1)
    store.start_run(first)
    store.finish_run_success(first, TOPIC, GROUP, {0: 10, 1: 5})
    store.start_run(second)
    store.finish_run_success(second, TOPIC, GROUP, {1: 7, 2: 3})
    assert store.load_offsets(TOPIC, GROUP) == {0: 10, 1: 7, 2: 3}


def window(start: str, end: str, partitions: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    return {start: {"start": start, "end": end, "partitions": partitions}}


def test_time_window_ranges_are_recorded_once(backend: Backend, store: StateStore) -> None:
    """A window's ranges are written by its first successful run; a rerun (backfill) that passes
    other ranges leaves them as they were, while a partition new to the window is added."""
    h0, h1 = "2024-03-01T00:00:00+00:00", "2024-03-01T01:00:00+00:00"
    first, second = run("r1"), run("r2", minutes=1)
    store.start_run(first)
    store.finish_run_success(first, TOPIC, GROUP, None, windows=window(h0, h1, {"0": [0, 3], "1": [0, 0]}))
    store.start_run(second)
    store.finish_run_success(second, TOPIC, GROUP, None, windows={
        **window(h0, h1, {"0": [0, 5], "2": [0, 1]}),
        **window(h1, "2024-03-01T02:00:00+00:00", {"0": [3, 7]}),
    })  # fmt: skip
    recorded = backend.open().load_windows(TOPIC, GROUP)
    assert {k: (v["end"], v["partitions"]) for k, v in recorded.items()} == {
        h0: (h1, {"0": [0, 3], "1": [0, 0], "2": [0, 1]}),
        h1: ("2024-03-01T02:00:00+00:00", {"0": [3, 7]}),
    }
    assert store.load_offsets(TOPIC, GROUP) == {}  # windows never move the stored offsets
    assert backend.open().load_windows(TOPIC, "other-group") == {}
    third = run("r3", minutes=2)
    store.start_run(third)
    with pytest.raises(ValueError, match="invalid range"):
        store.finish_run_success(third, TOPIC, GROUP, None, windows=window(h0, h1, {"0": [5, 3]}))


def test_failed_run_keeps_offsets_and_records_error(store: StateStore) -> None:
    good = run("r1")
    store.start_run(good)
    store.finish_run_success(good, TOPIC, GROUP, {0: 10}, watermark={"column": "id", "value": 1})

    bad = run("r2", minutes=1)
    store.start_run(bad)
    store.finish_run_failed(replace_error(bad, "sink: broker unavailable"))

    assert store.load_offsets(TOPIC, GROUP) == {0: 10}
    assert store.load_watermark(PIPELINE) == {"column": "id", "value": 1}
    latest = store.list_runs(PIPELINE)[0]
    assert (latest.run_id, latest.status, latest.error) == ("r2", "failed", "sink: broker unavailable")
    assert latest.finished_at is not None


def test_a_running_run_advances_delivered_offsets_forward_only(backend: Backend, store: StateStore) -> None:
    earlier = run("r0")
    store.start_run(earlier)
    store.finish_run_success(earlier, TOPIC, GROUP, {0: 10, 1: 10})
    record = run("r1", minutes=1)
    store.start_run(record)
    store.advance_offsets(record, TOPIC, GROUP, {0: 30})
    store.advance_offsets(record, TOPIC, GROUP, {0: 20, 2: 5})  # 0 never moves back; 2 is new
    reopened = backend.open()
    assert reopened.load_offsets(TOPIC, GROUP) == {0: 30, 1: 10, 2: 5}
    assert status_of(reopened, "r1") == "running"  # the run goes on
    # A failed run keeps what it delivered; it never moves the offsets any further.
    store.finish_run_failed(replace_error(record, "killed"))
    with pytest.raises(StateConflict, match="r1"):
        store.advance_offsets(record, TOPIC, GROUP, {0: 40})
    assert backend.open().load_offsets(TOPIC, GROUP) == {0: 30, 1: 10, 2: 5}


def test_only_a_started_run_advances_offsets(store: StateStore) -> None:
    with pytest.raises(StateConflict):
        store.advance_offsets(run("never_started"), TOPIC, GROUP, {0: 5})
    assert store.load_offsets(TOPIC, GROUP) == {}


def replace_error(record: RunRecord, error: str) -> RunRecord:
    return RunRecord(**{**record.__dict__, "error": error})


def test_failed_run_without_start_is_recorded(store: StateStore) -> None:
    store.finish_run_failed(replace_error(run("r1"), "planning failed"))
    [stored] = store.list_runs(PIPELINE)
    assert (stored.status, stored.error) == ("failed", "planning failed")


def test_finished_run_cannot_commit_offsets(store: StateStore) -> None:
    record = run("r1")
    store.start_run(record)
    store.finish_run_failed(replace_error(record, "boom"))
    with pytest.raises(StateConflict, match="r1"):
        store.finish_run_success(record, TOPIC, GROUP, {0: 99})
    assert store.load_offsets(TOPIC, GROUP) == {}
    assert status_of(store, "r1") == "failed"
    assert issubclass(StateConflict, RunFailed)


def test_success_is_committed_once(store: StateStore) -> None:
    record = run("r1")
    store.start_run(record)
    store.finish_run_success(record, TOPIC, GROUP, {0: 10})
    with pytest.raises(StateConflict):
        store.finish_run_success(record, TOPIC, GROUP, {0: 50})
    store.finish_run_failed(replace_error(record, "late failure"))  # ignored: offsets already moved
    assert store.load_offsets(TOPIC, GROUP) == {0: 10}
    assert status_of(store, "r1") == "success"


def test_duplicate_start_is_refused(store: StateStore) -> None:
    store.start_run(run("r1"))
    with pytest.raises(StateConflict, match="already exists"):
        store.start_run(run("r1"))


def test_offsets_need_topic_and_group(store: StateStore) -> None:
    record = run("r1")
    store.start_run(record)
    with pytest.raises(ValueError, match="topic and group_id"):
        store.finish_run_success(record, None, None, {0: 1})
    with pytest.raises(ValueError, match=">= 0"):
        store.finish_run_success(record, TOPIC, GROUP, {0: -1})
    assert status_of(store, "r1") == "running"


def test_reset_offsets(store: StateStore) -> None:
    record = run("r1")
    store.start_run(record)
    store.finish_run_success(record, TOPIC, GROUP, {0: 10, 1: 5})
    other = run("r2", minutes=1)
    store.start_run(other)
    store.finish_run_success(other, "payments", GROUP, {0: 4})

    store.reset_offsets(TOPIC, GROUP, {0: 3})  # exactly these: partition 1 disappears
    assert store.load_offsets(TOPIC, GROUP) == {0: 3}

    store.reset_offsets(TOPIC, GROUP, None)  # to earliest
    assert store.load_offsets(TOPIC, GROUP) == {}
    assert store.load_offsets("payments", GROUP) == {0: 4}
    store.reset_offsets(TOPIC, GROUP, None)  # nothing stored: still fine


def test_watermark_round_trip(backend: Backend, store: StateStore) -> None:
    first = run("r1")
    store.start_run(first)
    store.finish_run_success(
        first, None, None, None, watermark={"column": "updated_at", "value": "2024-05-01"}
    )
    assert store.load_watermark(PIPELINE) == {"column": "updated_at", "value": "2024-05-01"}
    assert store.load_watermark("another_pipeline") is None

    second = run("r2", minutes=1)
    store.start_run(second)
    mark = {"column": "id", "value": 12345678901234, "ties": ["a", "b"], "nested": {"k": [1, 2]}}
    store.finish_run_success(second, None, None, None, watermark=mark)
    assert backend.open().load_watermark(PIPELINE) == mark
    assert store.load_offsets(TOPIC, GROUP) == {}


def test_json_columns_round_trip(store: StateStore) -> None:
    payload = {"ints": [1, 2, 2**62], "text": "zürich ✓", "nested": {"a": {"b": [None, True, 1.5]}}}
    record = run("r1", boundary=payload, counts={"read": 3, "by_partition": {"0": 1, "1": 2}}, timings={})
    store.start_run(record)
    store.finish_run_success(record, TOPIC, GROUP, {0: 3})
    [stored] = store.list_runs(PIPELINE)
    assert stored.boundary == payload
    assert stored.counts == {"read": 3, "by_partition": {"0": 1, "1": 2}}
    assert stored.timings == {}


def test_list_runs_newest_first_with_limit(store: StateStore) -> None:
    for index, minutes in enumerate([5, 1, 9, 3]):
        store.start_run(run(f"r{index}", minutes=minutes))
    store.start_run(run("x1", minutes=100, pipeline="other_pipeline"))
    store.finish_run_failed(replace_error(run("r2", minutes=9), "e"))

    runs = store.list_runs(PIPELINE)
    assert [r.run_id for r in runs] == ["r2", "r0", "r3", "r1"]
    assert runs[0].status == "failed"
    assert [r.run_id for r in store.list_runs(PIPELINE, limit=2)] == ["r2", "r0"]
    assert [r.run_id for r in store.list_runs("other_pipeline")] == ["x1"]


def test_opening_twice_is_idempotent(backend: Backend, store: StateStore) -> None:
    record = run("r1")
    store.start_run(record)
    store.finish_run_success(record, TOPIC, GROUP, {0: 1}, watermark={"v": 1})
    again = backend.open()  # creates tables / directories again: must be a no-op
    assert again.load_offsets(TOPIC, GROUP) == {0: 1}
    assert again.load_watermark(PIPELINE) == {"v": 1}
    assert [r.status for r in again.list_runs(PIPELINE)] == ["success"]


def test_lock_is_exclusive_between_stores(backend: Backend, store: StateStore) -> None:
    other = backend.open()
    assert store.try_lock(PIPELINE)
    assert store.try_lock(PIPELINE)  # already ours
    assert not other.try_lock(PIPELINE)
    assert other.try_lock("another_pipeline")  # locks are per pipeline

    store.unlock(PIPELINE)
    assert other.try_lock(PIPELINE)
    assert not store.try_lock(PIPELINE)

    other.close()  # closing releases every lock the store held
    assert store.try_lock(PIPELINE)
    assert store.try_lock("another_pipeline")


def test_unserializable_value_fails_inside_the_commit(store: StateStore) -> None:
    good = run("r1")
    store.start_run(good)
    store.finish_run_success(good, TOPIC, GROUP, {0: 10}, watermark={"v": 1})

    broken = run("r2", minutes=1, counts={"rows": object()})
    store.start_run(run("r2", minutes=1))
    with pytest.raises(TypeError):
        store.finish_run_success(broken, TOPIC, GROUP, {0: 99, 1: 5}, watermark={"v": 2})

    assert store.load_offsets(TOPIC, GROUP) == {0: 10}
    assert store.load_watermark(PIPELINE) == {"v": 1}
    assert status_of(store, "r2") == "running"


def test_describe_names_the_store(store: StateStore, backend: Backend) -> None:
    assert store.describe()["type"] == backend.kind


@pytest.mark.parametrize(
    "connect_kwargs",
    [
        {"host": "db", "port": 6432, "dbname": "state", "user": "etl", "password": "pw-Canary-1"},
        {"dsn": "postgresql://etl:pw-Canary-1@db:6432/state"},
        {"dsn": "host=db port=6432 dbname=state user=etl password=pw-Canary-1"},
    ],
    ids=["kwargs", "url_dsn", "keyword_dsn"],
)
def test_connection_summary_keeps_where_and_drops_the_password(connect_kwargs: dict[str, Any]) -> None:
    summary = connection_summary(connect_kwargs)
    assert summary == {"host": "db", "port": 6432, "dbname": "state", "user": "etl"}
    assert "pw-Canary-1" not in json.dumps(summary)


def test_postgres_describe_leaves_the_password_out(pg_kwargs: dict[str, Any]) -> None:
    # Trust auth ignores the password, so the store opens and describes itself with one set.
    store = PostgresStateStore({**pg_kwargs, "password": "pw-Canary-2"}, **_pg_tables(f"etl_state_{uuid.uuid4().hex[:8]}"))
    try:
        described = store.describe()
    finally:
        store.close()
    assert described["host"] == pg_kwargs["host"] and described["dbname"] == pg_kwargs["dbname"]
    assert "pw-Canary-2" not in json.dumps(described)


# --------------------------------------------------------------------------- records


def test_run_record_requires_aware_datetimes() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        RunRecord("r", PIPELINE, "running", datetime(2024, 1, 1), None, {}, {}, {}, None)
    with pytest.raises(ValueError, match="status"):
        RunRecord("r", PIPELINE, "done", T0, None, {}, {}, {}, None)
    paris = timezone(timedelta(hours=2))
    record = RunRecord(
        "r", PIPELINE, "running", datetime(2024, 1, 1, 14, tzinfo=paris), None, {}, {}, {}, None
    )
    assert record.started_at == datetime(2024, 1, 1, 12, tzinfo=UTC)
    assert record.started_at.tzinfo == UTC
    assert PartitionOffset(partition=0, offset=5) == PartitionOffset(0, 5)


# --------------------------------------------------------------------------- PostgreSQL only


def _pg_store(kwargs: dict[str, Any], schema: str) -> PostgresStateStore:
    return PostgresStateStore(kwargs, **_pg_tables(schema))


def test_pg_crash_between_offsets_and_status_rolls_back(
    pg_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _pg_store(pg_kwargs, f"crash_{uuid.uuid4().hex[:8]}")
    try:
        first = run("r1")
        store.start_run(first)
        store.finish_run_success(first, TOPIC, GROUP, {0: 10})
        second = run("r2", minutes=1)
        store.start_run(second)

        seen_in_transaction: dict[int, int] = {}

        def crash(self: PostgresStateStore, cur: Any, record: RunRecord) -> None:
            # The offsets are already written inside this transaction; then the process "dies".
            cur.execute(
                sql.SQL('SELECT "partition", "offset" FROM {}').format(sql.Identifier(*self._offsets))
            )
            seen_in_transaction.update(dict(cur.fetchall()))
            raise RuntimeError("simulated crash before the status update")

        monkeypatch.setattr(PostgresStateStore, "_mark_success", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            store.finish_run_success(second, TOPIC, GROUP, {0: 99, 1: 7}, watermark={"v": 2})
        monkeypatch.undo()

        assert seen_in_transaction == {0: 99, 1: 7}
        assert store.load_offsets(TOPIC, GROUP) == {0: 10}
        assert store.load_watermark(PIPELINE) is None
        assert status_of(store, "r2") == "running"
        # The connection is usable afterwards and the run can still commit.
        store.finish_run_success(second, TOPIC, GROUP, {0: 99, 1: 7})
        assert store.load_offsets(TOPIC, GROUP) == {0: 99, 1: 7}
    finally:
        store.close()


def test_pg_tables_have_the_documented_shape(pg_kwargs: dict[str, Any]) -> None:
    schema = f"shape_{uuid.uuid4().hex[:8]}"
    _pg_store(pg_kwargs, schema).close()
    with psycopg2.connect(**pg_kwargs) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = %s ORDER BY table_name, ordinal_position",
            (schema,),
        )
        columns: dict[str, dict[str, str]] = {}
        for table, column, data_type in cur.fetchall():
            columns.setdefault(table, {})[column] = data_type
        cur.execute(
            "SELECT tc.table_name, array_agg(kcu.column_name::text ORDER BY kcu.ordinal_position)"
            " FROM information_schema.table_constraints tc"
            " JOIN information_schema.key_column_usage kcu USING (constraint_schema, constraint_name)"
            " WHERE tc.table_schema = %s AND tc.constraint_type = 'PRIMARY KEY' GROUP BY tc.table_name",
            (schema,),
        )
        keys = dict(cur.fetchall())
    conn.close()
    assert columns["etl_kafka_offsets"] == {
        "group_id": "text",
        "topic": "text",
        "partition": "integer",
        "offset": "bigint",
        "run_id": "text",
        "updated_at": "timestamp with time zone",
    }
    assert columns["dpone_state"]["boundary"] == "jsonb"
    assert columns["dpone_state"]["started_at"] == "timestamp with time zone"
    assert list(columns["dpone_state"]) == [
        "run_id", "pipeline", "status", "started_at", "finished_at", "boundary", "counts", "timings", "error",
    ]  # fmt: skip
    assert columns["etl_watermarks"]["watermark"] == "jsonb"
    assert keys == {
        "etl_kafka_offsets": ["group_id", "topic", "partition"],
        "dpone_state": ["run_id"],
        "etl_watermarks": ["pipeline"],
        "etl_kafka_window_offsets": ["group_id", "topic", "window_start", "partition"],
    }
    assert columns["etl_kafka_window_offsets"] == {
        "group_id": "text",
        "topic": "text",
        "window_start": "timestamp with time zone",
        "window_end": "timestamp with time zone",
        "partition": "integer",
        "start_offset": "bigint",
        "end_offset": "bigint",
        "run_id": "text",
        "updated_at": "timestamp with time zone",
    }


def test_pg_concurrent_table_creation(pg_kwargs: dict[str, Any]) -> None:
    """Several processes starting at once on an empty database all get their store."""
    schema = f"race_{uuid.uuid4().hex[:8]}"
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            barrier.wait()
            _pg_store(pg_kwargs, schema).close()
        except BaseException as exc:  # collected and asserted in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []


def test_pg_pre_created_tables_need_no_create_privilege(pg_kwargs: dict[str, Any]) -> None:
    schema, role = f"provisioned_{uuid.uuid4().hex[:8]}", f"dpone_test_state_{uuid.uuid4().hex[:8]}"
    _pg_store(pg_kwargs, schema).close()  # the DBA creates the tables
    admin = psycopg2.connect(**pg_kwargs)
    admin.autocommit = True
    grants = [
        "CREATE ROLE {role} LOGIN",
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
        "REVOKE CREATE ON DATABASE {db} FROM PUBLIC",
        "GRANT USAGE ON SCHEMA {schema} TO {role}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
    ]
    names = {
        "role": sql.Identifier(role),
        "schema": sql.Identifier(schema),
        "db": sql.Identifier(pg_kwargs["dbname"]),
    }
    try:
        with admin.cursor() as cur:
            for statement in grants:
                cur.execute(sql.SQL(statement).format(**names))
        store = _pg_store({**pg_kwargs, "user": role}, schema)
        try:
            record = run("r1")
            store.start_run(record)
            store.finish_run_success(record, TOPIC, GROUP, {0: 1}, watermark={"v": 1})
            assert store.load_offsets(TOPIC, GROUP) == {0: 1}
        finally:
            store.close()
        config = StateConfig.model_validate(
            {
                "type": "postgres",
                "connection_id": "postgres_state",
                "table": {"schema": f"{schema}_new", "name": "t"},
            }
        )
        with pytest.raises(ConfigError, match="cannot create the state tables.*grant the state user CREATE"):
            open_state_store(config, PIPELINE, {**pg_kwargs, "user": role})
    finally:
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP OWNED BY {role}").format(**names))
            cur.execute(sql.SQL("DROP ROLE {role}").format(**names))
        admin.close()


def test_pg_quotes_identifiers(pg_kwargs: dict[str, Any]) -> None:
    odd = f'Odd "Schema"; {uuid.uuid4().hex[:6]}'
    store = PostgresStateStore(pg_kwargs, (odd, "Run State"), (odd, "offsets-table"), (odd, "marks"))
    try:
        record = run("r1")
        store.start_run(record)
        store.finish_run_success(record, TOPIC, GROUP, {0: 1})
        assert store.load_offsets(TOPIC, GROUP) == {0: 1}
    finally:
        store.close()


def test_pg_lock_is_a_session_advisory_lock(pg_kwargs: dict[str, Any]) -> None:
    store = _pg_store(pg_kwargs, f"lock_{uuid.uuid4().hex[:8]}")
    try:
        assert lock_key(PIPELINE) == lock_key(PIPELINE) != lock_key("other")
        assert store.try_lock(PIPELINE)
        with psycopg2.connect(**pg_kwargs) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(PIPELINE),))
            assert cur.fetchone()[0] is False
        conn.close()
        # A failed transaction on the store's connection keeps the session lock.
        with pytest.raises(TypeError):
            store.finish_run_success(run("r1", counts={"x": object()}), None, None, None)
        with psycopg2.connect(**pg_kwargs) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(PIPELINE),))
            assert cur.fetchone()[0] is False
        conn.close()
    finally:
        store.close()


def test_factory_opens_postgres_store(pg_kwargs: dict[str, Any]) -> None:
    schema = f"factory_{uuid.uuid4().hex[:8]}"
    config = StateConfig.model_validate(
        {
            "type": "postgres",
            "connection_id": "postgres_state",
            "table": {"schema": schema, "name": "dpone_state"},
            "offsets_table": {"schema": schema, "name": "etl_kafka_offsets"},
        }
    )
    store = open_state_store(config, PIPELINE, pg_kwargs)
    try:
        assert isinstance(store, PostgresStateStore)
        assert store.describe()["watermarks_table"] == f"{schema}.etl_watermarks"
        assert store.describe()["offsets_table"] == f"{schema}.etl_kafka_offsets"
    finally:
        store.close()


# --------------------------------------------------------------------------- factory errors

POSTGRES_CONFIG = StateConfig(type="postgres", connection_id="postgres_state")
SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    "connect_kwargs",
    [
        {"host": "127.0.0.1", "port": 1, "user": "etl", "password": SECRET, "dbname": "state"},
        {"dsn": f"postgresql://etl:{SECRET}@127.0.0.1:1/state"},
        {"dsn": f"host=127.0.0.1 port=1 password={SECRET} {SECRET}garbage"},
    ],
    ids=["kwargs", "url", "broken-dsn"],
)
def test_unreachable_postgres_is_a_config_error(connect_kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as caught:
        open_state_store(POSTGRES_CONFIG, PIPELINE, connect_kwargs)
    message = str(caught.value)
    assert "state.connection_id postgres_state" in message
    assert "127.0.0.1:1" in message or "invalid DSN" in message
    assert "start it or fix POSTGRES_STATE_HOST" in message
    assert SECRET not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_wrong_credentials_are_a_config_error(pg_kwargs: dict[str, Any]) -> None:
    kwargs = {**pg_kwargs, "user": "dpone_no_such_role", "password": SECRET}
    with pytest.raises(ConfigError, match="dpone_no_such_role") as caught:
        open_state_store(POSTGRES_CONFIG, PIPELINE, kwargs)
    assert SECRET not in str(caught.value)


def test_postgres_without_connection_settings_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="state.connection_id postgres_state"):
        open_state_store(POSTGRES_CONFIG, PIPELINE, None)


def test_factory_opens_local_store(tmp_path: Path) -> None:
    config = StateConfig(type="local", path=str(tmp_path / "st"))
    store = open_state_store(config, PIPELINE, None)
    assert isinstance(store, LocalStateStore)
    assert store.describe() == {"type": "local", "path": str(tmp_path / "st")}


# --------------------------------------------------------------------------- local only


def test_local_crash_before_replace_leaves_state_and_no_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStateStore(tmp_path)
    first = run("r1")
    store.start_run(first)
    store.finish_run_success(first, TOPIC, GROUP, {0: 10})
    second = run("r2", minutes=1)
    store.start_run(second)

    def crash(src: str, dst: str) -> None:
        raise OSError("simulated crash before the atomic replace")

    monkeypatch.setattr(local_module.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.finish_run_success(second, TOPIC, GROUP, {0: 99}, watermark={"v": 2})
    monkeypatch.undo()

    assert store.load_offsets(TOPIC, GROUP) == {0: 10}
    assert store.load_watermark(PIPELINE) is None
    assert status_of(store, "r2") == "running"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_local_crash_after_replace_keeps_the_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStateStore(tmp_path)
    first = run("r1")
    store.start_run(first)

    real_append = LocalStateStore._append_run

    def crash(self: LocalStateStore, record: RunRecord) -> None:
        if record.status == "success":
            raise OSError("simulated crash after the state commit")
        real_append(self, record)

    monkeypatch.setattr(LocalStateStore, "_append_run", crash)
    with pytest.raises(OSError):
        store.finish_run_success(first, TOPIC, GROUP, {0: 10})
    monkeypatch.undo()

    reopened = LocalStateStore(tmp_path)
    assert reopened.load_offsets(TOPIC, GROUP) == {0: 10}
    assert status_of(reopened, "r1") == "success"

    # The next commit replaces the last success in state.json; r1 must stay success in history.
    second = run("r2", minutes=1)
    reopened.start_run(second)
    reopened.finish_run_success(second, TOPIC, GROUP, {0: 20})
    assert [(r.run_id, r.status) for r in reopened.list_runs(PIPELINE)] == [
        ("r2", "success"),
        ("r1", "success"),
    ]


def test_local_tolerates_a_torn_log_line(tmp_path: Path) -> None:
    store = LocalStateStore(tmp_path)
    store.start_run(run("r1"))
    log_path = next((tmp_path / "runs").iterdir())
    with open(log_path, "a", encoding="utf-8") as handle:
        handle.write('{"run_id": "r2", "pipel')  # crash mid-append
    store.start_run(run("r3", minutes=2))
    assert [r.run_id for r in store.list_runs(PIPELINE)] == ["r3", "r1"]


def test_local_corrupt_state_file_is_a_config_error(tmp_path: Path) -> None:
    store = LocalStateStore(tmp_path)
    (tmp_path / "state.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="state.json: state file is not valid JSON"):
        store.load_offsets(TOPIC, GROUP)


def test_local_state_file_is_one_document(tmp_path: Path) -> None:
    store = LocalStateStore(tmp_path)
    record = run("r1")
    store.start_run(record)
    store.finish_run_success(record, TOPIC, GROUP, {0: 10}, watermark={"v": 1})
    state = json.loads((tmp_path / "state.json").read_text(encoding="utf-8"))
    assert state["offsets"][GROUP][TOPIC]["0"]["offset"] == 10
    assert state["offsets"][GROUP][TOPIC]["0"]["run_id"] == "r1"
    assert state["watermarks"][PIPELINE]["value"] == {"v": 1}
    assert state["last_success"][PIPELINE]["status"] == "success"
