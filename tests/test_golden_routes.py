"""Golden outputs of every route: what each route writes to its target topics (keys, values,
headers, partitions of keyed messages, and the order of each key's messages), byte for byte, on
fixed inputs. The files under tests/golden/ were written by the engine as it was before its
shaping moved to one engine; a rewrite must produce the same bytes.

    DPONE_GOLDEN_WRITE=1 .venv/bin/python -m pytest tests/test_golden_routes.py   # rewrite them

Every run has a fixed run id (it is in the dpone envelope and dead-letter headers); a message
without a key has no fixed partition (the producer picks one) and is compared without it; Schema
Registry ids come from a fresh in-memory registry each time.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from confluent_kafka import Producer
from conftest import PG_HOST, PG_PORT, PG_USER, consume_raw, create_topic, fresh_pg_database

from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.manifest import parse_manifest

GOLDEN = Path(__file__).parent / "golden"
WRITE = os.environ.get("DPONE_GOLDEN_WRITE") == "1"
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def order(i: int) -> dict[str, Any]:
    """An order event with nested objects, arrays, doubles, nulls, escapes and non-ASCII text."""
    return {
        "order_id": i,
        "customer": f"c{i % 7}",
        "amount": round(i * 1.37 % 1000, 2) if i % 11 else None,
        "rate": (i % 7) / 3,
        "paid": i % 3 == 0,
        "note": ["plain", 'say "hi"\n', "é€😀", "tab\tand\\slash", "\u0001ctl"][i % 5],
        "tags": [f"t{j}" for j in range(i % 3)],
        "address": {"city": f"city{i % 5}", "zip": None if i % 4 == 0 else f"{i:05d}"},
    }


@dataclass
class Source:
    """Records of a source topic: (partition, key, value or None, headers, timestamp ms)."""

    partitions: int = 2
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]] = field(default_factory=list)

    def add(self, partition: int, value: Any, key: Any = None, headers: list[tuple[str, bytes]] | None = None, at_s: int = 0) -> None:
        raw = None if value is None else value if isinstance(value, bytes) else json.dumps(value).encode()
        key_bytes = None if key is None else str(key).encode()
        self.records.append((partition, key_bytes, raw, headers or [], BASE_MS + at_s * 1000))

    def produce(self, bootstrap: str, topic: str) -> None:
        create_topic(bootstrap, topic, self.partitions)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for partition, key, value, headers, timestamp in self.records:
            producer.produce(topic, value=value, key=key, partition=partition, headers=headers or None, timestamp=timestamp)
        assert producer.flush(30) == 0


def orders_source(n: int = 120, repeat_every: int | None = None) -> Source:
    """n orders over two partitions; with `repeat_every`, order ids repeat (later updates win)."""
    source = Source()
    for i in range(n):
        oid = i % repeat_every if repeat_every else i
        value = {**order(oid), "version": i}
        source.add(i % 2, value, key=oid, headers=[("trace", f"t{i}".encode())], at_s=i)
    return source


def deletes_source() -> Source:
    """Upserts, source tombstones (key only) and dpone envelopes with op delete, mixed."""
    source = Source()
    for i in range(40):
        source.add(i % 2, {"op": "upsert", "data": order(i % 20)}, key=i % 20, at_s=i)
    for i in range(0, 20, 3):
        source.add(i % 2, None, key=i, at_s=100 + i)  # a tombstone deletes key i
    for i in range(1, 20, 5):
        source.add(i % 2, {"op": "delete", "data": {"order_id": i}}, key=i, at_s=200 + i)
    return source


def bad_records_source() -> Source:
    source = Source()
    for i in range(30):
        source.add(i % 2, order(i) if i % 7 else b"{not json", key=i, at_s=i)
    return source


@dataclass(frozen=True)
class Route:
    name: str
    source: Any  # () -> Source
    strategy: str = "{mode: incremental_append, unique_key: order_id}"
    sink_options: str = "{}"
    source_options: str = "{}"
    registry: bool = False
    dead_letters: bool = False
    path: str = "direct"  # the path the run takes


ROUTES = [
    Route("json_flat_append", orders_source),
    Route("json_flat_merge_keep_last", lambda: orders_source(160, repeat_every=45),
          strategy="{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"),
    Route("json_flat_merge_keep_first", lambda: orders_source(160, repeat_every=45),
          strategy="{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_first}"),
    Route("json_composite_key", orders_source, strategy="{mode: incremental_append, unique_key: [customer, order_id]}"),
    Route("json_hash_row_key", orders_source, sink_options="{key: {mode: hash_row}}"),
    Route("json_null_key", orders_source, sink_options='{key: {mode: "null"}}'),
    Route("json_dpone_envelope_headers", orders_source,
          sink_options="{envelope: dpone, headers: {static: {team: dwh, env: test}, lineage: true, replicate_source: true}}"),
    Route("json_deletes_tombstones", deletes_source,
          strategy="{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}",
          sink_options="{deletes: {enabled: true, tombstone: true}}", source_options="{envelope: dpone}"),
    Route("json_deletes_as_envelope_events", deletes_source,
          strategy="{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}",
          sink_options="{envelope: dpone, deletes: {enabled: true, tombstone: false}}", source_options="{envelope: dpone}"),
    Route("json_bad_records_to_dead_letters", bad_records_source,
          source_options="{on_error: dead_letter, dead_letter: {topic: DLQ, create: true}}", dead_letters=True),
    Route("json_full_refresh_envelope", lambda: orders_source(160, repeat_every=45),
          strategy="{mode: full_refresh, unique_key: order_id, duplicate_policy: keep_last}", sink_options="{envelope: dpone}"),
    Route("json_replace_window_keep_first", lambda: orders_source(160, repeat_every=45),
          strategy="{mode: replace, unique_key: order_id, duplicate_policy: keep_first}",
          source_options="{start_timestamp: '2026-01-01T00:00:30Z', end_timestamp: '2026-01-01T00:02:00Z'}"),
    Route("avro_registry", orders_source, registry=True,
          sink_options="{message_format: avro, schema_registry: {enabled: true}}"),
    Route("json_schema_registry", orders_source, registry=True,
          sink_options="{message_format: json_schema, schema_registry: {enabled: true}}"),
    Route("avro_registry_merge_keep_last", lambda: orders_source(160, repeat_every=45), registry=True,
          strategy="{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}",
          sink_options="{message_format: avro, headers: {lineage: true}, schema_registry: {enabled: true}}"),
    Route("avro_registry_deletes_tombstones", deletes_source, registry=True,
          strategy="{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}",
          sink_options="{message_format: avro, deletes: {enabled: true, tombstone: true}, schema_registry: {enabled: true}}",
          source_options="{envelope: dpone}"),
]


def manifest_text(route: Route, src: str, dst: str, state: Path) -> str:
    return f"""
