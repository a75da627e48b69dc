"""The direct path (engine/direct.py) against the Spark SQL path on the same source: the target
topics must hold the same messages (key, value, partition), byte for byte; what the direct path
cannot do exactly goes to the Spark SQL path, never half done. The Spark SQL path's outcomes are
stored under tests/golden/spark_sql/ (tests/spark_sql_golden.py); the direct path runs live."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import spark_sql_golden
from confluent_kafka import Producer
from conftest import consume_raw, create_topic, produce_json, unique_topic
from spark_sql_golden import names, on_both_paths, without_timestamp

from dpone_dagster.direct import spill, task
from dpone_dagster.direct.keys import (
    TaskHashes,
    candidates,
    in_sorted,
    is_candidate,
    key_hashes,
    keyed_hashes,
    left_out_by_policy,
    repeated_keys,
)
from dpone_dagster.direct.late import late_counts
from dpone_dagster.direct.progress import SliceProgress, SliceSchedule
from dpone_dagster.engine.direct_keys import losers
from dpone_dagster.engine.run import RunRequest, open_manifest_state_store, run_pipeline
from dpone_dagster.errors import ConfigError, DataRefused, RunFailed
from dpone_dagster.formats import avro_columns, registry_source
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.schema.avro import avro_to_spark
from dpone_dagster.sources.kafka_reader import ReaderSettings
from dpone_dagster.spark.jobs import BoundedJobs, JobTimedOut, in_tasks
from dpone_dagster.state.local import LocalStateStore


def manifest_text(src: str, dst: str, state: Path, strategy: str, sink_options: str = "", quality: str = "") -> str:
    return f"""
name: direct_{dst}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options: {{group_id: g_{dst}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {strategy}
  options: {{{sink_options}}}
state: {{type: local, path: "{state}"}}
{quality}
"""


def run_both(
    bs: str, spark: Any, src: str, tmp_path: Path, monkeypatch: Any, strategy: str, sink_options: str = "", partitions: int = 3, source_options: str = ""
):
    """The same manifest on each path, each into its own target; returns (direct, spark_sql),
    each as (RunResult, records)."""
    def run(path: str, dst: str) -> tuple[Any, list[dict[str, Any]]]:
        create_topic(bs, dst, partitions)
        text = manifest_text(src, dst, tmp_path / path, strategy, sink_options)
        if source_options:
            text = text.replace("options: {group_id:", f"options: {{{source_options}, group_id:")
        request = RunRequest(run_id=spark_sql_golden.run_id()) if path == "spark_sql" else RunRequest()
        result = run_pipeline(parse_manifest(text), spark, request)
        records = consume_raw(bs, dst, expected=result.messages_produced)
        arrived = {p: sorted(r["offset"] for r in records if r["partition"] == p) for p in range(partitions)}
        assert len(records) == result.messages_produced, (path, result.messages_produced, {p: (len(o), o[:1], o[-1:]) for p, o in arrived.items()})
        return result, [without_timestamp(r) for r in records]

    both = on_both_paths(monkeypatch, tmp_path, run, {"dst": "d"}, src=src)
    return [both["direct"], both["spark_sql"]]


def on_error_outcomes(bs: str, spark: Any, src: str, tmp_path: Path, monkeypatch: Any, strategy: str, sink_options: str, source_options: str) -> dict[str, tuple]:
    """The same manifest on each path, with a dead-letter topic of its own (`source_options` name
    on_error): per path (rows extracted, dead-lettered, skipped, duplicates removed, produced,
    committed offsets, the target's messages and each key's order, the dead letters without the
    run's own headers)."""
    def run(path: str, dst: str, dlq: str) -> tuple:
        create_topic(bs, dst, 2)
        create_topic(bs, dlq, 1)
        text = manifest_text(src, dst, tmp_path / path, strategy, sink_options)
        text = text.replace("options: {group_id:", f"options: {{{source_options}, dead_letter: {{topic: {dlq}}}, group_id:")
        result = run_pipeline(parse_manifest(text), spark)
        assert result.execution_path == path, result.notes
        own = ("dpone.error.run_id", "dpone.error.pipeline")  # the run's and the manifest's names
        letters = sorted((r["key"], r["value"], tuple((k, v) for k, v in r["headers"] if k not in own)) for r in consume_raw(bs, dlq, expected=result.rows_dead_lettered))
        return (
            result.rows_extracted, result.rows_dead_lettered, result.rows_skipped, result.duplicates_removed, result.messages_produced,
            result.committed_offsets, in_key_order(consume_raw(bs, dst, expected=result.messages_produced)), letters,
        )

    return on_both_paths(monkeypatch, tmp_path, run, {"dst": "db", "dlq": "dbl"}, src=src)


def no_handover(monkeypatch: Any) -> None:
    """A batch the direct path hands to the Spark SQL path fails the test (for tests whose
    outcome, a refusal, is the same on both paths)."""
    from dpone_dagster.engine.direct_attempt import Attempt

    def refused(self: Any, result: Any, reason: Any, log: Any) -> None:
        raise AssertionError(f"the direct path handed the batch over: {reason}")

    monkeypatch.setattr(Attempt, "take_back", refused)


def messages(records: list[dict[str, Any]]) -> Counter:
    """Keyed messages with their partition; a message without a key lands where the producer's
    sticky partitioner put it, on either path."""
    return Counter((r["partition"] if r["key"] is not None else None, r["key"], r["value"]) for r in records)


def in_key_order(records: list[dict[str, Any]]) -> tuple[Counter, dict[bytes, list[bytes]]]:
    """`messages`, and each key's values in topic order (a key's messages share a partition)."""
    order: dict[bytes, list[bytes]] = {}
    for r in sorted((r for r in records if r["key"] is not None), key=lambda r: r["offset"]):
        order.setdefault(r["key"], []).append(r["value"])
    return messages(records), order


def orders(n: int, start: int = 0) -> list[dict[str, Any]]:
    """Order events with nested objects, arrays, doubles, nulls, escapes and non-ASCII text."""
    out = []
    for i in range(start, start + n):
        out.append(
            {
                "order_id": i,
                "customer": f"c{i % 97}",
                "amount": round(i * 1.37 % 1000, 2) if i % 11 else None,
                "rate": (i % 7) / 3,
                "big": i * 1_000_003,
                "paid": i % 3 == 0,
                "note": ["plain", 'say "hi"\n', "é€😀", "tab\tand\\slash", "\u0001ctl"][i % 5],
                "tags": [f"t{j}" for j in range(i % 3)],
                "address": {"city": f"city{i % 5}", "zip": None if i % 4 == 0 else f"{i:05d}", "lines": [{"n": i % 9}]},
            }
        )
    return out


def test_same_messages_on_both_paths(broker, spark, kafka_env, tmp_path, monkeypatch):
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 3)
    for p in range(3):
        produce_json(bs, src, orders(400, p * 400), partition=p)
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_merge, unique_key: order_id}"
    )
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql"
    assert len(direct_records) == 1200
    assert messages(direct_records) == messages(sql_records)
    assert direct.committed_offsets == sql.committed_offsets == {0: 400, 1: 400, 2: 400}
    assert direct.rows_extracted == direct.messages_produced == 1200
    # The values are the source records (what the JVM decoder and encoder make of them).
    assert sorted(json.loads(r["value"])["order_id"] for r in direct_records) == list(range(1200))


@pytest.mark.parametrize("policy", ["keep_last", "keep_first"])
def test_repeated_keys_keep_the_record_the_spark_sql_path_keeps(broker, spark, kafka_env, tmp_path, monkeypatch, policy):
    """Keys repeat within a partition and across partitions, with equal timestamps (the tie is
    broken by partition, then offset), and order ids look alike as text and as numbers."""
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 3)
    rows = {p: [{"order_id": i % 50, "version": f"p{p}-{i}"} for i in range(120)] for p in range(3)}
    for p in range(3):
        produce_json(bs, src, rows[p], partition=p, timestamps=[1_700_000_000_000 + i // 7 for i in range(120)])
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, f"{{mode: incremental_merge, unique_key: order_id, duplicate_policy: {policy}}}"
    )
    assert direct.execution_path == "direct"
    assert direct.duplicates_removed == sql.duplicates_removed == 310
    assert len(direct_records) == 50
    assert messages(direct_records) == messages(sql_records)


def orders_for_a_registry_sink(bs: str, monkeypatch: Any, strategy: str) -> tuple[str, str]:
    """A fresh in-memory registry and a source topic of 1,200 orders over three partitions, whose
    order ids repeat across partitions when the strategy merges: (registry url, topic)."""
    url = f"mock://{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", url)
    src = unique_topic("dsrc")
    create_topic(bs, src, 3)
    repeat = 700 if "merge" in strategy else 10**9
    for p in range(3):
        produce_json(bs, src, [{**o, "order_id": o["order_id"] % repeat} for o in orders(400, p * 400)], partition=p)
    return url, src


@pytest.mark.parametrize(
    "fmt, strategy",
    [
        ("avro", "{mode: incremental_append, unique_key: order_id}"),
        ("avro", "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"),
        ("json_schema", "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"),
    ],
)
def test_a_registry_sink_writes_what_the_spark_sql_path_writes(broker, spark, kafka_env, tmp_path, monkeypatch, fmt, strategy):
    """Seed 001's sink (and JSON Schema): the value schema derived from the batch, registered in
    the registry, each value framed with its id. Nested objects, arrays, nulls, doubles and text of
    every kind, keys repeated across partitions: the same bytes on both paths, the schema
    registered once."""
    from dpone_dagster.schema.registry import registry_client

    bs = broker.bootstrap_servers
    url, src = orders_for_a_registry_sink(bs, monkeypatch, strategy)
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, strategy, f"message_format: {fmt}, schema_registry: {{enabled: true}}"
    )
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql"
    assert len(direct_records) == direct.messages_produced == sql.messages_produced
    # Each target's subject (named after its topic) has its own id; past the frame, the same bytes.
    for result, records in ((direct, direct_records), (sql, sql_records)):
        assert {r["value"][:5] for r in records} == {b"\x00" + result.schema_evolution["schema_id"].to_bytes(4, "big")}
    assert messages([{**r, "value": r["value"][5:]} for r in direct_records]) == messages([{**r, "value": r["value"][5:]} for r in sql_records])
    client = registry_client({"url": url})
    [direct_subject] = [s for s in client.get_subjects() if s.startswith("d_direct")]
    assert client.get_versions(direct_subject) == [1]  # registered once


@pytest.mark.parametrize(
    "fmt, strategy",
    [
        ("avro", "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"),
        ("avro", "{mode: incremental_append, unique_key: [customer, amount, order_id]}"),
        ("json_schema", "{mode: incremental_merge, unique_key: 'rate, order_id', duplicate_policy: keep_first}"),
    ],
)
def test_registry_encoded_keys_as_the_spark_sql_path_writes_them(broker, spark, kafka_env, tmp_path, monkeypatch, fmt, strategy):
    """key.format avro | json_schema: each key is the key columns' record under the `-key`
    subject's schema, framed with its id; repeated keys settled on them. The same keys and values
    on both paths; a key column null in some rows (amount) is a null field of the key record."""
    from dpone_dagster.schema.registry import registry_client

    bs = broker.bootstrap_servers
    url, src = orders_for_a_registry_sink(bs, monkeypatch, strategy)
    sink = f"message_format: {fmt}, key: {{format: {fmt}}}, schema_registry: {{enabled: true}}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, sink)
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql"
    assert len(direct_records) == direct.messages_produced == sql.messages_produced == (700 if "merge" in strategy else 1200)
    client = registry_client({"url": url})

    def key_subject_id(path: str) -> int:
        [key_subject] = [s for s in client.get_subjects() if s.endswith("-key") and s.startswith(f"d_{path}")]
        return client.get_latest_version(key_subject).schema_id

    registered = {"direct": key_subject_id("direct"), "spark_sql": spark_sql_golden.spark_sql_outcome(names(tmp_path, src=src), lambda: key_subject_id("spark_sql"))}
    for result, records in ((direct, direct_records), (sql, sql_records)):
        key_id = result.schema_evolution["key_subject_schema_id"]
        assert registered[result.execution_path] == key_id
        assert {r["key"][:5] for r in records} == {b"\x00" + key_id.to_bytes(4, "big")}
    # Each target's subjects are named after its topic (so are the key records): past the frames,
    # the same keys and values (a partition follows the framed key, so it is not compared).
    assert unframed(direct_records) == unframed(sql_records)


def unframed(records: list[dict[str, Any]]) -> Counter:
    return Counter((r["key"][5:], r["value"][5:]) for r in records)


@pytest.mark.parametrize("fmt", ["avro", "json_schema"])
def test_a_type_change_routed_to_a_new_column_as_the_spark_sql_path_routes_it(broker, spark, kafka_env, tmp_path, monkeypatch, fmt):
    """on_type_change: new_column: a batch whose qty turned to text after the subject registered it
    as a number writes qty null and the text in `__dpone__nc__qty`, under the evolved schema; the
    same values as the Spark SQL path's, on the direct path."""
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 2)
    sink = f"message_format: {fmt}, on_type_change: new_column, schema_registry: {{enabled: true}}"
    strategy = "{mode: incremental_append, unique_key: order_id}"
    targets = {path: unique_topic(f"d_{path}") for path in ("direct", "spark_sql")}
    renames = names(tmp_path, src=src, dst=targets["spark_sql"])
    for dst in targets.values():
        create_topic(bs, dst, 2)
    results: dict[str, list[Any]] = {path: [] for path in targets}

    def run(path: str) -> Any:
        return run_pipeline(parse_manifest(manifest_text(src, targets[path], tmp_path / path, strategy, sink)), spark)

    for batch in ([{"order_id": i, "qty": i, "note": f"n{i}"} for i in range(300)], [{"order_id": i, "qty": f"many {i} é", "note": None} for i in range(300, 600)]):
        produce_json(bs, src, batch, key=lambda row: row["order_id"])
        results["direct"].append(run("direct"))
        with monkeypatch.context() as patched:
            patched.setenv("DPONE_DIRECT_PATH", "off")
            results["spark_sql"].append(spark_sql_golden.spark_sql_outcome(renames, lambda: run("spark_sql")))
    assert [r.execution_path for r in results["direct"]] == ["direct", "direct"]
    routed = results["direct"][1].schema_evolution["evolution"]["actions"]
    assert any(a["kind"] == "route_new_column" for a in routed)
    records = {
        "direct": consume_raw(bs, targets["direct"]),
        "spark_sql": spark_sql_golden.spark_sql_outcome(renames, lambda: [without_timestamp(r) for r in consume_raw(bs, targets["spark_sql"])]),
    }
    assert len(records["direct"]) == 600
    assert unframed(records["direct"]) == unframed(records["spark_sql"])
    assert sum(b"many 3" in r["value"] for r in records["direct"]) == 100  # order ids 300..399


KEY_SUBJECT_CASES = {  # source rows; the value subject registered before the run; sink options
    # Two order ids a double cannot tell apart: one key record, two keys.
    "a narrower type": (
        [{"order_id": 2**53, "v": "a"}, {"order_id": 2**53 + 1, "v": "b"}],
        {"type": "record", "name": "R", "fields": [{"name": "order_id", "type": ["null", "double"]}, {"name": "v", "type": ["null", "string"]}]},
        "schema_evolution: false",
    ),
    # A null region written as the field's default: one key record, two keys.
    "a default for a null": (
        [{"order_id": 1, "region": None, "v": "a"}, {"order_id": 1, "region": "EU", "v": "b"}],
        {"type": "record", "name": "R", "fields": [
            {"name": "order_id", "type": "long"}, {"name": "region", "type": "string", "default": "EU"}, {"name": "v", "type": ["null", "string"]}]},
        "",
    ),
}


@pytest.mark.parametrize("policy", ["keep_last", "fail"])
@pytest.mark.parametrize("case", sorted(KEY_SUBJECT_CASES))
def test_registry_encoded_keys_are_told_apart_as_the_spark_sql_path_tells_them(broker, spark, kafka_env, tmp_path, monkeypatch, case, policy):
    """Repeated keys are settled on the keys' text, as on the Spark SQL path, not on the key
    records, which the registered schema may make identical for two keys: both rows are kept
    (and duplicate_policy: fail passes), on both paths."""
    import json

    from confluent_kafka.schema_registry import Schema

    from dpone_dagster.schema.registry import registry_client

    rows, value_schema, options = KEY_SUBJECT_CASES[case]
    url = f"mock://{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", url)
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 1)
    produce_json(bs, src, rows, partition=0)
    unique_key = "[order_id, region]" if "region" in rows[0] else "order_id"
    strategy = f"{{mode: incremental_merge, unique_key: {unique_key}, duplicate_policy: {policy}}}"
    sink = f"message_format: avro, key: {{format: avro}}, schema_registry: {{enabled: true}}{', ' + options if options else ''}"

    def one(path: str, dst: str) -> tuple[str, Counter]:
        create_topic(bs, dst, 1)
        registry_client({"url": url}).register_schema(f"{dst}-value", Schema(json.dumps(value_schema), "AVRO"))
        result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path / path, strategy, sink)), spark)
        return (result.execution_path, Counter(r["key"][5:] for r in consume_raw(bs, dst)))

    out = on_both_paths(monkeypatch, tmp_path, one, {"dst": "d"}, src=src)
    assert out["direct"][0] == "direct"
    assert out["direct"][1] == out["spark_sql"][1] and sum(out["direct"][1].values()) == 2


def test_registry_encoded_keys_with_deletes_enabled_and_no_delete_take_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Deletes enabled beside registry-encoded keys, a batch of upserts only: the direct path."""
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dsrc"), unique_topic("ddst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, orders(50), partition=0)
    sink = "message_format: avro, key: {format: avro}, schema_registry: {enabled: true}, deletes: {enabled: true, tombstone: true}"
    text = manifest_text(src, dst, tmp_path / dst, "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", sink)
    result = run_pipeline(parse_manifest(text), spark)
    assert result.execution_path == "direct", result.notes
    assert len(consume_raw(bs, dst)) == 50


def test_a_source_tombstone_under_registry_encoded_keys_fails_the_run_and_produces_nothing(broker, spark, kafka_env, tmp_path, monkeypatch):
    """A source tombstone has no columns, so no record of the key columns can key it: like a
    delete without its key it fails the run before anything is produced (a tombstone with a
    null key deletes nothing), and no offset is stored."""
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dsrc"), unique_topic("ddst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [*orders(20), None], partition=0, key=lambda row: row["order_id"] if row else 7)
    sink = "message_format: avro, key: {format: avro}, schema_registry: {enabled: true}, deletes: {enabled: true, tombstone: true}"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path / dst, "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", sink))
    with pytest.raises(RunFailed, match=r"^1 delete\(s\) have no key, so no tombstone .*key.format: string"):
        run_pipeline(manifest, spark)
    assert consume_raw(bs, dst, timeout_s=5) == []
    assert LocalStateStore(str(tmp_path / dst)).load_offsets(src, f"g_{dst}") == {}


def test_envelope_deletes_with_their_data_under_avro_keys_take_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """A dpone-envelope source whose delete events carry their data: each delete's Avro key is the
    key columns' record, as an upsert's, so the tombstones are keyed on the direct path, byte for
    byte past the frames the Spark SQL path's."""
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 2)
    events = [
        {"op": "delete", "data": {"order_id": i % 40}} if i % 9 == 4 else {"op": "upsert", "data": {"order_id": i % 40, "amount": i * 1.5}}
        for i in range(200)
    ]
    produce_json(bs, src, events, key=lambda event: event["data"]["order_id"])
    sink = "message_format: avro, key: {format: avro}, schema_registry: {enabled: true}, deletes: {enabled: true, tombstone: true}"
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", sink, 2,
        source_options="envelope: dpone",
    )
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes

    def unframed(records: list[dict[str, Any]]) -> Counter:
        return Counter((r["key"][5:], r["value"] and r["value"][5:]) for r in records)  # partitions follow the framed key

    assert len(direct_records) == 40 and any(r["value"] is None for r in direct_records)
    assert all(r["key"] is not None and r["key"][:1] == b"\x00" for r in direct_records)
    assert unframed(direct_records) == unframed(sql_records)


def test_a_protobuf_sink_writes_what_the_spark_sql_path_writes(broker, spark, kafka_env, tmp_path, monkeypatch):
    """A generated message class (its file imports well-known types): registered after the gates,
    each value framed with the schema id and the message indexes; the same bytes on both paths."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "proto"))
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 2)
    rows = [{"id": i, "name": None if i % 5 == 0 else f"n{i} é", "amount": i * 0.5, "tags": [f"t{j}" for j in range(i % 3)]} for i in range(400)]
    produce_json(bs, src, rows, key=lambda row: row["id"])
    sink = "message_format: protobuf, schema_registry: {enabled: true, protobuf_message: 'dpone_test_orders_pb2:Order'}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: id}", sink, 2)
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql"
    assert len(direct_records) == 400
    # Each target's subject has its own id; then the message index (0: the file's first message).
    for result, records in ((direct, direct_records), (sql, sql_records)):
        assert {r["value"][:6] for r in records} == {b"\x00" + result.schema_evolution["schema_id"].to_bytes(4, "big") + b"\x00"}
    assert messages([{**r, "value": r["value"][6:]} for r in direct_records]) == messages([{**r, "value": r["value"][6:]} for r in sql_records])


SHOP_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": "double"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
]}
SHOP_V2 = {**SHOP_V1, "fields": [*SHOP_V1["fields"], {"name": "channel", "type": ["null", "string"], "default": None}]}


def normalized(result: Any, records: list[dict[str, Any]], framed: bool) -> Counter:
    """Messages past a registry sink's frame (each target's subject has its own id), with the
    run id masked."""
    run_id, frame = result.run_id.encode(), 5 if framed else 0
    return Counter(
        (r["partition"], r["key"], r["value"] and r["value"][frame:].replace(run_id, b"<run>"), tuple(r["headers"] or ()))
        for r in records
    )


def produce_registry(bs: str, url: str, src: str, fmt: str, rows: list[dict[str, Any]], schema: dict[str, Any] | None = None, tombstones: tuple[int, ...] = ()) -> None:
    """Confluent-framed values, written by confluent-kafka's own serializers; keys are the order
    ids. The in-memory registry is confluent-kafka's mock client (registry_client for mock://)."""
    import json

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from dpone_dagster.schema.registry import registry_client

    client = registry_client({"url": url})
    ctx = SerializationContext(src, MessageField.VALUE)
    if fmt == "avro":
        serialize = AvroSerializer(client, json.dumps(schema or SHOP_V1))
    elif fmt == "json_schema":
        json_type = {"type": "object", "title": "shop.Order", "properties": {
            "order_id": {"type": "integer"}, "note": {"type": ["string", "null"]}, "amount": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["order_id", "amount", "tags"]}
        serialize = JSONSerializer(json.dumps(json_type), client)
    else:
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from dpone_test_orders_pb2 import Order

        proto = ProtobufSerializer(Order, client, {"use.deprecated.format": False})

        def serialize(row: dict[str, Any], c: Any) -> bytes:
            message = Order(id=row["order_id"], amount=row["amount"], tags=row["tags"])
            if row["note"] is not None:
                message.name = row["note"]
            return proto(message, c)
    producer = Producer({"bootstrap.servers": bs})
    for row in rows:
        value = None if row["order_id"] in tombstones else serialize(row, ctx)
        producer.produce(src, key=str(row["order_id"]).encode(), value=value, partition=row["order_id"] % 2)
    assert producer.flush(30) == 0


def registry_topic(bs: str, monkeypatch: Any) -> tuple[str, str]:
    """A source topic of two partitions and a fresh in-memory registry for the run: (url, topic)."""
    url = f"mock://{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", url)
    src = unique_topic("rsrc")
    create_topic(bs, src, 2)
    return url, src


def shop_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"order_id": i, "note": None if i % 4 == 0 else f"n{i} é\"q\"", "amount": i * 0.25, "tags": [f"t{j}" for j in range(i % 3)]} for i in range(start, start + n)]


@pytest.mark.parametrize(
    ("fmt", "sink"),
    [
        ("avro", ""),
        ("avro", "message_format: avro, schema_registry: {enabled: true}"),
        ("json_schema", "envelope: dpone, headers: {lineage: true}"),
        ("protobuf", ""),
    ],
)
def test_a_registry_source_is_decoded_in_the_tasks_as_the_spark_sql_path_decodes_it(broker, spark, kafka_env, tmp_path, monkeypatch, fmt, sink):
    """Seed 001's source formats: values framed by the registry, every version of the topic's
    value subject fetched on the driver and decoded in the tasks; tombstones are deletes. The
    same messages on both paths."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "proto"))
    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    produce_registry(bs, url, src, fmt, shop_rows(600), tombstones=(7, 300))
    source = f"message_format: {fmt}, schema_registry: {{enabled: true}}"
    if fmt == "protobuf":  # the fields the direct path reads (the message also has maps, enums, timestamps)
        source += ", schema: [{name: id, type: long}, {name: name, type: string}, {name: amount, type: double}, {name: tags, type: 'array<string>'}]"
    strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}" if fmt != "protobuf" else "{mode: incremental_append, unique_key: id}"
    sink = ", ".join(x for x in (sink, "deletes: {enabled: true, tombstone: true}") if x)
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, sink, 2, source)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert len(direct_records) == 600 and direct.rows_extracted == sql.rows_extracted == 600
    assert normalized(direct, direct_records, "avro" in sink) == normalized(sql, sql_records, "avro" in sink)
    assert [n for n in direct.notes if "schema id" in n] == [n for n in sql.notes if "schema id" in n]



@pytest.mark.parametrize("subject", ["record", "empty", "many_versions"])
def test_a_registry_source_its_subject_does_not_plan_is_planned_from_the_batchs_ids(broker, spark, kafka_env, tmp_path, monkeypatch, subject):
    """The topic's subject does not tell the batch's schemas: values written under the record
    subject strategy, values of another subject's ids only (the topic's subject is empty), or a
    subject with more versions than the direct path decodes with. The batch's ids are read in the
    tasks and fetched by id, as the Spark SQL path fetches them: the same schema registered and
    the same messages on both paths."""
    import json

    from confluent_kafka.schema_registry import record_subject_name_strategy
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from dpone_dagster.schema.registry import registry_client
    from dpone_dagster.sources import kafka as kafka_source

    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    client = registry_client({"url": url})
    context = SerializationContext(src, MessageField.VALUE)
    # Registered under the record's name, under another subject only, or under the topic's.
    naming = {"record": record_subject_name_strategy, "empty": lambda ctx, name: "shop.Order-other"}.get(subject)
    conf = {"subject.name.strategy": naming} if naming else {}
    v1, v2 = (AvroSerializer(client, json.dumps(schema), conf=conf) for schema in (SHOP_V1, SHOP_V2))
    if subject == "many_versions":
        monkeypatch.setattr(kafka_source, "MAX_SUBJECT_VERSIONS", 1)
    rows = shop_rows(400)
    produce_json(bs, src, [(v2 if i % 3 == 0 else v1)({**r, "channel": "web"} if i % 3 == 0 else r, context) for i, r in enumerate(rows)], partition=0)
    source = "message_format: avro, schema_registry: {enabled: true"
    source += ", subject_name_strategy: record, record_name: Order, record_namespace: shop}" if subject == "record" else "}"
    sink = "message_format: avro, schema_registry: {enabled: true}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", sink, 2, source)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert len(direct_records) == 400
    registered = [[f["name"] for f in r.schema_evolution["evolution"]["result_schema"]] for r in (direct, sql)]
    assert registered[0] == registered[1] == ["order_id", "note", "amount", "tags", "channel"], registered
    assert normalized(direct, direct_records, True) == normalized(sql, sql_records, True)
    assert [n for n in direct.notes if "schema id" in n] == [n for n in sql.notes if "schema id" in n]


@pytest.mark.parametrize(
    ("strategy", "sink_options"),
    [
        ("{mode: incremental_append, unique_key: [order_id, big]}", ""),  # the key is the columns' JSON
        ("{mode: incremental_append, unique_key: order_id}", "key: {mode: hash_row}"),
        ("{mode: incremental_merge, unique_key: order_id}", "envelope: dpone"),
        ("{mode: incremental_append, unique_key: big}", ""),  # the key is the double's text
    ],
)
def test_numbers_java_prints_otherwise_than_the_shortest_are_printed_by_spark(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink_options):
    """Doubles of 1e16 or more, below 1e-307, or powers of two below 1e-3, where Java 17 may print
    more digits than the shortest (1.9999999999999998E23 for 2e23): the scan collects them, Spark
    prints them on the driver and the batch is scanned again with its texts, so both paths write
    the same keys and values."""
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 2)
    special = [2e23, 1e23, 6.960309306789904e18, -1.2345678901234567e16, 5e-324, 1e-310, 2.0**-20, -(2.0**-40)]
    rows = [{"order_id": i, "amount": special[i % 8] if i % 3 == 0 else i * 0.5, "big": special[(i + 1) % 8]} for i in range(300)]
    for partition in range(2):
        produce_json(bs, src, rows[partition::2], partition=partition)
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, sink_options, 2)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert len(direct_records) == 300
    assert normalized(direct, direct_records, False) == normalized(sql, sql_records, False)
    assert any(b"1.9999999999999998E23" in (r["value"] or b"") + (r["key"] or b"") for r in direct_records) or "hash_row" in sink_options


@pytest.mark.parametrize(
    ("strategy", "sink_options"),
    [
        ("{mode: incremental_append, unique_key: [order_id, amount]}", ""),  # the key is the columns' JSON
        ("{mode: incremental_append, unique_key: order_id}", "key: {mode: hash_row}"),
        ("{mode: incremental_merge, unique_key: order_id}", "envelope: dpone"),
        ("{mode: incremental_merge, unique_key: amount, duplicate_policy: keep_last}", ""),  # NaN keys repeat: one is kept
    ],
)
def test_nan_and_infinities_are_written_as_the_spark_sql_path_writes_them(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink_options):
    """An Avro source's doubles holding NaN (of either sign) and the infinities, into a JSON sink:
    the strings Jackson writes in values ("NaN", "Infinity", "-Infinity"), Spark's text in keys,
    the same records kept; the batch stays on the direct path."""
    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    special = [float("nan"), float("inf"), float("-inf"), -float("nan")]
    rows = [{**r, "amount": special[r["order_id"] % 4] if r["order_id"] % 3 == 0 else r["amount"]} for r in shop_rows(300)]
    produce_registry(bs, url, src, "avro", rows)
    source = "message_format: avro, schema_registry: {enabled: true}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, sink_options, 2, source)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert len(direct_records) == len(sql_records) == direct.messages_produced
    assert normalized(direct, direct_records, False) == normalized(sql, sql_records, False)
    assert any(b'"Infinity"' in (r["value"] or b"") for r in direct_records)


def test_a_registry_batch_with_another_subjects_id_and_numbers_spark_prints_stays_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Partition 0: the subject's version, partition 1: another subject's id, both with doubles
    only Spark prints alike. The task stopped by the numbers still reports its schema ids, so the
    batch is fetched by id and printed in one scan again (not planned without partition 0's id)."""
    import io

    import fastavro
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from dpone_dagster.schema.registry import registry_client
    from dpone_dagster.schema.wire_format import frame

    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    client = registry_client({"url": url})
    v1 = AvroSerializer(client, json.dumps(SHOP_V1))
    context = SerializationContext(src, MessageField.VALUE)
    produce_json(bs, src, [v1({**r, "amount": 2e23 + i * 1e8}, context) for i, r in enumerate(shop_rows(20))], partition=0)
    other_id = client.register_schema("shop.Order-other", Schema(json.dumps(SHOP_V2), "AVRO"))
    parsed, producer = fastavro.parse_schema(SHOP_V2), Producer({"bootstrap.servers": bs})
    for i, row in enumerate(shop_rows(20, 100)):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, {**row, "amount": 3e23 + i * 1e8, "channel": "app"})
        producer.produce(src, value=frame(other_id, buffer.getvalue()), partition=1)
    assert producer.flush(30) == 0
    source = "message_format: avro, schema_registry: {enabled: true}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", "", 2, source)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert len(direct_records) == 40
    assert normalized(direct, direct_records, False) == normalized(sql, sql_records, False)

TYPED = {"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "qty", "type": "int"},
    {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}]},
    {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 10}},
    {"name": "paid_at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "seen_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "due", "type": ["null", {"type": "int", "logicalType": "date"}]},
    {"name": "blob", "type": ["null", "bytes"]},
    {"name": "note", "type": ["null", "string"]},
    {"name": "ratio", "type": ["null", "float"]},
]}


def typed_rows(n: int) -> list[dict[str, Any]]:
    from datetime import UTC, date, datetime, timedelta
    from decimal import Decimal

    epoch = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        {
            "order_id": i,
            "qty": i % 5 - 2,
            "price": None if i % 9 == 0 else Decimal((i - 150) * 1337).scaleb(-2),  # negative ones too
            "fee": Decimal([0, 1, 1000, i * 7919][i % 4]).scaleb(-10),  # 0E-10 and 1.000E-7 in Spark's JSON
            "paid_at": None if i % 7 == 0 else epoch + timedelta(seconds=i * 61, microseconds=(i * 123457) % 1_000_000),
            "seen_at": epoch + timedelta(milliseconds=i * 1500),
            "due": None if i % 6 == 0 else date(2026, 1, 1) + timedelta(days=i),
            "blob": None if i % 8 == 0 else bytes([i % 256, 255, 0]),
            "note": f"n{i} é",
            "ratio": None if i % 13 == 0 else i / 7 - 20,  # a float: Float.toString in Spark's JSON
        }
        for i in range(n)
    ]


def avro_runs(bs: str, spark: Any, tmp_path: Path, monkeypatch: Any, rows: list[dict[str, Any]], schema: dict[str, Any], strategy: str, sink: str) -> tuple:
    """`rows` written with the Avro `schema` (order 11 a tombstone) and run on both paths, each of
    which reads every record: ((direct, records), (spark_sql, records), the sink options run)."""
    url, src = registry_topic(bs, monkeypatch)
    produce_registry(bs, url, src, "avro", rows, schema, tombstones=(11,))
    if "deletes" not in sink:
        sink = ", ".join(x for x in (sink, "deletes: {enabled: true, tombstone: true}") if x)
    source = "message_format: avro, schema_registry: {enabled: true}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, sink, 2, source)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert direct.rows_extracted == sql.rows_extracted == len(rows)
    return (direct, direct_records), (sql, sql_records), sink


DECLARED_INTEGERS = "schema: [{name: order_id, type: int}, {name: qty, type: smallint}, {name: flag, type: tinyint}, {name: note, type: string}]"


@pytest.mark.parametrize(
    ("strategy", "sink"),
    [
        ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", ""),
        ("{mode: incremental_append, unique_key: [qty, order_id]}", "message_format: avro, schema_registry: {enabled: true}"),
        ("{mode: incremental_append, unique_key: flag}", "envelope: dpone, key: {format: json}"),
    ],
)
def test_declared_integer_columns_take_the_direct_path_with_the_spark_sql_paths_messages(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink):
    """A JSON source whose manifest declares int, smallint and tinyint columns (values at each
    type's bounds, nulls, repeated keys): decoded in the tasks, with the Spark SQL path's keys and
    values (Avro `int` fields through the registry too)."""
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    bs = broker.bootstrap_servers
    src = unique_topic("dints")
    create_topic(bs, src, 2)
    bounds = [(2**31 - 1, 2**15 - 1, 127), (-(2**31), -(2**15), -128), (0, None, 0), (7, 300, 5)]
    rows = [{"order_id": i % 50 if n % 4 == 3 else oid, "qty": q, "flag": f, "note": f"n{n}"} for n, ((oid, q, f), i) in enumerate(zip(bounds * 100, range(400), strict=True))]
    rows[11]["flag"] = 200  # Spark reads a tinyint from 128 to 255 as -128..-1: its decoder reads this record
    for p in range(2):
        produce_json(bs, src, rows[p::2], partition=p)
    no_handover(monkeypatch)
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, sink, 2, DECLARED_INTEGERS)
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql", direct.notes
    assert direct.messages_produced == sql.messages_produced > 0 and direct.duplicates_removed == sql.duplicates_removed
    framed = "avro" in sink
    assert normalized(direct, direct_records, framed) == normalized(sql, sql_records, framed)
    assert any(b"2147483647" in r["value"] for r in direct_records) or framed


def declared_runs(bs: str, spark: Any, tmp_path: Path, monkeypatch: Any, prefix: str, records: list[bytes], declared: str, strategy: str, sink: str) -> bytes:
    """`records` in a JSON topic of two partitions whose manifest declares `declared`, run on both
    paths (the direct path handing nothing over): the same messages; the direct path's keys and
    values joined (b"" for an Avro sink), for what Spark writes in its own form."""
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    src = unique_topic(prefix)
    create_topic(bs, src, 2)
    for p in range(2):
        produce_json(bs, src, records[p::2], partition=p)
    no_handover(monkeypatch)
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, sink, 2, declared)
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql", direct.notes
    assert direct.messages_produced == sql.messages_produced > 0 and direct.duplicates_removed == sql.duplicates_removed
    framed = "avro" in sink
    assert normalized(direct, direct_records, framed) == normalized(sql, sql_records, framed)
    return b"" if framed else b" ".join((r["key"] or b"") + b" " + (r["value"] or b"") for r in direct_records)


DECLARED_NUMBERS = (
    "schema: [{name: order_id, type: long}, {name: ratio, type: float}, {name: price, type: 'decimal(12,2)'},"
    " {name: fees, type: 'array<decimal(20,10)>'}, {name: note, type: string}]"
)


def declared_numbers(n: int) -> list[bytes]:
    """JSON records for DECLARED_NUMBERS: floats Java prints in its own form (1.0E7, 1.0E-5,
    -0.0, NaN) or beside the shortest, decimals at every scale (0E-10 and 1.0E-7 in Spark's JSON),
    repeated keys, and records only Spark's decoder reads (a double halfway between two floats,
    a decimal Spark rounds half up, grouping commas, a quoted number)."""
    ratios = [b"0.1", b"1e7", b"1e-5", b"-0.0", b"NaN", b"3.4028235e38", b"123456.79", b"7", b"2.5e-3"]  # a key too
    prices = [b"1234567890.12", b"-7.5", b"1e2", b'"0.50"', b"0", b"3.14"]  # never null: a key
    fees = [b"0.0000000001", b"1e-7", b"0", b"-123.4567890123", b'"12"', b"null"]
    records = [
        b'{"order_id": %d, "ratio": %s, "price": %s, "fees": [%s, 1], "note": "n%d"}'
        % (i % 40 if i % 3 == 0 else i, ratios[i % len(ratios)], prices[i % len(prices)], fees[i % len(fees)], i)
        for i in range(n)
    ]
    records[5] = b'{"order_id": 5, "ratio": 1.0000000596046447753906251, "price": 3.25}'
    records[7] = b'{"order_id": 7, "ratio": 7.5, "price": 1.005}'
    records[8] = b'{"order_id": 8, "ratio": 8.5, "price": "1,000.5", "fees": [1e-11]}'
    records[13] = b'{"order_id": 13, "ratio": "Infinity", "price": 0.5, "note": null}'
    return records