name: golden_{route.name}
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}, options: {route.source_options}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {route.strategy}
  options: {route.sink_options}
state: {{type: local, path: {state}}}
"""


def observed(bootstrap: str, topic: str, expected: int | None = None) -> dict[str, Any]:
    """What a topic holds, in a form that does not depend on the run: the messages (sorted), and
    each key's values in the order they were written. `expected`: what the run's deliveries
    acknowledged (a read that ends short is read again: conftest.consume_raw)."""
    records = sorted(consume_raw(bootstrap, topic, timeout_s=60, expected=expected), key=lambda r: (r["partition"], r["offset"]))

    def text(data: bytes | None) -> str | None:
        """Printable UTF-8 (JSON, text keys) as text, anything else (registry framing) as hex."""
        if data is None:
            return None
        try:
            decoded = data.decode("utf-8")
        except UnicodeDecodeError:
            return "hex:" + data.hex()
        return decoded if decoded.isprintable() else "hex:" + data.hex()

    messages = []
    by_key: dict[str, list[str | None]] = defaultdict(list)
    for r in records:
        key = text(r["key"])
        value = text(r["value"])
        messages.append(
            {
                "partition": r["partition"] if r["key"] is not None else None,
                "key": key,
                "value": value,
                "headers": [[k, text(v)] for k, v in r["headers"]],
            }
        )
        if key is not None:
            by_key[key].append(value)
    messages.sort(key=lambda m: json.dumps(m, sort_keys=True))
    return {"messages": messages, "order_by_key": dict(sorted(by_key.items()))}


@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_route_writes_its_golden_output(broker, spark, kafka_env, tmp_path, monkeypatch, route):
    bs = broker.bootstrap_servers
    # Fixed names: the source topic is in lineage headers and the dpone envelope.
    src, dst, dlq = f"golden_{route.name}", f"golden_{route.name}_out", f"golden_{route.name}_dlq"
    route.source().produce(bs, src)
    create_topic(bs, dst, 2)
    if route.registry:
        monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://golden-{uuid.uuid4().hex[:8]}")
    text = manifest_text(route, src, dst, tmp_path / "state").replace("DLQ", dlq)
    result = run_pipeline(parse_manifest(text), spark, RunRequest(run_id=f"golden-{route.name}"))
    assert result.status == "success"
    assert WRITE or result.execution_path == route.path, result.notes
    got = {"target": observed(bs, dst, result.messages_produced)}
    if route.dead_letters:
        got["dead_letters"] = observed(bs, dlq, result.rows_dead_lettered)
    check_golden(route.name, got)


DEDUPLICATED = [r for r in ROUTES if "keep_" in r.strategy]


@pytest.mark.parametrize("route", DEDUPLICATED, ids=[r.name for r in DEDUPLICATED])
def test_repeated_keys_ranked_by_spark_write_the_same_output(broker, spark, kafka_env, tmp_path, monkeypatch, route):
    """keep_last / keep_first past the driver's limit of candidate keys: a Spark window ranks the
    records of repeated keys (engine/direct_keys.py). Same input, same run id: the messages are
    those of the driver's ranking (which the golden output above fixes), byte for byte."""
    from dpone_dagster.engine import direct_keys

    bs = broker.bootstrap_servers
    src = f"golden_{route.name}_ranked"
    route.source().produce(bs, src)
    real, ranked = direct_keys.ranked_losers, []
    monkeypatch.setattr(direct_keys, "ranked_losers", lambda *args: ranked.append(args) or real(*args))
    out = {}
    for ranking, limit in (("driver", direct_keys.DRIVER_CANDIDATES), ("spark", 0)):
        monkeypatch.setattr(direct_keys, "DRIVER_CANDIDATES", limit)
        if route.registry:  # a registry of its own: the schema's id is the same in both outputs
            monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://golden-{uuid.uuid4().hex[:8]}")
        dst = f"{src}_{ranking}"
        create_topic(bs, dst, 2)
        text = manifest_text(route, src, dst, tmp_path / ranking)
        result = run_pipeline(parse_manifest(text), spark, RunRequest(run_id=f"golden-{route.name}"))
        assert result.execution_path == "direct" and result.duplicates_removed > 0, result.notes
        out[ranking] = (observed(bs, dst, result.messages_produced), result.duplicates_removed)
    assert len(ranked) == 1  # the second run only
    assert out["spark"] == out["driver"]


def test_postgres_to_kafka_writes_its_golden_output(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Seed 002's route on PostgreSQL: a table of typed rows (decimals, timestamps, dates, text,
    binary, nulls) to JSON messages keyed by order_id."""
    bs = broker.bootstrap_servers
    dst = "golden_postgres_out"
    create_topic(bs, dst, 2)
    with fresh_pg_database("dpone_golden") as db:
        conn = psycopg2.connect(**db)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(
                "CREATE TABLE public.orders (order_id bigint PRIMARY KEY, customer text, amount numeric(12,2), "
                "placed_at timestamp, placed_on date, flag boolean, blob bytea, updated_at timestamp NOT NULL)"
            )
            cur.execute(
                "INSERT INTO public.orders SELECT i, 'c' || (i % 7) || CASE WHEN i % 5 = 0 THEN ' é\"x' ELSE '' END, "
                "CASE WHEN i % 11 = 0 THEN NULL ELSE (i * 13.37)::numeric(12,2) END, "
                "timestamp '2026-01-01 00:00:00' + i * interval '1 minute 1.5 second', date '2026-01-01' + i, "
                "i % 2 = 0, decode(lpad(to_hex(i), 4, '0'), 'hex'), timestamp '2026-01-02 00:00:00' + i * interval '1 second' "
                "FROM generate_series(1, 150) AS i"
            )
        conn.close()
        for key, value in {"SQL_DB_HOST": PG_HOST, "SQL_DB_PORT": str(PG_PORT), "SQL_DB_USER": PG_USER, "SQL_DB_DATABASE": db["dbname"]}.items():
            monkeypatch.setenv(key, value)
        text = f"""
name: golden_postgres
source:
  type: postgres
  connection_id: sql_db
  table: {{schema: public, name: orders}}
  options: {{incremental_column: updated_at}}
sink: {{type: kafka, connection_id: kafka_cluster, topic: {dst}, strategy: {{mode: incremental_append, unique_key: order_id}}}}
state: {{type: local, path: {tmp_path / "state"}}}
"""
        result = run_pipeline(parse_manifest(text), spark, RunRequest(run_id="golden-postgres"))
    check_golden("postgres_to_kafka_json", {"target": observed(bs, dst, result.messages_produced)})


def check_golden(name: str, got: dict[str, Any]) -> None:
    path = GOLDEN / f"{name}.json"
    if WRITE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
        return
    assert path.exists(), f"{path} is missing: write it with DPONE_GOLDEN_WRITE=1 from the engine whose output it fixes"
    expected = json.loads(path.read_text())
    for topic in expected:
        assert got[topic]["messages"] == expected[topic]["messages"], f"{name}: the {topic} messages differ from {path.name}"
        assert got[topic]["order_by_key"] == expected[topic]["order_by_key"], f"{name}: a key's messages come in another order"
    assert set(got) == set(expected)