@pytest.mark.parametrize(
    ("strategy", "sink"),
    [
        ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", ""),
        ("{mode: incremental_append, unique_key: [price, order_id]}", "message_format: avro, schema_registry: {enabled: true}"),
        ("{mode: incremental_append, unique_key: price}", "envelope: dpone, key: {format: json}"),
        ("{mode: incremental_merge, unique_key: ratio, duplicate_policy: keep_first}", ""),
    ],
)
def test_declared_float_and_decimal_columns_take_the_direct_path_with_the_spark_sql_paths_messages(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink):
    """A JSON source whose manifest declares float and decimal columns (a list of decimals too):
    decoded in the tasks, the records only Spark's decoder reads decoded by it, with the Spark SQL
    path's keys and values (Float.toString and BigDecimal's text in JSON; Avro float and decimal
    fields through the registry)."""
    written = declared_runs(broker.bootstrap_servers, spark, tmp_path, monkeypatch, "dnums", declared_numbers(300), DECLARED_NUMBERS, strategy, sink)
    assert "avro" in sink or b"1.0E7" in written and ("ratio" in strategy or b"1.000E-7" in written)  # Java's forms, not Python's


@pytest.mark.parametrize(
    ("strategy", "sink"),
    [
        ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", "envelope: dpone, headers: {lineage: true}"),
        ("{mode: incremental_append, unique_key: seen_at}", "message_format: avro, schema_registry: {enabled: true}"),
        ("{mode: incremental_append, unique_key: [order_id, fee]}", ""),
        ("{mode: incremental_append}", "key: {mode: hash_row}, deletes: {enabled: false, when_disabled: skip}"),
    ],
)
def test_avro_logical_types_take_the_direct_path_with_the_spark_sql_paths_messages(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink):
    """An Avro source whose values hold decimals, timestamps (micros, millis), dates, bytes, floats
    and ints — what a database's change feed writes — decoded and written in the tasks: JSON in the
    dpone envelope, Avro through the registry, a timestamp as the key, a row hash; the same
    messages on both paths."""
    (direct, direct_records), (sql, sql_records), sink = avro_runs(broker.bootstrap_servers, spark, tmp_path, monkeypatch, typed_rows(300), TYPED, strategy, sink)
    # The tasks read these values column by column (formats/avro_columns.py), the Spark SQL path record by record.
    assert avro_columns.reader(1, json.dumps(TYPED), registry_source.arrow_schema(avro_to_spark(TYPED))) is not None

    assert normalized(direct, direct_records, "avro" in sink) == normalized(sql, sql_records, "avro" in sink)
    assert len(direct_records) == 300 - direct.deletes_skipped


DECLARED_TIMES = (
    "schema: [{name: order_id, type: long}, {name: day, type: date}, {name: at, type: timestamp},"
    " {name: log, type: 'array<struct<at:timestamp,what:string>>'}]"
)


def declared_times(n: int) -> list[bytes]:
    """JSON records for DECLARED_TIMES: ISO-8601 dates and timestamps (zone-less, Z, offsets,
    fractions, leap days), repeated keys, and records only Spark's decoder reads (a short date,
    a date as a timestamp, epoch seconds)."""
    days = ["2024-02-29", "0001-01-01", "9999-12-31", "1970-01-01", "2026-11-29"]
    times = ["2024-01-05T10:00:00Z", "2024-01-05 10:00:00.5", "2024-01-05T11:30:00.123456+01:30", "1969-12-31T23:59:59.999999-05:00", "2026-11-29T00:00:00.1Z"]
    records = [
        json.dumps({"order_id": i % 40 if i % 3 == 0 else i, "day": days[i % 5], "at": times[(i // 5) % 5], "log": [{"at": times[i % 5], "what": "w"}, None]}).encode()
        for i in range(n)
    ]
    records[5] = b'{"order_id": 5, "day": "2024-1-5", "at": "2024-01-05T10:00:00Z"}'
    records[7] = b'{"order_id": 7, "day": "2024-01-05", "at": "2024-01-05"}'
    records[8] = b'{"order_id": 8, "day": "2024-01-05", "at": 1704448800}'
    return records


@pytest.mark.parametrize(
    ("strategy", "sink"),
    [
        ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", ""),
        ("{mode: incremental_append, unique_key: [day, order_id]}", "message_format: avro, schema_registry: {enabled: true}"),
        ("{mode: incremental_merge, unique_key: at, duplicate_policy: keep_first}", "envelope: dpone"),
        ("{mode: incremental_append}", "key: {mode: hash_row}"),
    ],
)
def test_declared_date_and_timestamp_columns_take_the_direct_path_with_the_spark_sql_paths_messages(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink):
    """A JSON source whose manifest declares date and timestamp columns (in a list of records
    too): decoded in the tasks, the records only Spark's decoder reads decoded by it, with the
    Spark SQL path's keys (a timestamp's text, a row hash) and values (JSON text in UTC; Avro
    dates and timestamps through the registry)."""
    written = declared_runs(broker.bootstrap_servers, spark, tmp_path, monkeypatch, "dtimes", declared_times(300), DECLARED_TIMES, strategy, sink)
    assert "avro" in sink or b"2024-01-05T10:00:00.500000Z" in written or b"2024-01-05 10:00:00.5" in written  # Spark's text of 10:00:00.5


@pytest.mark.parametrize(
    ("strategy", "sink"),
    [
        ("{mode: incremental_append}", ""),
        ("{mode: incremental_append, unique_key: seen_at}", "message_format: avro, schema_registry: {enabled: true}"),
        ("{mode: incremental_append}", "message_format: avro, schema_registry: {enabled: true}, key: {mode: hash_row}"),
    ],
)
def test_timestamps_written_as_text_in_another_session_time_zone_take_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink):
    """spark.sql.session.timeZone Europe/Berlin: Spark writes a timestamp's text (in JSON values,
    a key's text, the row hash's JSON) in that zone, the tasks in UTC, so such a batch takes the
    Spark SQL path and the target holds Berlin's offsets; an Avro value holds the instant, so an
    Avro sink keyed without timestamps stays on the direct path."""
    url, src = registry_topic(broker.bootstrap_servers, monkeypatch)
    produce_registry(broker.bootstrap_servers, url, src, "avro", typed_rows(30), TYPED)
    dst = unique_topic("dzone")
    create_topic(broker.bootstrap_servers, dst, 2)
    text = manifest_text(src, dst, tmp_path, strategy, sink)
    text = text.replace("options: {group_id:", "options: {message_format: avro, schema_registry: {enabled: true}, group_id:")
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Europe/Berlin")
    try:
        result = run_pipeline(parse_manifest(text), spark)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert result.execution_path == "spark_sql", result.notes
    records = consume_raw(broker.bootstrap_servers, dst, expected=result.messages_produced)
    assert len(records) == 30 == result.messages_produced
    if not sink:
        assert all(b'+01:00"' in r["value"] for r in records if json.loads(r["value"])["paid_at"]), records[1]
    elif "seen_at" in strategy:
        assert {r["key"] for r in records} >= {b"2026-01-01 01:00:00", b"2026-01-01 01:00:01.5"}  # 00:00:01.5 UTC in Berlin

    create_topic(broker.bootstrap_servers, f"{dst}_utc", 2)
    spark.conf.set("spark.sql.session.timeZone", "Etc/UTC")  # a zone of offset zero: as the tasks write
    try:
        result = run_pipeline(parse_manifest(text.replace(dst, f"{dst}_utc").replace(str(tmp_path), str(tmp_path / "utc"))), spark)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert result.execution_path == "direct", result.notes


@pytest.mark.parametrize(
    ("setting", "value"), [("spark.sql.session.timeZone", "Europe/Berlin"), ("spark.sql.legacy.timeParserPolicy", "LEGACY")]
)
def test_declared_dates_and_timestamps_are_read_by_spark_in_a_session_of_another_zone_or_calendar(broker, spark, kafka_env, tmp_path, monkeypatch, setting, value):
    """A zone-less timestamp is Berlin's wall time in a Berlin session, and Spark's legacy parser
    reads fractions and old dates its own way: the tasks read neither, so the batch takes the
    Spark SQL path, even into an Avro sink that writes no text."""
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex[:8]}")
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dlegacy"), unique_topic("dlegacyd")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, declared_times(20), partition=0)
    text = manifest_text(src, dst, tmp_path, "{mode: incremental_append}", "message_format: avro, schema_registry: {enabled: true}")
    text = text.replace("options: {group_id:", f"options: {{{DECLARED_TIMES}, group_id:")
    before = spark.conf.get(setting)
    spark.conf.set(setting, value)
    try:
        result = run_pipeline(parse_manifest(text), spark)
    finally:
        spark.conf.set(setting, before)
    assert result.execution_path == "spark_sql" and result.messages_produced == 20 == len(consume_raw(bs, dst, expected=20)), result.notes


MAPPED = {"type": "record", "name": "Tagged", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "attrs", "type": ["null", {"type": "map", "values": ["null", "string"]}]},
    {"name": "counts", "type": {"type": "map", "values": "long"}},
]}


@pytest.mark.parametrize(
    ("strategy", "sink"),
    [
        ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", ""),
        ("{mode: incremental_append, unique_key: order_id}", "envelope: dpone, headers: {lineage: true}"),
        ("{mode: incremental_append}", "key: {mode: hash_row}, deletes: {enabled: false, when_disabled: skip}"),
        ("{mode: incremental_append, unique_key: order_id}", "message_format: avro, schema_registry: {enabled: true}"),
    ],
)
def test_avro_maps_take_the_direct_path_with_the_spark_sql_paths_messages(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink):
    """An Avro source with map fields (entries in the writer's order, null values, escaped keys,
    empty maps): decoded record by record as on the Spark SQL path, written in the tasks; the
    same messages on both paths."""
    rows = [
        {
            "order_id": i,
            "attrs": None if i % 5 == 0 else {"k" + str(j) + ('"' if i % 7 == 0 else ""): (None if (i + j) % 4 == 0 else f"v{i}") for j in range(i % 4)},
            "counts": {f"c{j}": i * j for j in range(i % 3)},
        }
        for i in range(300)
    ]
    (direct, direct_records), (sql, sql_records), sink = avro_runs(broker.bootstrap_servers, spark, tmp_path, monkeypatch, rows, MAPPED, strategy, sink)
    framed = "avro" in sink
    assert normalized(direct, direct_records, framed) == normalized(sql, sql_records, framed)
    assert framed or any(b'"attrs":{"k0":"v3","k1":null,"k2":"v3"}' in (r["value"] or b"") for r in direct_records)


def test_a_registry_batch_of_old_versions_only_is_decoded_with_those_versions(broker, spark, kafka_env, tmp_path, monkeypatch):
    """The subject holds v1 and v2 (a new field); a batch of v1 records merges into v1's fields
    only, as the Spark SQL path merges them: the direct path scans it again with v1 alone, and
    the messages (and an Avro sink's registered schema) are the same. A later batch that carries
    both versions is decoded with both."""
    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    produce_registry(bs, url, src, "avro", shop_rows(100))
    import json

    from confluent_kafka.schema_registry import Schema

    from dpone_dagster.schema.registry import registry_client

    registry_client({"url": url}).register_schema(f"{src}-value", Schema(json.dumps(SHOP_V2), "AVRO"))
    source = "message_format: avro, schema_registry: {enabled: true}"
    strategy = "{mode: incremental_append, unique_key: order_id}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, "", 2, source)
    assert direct.execution_path == "direct", direct.notes
    assert messages(direct_records) == messages(sql_records) and len(direct_records) == 100
    avro = "message_format: avro, schema_registry: {enabled: true}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path / "avro", monkeypatch, strategy, avro, 2, source)
    assert direct.execution_path == "direct", direct.notes
    assert normalized(direct, direct_records, True) == normalized(sql, sql_records, True) and len(direct_records) == 100
    registered = [[f["name"] for f in r.schema_evolution["evolution"]["result_schema"]] for r in (direct, sql)]
    assert registered[0] == registered[1] == ["order_id", "note", "amount", "tags"], registered

    produce_registry(bs, url, src, "avro", [{**r, "channel": "web"} for r in shop_rows(50, 100)], SHOP_V2)
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path / "both", monkeypatch, strategy, "", 2, source)
    assert direct.execution_path == "direct", direct.notes
    assert messages(direct_records) == messages(sql_records) and len(direct_records) == 150
    assert any(b'"channel":"web"' in r["value"] for r in direct_records)


def produce_bad_registry_values(bs: str, url: str, src: str, unknown_id: bool = False) -> None:
    """Values the registry decoder does not read, after 300 good ones: plain JSON (a wrong magic
    byte), a value too short for its frame, a payload of the subject's id that does not decode;
    with `unknown_id`, a frame whose id the subject does not hold."""
    from confluent_kafka import Producer

    from dpone_dagster.schema.registry import registry_client
    from dpone_dagster.schema.wire_format import frame

    produce_registry(bs, url, src, "avro", shop_rows(300))
    schema_id = registry_client({"url": url}).get_latest_version(f"{src}-value").schema_id
    bad = [(0, b'{"order_id": 1}'), (0, b"\x00\x00"), (1, frame(schema_id, b"\xff\xff\xff"))]
    if unknown_id:
        bad.append((1, frame(424_242, b"\x02")))
    producer = Producer({"bootstrap.servers": bs})
    for i, (partition, value) in enumerate(bad):
        producer.produce(src, key=f"bad{i}".encode(), value=value, partition=partition)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("on_error", ["skip", "dead_letter", "fail"])
def test_registry_values_that_do_not_decode_are_bad_records_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch, on_error):
    """Bad registry-framed values are set aside by the tasks with the decoder's reason and follow
    on_error as on the Spark SQL path: the same target, dead letters (reason headers included)
    and failure."""
    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    produce_bad_registry_values(bs, url, src)
    source = f"message_format: avro, schema_registry: {{enabled: true}}, on_error: {on_error}"
    strategy = "{mode: incremental_append, unique_key: order_id}"
    if on_error == "fail":

        def fails(path: str, dst: str) -> str:
            if path == "direct":
                no_handover(monkeypatch)
            create_topic(bs, dst, 2)
            text = manifest_text(src, dst, tmp_path / path, strategy).replace("options: {group_id:", f"options: {{{source}, group_id:")
            with pytest.raises(RunFailed) as failed:
                run_pipeline(parse_manifest(text), spark)
            assert consume_raw(bs, dst) == []
            return str(failed.value)

        failures = on_both_paths(monkeypatch, tmp_path, fails, {"dst": "rbdst"}, src=src)
        assert failures["direct"] == failures["spark_sql"] and "3 record(s)" in failures["direct"] and "wrong magic byte 0x7b" in failures["direct"]
        return
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, strategy, "", source)
    assert outcomes["direct"] == outcomes["spark_sql"]
    extracted, lettered, skipped, _, produced, _, _, letters = outcomes["direct"]
    assert (extracted, lettered + skipped, produced) == (303, 3, 300)
    assert len(letters) == (3 if on_error == "dead_letter" else 0)


def test_json_schema_values_that_do_not_decode_are_bad_records_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """JSON Schema values: not framed, too short, not JSON, a field of another type, an array, an
    empty value: dead letters with the same reasons on both paths."""
    from confluent_kafka import Producer

    from dpone_dagster.schema.registry import registry_client
    from dpone_dagster.schema.wire_format import frame

    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    produce_registry(bs, url, src, "json_schema", shop_rows(200))
    schema_id = registry_client({"url": url}).get_latest_version(f"{src}-value").schema_id
    bad = [(0, b'{"order_id": 1}'), (0, b"\x00\x00"), (1, frame(schema_id, b"{not json")),
           (1, frame(schema_id, b'{"order_id": "x", "amount": 1, "tags": []}')), (0, frame(schema_id, b"[1]")), (1, b"")]
    producer = Producer({"bootstrap.servers": bs})
    for i, (partition, value) in enumerate(bad):
        producer.produce(src, key=f"bad{i}".encode(), value=value, partition=partition)
    assert producer.flush(30) == 0
    source = "message_format: json_schema, schema_registry: {enabled: true}, on_error: dead_letter"
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", "", source)
    assert outcomes["direct"] == outcomes["spark_sql"]
    assert outcomes["direct"][:5] == (206, 6, 0, 0, 200) and len(outcomes["direct"][7]) == 6


@pytest.mark.parametrize("on_error", ["skip", "dead_letter"])
def test_registry_ids_outside_the_subject_are_fetched_by_id_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch, on_error):
    """Values of an id registered under another subject (another producer's schema) are fetched
    by that id, as the Spark SQL path fetches them, and decoded in the tasks; an id the registry
    does not hold is a bad record with that path's reason. The same target, counts and dead
    letters on both paths."""
    import io
    import json

    import fastavro
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import Schema

    from dpone_dagster.schema.registry import registry_client
    from dpone_dagster.schema.wire_format import frame

    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    produce_bad_registry_values(bs, url, src, unknown_id=True)
    other_id = registry_client({"url": url}).register_schema("shop.Order-other", Schema(json.dumps(SHOP_V2), "AVRO"))
    parsed, producer = fastavro.parse_schema(SHOP_V2), Producer({"bootstrap.servers": bs})
    for row in shop_rows(50, 400):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, {**row, "channel": "app"})
        producer.produce(src, key=str(row["order_id"]).encode(), value=frame(other_id, buffer.getvalue()), partition=row["order_id"] % 2)
    assert producer.flush(30) == 0
    source = f"message_format: avro, schema_registry: {{enabled: true}}, on_error: {on_error}"
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", "", source)
    assert outcomes["direct"] == outcomes["spark_sql"]
    extracted, lettered, skipped, _, produced, _, (_, per_key), letters = outcomes["direct"]
    assert (extracted, lettered + skipped, produced) == (354, 4, 350)
    assert sum(b'"channel":"app"' in value for values in per_key.values() for value in values) == 50
    reasons = [v for _, _, headers in letters for _, v in headers if b"unknown schema id 424242" in (v or b"")]
    assert len(reasons) == (1 if on_error == "dead_letter" else 0)


LATE_MINUTES = [5, 20, 70, 55, 80, 100]  # minutes past the first window's start: the 4th is late in the second window


def late_window_runs(bs: str, spark: Any, tmp_path: Path, monkeypatch: Any, src: str, values: list[bytes]) -> dict[str, tuple[Any, list[dict[str, Any]], int]]:
    """`values` produced at LATE_MINUTES, then one Avro-to-Avro run of the two hourly windows with
    late records to the dead-letter topic on each path: its result, target records and letters."""
    from datetime import UTC, datetime, timedelta

    from test_time_windows import manifest_text as window_manifest

    from dpone_dagster.kafka.windows import Window

    start = datetime(2024, 3, 1, tzinfo=UTC)
    produce_json(bs, src, values, partition=0, timestamps=[int((start + timedelta(minutes=m)).timestamp() * 1000) for m in LATE_MINUTES])
    windows = [Window(start + timedelta(hours=h), start + timedelta(hours=h + 1), f"2024-03-01-{h:02d}:00") for h in (0, 1)]

    def one(path: str, dst: str, dlq: str) -> tuple[Any, list[dict[str, Any]], int]:
        create_topic(bs, dst, 2)
        create_topic(bs, dlq, 1)
        source = f"    message_format: avro\n    schema_registry: {{enabled: true}}\n    dead_letter: {{topic: {dlq}}}"
        text = window_manifest(src, dst, tmp_path / path, ", late_records: dead_letter", source)
        text = text.replace(f"  topic: {dst}\n", f"  topic: {dst}\n  options: {{message_format: avro, schema_registry: {{enabled: true}}}}\n")
        result = run_pipeline(parse_manifest(text), spark, RunRequest(windows=windows))
        return result, [without_timestamp(r) for r in consume_raw(bs, dst)], len(consume_raw(bs, dlq))

    return on_both_paths(monkeypatch, tmp_path, one, {"dst": "rl", "dlq": "rll"}, src=src)


def test_a_late_record_of_a_newer_version_counts_among_the_batchs_versions(broker, spark, kafka_env, tmp_path, monkeypatch):
    """A time-window batch of v1 records whose only v2 record is late and held back for the
    dead-letter topic: the Spark SQL path merges v1 and v2 (the versions of every record read),
    and so does the direct path, which registers the same schema and writes the same messages."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from dpone_dagster.schema.registry import registry_client

    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    client = registry_client({"url": url})
    context = SerializationContext(src, MessageField.VALUE)
    v1, v2 = AvroSerializer(client, json.dumps(SHOP_V1)), AvroSerializer(client, json.dumps(SHOP_V2))
    values = [v2({**r, "channel": "web"}, context) if m == 55 else v1(r, context) for r, m in zip(shop_rows(6), LATE_MINUTES, strict=True)]
    out = late_window_runs(bs, spark, tmp_path, monkeypatch, src, values)
    assert [r.execution_path for r, _, _ in out.values()] == ["direct", "spark_sql"], out["direct"][0].notes
    (direct, direct_records, direct_letters), (sql, sql_records, sql_letters) = out["direct"], out["spark_sql"]
    registered = [[f["name"] for f in r.schema_evolution["evolution"]["result_schema"]] for r in (direct, sql)]
    assert registered[0] == registered[1] == ["order_id", "note", "amount", "tags", "channel"], registered
    unframed = [messages([{**r, "value": r["value"][5:]} for r in records]) for records in (direct_records, sql_records)]
    assert unframed[0] == unframed[1] and len(direct_records) == 5
    assert direct_letters == sql_letters == 1


def test_a_subject_version_that_does_not_read_is_left_out_of_the_plan_of_a_batch_without_it(broker, spark, kafka_env, tmp_path, monkeypatch):
    """The subject's first version is not a record (registered by mistake); the batch carries only
    the record version. Both paths plan the batch from the versions it carries, so the run succeeds
    on the direct path with the Spark SQL path's messages."""
    import json

    from confluent_kafka.schema_registry import Schema

    from dpone_dagster.schema.registry import registry_client

    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    registry_client({"url": url}).register_schema(f"{src}-value", Schema(json.dumps("string"), "AVRO"))
    produce_registry(bs, url, src, "avro", shop_rows(40))
    source = "message_format: avro, schema_registry: {enabled: true}"
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", "", 2, source)
    assert direct.execution_path == "direct" and direct.status == "success", direct.notes
    assert messages(direct_records) == messages(sql_records) and len(direct_records) == 40
    assert direct.notes == sql.notes, (direct.notes, sql.notes)


@pytest.mark.parametrize(
    "sink_options",
    [
        "envelope: dpone, headers: {static: {team: dwh, env: \"a b\"}, lineage: true, replicate_source: true}",
        "key: {mode: hash_row}, headers: {replicate_source: true}",
        "envelope: dpone, key: {mode: hash_row}",
    ],
)
def test_envelope_headers_and_row_hash_keys_as_the_spark_sql_path_writes_them(broker, spark, kafka_env, tmp_path, monkeypatch, sink_options):
    """The dpone envelope, static, lineage and replicated source headers (some records without
    any), and row-hash keys: the same keys, values, headers and partitions on both paths."""
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 3)
    producer = Producer({"bootstrap.servers": bs})
    for i, row in enumerate(orders(600)):
        extra = {"headers": [("trace", f"t{i}".encode()), ("empty", b"")]} if i % 3 else {}
        producer.produce(src, json.dumps(row).encode(), str(row["order_id"]).encode(), partition=i % 3, **extra)
    assert producer.flush(30) == 0
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", sink_options
    )
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql"
    assert len(direct_records) == 600

    def written(result: Any, records: list[dict[str, Any]]) -> Counter:  # each run names its own run id
        run_id = result.run_id.encode()
        return Counter((r["partition"], r["key"], r["value"].replace(run_id, b"<run>"), tuple(r["headers"])) for r in records)

    assert written(direct, direct_records) == written(sql, sql_records)


def test_append_without_repeats_and_with_null_or_composite_keys(broker, spark, kafka_env, tmp_path, monkeypatch):
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 2)
    for p in range(2):
        produce_json(bs, src, [{"a": p, "b": f"x{p}-{i}", "v": i * 0.5} for i in range(300)], partition=p)
    for strategy in (
        "{mode: incremental_append, unique_key: b}",
        "{mode: incremental_append}",  # no unique key: the key is null
        "{mode: incremental_merge, unique_key: [a, b]}",  # a JSON object key
    ):
        (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, partitions=2)
        assert direct.execution_path == "direct", strategy
        assert len(direct_records) == 600 and messages(direct_records) == messages(sql_records), strategy


@pytest.mark.parametrize(
    ("strategy", "sink_options", "found_by"),
    [
        ("{mode: incremental_append, unique_key: customer}", "headers: {lineage: true, static: {team: dwh}}", "driver"),
        ("{mode: incremental_merge, unique_key: [customer, region], duplicate_policy: allow}", "", "driver"),
        ("{mode: incremental_append, unique_key: customer}", "", "spark"),
        ("{mode: kafka_offsets, unique_key: customer}", "", "driver"),  # an append by another name
    ],
)
def test_keys_that_repeat_where_every_record_is_published_keep_the_source_order(broker, spark, kafka_env, tmp_path, monkeypatch, strategy, sink_options, found_by):
    """Keys repeat across three source partitions whose timestamps interleave otherwise than their
    offsets: the direct path publishes every record, and each key's messages reach the target in
    source order (timestamp, partition, offset) with the Spark SQL path's keys, values, headers
    and partitions; nothing is left out or sent twice. The records of repeated keys are found on
    the driver, or by Spark past its limit of candidate keys."""
    from dpone_dagster.engine import direct_keys

    if found_by == "spark":
        monkeypatch.setattr(direct_keys, "DRIVER_CANDIDATES", 1)
    bs = broker.bootstrap_servers
    src = unique_topic("dosrc")
    create_topic(bs, src, 3)
    producer = Producer({"bootstrap.servers": bs})
    rng = random.Random(7)
    for i in range(900):
        order = {"order_id": i, "customer": f"c{rng.randrange(40)}", "region": ["eu", "us"][i % 2], "n": i}
        # Timestamps ascend with i but partitions take records in a shuffled order of i.
        producer.produce(src, json.dumps(order).encode(), partition=i % 3, timestamp=1_700_000_000_000 + rng.randrange(5_000))
    assert producer.flush(30) == 0
    (direct, direct_records), (sql, sql_records) = run_both(bs, spark, src, tmp_path, monkeypatch, strategy, sink_options)
    assert (direct.execution_path, sql.execution_path) == ("direct", "spark_sql"), direct.notes
    assert direct.messages_produced == sql.messages_produced == len(direct_records) == len(sql_records) == 900

    def per_key(result: Any, records: list[dict[str, Any]]) -> dict[bytes, list[tuple]]:
        run_id = result.run_id.encode()
        out: dict[bytes, list[tuple]] = {}
        for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
            headers = tuple((k, v.replace(run_id, b"<run>")) for k, v in r["headers"] or ())
            out.setdefault(r["key"], []).append((r["partition"], r["value"], headers))
        return out

    direct_keys, sql_keys = per_key(direct, direct_records), per_key(sql, sql_records)
    assert direct_keys == sql_keys
    assert max(len(v) for v in direct_keys.values()) > 10  # keys do repeat, across partitions


def test_unique_check_on_the_key_refuses_an_append_whose_keys_repeat_on_both_paths(broker, spark, kafka_env, tmp_path, monkeypatch):
    """An append whose unique key repeats, with a `unique` check (mode fail) on that key: both
    paths refuse the batch, with the same count, before anything is produced."""
    bs = broker.bootstrap_servers
    src = unique_topic("urev")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"order_id": i % 10, "status": "new"} for i in range(40)], partition=0)
    quality = "quality:\n  mode: fail\n  checks: [{type: unique, columns: [order_id]}]"

    def one(path: str, dst: str) -> tuple:
        create_topic(bs, dst, 1)
        m = parse_manifest(manifest_text(src, dst, tmp_path / path, "{mode: incremental_append, unique_key: order_id}", quality=quality))
        try:
            result = run_pipeline(m, spark)
            return ("success", result.execution_path, len(consume_raw(bs, dst)), [g for g in result.gates if "unique" in g["name"]])
        except DataRefused as exc:
            return ("refused", str(exc)[:200], len(consume_raw(bs, dst)))

    outcomes = on_both_paths(monkeypatch, tmp_path, one, {"dst": "urev"}, src=src)
    assert outcomes["spark_sql"][0] == "refused" and outcomes["spark_sql"][2] == 0
    assert outcomes["direct"] == outcomes["spark_sql"]


@pytest.mark.parametrize("late", ["next_window", "dead_letter"])
def test_repeated_keys_of_a_time_window_append_keep_the_source_order(broker, spark, kafka_env, tmp_path, monkeypatch, late):
    """Two hourly windows of an append whose keys repeat, with tombstones (deletes enabled) and
    late records (kept for the next window, or dead-lettered): each key's messages, the counts and
    the dead letters are the Spark SQL path's."""
    from datetime import UTC, datetime, timedelta

    from test_time_windows import manifest_text as window_manifest

    from dpone_dagster.kafka.windows import Window

    bs = broker.bootstrap_servers
    src = unique_topic("twrev")
    create_topic(bs, src, 2)
    start = datetime(2024, 3, 1, tzinfo=UTC)
    producer = Producer({"bootstrap.servers": bs})
    rng = random.Random(5)
    for n in range(300):  # records past the first 20 stamped anywhere in two hours: some are late
        minute = rng.randrange(120) if n > 20 else rng.randrange(60)
        value = None if n % 17 == 0 else json.dumps({"order_id": n, "k": f"k{n % 7}", "m": minute}).encode()
        producer.produce(src, value, f"k{n % 7}".encode(), partition=n % 2, timestamp=int((start + timedelta(minutes=minute)).timestamp() * 1000))
    assert producer.flush(30) == 0
    windows = [Window(start + timedelta(hours=h), start + timedelta(hours=h + 1), f"2024-03-01-{h:02d}:00") for h in (0, 1)]

    def one(path: str, dst: str, dlq: str) -> tuple:
        create_topic(bs, dst, 2)
        create_topic(bs, dlq, 1)
        text = window_manifest(src, dst, tmp_path / path, f", late_records: {late}", f"    dead_letter: {{topic: {dlq}}}")
        sink = "  strategy: {mode: incremental_append, unique_key: k}\n  options: {deletes: {enabled: true, tombstone: true}, headers: {lineage: true}}\n"
        text = text.replace(f"  topic: {dst}\n", f"  topic: {dst}\n{sink}")
        result = run_pipeline(parse_manifest(text), spark, RunRequest(windows=windows))
        assert result.execution_path == path, result.notes
        per_key = {}
        for r in sorted(consume_raw(bs, dst), key=lambda r: (r["partition"], r["offset"])):
            per_key.setdefault(r["key"], []).append((r["partition"], r["value"], tuple(r["headers"] or ())))
        return (result.rows_extracted, result.messages_produced, per_key, sorted(x["value"] or b"" for x in consume_raw(bs, dlq)))

    outcomes = on_both_paths(monkeypatch, tmp_path, one, {"dst": "twr", "dlq": "twrl"}, src=src)
    assert outcomes["direct"] == outcomes["spark_sql"]


def test_ordered_phase_with_spill_files_gone_and_bad_records(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Spill files removed before the ordered produce (as on a cluster where a task lands on
    another executor): every slice is read again, the bad records set aside stay out (dead
    letters), and each key's messages match the Spark SQL path's."""
    from dpone_dagster.direct import task
    from dpone_dagster.engine import direct as direct_engine

    bs = broker.bootstrap_servers
    src = unique_topic("sprev")
    create_topic(bs, src, 2)
    for p in range(2):
        rows = [{"order_id": i % 50, "amount": 1.5, "n": p * 1000 + i} for i in range(600)]
        rows[7] = b"{not json"
        rows[300] = {"order_id": None, "amount": 2.0, "n": -1}
        produce_json(bs, src, rows, partition=p, timestamps=[1_700_000_000_000 + (i * 7919) % 1000 for i in range(600)])
    original = direct_engine.produce_ordered
    calls = []

    def gone_then_produce(jobs, window, settings, producer, groups, ordered, set_aside, log):
        jobs.in_tasks(groups, lambda g: task.remove_spills(settings, g), 60, "remove")
        calls.append(sum(len(v) for v in ordered.values()))
        return original(jobs, window, settings, producer, groups, ordered, set_aside, log)

    monkeypatch.setattr(direct_engine, "produce_ordered", gone_then_produce)

    def one(path: str, dst: str, dlq: str) -> tuple:
        create_topic(bs, dst, 2)
        create_topic(bs, dlq, 1)
        text = manifest_text(src, dst, tmp_path / path, "{mode: incremental_append, unique_key: order_id}", "headers: {lineage: true}")
        text = text.replace("options: {group_id:", f"options: {{on_error: dead_letter, dead_letter: {{topic: {dlq}}}, group_id:")
        result = run_pipeline(parse_manifest(text), spark)
        assert result.execution_path == path, result.notes
        per_key = {}
        for r in sorted(consume_raw(bs, dst), key=lambda r: (r["partition"], r["offset"])):
            per_key.setdefault(r["key"], []).append((r["partition"], r["value"], tuple(r["headers"] or ())))
        return (result.rows_extracted, result.rows_dead_lettered, result.messages_produced, result.committed_offsets, per_key, len(consume_raw(bs, dlq)))

    outcomes = on_both_paths(monkeypatch, tmp_path, one, {"dst": "spr", "dlq": "sprl"}, src=src)
    assert calls and calls[0] > 0
    d, s = outcomes["direct"], outcomes["spark_sql"]
    assert d[:4] == s[:4] and d[5] == s[5], (d[:4], s[:4], d[5], s[5])
    assert d[4] == s[4]


def test_non_numeric_numbers_of_a_json_source_are_read_as_spark_reads_them(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Bare NaN, Infinity and -Infinity tokens (in the schema sample and past it) are doubles to
    both paths and written as Spark writes them; -NaN, Inf and -Inf, which Arrow's reader takes
    and Spark's does not, are bad records on both paths (dead letters), not values."""
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 1)
    tokens = {10: b"NaN", 20: b"Infinity", 30: b"-Infinity", 1_050: b"NaN", 1_060: b"-Infinity", 1_070: b"Inf", 1_080: b"-Inf", 1_090: b"-NaN"}
    rows: list[Any] = [
        b'{"order_id": %d, "amount": %s, "note": "Info %d"}' % (i, tokens[i], i) if i in tokens else {"order_id": i, "amount": i * 0.5, "note": f"Info {i}"}
        for i in range(1_200)
    ]
    produce_json(bs, src, rows, partition=0)
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", "", "on_error: dead_letter")
    assert outcomes["direct"] == outcomes["spark_sql"]
    extracted, dead_lettered, _, _, produced, committed, (_, by_key), letters = outcomes["direct"]
    assert (extracted, dead_lettered, produced, committed, len(letters)) == (1_200, 3, 1_197, {0: 1_200}, 3)
    values = [v for per_key in by_key.values() for v in per_key]
    counts = [sum(f'"amount":{text}'.encode() in v for v in values) for text in ('"NaN"', '"Infinity"', '"-Infinity"')]
    assert counts == [2, 1, 2], values[:3]


ONLY_SPARK_READS = {  # index past the schema sample: a record Spark's decoder reads and Arrow's does not
    810: b'{"order_id": %d, "amount": +INF, "note": "plus inf"}',
    820: b'{"order_id": %d, "amount": -INF, "note": "minus inf"}',
    830: b'{"order_id": %d, "amount": +Infinity, "note": "plus infinity"}',
    840: b'{"order_id": %d, "amount": "NaN", "note": "quoted nan"}',
    850: b'{"order_id": %d, "amount": "-Infinity", "note": "quoted minus infinity"}',
    860: b'{"order_id": %d, "amount": 2.5, "note": 12345}',
    870: b'{"order_id": %d, "amount": 3.5, "note": {"nested": [1, "two", null]}}',
    880: b'{"order_id": %d, "amount": 4.5, "note": ["a", 1]}',
    890: b'{not json at %d',
}
ENVELOPES = {  # under envelope: auto, dpone envelopes past the sample of a flat topic
    815: b'{"op": "upsert", "data": {"order_id": %d, "amount": 7.25, "note": "enveloped"}}',
    835: b'{"op": "delete", "data": {"order_id": %d, "amount": null, "note": null}}',
    855: b'{"op": "upsert", "data": {"order_id": %d, "amount": 8.5, "note": 77}}',
    # Spark's envelope decoder reads the data without allowNonNumericNumbers: a bad record there.
    865: b'{"op": "upsert", "data": {"order_id": %d, "amount": +INF, "note": "bad"}}',
}


def only_spark_reads(partition: int, odd: dict[int, bytes]) -> list[Any]:
    """1,200 orders of one partition (keys repeat: order_id i % 400, per partition); past the
    schema sample (its 500 records of each of two partitions), the records of `odd`."""
    return [
        odd[i] % (partition * 1_000 + i % 400) if i in odd else {"order_id": partition * 1_000 + i % 400, "amount": i * 0.5, "note": f"n{i}"}
        for i in range(1_200)
    ]


@pytest.mark.parametrize("case", ["flat values", "envelopes among flat records"])
def test_records_only_spark_reads_are_decoded_by_spark_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch, case):
    """Records Spark's JSON decoder reads and the task decoder does not (+INF and -INF, quoted
    NaN and infinities in a double field, numbers, objects and lists in a string field, dpone
    envelopes under envelope: auto) are decoded by Spark and spliced into the tasks' batches: the
    batch stays on the direct path and writes the Spark SQL path's messages, dead letters and
    offsets; a corrupt record is still a bad record."""
    bs = broker.bootstrap_servers
    src = unique_topic("dspark")
    create_topic(bs, src, 2)
    odd = {**ONLY_SPARK_READS, **(ENVELOPES if case.startswith("envelopes") else {})}
    for partition in (0, 1):
        produce_json(bs, src, only_spark_reads(partition, odd), partition=partition)
    strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    sink = "deletes: {enabled: true, tombstone: true}" if case.startswith("envelopes") else ""
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, strategy, sink, "on_error: dead_letter")
    assert outcomes["direct"] == outcomes["spark_sql"]
    extracted, dead_lettered, _, removed, produced, committed, (_, by_key), letters = outcomes["direct"]
    bad = 4 if case.startswith("envelopes") else 2  # the corrupt records, and +INF in an envelope's data
    assert (extracted, dead_lettered, committed, len(letters)) == (2_400, bad, {0: 1_200, 1: 1_200}, bad)
    assert produced == 800 and removed == 2_400 - bad - 800
    every = [v for per_key in by_key.values() for v in per_key]
    values = [v for v in every if v is not None]
    assert sum(b'"amount":"Infinity"' in v for v in values) == 4
    assert sum(b'"note":"{\\"nested\\":[1,\\"two\\",null]}"' in v for v in values) == 2, values[:2]
    assert sum(b'"note":"12345"' in v for v in values) == 2 and sum(b'"note":"[\\"a\\",1]"' in v for v in values) == 2
    if case.startswith("envelopes"):
        assert sum(b'"note":"77"' in v for v in values) == 2 and len(every) - len(values) == 2  # the deletes' tombstones


def test_envelopes_without_data_and_fields_named_like_positions_under_envelope_auto(broker, spark, kafka_env, tmp_path, monkeypatch):
    """A topic of dpone envelopes (auto): a value with op but no data is no envelope to Spark's
    per-record rule, so the tasks leave it to Spark, as they leave a number in a text field;
    payload fields named partition and offset travel with those rows. Both paths write the same."""
    bs = broker.bootstrap_servers
    src = unique_topic("dauto")
    create_topic(bs, src, 1)
    rows: list[Any] = [{"op": "upsert", "data": {"order_id": i % 300, "partition": i % 3, "offset": i, "note": f"n{i}"}} for i in range(1_200)]
    rows[1_150] = b'{"op": "delete", "order_id": 5}'  # the last of key 5
    rows[950] = b'{"op": "upsert", "data": {"order_id": 50, "partition": 1, "offset": 950, "note": 950}}'
    produce_json(bs, src, rows, partition=0)
    strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, strategy, "deletes: {enabled: true, tombstone: true}", "envelope: auto, on_error: dead_letter")
    assert outcomes["direct"] == outcomes["spark_sql"]
    extracted, _, _, _, produced, committed, (_, by_key), _ = outcomes["direct"]
    assert extracted == 1_200 and committed == {0: 1_200} and produced >= 300
    assert any(v is not None and b'"note":"950"' in v for v in by_key[b"50"]), by_key[b"50"]
    assert by_key[b"5"][-1] is not None and b'"op":"delete"' in by_key[b"5"][-1]  # a flat record to Spark: an upsert


def test_more_records_only_spark_reads_than_travel_to_the_tasks_go_to_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Past the rows the driver hands the tasks (spark_rows.MAX_ROWS), the whole batch takes the
    Spark SQL path before anything is produced, so the target holds each message once."""
    from dpone_dagster.direct import spark_rows

    monkeypatch.setattr(spark_rows, "MAX_ROWS", 3)
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dsrc"), unique_topic("ddst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, only_spark_reads(0, {i: v for i, v in ONLY_SPARK_READS.items() if b"not json" not in v}), partition=0)
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path / dst, "{mode: incremental_append, unique_key: order_id}")), spark)
    assert result.execution_path == "spark_sql"
    assert any("only Spark's decoder reads" in n for n in result.notes), result.notes
    produced = consume_raw(bs, dst, expected=1_200)
    assert len(produced) == result.messages_produced == 1_200
    assert len({r["value"] for r in produced}) == 1_200
    assert result.committed_offsets == {0: 1_200}


def drifting(n: int, envelope: str = "flat") -> list[Any]:
    """Orders whose last records (past the schema sample, the first 1,000) bring new fields:
    a number in some, an object with a list in one, next to a corrupt record."""
    rows: list[Any] = []
    for i in range(n):
        order: dict[str, Any] = {"order_id": i % 700 if i < 1_000 else i, "amount": i * 0.5, "note": f"v{i}"}
        if i >= 1_050 and i % 10 == 3:
            order["extra"] = i
        if i == 1_177:
            order["detail"] = {"tags": ["a", "b"], "weight": 1.25}
        rows.append({"op": "upsert", "data": order} if envelope == "dpone" else order)
    rows[1_111] = b"{not json"
    return rows


DRIFT = {  # case: (source envelope, strategy, sink options)
    "flat records, merged keep_last": ("flat", "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", ""),
    "flat records, every record appended": ("flat", "{mode: incremental_append, unique_key: order_id, duplicate_policy: allow}", "headers: {lineage: true}"),
    "dpone envelopes, into the envelope": ("dpone", "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_first}", "envelope: dpone"),
    "flat records, into Avro through the registry": ("flat", "{mode: incremental_merge, unique_key: order_id}", "message_format: avro, schema_registry: {enabled: true}"),
}


@pytest.mark.parametrize("case", sorted(DRIFT))
def test_fields_the_schema_sample_missed_widen_the_schema_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch, case):
    """Records past the sample bring fields it did not hold: the direct path widens the schema as
    the Spark SQL path widens it, scans the batch again and writes the same messages."""
    bs = broker.bootstrap_servers
    envelope, strategy, sink_options = DRIFT[case]
    src = unique_topic("ddrift")
    create_topic(bs, src, 1)
    framed = "avro" in sink_options
    if framed:
        registry_topic(bs, monkeypatch)
    produce_json(bs, src, drifting(1_200, envelope), partition=0)
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, strategy, sink_options, partitions=2, source_options=f"envelope: {envelope}, on_error: skip"
    )
    assert direct.execution_path == "direct", direct.notes
    assert sql.execution_path == "spark_sql"
    widened = "schema widened with fields not in the sample: ['detail', 'extra']"
    assert widened in direct.notes and widened in sql.notes, (direct.notes, sql.notes)
    assert direct.rows_extracted == sql.rows_extracted == 1_200 and direct.rows_skipped == sql.rows_skipped == 1
    assert direct.messages_produced == sql.messages_produced == len(direct_records)
    assert direct.committed_offsets == sql.committed_offsets == {0: 1_200}

    def written(result: Any, records: list[dict[str, Any]]) -> tuple[Counter, dict[bytes, list[bytes]]]:
        run_id = result.run_id.encode()
        return in_key_order([{**r, "value": r["value"][5 if framed else 0 :].replace(run_id, b"<run>")} for r in records])

    assert written(direct, direct_records) == written(sql, sql_records)
    if framed:  # registered with the widened fields, on both paths
        registered = [[f["name"] for f in r.schema_evolution["evolution"]["result_schema"]] for r in (direct, sql)]
        assert registered[0] == registered[1] == ["order_id", "amount", "note", "detail", "extra"]
        return
    values = [json.loads(r["value"]) for r in direct_records]
    payloads = [v["data"] if envelope == "dpone" else v for v in values]
    assert {"tags": ["a", "b"], "weight": 1.25} in [p.get("detail") for p in payloads]
    assert any(p.get("extra") == 1_193 for p in payloads)


def test_a_field_the_sample_missed_in_a_record_of_another_type(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Corrupt as sampled (a text where the sample held numbers), but its new field widens the
    schema, and it decodes then: the direct path widens it, has Spark decode the record the task
    decoder does not read (a number where the widened schema holds text) and writes what the
    Spark SQL path writes on its own."""
    bs = broker.bootstrap_servers
    src = unique_topic("ddrift")
    create_topic(bs, src, 1)
    rows: list[Any] = [{"order_id": i, "amount": 1.5} for i in range(1_200)]
    rows[1_100] = {"order_id": "5000", "amount": 1.5, "extra": 1}
    produce_json(bs, src, rows, partition=0)
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", partitions=1, source_options="on_error: skip"
    )
    # Widened, order_id is text, which the task decoder does not read from JSON numbers: Spark does.
    assert direct.execution_path == "direct" and "schema widened with fields not in the sample: ['extra']" in direct.notes
    assert messages(direct_records) == messages(sql_records)
    assert direct.messages_produced == sql.messages_produced == 1_200
    assert direct.committed_offsets == sql.committed_offsets == {0: 1_200}


DELETE_SINKS = {
    "tombstones": ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", "deletes: {enabled: true, tombstone: true}"),
    "envelope events": ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", "envelope: dpone, deletes: {enabled: true}"),
    "skipped": ("{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_first}", "deletes: {when_disabled: skip}"),
    # No unique_key: upserts have no key, a delete the source record's key.
    "events without a unique key": ("{mode: incremental_append}", "envelope: dpone, deletes: {enabled: true}, headers: {replicate_source: true}"),
    # keep_last settles the deletes among themselves, by the source record's key.
    "full_refresh without a unique key": ("{mode: full_refresh, duplicate_policy: keep_last}", "envelope: dpone, deletes: {enabled: true}"),
    "replace events without a unique key": ("{mode: replace, duplicate_policy: keep_first}", "envelope: dpone, deletes: {enabled: true}"),
}


@pytest.mark.parametrize("sink", sorted(DELETE_SINKS))
@pytest.mark.parametrize("source_envelope", ["flat", "dpone"])
def test_deletes_as_the_spark_sql_path_writes_them(broker, spark, kafka_env, tmp_path, monkeypatch, sink, source_envelope):
    """Source tombstones (the key is the source key), envelope deletes (with or without their
    data), upserts before and after them, keys repeated across partitions: tombstones, envelope
    delete events or deletes left out, the same on both paths."""
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 2)
    producer = Producer({"bootstrap.servers": bs})
    for i in range(300):
        order = {"order_id": i % 60, "amount": i * 1.5, "note": f"v{i}"}
        if i % 7 == 3:
            value = None  # a tombstone: the record's key says what is deleted
        elif source_envelope == "dpone" and i % 11 == 5:
            value = json.dumps({"op": "delete", "data": {"order_id": i % 60} if i % 2 else None}).encode()
        elif source_envelope == "dpone":
            value = json.dumps({"op": "upsert", "data": order, "schema_version": 1}).encode()
        else:
            value = json.dumps(order).encode()
        producer.produce(src, value, str(i % 60).encode(), partition=i % 2, timestamp=1_700_000_000_000 + i)
    assert producer.flush(30) == 0
    strategy, sink_options = DELETE_SINKS[sink]
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, strategy, sink_options, source_options=f"envelope: {source_envelope}"
    )
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql"
    assert direct.deletes_skipped == sql.deletes_skipped and direct.tombstones == sql.tombstones
    assert direct.messages_produced == sql.messages_produced == len(direct_records)

    def written(result: Any, records: list[dict[str, Any]]) -> Counter:  # each run names its own run id
        run_id = result.run_id.encode()
        return Counter(
            (r["partition"] if r["key"] is not None else None, r["key"], r["value"] and r["value"].replace(run_id, b"<run>"), tuple(r["headers"]))
            for r in records
        )

    assert written(direct, direct_records) == written(sql, sql_records)

    def per_key(result: Any, records: list[dict[str, Any]]) -> dict[bytes, list[bytes]]:  # a key's messages in topic order
        run_id = result.run_id.encode()
        out: dict[bytes, list[bytes]] = {}
        for r in sorted((r for r in records if r["key"] is not None), key=lambda r: r["offset"]):
            out.setdefault(r["key"], []).append(r["value"] and r["value"].replace(run_id, b"<run>"))
        return out

    assert per_key(direct, direct_records) == per_key(sql, sql_records)


def test_headers_of_a_slice_left_empty():
    """Every record of a spilled batch left out (keep_last, deletes skipped): no headers to build."""
    from dpone_dagster.shape.headers import HEADERS_TYPE, HeaderSpec, headers

    spec = HeaderSpec.of({"env": "prod"}, True, True, "t")
    assert headers(spec, 0, pa.array([], pa.int64()), pa.array([], HEADERS_TYPE)).to_pylist() == []


def test_deletes_a_sink_does_not_take_fail_the_run_on_both_paths(broker, spark, kafka_env, tmp_path, monkeypatch):
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"order_id": i} for i in range(10)] + [None], partition=0, key=lambda row: "9")

    def fails(path: str, dst: str) -> None:
        create_topic(bs, dst, 1)
        m = parse_manifest(manifest_text(src, dst, tmp_path / path, "{mode: incremental_append, unique_key: order_id}"))
        with pytest.raises(RunFailed, match=r"the batch holds 1 delete\(s\) but sink.options.deletes.enabled is false"):
            run_pipeline(m, spark)
        assert consume_raw(bs, dst) == []

    on_both_paths(monkeypatch, tmp_path, fails, {"dst": "ddst"}, src=src)


def test_an_op_field_takes_the_spark_sql_path_and_other_engine_names_are_refused(broker, spark, kafka_env, tmp_path):
    """`__dpone__op` in a flat record marks deletes (the Spark SQL path reads it, it is not
    payload); other names of the engine's columns are refused with the fix, on either path."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dsrc"), unique_topic("ddst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": i, "__dpone__op": "upsert"} for i in range(5)], partition=0)
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path / "a", "{mode: incremental_append}")), spark)
    assert result.execution_path == "spark_sql" and result.messages_produced == 5
    assert sorted(json.loads(r["value"])["order_id"] for r in consume_raw(bs, dst)) == list(range(5))
    assert all(json.loads(r["value"]).keys() == {"order_id"} for r in consume_raw(bs, dst))  # the op is not payload

    other = unique_topic("dsrc")
    create_topic(bs, other, 1)
    produce_json(bs, other, [{"order_id": 1, "__dpone__source_offset": 7}], partition=0)
    with pytest.raises(ConfigError, match=r"__dpone__source_offset.*declare source.options.schema"):
        run_pipeline(parse_manifest(manifest_text(other, dst, tmp_path / "b", "{mode: incremental_append}")), spark)


def test_gates_refuse_before_the_direct_path_produces(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dsrc"), unique_topic("ddst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": i % 5} for i in range(20)], partition=0)
    quality = "quality:\n  mode: fail\n  checks: [{type: min_rows, threshold: 21}]"
    m = parse_manifest(manifest_text(src, dst, tmp_path, "{mode: incremental_merge, unique_key: order_id}", quality=quality))
    with pytest.raises(DataRefused, match="min_rows"):
        run_pipeline(m, spark)  # 20 rows extracted
    assert consume_raw(bs, dst) == []
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{dst}") == {}


@pytest.mark.parametrize("ranked_by", ["driver", "spark"])
def test_duplicate_policy_fail_is_judged_on_the_keys(broker, spark, kafka_env, tmp_path, monkeypatch, ranked_by):
    """Keys that repeat under duplicate_policy: fail refuse the batch on the direct path itself,
    with the Spark SQL path's error; hashes shared by different keys do not."""
    from dpone_dagster.engine import direct_keys
    from dpone_dagster.sinks import kafka_messages

    if ranked_by == "spark":
        monkeypatch.setattr(direct_keys, "DRIVER_CANDIDATES", 0)

    def spark_sql_judged(*args: Any) -> None:
        raise AssertionError("the Spark SQL path judged the batch")

    monkeypatch.setattr(kafka_messages, "duplicate_keys", spark_sql_judged)
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dsrc"), unique_topic("ddst")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    produce_json(bs, src, [{"order_id": i} for i in range(10)], partition=0)
    strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: fail}"
    m = parse_manifest(manifest_text(src, dst, tmp_path, strategy))
    assert run_pipeline(m, spark).execution_path == "direct"
    produce_json(bs, src, [{"order_id": 3}, {"order_id": 12}], partition=1)
    produce_json(bs, src, [{"order_id": 3}, {"order_id": 12}, {"order_id": 14}], partition=0)
    with pytest.raises(RunFailed, match=r"duplicate_policy: fail — 2 key\(s\) occur more than once in the batch \(e.g. \['(12|3)', '(12|3)'\]\)"):
        run_pipeline(m, spark)
    assert len(consume_raw(bs, dst)) == 10
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{dst}") == {0: 10, 1: 0}


def test_a_produce_task_without_its_spill_reads_the_slice_again(broker, kafka_env, tmp_path):
    """No Spark here: the task functions themselves. What a produce task sends is the same whether
    the scan's file is there or the slice is read and shaped again."""
    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 1)
    produce_json(bs, src, orders(500), partition=0)
    schema = pa.schema([("order_id", pa.int64()), ("note", pa.string()), ("tags", pa.list_(pa.string()))])
    rows = [{k: r[k] for k in schema.names} for r in orders(500)]
    produce_json(bs, src, rows, partition=0)
    settings = task.DirectSettings(
        reader=ReaderSettings(client_config={"bootstrap.servers": bs}, group_id="g"),
        schema=schema,
        key_columns=(0,),
        hashed=True,
        max_message_bytes=1_000_000,
        run_id="r1",
    )
    piece = (src, 0, 500, 1000)
    kept = list(task.slice_messages(settings, piece, None))  # no spill yet: read and shaped
    report = task.scan(settings, [piece])
    assert report.refused is None and report.rows == 500
    assert Path(task.spill_path(settings, piece)).exists()
    from_spill = list(task.slice_messages(settings, piece, None))
    assert pa.Table.from_batches(from_spill).equals(pa.Table.from_batches(kept))
    first = json.loads(from_spill[0].column("value")[0].as_py())
    assert first == {"order_id": 0, "note": "plain", "tags": []}
    # A second scan of the run (its plan changed) keeps its own files: on a cluster its produce
    # task may run where the first scan's file was left, and must not take it.
    again = replace(settings, scan=2)
    assert list(task.slice_messages(again, piece, None))  # read and shaped, not the first scan's file
    assert task.spill_path(again, piece) != task.spill_path(settings, piece) and not Path(task.spill_path(again, piece)).exists()
    task.remove_spills(settings, [piece])
    assert not Path(task.spill_path(settings, piece)).exists()

    # A bad record the scan set aside: read again, the slice leaves it out as the driver said, or
    # the task fails (it would not give the messages the driver judged).
    produce_json(bs, src, [{"order_id": 1_000 + i} if i != 3 else b"{not json" for i in range(10)], partition=0)
    screening = replace(settings, screen_undecodable=True)
    bad_piece = (src, 0, 1_000, 1_010)
    report = task.scan(screening, [bad_piece])
    assert report.rows == 10 and report.set_aside["offset"].to_pylist() == [1_003]
    task.remove_spills(screening, [bad_piece])
    again = pa.Table.from_batches(list(task.slice_messages(screening, bad_piece, np.array([1_003]))))
    assert again["offset"].to_pylist() == [1_000, 1_001, 1_002, *range(1_004, 1_010)]
    with pytest.raises(RuntimeError, match="sets aside records its scan did not"):
        list(task.slice_messages(screening, bad_piece, None))


def test_a_scan_stopped_by_an_unplanned_schema_id_reports_the_ids_of_all_its_slices(broker, kafka_env):
    """No Spark here: the task function. A JSON Schema source planned with id 1 only, one record
    per Arrow batch: the scan stops at partition 0's id-2 value (offset 1) and reads what follows
    for its ids only (id 3 further on, id 4 in the next slice), for the driver to fetch them all."""
    from pyspark.sql.types import LongType, StructField, StructType

    from dpone_dagster.schema.wire_format import frame
    from dpone_dagster.sources.kafka import RegistryPlan

    bs = broker.bootstrap_servers
    src = unique_topic("dsrc")
    create_topic(bs, src, 2)
    produce_json(bs, src, [frame(i, json.dumps({"order_id": n}).encode()) for n, i in enumerate([1, 2, 1, 3, 1])], partition=0)
    produce_json(bs, src, [frame(4, b'{"order_id": 9}')], partition=1)
    plan = RegistryPlan("json_schema", {1: ("JSON", '{"type": "object"}')}, None, StructType([StructField("order_id", LongType())]))
    settings = task.DirectSettings(
        reader=ReaderSettings(client_config={"bootstrap.servers": bs}, group_id="g", arrow_batch_rows=1),
        schema=pa.schema([("order_id", pa.int64())]),
        key_columns=None,
        hashed=False,
        max_message_bytes=1_000_000,
        run_id="r-ids",
        registry_source=plan,
    )
    slices = [(src, 0, 0, 5), (src, 1, 0, 1)]
    report = task.scan(settings, slices)
    task.remove_spills(settings, slices)
    assert report.refused is not None and report.refused.startswith(task.UNPLANNED), report.refused
    assert report.schema_ids == {1, 2, 3, 4}


# --------------------------------------------------------------------------- pure parts


def test_key_hashes_tell_keys_apart():
    keys = [b"", b"a", b"\x00", b"ab", b"ba", b"a" * 300, b"a" * 301, "é".encode(), b"12", b"21"]
    hashes = key_hashes(pa.array(keys, pa.binary()))
    assert len(set(hashes.tolist())) == len(keys)
    # A sliced array hashes its own values.
    assert key_hashes(pa.array(keys, pa.binary()).slice(3, 4)).tolist() == hashes[3:7].tolist()
    assert key_hashes(pa.array([b"ab"], pa.binary())).tolist() == [hashes[3]]


def test_a_null_key_is_never_hashed_nor_a_candidate():
    """Messages without a key are published unsettled (as the Spark SQL path keeps every one):
    only the other keys are hashed, and a null key is never chosen, wherever it sits."""
    keys = pa.array([b"a", None, b"b", None, b"a"], pa.binary())
    hashes = key_hashes(pa.array([b"a", b"b"], pa.binary()))
    assert keyed_hashes(keys).tolist() == [hashes[0], hashes[1], hashes[0]]
    assert is_candidate(keys, np.sort(hashes[:1])).tolist() == [True, False, False, False, True]
    assert is_candidate(keys.slice(1, 3), np.sort(hashes)).tolist() == [False, True, False]
    assert is_candidate(pa.array([b"b"], pa.binary()), np.sort(hashes)).tolist() == [True]


def test_candidates_are_hashes_seen_twice_anywhere():
    first = TaskHashes.of([np.array([5, 1, 5, 9], np.uint64)])
    second = TaskHashes.of([np.array([2, 9], np.uint64), np.array([7], np.uint64)])
    third = TaskHashes.of([])
    assert first.repeated.tolist() == [5]
    assert candidates([first, second, third]).tolist() == [5, 9]
    assert candidates([second]).tolist() == []
    # By bucket: each bucket finds the candidates of its own hashes.
    by_bucket = [candidates(parts).tolist() for parts in zip(*(t.split(3) for t in (first, second, third)), strict=True)]
    assert sorted(h for found in by_bucket for h in found) == [5, 9]


def test_repeated_keys_are_the_keys_found_more_than_once():
    """Candidate records whose hashes collide but whose keys differ give no repeated key."""
    records = pa.table({"key": pa.array([b"b", b"a", b"c", b"b", b"a", b"b"]), "offset": pa.array(range(6))})
    assert repeated_keys(records).to_pylist() == [b"a", b"b"]
    assert repeated_keys(records.slice(0, 3)).to_pylist() == []


def test_a_null_in_the_source_order_ranks_before_any_value():
    """As Spark orders the struct of a SQL row's order (watermark, key): a null field is the
    smallest value, so keep_last never keeps it over a value and keep_first keeps it first."""
    records = pa.table({"key": [b"k", b"k", b"k", b"j"], "w": [None, 5, 3, 1], "row": [0, 1, 2, 3]})
    assert left_out_by_policy(records, ["w", "row"], "keep_last")["row"].to_pylist() == [2, 0]
    assert left_out_by_policy(records, ["w", "row"], "keep_first")["row"].to_pylist() == [2, 1]
    # NaN ranks above every number (and infinity), as in Spark; a null still below it.
    doubles = pa.table({"key": [b"k"] * 4, "w": [float("inf"), float("nan"), 1.0, None], "row": [0, 1, 2, 3]})
    assert sorted(left_out_by_policy(doubles, ["w", "row"], "keep_last")["row"].to_pylist()) == [0, 2, 3]
    assert sorted(left_out_by_policy(doubles, ["w", "row"], "keep_first")["row"].to_pylist()) == [0, 1, 2]
    assert in_sorted(np.array([1, 5, 7, 0, 9]), np.array([1, 7, 9])).tolist() == [True, False, True, False, True]


def test_losers_follow_the_source_order():
    records = pa.table(
        {
            "key": [b"k", b"k", b"k", b"j", b"j"],
            "offset": [3, 1, 2, 0, 1],
            "timestamp": [10, 10, 9, 5, 5],
            "partition": [0, 1, 1, 2, 0],
        },
        schema=pa.schema([("key", pa.binary()), ("offset", pa.int64()), ("timestamp", pa.int64()), ("partition", pa.int32())]),
    )
    # keep_last: k -> (10, 1, 1) beats (10, 0, 3) and (9, 1, 2); j -> (5, 2, 0) beats (5, 0, 1).
    skip, dropped = losers(records, "keep_last")
    assert dropped == 3
    assert {p: o.tolist() for p, o in skip.items()} == {0: [1, 3], 1: [2]}
    skip, dropped = losers(records, "keep_first")
    assert {p: o.tolist() for p, o in skip.items()} == {0: [3], 1: [1], 2: [0]}


def test_spark_ranks_repeated_keys_as_the_driver_does(spark):
    """engine/direct_keys: the Spark window past the driver's limit leaves out the records the
    driver's ranking leaves out (ties on the timestamp broken by partition, then offset)."""
    from dpone_dagster.engine.direct_keys import CANDIDATE_SCHEMA, ranked_losers

    rng = np.random.default_rng(11)
    n = 3000
    schema = pa.schema([("key", pa.binary()), ("offset", pa.int64()), ("timestamp", pa.int64()), ("partition", pa.int32())])
    records = pa.table(
        {
            "key": [f"k{i}".encode() for i in rng.integers(0, 400, n)],
            "offset": rng.permutation(n),
            "timestamp": rng.integers(0, 20, n),
            "partition": rng.integers(0, 3, n).astype(np.int32),
        },
        schema=schema,
    )
    frame = spark.createDataFrame(records.to_pandas(), CANDIDATE_SCHEMA)
    for policy in ("keep_last", "keep_first"):
        expected, dropped = losers(records, policy)
        got = ranked_losers(frame, policy).toArrow()
        assert got.num_rows == dropped > 0
        ranked = {int(p): sorted(got.filter(pc.equal(got["partition"], p))["offset"].to_pylist()) for p in set(got["partition"].to_pylist())}
        assert ranked == {p: o.tolist() for p, o in expected.items()}


def test_spark_connect_hands_too_many_candidate_keys_to_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Over Spark Connect the candidate hashes would travel in the ranking's plan: past
    CONNECT_CANDIDATES the batch goes to the Spark SQL path whole, and keep_last still holds.
    (Connect is simulated on the classic session: only the limit's branch depends on it.)"""
    from dpone_dagster.engine import direct_keys

    monkeypatch.setattr(direct_keys, "DRIVER_CANDIDATES", 0)
    monkeypatch.setattr(direct_keys, "CONNECT_CANDIDATES", 0)
    monkeypatch.setattr(direct_keys, "is_connect", lambda _: True)
    bs = broker.bootstrap_servers
    src, dst = unique_topic("cksrc"), unique_topic("ckdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": i % 5, "v": i} for i in range(20)], partition=0)
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"))
    result = run_pipeline(manifest, spark)
    assert result.execution_path == "spark_sql" and any("Spark Connect" in n for n in result.notes), result.notes
    assert {int(r["key"]): json.loads(r["value"])["v"] for r in consume_raw(bs, dst)} == {k: 15 + k for k in range(5)}


def test_a_partition_is_stored_up_to_its_first_undelivered_slice():
    progress = SliceProgress({0: 100, 1: 0})
    assert progress.delivered(0, 200, 300) == {}  # [100, 200) is not delivered yet
    assert progress.delivered(1, 0, 50) == {1: 50}
    assert progress.delivered(0, 100, 200) == {0: 300}  # both slices now
    assert progress.delivered(1, 100, 150) == {}
    assert progress.reached == {0: 300, 1: 50}


@pytest.mark.parametrize("seed", range(20))
def test_never_more_slices_open_than_the_window_whatever_order_they_finish_in(seed):
    """Slices finish in a random order (a slow one anywhere): at every moment the slices started
    and not yet covered by a storable offset are at most the window, every slice runs once, and
    the partitions end stored at their ends."""
    rng = random.Random(seed)
    slices = [("t", p, start, start + 10) for p, (first, count) in enumerate([(0, 7), (100, 3), (5, 1)]) for start in range(first, first + 10 * count, 10)]
    window = rng.choice([1, 2, 3])
    schedule = SliceSchedule(slices, {0: 0, 1: 100, 2: 5}, window)
    running: list[tuple[str, int, int, int]] = []
    stored: dict[int, int] = {}
    started: list[tuple[str, int, int, int]] = []
    while True:
        piece = schedule.next()
        while piece is not None:
            running.append(piece)
            started.append(piece)
            piece = schedule.next()
        unstored = [s for s in started if s[3] > stored.get(s[1], {0: 0, 1: 100, 2: 5}[s[1]])]
        assert len(unstored) <= window and schedule.open == len(unstored)
        if not running:
            break
        done = running.pop(rng.randrange(len(running)))
        stored.update(schedule.delivered(done))
    assert sorted(started) == sorted(slices) and schedule.done
    assert stored == {0: 70, 1: 130, 2: 15}


def test_a_stopped_schedule_starts_nothing_more():
    schedule = SliceSchedule([("t", 0, 0, 10), ("t", 0, 10, 20), ("t", 0, 20, 30)], {0: 0}, 2)
    first, second = schedule.next(), schedule.next()
    assert schedule.next() is None  # the window is full
    schedule.stop()
    assert schedule.delivered(second) == {} and schedule.delivered(first) == {0: 20}
    assert schedule.next() is None and not schedule.done


def test_a_job_past_its_bound_is_cancelled_and_named(spark):
    """A real Spark job whose task sleeps: the wait ends at the bound with the job named, the job
    is cancelled (no active job remains), and the session serves the next job."""
    jobs = BoundedJobs(spark, "bounded-test")
    started = time.monotonic()
    with pytest.raises(JobTimedOut, match=r"the sleeper did not finish within 2 s"):
        jobs.run(lambda: in_tasks(spark, [0], lambda _: time.sleep(60)), 2, "the sleeper")
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 30
    while spark.sparkContext.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    assert jobs.run(lambda: in_tasks(spark, [1, 2], lambda g: g * 10), 30, "a quick job") == [10, 20]


def test_spill_directories_are_removed_with_the_run_and_left_overs_swept(broker, spark, kafka_env, tmp_path):
    """A direct run removes its spill directory (a killed worker's .partial file in it too), and
    its scan removes other runs' directories left untouched for hours (a killed driver's); a
    recent one stays. The left-overs are written here as a killed process leaves them."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("spill"), unique_topic("spill_out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, orders(50), partition=0)
    root = Path(spark.sparkContext.parallelize([0], 1).map(lambda _: spill.spill_root()).collect()[0])
    run_id = "spill-cleanup-run"
    mine = root / f"{spill.SPILL_PREFIX}{run_id}"
    mine.mkdir(parents=True, exist_ok=True)
    (mine / f"{src}-0-0-9.arrow.4242.partial").write_bytes(b"half")  # a worker killed mid-write
    stale, recent = root / f"{spill.SPILL_PREFIX}killed-run", root / f"{spill.SPILL_PREFIX}live-run"
    for leftover in (stale, recent):
        leftover.mkdir(exist_ok=True)
        (leftover / "x.arrow").write_bytes(b"kept")
    hours_ago = time.time() - spill.STALE_SPILL_S - 60
    os.utime(stale, (hours_ago, hours_ago))
    m = parse_manifest(manifest_text(src, dst, tmp_path / "state", "{mode: incremental_append}"))
    result = run_pipeline(m, spark, RunRequest(run_id=run_id))
    assert result.execution_path == "direct" and result.messages_produced == 50
    assert not mine.exists() and not stale.exists()
    assert (recent / "x.arrow").exists()
    shutil.rmtree(recent)


# --------------------------------------------------------------------------- time windows


def test_late_counts_follow_the_spark_sql_rule(spark):
    """The scan's count of late records per window equals the Spark SQL path's late_window on the
    same records: three windows over two partitions, timestamps on both sides of each start."""
    from pyspark.sql import functions as F

    from dpone_dagster.kafka.boundary import Boundary, PartitionRange
    from dpone_dagster.sources.kafka import late_window

    hour = 3_600_000
    edges = {0: [(0, 40), (40, 90), (90, 150)], 1: [(0, 10), (10, 10), (10, 70)]}  # one empty range
    windows = tuple(
        {"start": f"w{i}", "start_ms": (i + 1) * hour, "partitions": [{"partition": p, "start": edges[p][i][0], "end": edges[p][i][1]} for p in (0, 1)]}
        for i in range(3)
    )
    boundary = Boundary("t", "time_window", (PartitionRange(0, 0, 150), PartitionRange(1, 0, 70)), windows=windows)
    rng = np.random.default_rng(7)
    records = {p: (np.arange(end), rng.integers(0, 5 * hour, end)) for p, end in ((0, 150), (1, 70))}
    frame = spark.createDataFrame(
        [(p, int(o), int(t)) for p, (offsets, stamps) in records.items() for o, t in zip(offsets, stamps, strict=True)],
        "partition int, offset long, timestamp long",
    )
    late = late_window(boundary, F.col("partition"), F.col("offset"), F.col("timestamp"))
    expected = {row["w"]: row["count"] for row in frame.select(late.alias("w")).where("w is not null").groupBy("w").count().collect()}

    ranges = tuple((i, r["partition"], r["start"], r["end"], w["start_ms"]) for i, w in enumerate(windows) for r in w["partitions"])
    counted: Counter = Counter()
    for p, (offsets, stamps) in records.items():
        counted.update(late_counts(ranges, p, offsets, stamps))
    assert dict(counted) == expected and sum(expected.values()) > 20  # late records in every window


def test_time_windows_count_late_records_as_the_spark_sql_path_does(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Two hourly windows in one run (a range backfill), two partitions, a record stamped before
    the start of the window whose offsets hold it in each: both paths deliver and count them alike
    (next_window), and both stop before producing anything under late_records: fail."""
    from datetime import UTC, datetime, timedelta

    from test_time_windows import manifest_text as window_manifest

    from dpone_dagster.engine.run import RunRequest
    from dpone_dagster.kafka.windows import Window

    bs = broker.bootstrap_servers
    src = unique_topic("dwsrc")
    create_topic(bs, src, 2)
    start = datetime(2024, 3, 1, tzinfo=UTC)
    # Minutes after 00:00 in write order: 00:55 and 00:10 are written among hour-1 records.
    minutes = {0: [5, 20, 50, 70, 55, 80, 100, 125, 130], 1: [1, 61, 90, 10, 110, 150]}
    for p, stamps in minutes.items():
        produce_json(bs, src, [{"order_id": p * 100 + i, "m": m} for i, m in enumerate(stamps)], partition=p,
                     timestamps=[int((start + timedelta(minutes=m)).timestamp() * 1000) for m in stamps])
    windows = [Window(start + timedelta(hours=h), start + timedelta(hours=h + 1), f"2024-03-01-{h:02d}:00") for h in (0, 1)]


    def one(path: str, dst: str, failing: str, held: str, dlq: str) -> tuple:
        create_topic(bs, dst, 2)
        result = run_pipeline(parse_manifest(window_manifest(src, dst, tmp_path / path)), spark, RunRequest(windows=windows))
        assert result.execution_path == path
        late = {w["start"]: w["late_records"] for w in result.boundary["windows"]}
        delivered = (result.boundary["late_records"], late, messages(consume_raw(bs, dst)))

        create_topic(bs, failing, 2)
        with pytest.raises(DataRefused, match="2 late record"):
            run_pipeline(parse_manifest(window_manifest(src, failing, tmp_path / f"{path}_fail", ", late_records: fail")), spark, RunRequest(windows=windows))
        assert consume_raw(bs, failing) == []
        assert LocalStateStore(str(tmp_path / f"{path}_fail")).load_windows(src, f"dpone.windows_{src}") == {}

        # dead_letter: the late records leave the batch and reach the dead-letter topic.
        create_topic(bs, held, 2)
        create_topic(bs, dlq, 1)
        text = window_manifest(src, held, tmp_path / f"{path}_held", ", late_records: dead_letter", f"    dead_letter: {{topic: {dlq}}}")
        result = run_pipeline(parse_manifest(text), spark, RunRequest(windows=windows))
        assert result.execution_path == path
        letters = sorted((r["key"], r["value"], tuple((k, v) for k, v in r["headers"] if k != "dpone.error.run_id")) for r in consume_raw(bs, dlq))
        windows_stored = LocalStateStore(str(tmp_path / f"{path}_held")).load_windows(src, f"dpone.windows_{src}")
        stored = {start: {k: v for k, v in w.items() if k != "run_id"} for start, w in windows_stored.items()}
        return delivered, (result.rows_extracted, result.messages_produced, messages(consume_raw(bs, held)), letters, stored)

    both = on_both_paths(monkeypatch, tmp_path, one, {"dst": "dw", "failing": "dwf", "held": "dwh", "dlq": "dwl"}, src=src)
    outcomes = {path: both[path][0] for path in both} | {f"{path}_held": both[path][1] for path in both}
    assert outcomes["direct"] == outcomes["spark_sql"]
    total, late, delivered = outcomes["direct"]
    assert total == 2 and late == {"2024-03-01T00:00:00+00:00": 0, "2024-03-01T01:00:00+00:00": 2}
    assert sum(delivered.values()) == 12  # hour 2's records (02:05, 02:10, 02:30) wait for their window
    assert outcomes["direct_held"] == outcomes["spark_sql_held"]
    rows, produced, kept, letters, stored = outcomes["direct_held"]
    assert rows == produced == sum(kept.values()) == 10 and len(letters) == 2 and stored
    assert sorted(json.loads(value)["m"] for _, value, _ in letters) == [10, 55]


@pytest.mark.parametrize("late", ["next_window", "fail", "dead_letter"])
def test_deletes_left_out_of_a_time_window_as_the_spark_sql_path_leaves_them(broker, spark, kafka_env, tmp_path, monkeypatch, late):
    """deletes.when_disabled: skip in a time window whose late records include a delete: both
    paths count the same late records (the late delete among them), leave out the same deletes,
    produce and dead-letter the same messages and store the same windows."""
    from datetime import UTC, datetime, timedelta

    from test_time_windows import manifest_text as window_manifest

    from dpone_dagster.kafka.windows import Window

    bs = broker.bootstrap_servers
    src = unique_topic("dwdsrc")
    create_topic(bs, src, 2)
    start = datetime(2024, 3, 1, tzinfo=UTC)
    producer = Producer({"bootstrap.servers": bs})
    # (partition, minute, tombstone): hour-1 offsets hold records stamped in hour 0 (late), one a tombstone.
    events = [(0, 5, False), (0, 20, True), (0, 70, False), (0, 55, True), (0, 80, False), (0, 30, False),
              (1, 1, False), (1, 61, True), (1, 90, False), (1, 10, False), (1, 110, True), (1, 150, False)]
    for i, (p, minute, tombstone) in enumerate(events):
        value = None if tombstone else json.dumps({"order_id": i, "m": minute}).encode()
        producer.produce(src, value, str(i).encode(), partition=p, timestamp=int((start + timedelta(minutes=minute)).timestamp() * 1000))
    assert producer.flush(30) == 0
    windows = [Window(start + timedelta(hours=h), start + timedelta(hours=h + 1), f"2024-03-01-{h:02d}:00") for h in (0, 1)]


    def one(path: str, dst: str, dlq: str) -> tuple:
        create_topic(bs, dst, 2)
        create_topic(bs, dlq, 1)
        state = tmp_path / path
        text = window_manifest(src, dst, state, f", late_records: {late}", f"    dead_letter: {{topic: {dlq}}}")
        text = text.replace(f"  topic: {dst}\n", f"  topic: {dst}\n  options: {{deletes: {{enabled: false, when_disabled: skip}}}}\n")
        try:
            result = run_pipeline(parse_manifest(text), spark, RunRequest(windows=windows))
        except DataRefused as exc:
            outcome: Any = ("refused", str(exc))
        else:
            assert result.execution_path == path
            late_by_window = {w["start"]: w["late_records"] for w in result.boundary["windows"]}
            outcome = (result.rows_extracted, result.deletes_skipped, result.messages_produced, result.boundary["late_records"], late_by_window)
        letters = sorted((r["key"], r["value"]) for r in consume_raw(bs, dlq))
        stored = {w: {k: v for k, v in fields.items() if k != "run_id"} for w, fields in LocalStateStore(str(state)).load_windows(src, f"dpone.windows_{src}").items()}
        return (outcome, messages(consume_raw(bs, dst)), letters, stored)

    outcomes = on_both_paths(monkeypatch, tmp_path, one, {"dst": "dwd", "dlq": "dwdl"}, src=src)
    assert outcomes["direct"] == outcomes["spark_sql"]
    outcome, delivered, letters, stored = outcomes["direct"]
    if late == "fail":
        assert outcome[0] == "refused" and not delivered and not stored
    else:
        assert outcome[3] == 3  # minutes 55 (a tombstone) and 30 in partition 0, 10 in 1, among hour 1's offsets
        assert outcome[1] == (3 if late == "dead_letter" else 4)  # the late tombstone is a dead letter, not skipped
        assert sum(delivered.values()) == outcome[2] and stored
        assert len(letters) == (3 if late == "dead_letter" else 0)


def test_a_producing_task_stops_at_its_bound_whatever_the_broker_does(monkeypatch):
    """No Spark: the task function itself, against a broker of its own frozen with SIGSTOP. Under
    a bound of 3 s the task ends by then, counting every message as not delivered, and purges its
    queue: once the broker resumes, nothing more arrives. Past its bound, a task sends nothing."""
    import signal

    from conftest import consume_raw

    from dpone_dagster.embedded_broker import EmbeddedBroker
    from dpone_dagster.sinks.kafka import ProducerSettings, produce_batches

    broker = EmbeddedBroker().start()
    try:
        bs = broker.bootstrap_servers
        create_topic(bs, "bounded", 1)
        batch = pa.RecordBatch.from_pydict({"key": [b"k%d" % i for i in range(1000)], "value": [b"v"] * 1000})
        settings = ProducerSettings("bounded", (("bootstrap.servers", bs),), flush_timeout_s=120, headers_or_partitions=False)
        os.kill(broker._process.pid, signal.SIGSTOP)
        started = time.monotonic()
        [report] = list(produce_batches(settings.bounded(3), iter([batch])))
        assert time.monotonic() - started < 6
        rows = report.to_pylist()
        assert sum(r["failed"] for r in rows) == 1000 and sum(r["delivered"] for r in rows) == 0
        os.kill(broker._process.pid, signal.SIGCONT)
        time.sleep(2)
        assert consume_raw(bs, "bounded") == []
        with pytest.raises(RuntimeError, match="passed its bound"):
            list(produce_batches(settings.bounded(0), iter([batch])))
        assert consume_raw(bs, "bounded") == []
    finally:
        os.kill(broker._process.pid, signal.SIGCONT)
        broker.stop()


BAD_RECORDS = {  # kind: (the bad records at (partition, index), strategy, sink options)
    "undecodable": ({(0, 3): b"{not json", (0, 1_100): b"{not json", (1, 700): b'{"order_id": 5'}, "{mode: incremental_append, unique_key: order_id}", ""),
    "keyless": ({(0, 3): {"order_id": None, "amount": 1.5}, (0, 1_100): {"amount": 2.5}, (1, 700): {"order_id": None}},
                "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", ""),
    "oversized": ({(0, 3): {"order_id": 3, "blob": "x" * 3_000}, (0, 1_100): {"order_id": 4, "blob": "y" * 5_000}, (1, 700): {"order_id": 5, "blob": "z" * 2_100}},
                  "{mode: incremental_append}", "delivery: {producer_config: {message.max.bytes: 2000}}"),
    # Keys that repeat, every record published in order per key: 5 in both partitions, 4 twice.
    "oversized among keys that repeat": (
        {(0, 3): {"order_id": 5, "blob": "x" * 3_000}, (0, 1_100): {"order_id": 4, "blob": "y" * 5_000}, (1, 700): {"order_id": 5, "blob": "z" * 2_100}},
        "{mode: incremental_append, unique_key: order_id}", "delivery: {producer_config: {message.max.bytes: 2000}}"),
    # Number tokens past Jackson's 1,000 characters: Arrow's reader reads them, Spark's decoder does not.
    "numbers too long for spark": ({(0, 3): b'{"order_id": 3, "amount": 1' + b"0" * 1_200 + b"}", (0, 1_100): b'{"order_id": 4, "amount": 0.' + b"0" * 1_200 + b"1}",
                                    (1, 700): b'{"order_id": 1' + b"0" * 1_100 + b', "amount": 1.5}'}, "{mode: incremental_append, unique_key: order_id}", ""),
    # dpone envelopes: not JSON, without an op, an upsert without its data.
    "undecodable envelopes": ({(0, 3): b"{not json", (0, 1_100): {"data": {"order_id": 7}}, (1, 700): {"op": "upsert"}}, "{mode: incremental_append, unique_key: order_id}", ""),
}


@pytest.mark.parametrize("kind", sorted(BAD_RECORDS))
@pytest.mark.parametrize("on_error", ["skip", "dead_letter"])
def test_bad_records_follow_on_error_as_on_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch, on_error, kind):
    """Bad records in two partitions, one of them past the schema sample: the direct path sets
    them aside, judges them by the Spark SQL path's rules (undecodable ones by Spark's own
    decoder), and both paths deliver, skip or dead-letter alike."""
    bad, strategy, sink_options = BAD_RECORDS[kind]
    bs = broker.bootstrap_servers
    src = unique_topic("dbsrc")
    create_topic(bs, src, 2)
    for p in range(2):
        rows: list[Any] = [{"order_id": p * 10_000 + i, "amount": 1.5, "blob": ""} for i in range(1_200)]
        if "envelope" in kind:
            rows = [{"op": "upsert", "data": row} for row in rows]
        for (partition, i), record in bad.items():
            if partition == p:
                rows[i] = record
        produce_json(bs, src, rows, partition=p)
    envelope = "envelope: dpone, " if "envelope" in kind else ""
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, strategy, sink_options, f"{envelope}on_error: {on_error}")
    assert outcomes["direct"] == outcomes["spark_sql"]
    extracted, lettered, skipped, _, produced, offsets, _, letters = outcomes["direct"]
    assert extracted == 2_400 and produced == 2_397 and offsets == {0: 1_200, 1: 1_200}
    assert (lettered, skipped, len(letters)) == ((3, 0, 3) if on_error == "dead_letter" else (0, 3, 0))


def poisoned(i: int, kind: str) -> Any:
    """Record `i` of a poisoned partition: one in six good, the rest cut short ("cut") or whole
    objects of the wrong types ("mistyped", where one good record in two also holds a field the
    declared schema lacks: Spark's decoder reads it, the task decoder does not)."""
    if i % 6 == 0:
        return {"order_id": i % 700, "amount": 2.5, **({"note": "x"} if kind == "mistyped" and i % 12 == 0 else {})}
    return b'{"order_id": %d, "amount": 1' % i if kind == "cut" else {"order_id": i, "amount": "one"}


@pytest.mark.parametrize("kind", ["cut", "mistyped"])
@pytest.mark.parametrize("on_error", ["skip", "dead_letter"])
def test_more_bad_records_than_the_tasks_once_reported_stay_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch, on_error, kind):
    """A poisoned topic: 12,500 corrupt records (more than the 10,000 a task once handed to the
    driver whole) among 2,500 good ones, over keys that repeat. The tasks report where the bad
    records are (the mistyped ones found by formats/json_suspects.py, not by halving), the driver
    reads them again in Spark: the direct path skips or dead-letters them all, with the Spark SQL
    path's outcome, letters and offsets."""
    bs = broker.bootstrap_servers
    src = unique_topic("dpoison")
    create_topic(bs, src, 2)
    for p in range(2):
        produce_json(bs, src, [poisoned(i, kind) for i in range(7_500)], partition=p)
    no_handover(monkeypatch)
    strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    declared = "schema: [{name: order_id, type: long}, {name: amount, type: double}]"
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, strategy, "", f"{declared}, on_error: {on_error}")
    assert outcomes["direct"] == outcomes["spark_sql"]
    extracted, lettered, skipped, removed, produced, offsets, _, letters = outcomes["direct"]
    assert extracted == 15_000 and produced == 350 and removed == 2_150 and offsets == {0: 7_500, 1: 7_500}
    assert (lettered, skipped, len(letters)) == ((12_500, 0, 12_500) if on_error == "dead_letter" else (0, 12_500, 0))


def test_a_record_only_spark_reads_beside_garbage_is_read_once_by_spark(broker, spark, kafka_env, tmp_path, monkeypatch):
    """A value Spark reads that is no object on its own line (a trailing line break) in the same
    Arrow batch as garbage: both are set aside, Spark decodes the first for the tasks, and the
    scan again reads it from there instead of setting it aside again (which would scan until
    the batch went to the Spark SQL path)."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dwsp"), unique_topic("dwspd")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [b'{"order_id": 3}\n' if i == 3 else b"{not json" if i == 5 else {"order_id": i} for i in range(10)], partition=0)
    no_handover(monkeypatch)
    text = manifest_text(src, dst, tmp_path, "{mode: incremental_append}")
    result = run_pipeline(parse_manifest(text.replace("options: {group_id:", "options: {on_error: skip, group_id:")), spark)
    assert result.execution_path == "direct" and result.rows_skipped == 1, result.notes
    values = sorted(r["value"] for r in consume_raw(bs, dst, expected=9))
    assert values == sorted(b'{"order_id":%d}' % i for i in range(10) if i != 5)


def test_more_bad_records_than_a_spark_connect_plan_carries_take_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Over Spark Connect the bad records' offsets travel in the produce jobs' plans: past
    CONNECT_CANDIDATES the batch goes to the Spark SQL path, which skips them alike. (The session
    is made to look like Connect and the bound lowered to 2: 4,000,000 records and a Connect server
    are more than a test of this rule needs; the Connect path itself is tests/test_spark_connect.py's.)"""
    from dpone_dagster.engine import direct_bad_records

    monkeypatch.setattr(direct_bad_records, "CONNECT_CANDIDATES", 2)
    monkeypatch.setattr(direct_bad_records, "is_connect", lambda session: True)
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dcbad"), unique_topic("dcbadd")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [b"{not json" if i in (1, 4, 6) else {"order_id": i} for i in range(10)], partition=0)
    text = manifest_text(src, dst, tmp_path, "{mode: incremental_append}")
    result = run_pipeline(parse_manifest(text.replace("options: {group_id:", "options: {on_error: skip, group_id:")), spark)
    assert result.execution_path == "spark_sql" and result.rows_skipped == 3, result.notes
    assert sorted(r["value"] for r in consume_raw(bs, dst, expected=7)) == sorted(b'{"order_id":%d}' % i for i in range(10) if i not in (1, 4, 6))


@pytest.mark.parametrize("gone", ["deleted", "compacted"])
def test_bad_records_gone_from_the_topic_before_they_are_read_again_fail_the_run(broker, spark, kafka_env, tmp_path, monkeypatch, gone):
    """The driver reads the records the scan set aside again: records deleted from the topic in
    between (a real DeleteRecords on the embedded broker) fail that read; a record missing from
    the read (compaction, which the embedded broker cannot be made to run on demand: the read is
    made to lose one record) fails the count. Either way nothing is produced or dead-lettered and
    no offset is stored."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from dpone_dagster.engine import direct_bad_records

    bs = broker.bootstrap_servers
    src, dst, dlq = unique_topic("dgone"), unique_topic("dgoned"), unique_topic("dgonel")
    for topic in (src, dst, dlq):
        create_topic(bs, topic, 1)
    produce_json(bs, src, [b"{not json" if i in (2, 7) else {"order_id": i} for i in range(20)], partition=0)
    read_again = direct_bad_records._read_again

    def vanished(spark: Any, planned: Any, aside: pa.Table) -> Any:
        if gone == "compacted":
            return read_again(spark, planned, aside).where("offset <> 7")
        done = AdminClient({"bootstrap.servers": bs}).delete_records([TopicPartition(src, 0, 5)])
        for future in done.values():
            future.result(timeout=30)
        return read_again(spark, planned, aside)

    monkeypatch.setattr(direct_bad_records, "_read_again", vanished)
    text = manifest_text(src, dst, tmp_path, "{mode: incremental_append}")
    on_error = "skip" if gone == "compacted" else "dead_letter"  # skipped, a lost record would pass unseen
    manifest = parse_manifest(text.replace("options: {group_id:", f"options: {{on_error: {on_error}, dead_letter: {{topic: {dlq}}}, group_id:"))
    with pytest.raises((RunFailed, ConfigError, DataRefused)) as caught:
        run_pipeline(manifest, spark)
    assert gone == "deleted" or "no longer in" in str(caught.value)
    assert consume_raw(bs, dst, expected=0) == [] and consume_raw(bs, dlq, expected=0) == []
    assert open_manifest_state_store(manifest).load_offsets(src, f"g_{dst}") == {}


# Messages over message.max.bytes among keys keep_last / keep_first settle (partition, index):
# keys 5 oversized before its small record, 4 and 10_005 (the other partition) after it, 99_999
# once.
OVERSIZED_KEYED = {
    (0, 3): {"order_id": 5, "blob": "x" * 3_000},
    (0, 5): {"order_id": 5, "amount": 5.5},
    (0, 4): {"order_id": 4, "amount": 4.5},
    (0, 1_100): {"order_id": 4, "blob": "y" * 5_000},
    (1, 5): {"order_id": 10_005, "amount": 1.5},
    (1, 700): {"order_id": 10_005, "blob": "z" * 2_100},
    (1, 900): {"order_id": 99_999, "blob": "w" * 2_500},
}


def produce_oversized_keyed(bs: str, src: str) -> None:
    create_topic(bs, src, 2)
    for p in range(2):
        rows: list[Any] = [{"order_id": p * 10_000 + i, "amount": 1.5, "blob": ""} for i in range(1_200)]
        for (partition, i), record in OVERSIZED_KEYED.items():
            if partition == p:
                rows[i] = record
        produce_json(bs, src, rows, partition=p)


@pytest.mark.parametrize(
    ("policy", "on_error", "ranked_by"),
    [("keep_last", "skip", "driver"), ("keep_first", "skip", "driver"), ("keep_last", "dead_letter", "driver"),
     ("keep_first", "dead_letter", "driver"), ("keep_last", "dead_letter", "spark")],
)
def test_oversized_messages_keep_last_leaves_out_are_no_bad_records(broker, spark, kafka_env, tmp_path, monkeypatch, policy, on_error, ranked_by):
    """A message over message.max.bytes is a bad record only where de-duplication keeps it, as
    the Spark SQL path measures the kept messages: both paths deliver, skip or dead-letter alike,
    on the direct path without handing the batch over (repeated keys ranked on the driver, or by
    Spark past its limit)."""
    from dpone_dagster.engine import direct_keys

    if ranked_by == "spark":
        monkeypatch.setattr(direct_keys, "DRIVER_CANDIDATES", 0)
    bs = broker.bootstrap_servers
    src = unique_topic("dosrc")
    produce_oversized_keyed(bs, src)
    strategy = f"{{mode: incremental_merge, unique_key: order_id, duplicate_policy: {policy}}}"
    sink = "delivery: {producer_config: {message.max.bytes: 2000}}"
    outcomes = on_error_outcomes(bs, spark, src, tmp_path, monkeypatch, strategy, sink, f"on_error: {on_error}")
    assert outcomes["direct"] == outcomes["spark_sql"]
    extracted, lettered, skipped, removed, produced, offsets, (written, _), letters = outcomes["direct"]
    # keep_last keeps keys 4, 10_005 and 99_999 oversized, keep_first keys 5 and 99_999.
    bad = 3 if policy == "keep_last" else 2
    assert (extracted, removed, lettered + skipped, produced) == (2_400, 3, bad, 2_400 - 3 - bad)
    assert len(letters) == (bad if on_error == "dead_letter" else 0) and offsets == {0: 1_200, 1: 1_200}
    assert sum(written.values()) == produced


def test_oversized_messages_of_keys_across_partitions_and_slices(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Keys whose records are in both partitions and several slices: one whose only repeats are
    oversized, two oversized messages of one key with the same timestamp (the partition decides),
    one with an earlier timestamp at a later offset; both paths alike under either policy."""
    bs = broker.bootstrap_servers
    src = unique_topic("dosrc")
    create_topic(bs, src, 2)
    big = "x" * 3_000
    odd = {  # (partition, index): (record, timestamp)
        (0, 10): ({"order_id": 7, "blob": big}, 1_000),
        (1, 20): ({"order_id": 7, "amount": 2.5}, 2_000),
        (0, 900): ({"order_id": 7, "blob": big + "b"}, 3_000),
        (1, 30): ({"order_id": 8, "blob": big + "c"}, 5_000),
        (0, 40): ({"order_id": 8, "blob": big + "d"}, 5_000),
        (0, 500): ({"order_id": 9, "amount": 9.5}, 100),
        (1, 600): ({"order_id": 9, "blob": big + "e"}, 50),
    }
    for p in range(2):
        rows: list[Any] = [{"order_id": p * 10_000 + i + 100, "amount": 1.5, "blob": ""} for i in range(1_000)]
        stamps = [10_000 + i for i in range(1_000)]
        for (partition, i), (record, stamp) in odd.items():
            if partition == p:
                rows[i], stamps[i] = record, stamp
        produce_json(bs, src, rows, partition=p, timestamps=stamps)
    for policy, counts in (("keep_last", (2_000, 2, 0, 4, 1_994)), ("keep_first", (2_000, 3, 0, 4, 1_993))):
        strategy = f"{{mode: incremental_merge, unique_key: order_id, duplicate_policy: {policy}}}"
        sink = "delivery: {producer_config: {message.max.bytes: 2000}}"
        outcomes = on_error_outcomes(bs, spark, src, tmp_path / policy, monkeypatch, strategy, sink, "records_per_task: 300, on_error: dead_letter")
        assert outcomes["direct"] == outcomes["spark_sql"], policy
        assert outcomes["direct"][:5] == counts, policy


def test_keys_that_repeat_with_an_oversized_message_are_refused_under_fail(broker, spark, kafka_env, tmp_path, monkeypatch):
    """duplicate_policy: fail counts an oversized message among the keys that repeat, on both paths."""
    bs = broker.bootstrap_servers
    src = unique_topic("dosrc")
    produce_oversized_keyed(bs, src)

    def fails(path: str, dst: str) -> None:
        if path == "direct":
            no_handover(monkeypatch)
        create_topic(bs, dst, 2)
        strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: fail}"
        text = manifest_text(src, dst, tmp_path / path, strategy, "delivery: {producer_config: {message.max.bytes: 2000}}")
        with pytest.raises(RunFailed, match=r"duplicate_policy: fail — 3 key\(s\) occur more than once"):
            run_pipeline(parse_manifest(text.replace("options: {group_id:", "options: {on_error: skip, group_id:")), spark)
        assert consume_raw(bs, dst) == []

    on_both_paths(monkeypatch, tmp_path, fails, {"dst": "dodst"}, src=src)


def test_undecodable_records_fail_the_run_before_anything_is_produced(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("dbsrc"), unique_topic("dbdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": i} if i != 40 else b"{not json" for i in range(100)], partition=0)
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, "{mode: incremental_append, unique_key: order_id}"))
    with pytest.raises(DataRefused, match=r"1 record\(s\) of .* could not be decoded \(partition@offset: 0@40"):
        run_pipeline(manifest, spark)
    assert consume_raw(bs, dst) == []
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{dst}") == {}


def test_failing_records_are_found_by_halves():
    bad = {3, 4, 97}
    calls = []

    def fails(low: int, n: int) -> bool:
        calls.append(n)
        return any(low <= b < low + n for b in bad)

    assert np.flatnonzero(task.failing(100, fails, 10)).tolist() == [3, 4, 97]
    assert len(calls) < 40  # not one decode per record
    with pytest.raises(task.Refused, match="more than 2"):
        task.failing(100, fails, 2)


def test_a_slice_that_delivers_other_than_judged_is_not_stored(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Slice by slice, a slice's offsets are stored only when it delivered the messages the batch
    was judged with. The expectation of the third slice is set one too high here (the driver's
    count of what it left out is patched; the tasks run untouched): the run fails, nothing from
    that slice on is stored, and the rerun delivers every record."""
    import dpone_dagster.engine.direct as direct_module

    bs = broker.bootstrap_servers
    src, dst = unique_topic("dcsrc"), unique_topic("dcdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": i} for i in range(1_000)], partition=0)
    text = manifest_text(src, dst, tmp_path, "{mode: incremental_append}").replace("options: {group_id:", "options: {records_per_task: 100, group_id:")
    within = direct_module._within
    monkeypatch.setattr(direct_module, "_within", lambda offsets, piece: within(offsets, piece) - (piece[2] == 200))
    with pytest.raises(RunFailed, match=r"offsets 200-300: 100 message\(s\) acknowledged where the batch was judged with 101"):
        run_pipeline(parse_manifest(text), spark)
    stored = LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{dst}")
    assert stored.get(0, 0) <= 200
    monkeypatch.setattr(direct_module, "_within", within)
    rerun = run_pipeline(parse_manifest(text), spark)
    assert rerun.committed_offsets == {0: 1_000}
    assert {json.loads(r["value"])["order_id"] for r in consume_raw(bs, dst)} == set(range(1_000))


def test_both_direct_paths_key_and_delete_by_one_rule():
    """The unique key's positions in the batch (none without unique_key columns or under another
    key.mode; a missing column is named), and what a delete becomes: pure, shared by the Kafka and
    SQL direct paths."""
    from dpone_dagster.engine import direct_shape
    from dpone_dagster.manifest.models import KafkaSink
    from dpone_dagster.shape.keys import unique_key_positions

    def sink(strategy: dict, options: dict | None = None) -> KafkaSink:
        return KafkaSink.model_validate({"type": "kafka", "connection_id": "k", "topic": "t", "strategy": strategy, "options": options or {}})

    names = ["a", "b", "c"]
    assert unique_key_positions(sink({"unique_key": ["c", "a"]}), names) == (2, 0)
    assert unique_key_positions(sink({"unique_key": "b"}, {"key": {"mode": "hash_row"}}), names) is None
    assert unique_key_positions(sink({}), names) is None
    with pytest.raises(ConfigError, match=r"sink.strategy.unique_key: column\(s\) \['z'\] are not in the batch \(columns: \['a', 'b', 'c'\]\)"):
        unique_key_positions(sink({"unique_key": ["a", "z"]}), names)
    assert direct_shape.delete_mode(sink({"unique_key": "a"}, {"deletes": {"enabled": True, "tombstone": True}})) == "tombstone"
    assert direct_shape.delete_mode(sink({}, {"envelope": "dpone", "deletes": {"enabled": True}})) == "event"
    assert direct_shape.delete_mode(sink({}, {"deletes": {"when_disabled": "skip"}})) == "skip"
    assert direct_shape.delete_mode(sink({})) == "fail"


def test_a_late_record_of_another_subjects_id_is_fetched_by_id_as_the_spark_sql_path_fetches_it(broker, spark, kafka_env, tmp_path, monkeypatch):
    import io

    import fastavro
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from dpone_dagster.schema.registry import registry_client
    from dpone_dagster.schema.wire_format import frame

    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    client = registry_client({"url": url})
    context = SerializationContext(src, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(SHOP_V1))
    other_id = client.register_schema("shop.Order-other", Schema(json.dumps(SHOP_V2), "AVRO"))
    parsed = fastavro.parse_schema(SHOP_V2)

    def other(row):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, {**row, "channel": "web"})
        return frame(other_id, buffer.getvalue())

    values = [other(r) if m == 55 else v1(r, context) for r, m in zip(shop_rows(6), LATE_MINUTES, strict=True)]
    out = late_window_runs(bs, spark, tmp_path, monkeypatch, src, values)
    registered = [[f["name"] for f in r.schema_evolution["evolution"]["result_schema"]] for r, _, _ in out.values()]
    assert registered[0] == registered[1], registered
    assert out["direct"][0].execution_path == "direct", out["direct"][0].notes
    keyless = {path: Counter({m[1:]: n for m, n in normalized(r, recs, True).items()}) for path, (r, recs, _) in out.items()}  # no key: any partition
    assert keyless["direct"] == keyless["spark_sql"]
    assert out["direct"][2] == out["spark_sql"][2] == 1


def test_a_checks_only_run_judges_the_batch_as_the_spark_sql_path_and_registers_nothing(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Asset checks selected without their asset (publish=False) into an Avro sink: the batch is
    judged on the direct path with the gates the Spark SQL path gives; nothing is produced, no
    offset moves and the sink's subject stays empty (the schema is planned, not registered)."""
    from dpone_dagster.schema.registry import registry_client

    bs = broker.bootstrap_servers
    strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    url, src = orders_for_a_registry_sink(bs, monkeypatch, strategy)
    checks = "[{type: min_rows, threshold: 600}, {type: not_null, columns: [order_id]}, {type: unique, columns: [order_id]}, {type: unique, columns: [order_id], stage: extracted}]"
    quality = f"quality:\n  mode: fail\n  checks: {checks}"
    selected = frozenset({"min_rows", "not_null_order_id", "unique_order_id"})

    def one(path: str, dst: str) -> tuple:
        create_topic(bs, dst, 3)
        manifest = parse_manifest(manifest_text(src, dst, tmp_path / path, strategy, "message_format: avro, schema_registry: {enabled: true}", quality))
        with pytest.raises(DataRefused, match="unique_order_id_extracted"):  # 1,200 records, 700 keys
            run_pipeline(manifest, spark, RunRequest(checks=frozenset({"unique_order_id_extracted"}), publish=False))
        judged = run_pipeline(manifest, spark, RunRequest(checks=selected, publish=False))
        assert judged.execution_path == path, judged.notes
        # Without auto-registration the schema is looked up, as a publishing run looks it up.
        looked_up = manifest_text(src, dst, tmp_path / path, strategy, "message_format: avro, schema_registry: {enabled: true, auto_register_schemas: false}", quality)
        with pytest.raises(ConfigError, match="does not exist and auto_register_schemas is false"):
            run_pipeline(parse_manifest(looked_up), spark, RunRequest(checks=selected, publish=False))
        assert consume_raw(bs, dst) == []
        assert LocalStateStore(str(tmp_path / path)).load_offsets(src, f"g_{dst}") == {}
        assert not [s for s in registry_client({"url": url}).get_subjects() if s.startswith(dst)]
        assert judged.schema_evolution["subject"] == f"{dst}-value" and judged.schema_evolution["registered"] is False
        return (
            [(g["name"], g["passed"], g.get("observed")) for g in judged.gates],
            judged.rows_extracted, judged.duplicates_removed, judged.messages_produced, judged.committed_offsets,
        )

    outcomes = on_both_paths(monkeypatch, tmp_path, one, {"dst": "dc"}, src=src)
    assert outcomes["direct"] == outcomes["spark_sql"]
    assert outcomes["direct"][0] == [("min_rows", True, 1200), ("not_null_order_id", True, 0), ("unique_order_id", True, 0)]
    assert outcomes["direct"][1:3] == (1200, 500)


def outcome_of(result: Any) -> dict[str, Any]:
    """What a run reports, but for what differs between any two runs (ids, times, the manifest's
    name) and the path it took; the stages it timed are kept by name."""
    data = result.as_dict()
    for field_name in ("run_id", "pipeline", "execution_path", "started_at", "finished_at", "executors", "lag_before", "lag_after"):
        data.pop(field_name)
    data["timings"] = sorted(data["timings"])
    return data


@pytest.mark.parametrize("fmt", ["json", "avro"])
@pytest.mark.parametrize("case", ["incremental rerun", "full_refresh of an empty topic"])
def test_a_batch_with_nothing_to_read_is_judged_on_the_direct_path_as_on_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch, fmt, case):
    """A batch without offsets to read (a second incremental run, or a full refresh of a topic
    without records): the direct path judges it itself (min_rows by its rule: skipped for an
    incremental read, failing a full refresh; not_null skipped), reports what the Spark SQL path
    reports, produces nothing and stores the same offsets."""
    bs = broker.bootstrap_servers
    rerun = case == "incremental rerun"
    if fmt == "avro":
        url, src = registry_topic(bs, monkeypatch)
        if rerun:
            produce_registry(bs, url, src, "avro", shop_rows(30))
        source_options = "message_format: avro, schema_registry: {enabled: true}, "
    else:
        src = unique_topic("dempty")
        create_topic(bs, src, 2)
        if rerun:
            produce_json(bs, src, orders(30), partition=1)
        source_options = ""
    strategy = "{mode: incremental_append, unique_key: order_id}" if rerun else "{mode: full_refresh}"
    quality = "quality:\n  checks:\n    - {type: min_rows, threshold: 1}\n    - {type: not_null, columns: [order_id]}\n"

    def one(path: str, dst: str) -> tuple[dict[str, Any], dict[int, int]]:
        create_topic(bs, dst, 2)
        text = manifest_text(src, dst, tmp_path / path, strategy, quality=quality).replace("options: {group_id:", f"options: {{{source_options}group_id:")
        manifest = parse_manifest(text)
        if rerun:
            first = run_pipeline(manifest, spark)
            assert first.rows_extracted == 30 and first.committed_offsets, first.notes
        try:
            second = run_pipeline(manifest, spark)
        except DataRefused as exc:
            second = exc.result
        assert second.execution_path == path, second.notes
        assert second.messages_produced == 0 and len(consume_raw(bs, dst, expected=30 if rerun else 0)) == (30 if rerun else 0)
        return outcome_of(second), open_manifest_state_store(manifest).load_offsets(src, f"g_{dst}")

    both = on_both_paths(monkeypatch, tmp_path, one, {"dst": "dempty"}, src=src)
    outcomes, stored = {path: both[path][0] for path in both}, {path: both[path][1] for path in both}
    assert outcomes["direct"] == outcomes["spark_sql"]
    assert stored["direct"] == stored["spark_sql"]
    if rerun:
        assert stored["direct"] and sum(stored["direct"].values()) == 30
    assert outcomes["direct"]["status"] == ("success" if rerun else "failed"), outcomes["direct"]
    judged = ["min_rows", "not_null_order_id"] if rerun else ["min_rows"]  # a failed gate stops the run there
    assert [g["name"] for g in outcomes["direct"]["gates"]] == judged, outcomes["direct"]["gates"]


def test_a_time_window_without_records_is_judged_on_the_direct_path_as_on_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """The first hour holds no record (they all fall in the second): its run records the window
    with no offsets and no late record on either path, and produces nothing."""
    from datetime import UTC, datetime, timedelta

    from test_time_windows import manifest_text as window_manifest

    from dpone_dagster.kafka.windows import Window

    bs = broker.bootstrap_servers
    src = unique_topic("dempty_window")
    create_topic(bs, src, 2)
    start = datetime(2024, 3, 1, tzinfo=UTC)
    produce_json(bs, src, orders(10), partition=0, timestamps=[int((start + timedelta(minutes=70 + m)).timestamp() * 1000) for m in range(10)])
    window = Window(start, start + timedelta(hours=1), "2024-03-01-00:00")

    def one(path: str, dst: str) -> dict[str, Any]:
        create_topic(bs, dst, 2)
        result = run_pipeline(parse_manifest(window_manifest(src, dst, tmp_path / path, ", late_records: fail")), spark, RunRequest(windows=[window]))
        assert result.execution_path == path, result.notes
        assert result.messages_produced == 0 == len(consume_raw(bs, dst, expected=0))
        return outcome_of(result)

    outcomes = on_both_paths(monkeypatch, tmp_path, one, {"dst": "dempty_window"}, src=src)
    assert outcomes["direct"] == outcomes["spark_sql"]
    assert outcomes["direct"]["boundary"]["late_records"] == 0 and outcomes["direct"]["rows_extracted"] == 0, outcomes["direct"]["boundary"]


@pytest.mark.parametrize("schema", ["registered", "inferred from the sample"])
def test_a_unique_key_column_not_in_the_batch_fails_as_on_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch, schema):
    """unique_key names a column the payload does not hold: the direct path leaves the batch to the
    Spark SQL path (which widens an inferred schema first, and succeeds on a batch without rows to
    publish), and both fail with the one rule's error (shape/keys.unique_key_positions); nothing
    is produced and no offset is stored."""
    bs = broker.bootstrap_servers
    if schema == "registered":
        url, src = registry_topic(bs, monkeypatch)
        produce_registry(bs, url, src, "avro", shop_rows(20))
        source_options = "message_format: avro, schema_registry: {enabled: true}, "
    else:
        src = unique_topic("dnokey")
        create_topic(bs, src, 2)
        produce_json(bs, src, shop_rows(20), partition=0)
        source_options = ""

    def one(path: str, dst: str) -> str:
        create_topic(bs, dst, 2)
        text = manifest_text(src, dst, tmp_path / path, "{mode: incremental_merge, unique_key: [order_id, region]}")
        manifest = parse_manifest(text.replace("options: {group_id:", f"options: {{{source_options}group_id:"))
        with pytest.raises(ConfigError) as caught:
            run_pipeline(manifest, spark)
        result = caught.value.result
        assert result.execution_path == "spark_sql", result.notes
        assert result.messages_produced == 0 == len(consume_raw(bs, dst, expected=0))
        assert open_manifest_state_store(manifest).load_offsets(src, f"g_{dst}") == {}
        return str(caught.value)

    errors = on_both_paths(monkeypatch, tmp_path, one, {"dst": "dnokey"}, src=src)
    assert errors["direct"] == errors["spark_sql"] and "sink.strategy.unique_key: column(s) ['region'] are not in the batch" in errors["direct"], errors


@pytest.mark.parametrize("publish", [True, False], ids=["run", "checks only"])
def test_a_column_a_schema_without_evolution_lacks_fails_as_on_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch, publish):
    """schema_evolution: false and a target subject registered without `tags`: the batch's `tags`
    would be dropped, so the run fails on the direct path itself, with the Spark SQL path's error,
    once the schema's id is known (registered, or looked up by a checks-only run); nothing is
    produced and no offset is stored."""
    import re

    from confluent_kafka.schema_registry import Schema

    from dpone_dagster.schema.registry import registry_client

    bs = broker.bootstrap_servers
    url, src = registry_topic(bs, monkeypatch)
    produce_registry(bs, url, src, "avro", shop_rows(20))
    narrow = {**SHOP_V1, "fields": [f for f in SHOP_V1["fields"] if f["name"] != "tags"]}

    def one(path: str, dst: str) -> str:
        create_topic(bs, dst, 2)
        registry_client({"url": url}).register_schema(f"{dst}-value", Schema(json.dumps(narrow), "AVRO"))
        sink = "message_format: avro, schema_registry: {enabled: true}, schema_evolution: false"
        text = manifest_text(src, dst, tmp_path / path, "{mode: incremental_append, unique_key: order_id}", sink)
        manifest = parse_manifest(text.replace("options: {group_id:", "options: {message_format: avro, schema_registry: {enabled: true}, group_id:"))
        with pytest.raises(ConfigError) as caught:
            run_pipeline(manifest, spark, RunRequest(publish=publish))
        assert caught.value.result.execution_path == ("spark_sql" if path == "spark_sql" else "direct"), caught.value.result.notes
        assert len(consume_raw(bs, dst, expected=0)) == 0
        assert open_manifest_state_store(manifest).load_offsets(src, f"g_{dst}") == {}
        return re.sub(r"schema id \d+", "schema id N", str(caught.value))

    errors = on_both_paths(monkeypatch, tmp_path, one, {"dst": "dunknown"}, src=src)
    assert errors["direct"] == errors["spark_sql"] and "column(s) ['tags'] are not in the registered schema id N" in errors["direct"], errors


def test_a_batch_of_bad_records_only_is_judged_on_the_direct_path_as_on_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Every record of the batch is corrupt and goes to the dead-letter topic: no row is left to
    publish, so neither path shapes, registers the Avro sink's schema or produces; both report
    the same outcome, send the same letters and store the same offsets."""
    from dpone_dagster.schema.registry import registry_client

    bs = broker.bootstrap_servers
    url = f"mock://{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", url)
    src = unique_topic("dbadonly")
    create_topic(bs, src, 2)
    produce_json(bs, src, [b"{not json", b'{"order_id": 1', b"\xff\xfe"] * 4, partition=0)

    def one(path: str, dst: str, dlq: str) -> tuple:
        create_topic(bs, dst, 2)
        create_topic(bs, dlq, 1)
        text = manifest_text(src, dst, tmp_path / path, "{mode: incremental_append, unique_key: order_id}", "message_format: avro, schema_registry: {enabled: true}")
        declared = "schema: [{name: order_id, type: long}]"  # an inferred schema of no field takes the Spark SQL path
        manifest = parse_manifest(text.replace("options: {group_id:", f"options: {{{declared}, on_error: dead_letter, dead_letter: {{topic: {dlq}}}, group_id:"))
        result = run_pipeline(manifest, spark)
        assert result.execution_path == path, result.notes
        assert result.messages_produced == 0 == len(consume_raw(bs, dst, expected=0))
        own = ("dpone.error.run_id", "dpone.error.pipeline")
        return (
            {**outcome_of(result), "notes": [n.replace(dlq, "<dead-letter topic>") for n in result.notes]},
            sorted((r["value"], tuple((k, v) for k, v in r["headers"] if k not in own)) for r in consume_raw(bs, dlq, expected=12)),
            open_manifest_state_store(manifest).load_offsets(src, f"g_{dst}"),
        )

    both = on_both_paths(monkeypatch, tmp_path, one, {"dst": "dbadonly", "dlq": "dbadonly_l"}, src=src)
    outcomes, letters, stored = ({path: both[path][i] for path in both} for i in range(3))
    assert outcomes["direct"] == outcomes["spark_sql"]
    assert outcomes["direct"]["rows_dead_lettered"] == 12 and outcomes["direct"]["schema_evolution"] is None, outcomes["direct"]
    assert letters["direct"] == letters["spark_sql"] and len(letters["direct"]) == 12
    assert stored["direct"] == stored["spark_sql"] == {0: 12, 1: 0}
    assert registry_client({"url": url}).get_subjects() == []


@pytest.mark.parametrize("fmt", ["avro", "json_schema"])
def test_registry_encoded_keys_without_a_unique_key_are_null_as_on_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch, fmt):
    """key.format avro | json_schema with no unique_key: no column sets a key, so every key is
    null on both paths, and both register the key subject's empty record, as the Spark SQL path
    always has; the values are the same past their frames."""
    from dpone_dagster.schema.registry import registry_client

    bs = broker.bootstrap_servers
    strategy = "{mode: incremental_append}"
    url, src = orders_for_a_registry_sink(bs, monkeypatch, strategy)
    no_handover(monkeypatch)
    (direct, direct_records), (sql, sql_records) = run_both(
        bs, spark, src, tmp_path, monkeypatch, strategy, f"message_format: {fmt}, key: {{format: {fmt}}}, schema_registry: {{enabled: true}}"
    )
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql", direct.notes
    assert len(direct_records) == len(sql_records) == 1200
    assert {r["key"] for r in direct_records} == {r["key"] for r in sql_records} == {None}
    values = [Counter(r["value"][5:] for r in records) for records in (direct_records, sql_records)]
    assert values[0] == values[1]
    client = registry_client({"url": url})

    def key_schema(path: str) -> str:  # the record is named after the topic
        subject = next(s for s in client.get_subjects() if s.startswith(f"d_{path}") and s.endswith("-key"))
        return client.get_latest_version(subject).schema.schema_str.replace(subject.removesuffix("-key"), "<topic>")

    keys = {"direct": key_schema("direct"), "spark_sql": spark_sql_golden.spark_sql_outcome(names(tmp_path, src=src), lambda: key_schema("spark_sql"))}
    assert keys["direct"] == keys["spark_sql"] and "_key" in keys["direct"], keys
    assert direct.schema_evolution["key_subject_schema_id"] is not None and sql.schema_evolution["key_subject_schema_id"] is not None
