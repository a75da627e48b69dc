"""End-to-end Kafka → Kafka runs on the embedded broker, a real Spark session and real state stores.

Every test asserts on what arrived in the sink topic and on the stored offsets.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import psycopg2
import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic

from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.state.local import LocalStateStore


def manifest_text(src: str, dst: str, state_path: Path, sink_extra: str = "", source_extra: str = "", name: str = "k2k") -> str:
    return f"""
name: {name}
source:
  type: kafka
  connection_id: kafka_cluster
  connection_type: env
  topic: {src}
  options:
    group_id: g_{src}
{source_extra}
sink:
  type: kafka
  connection_id: kafka_cluster
  connection_type: env
  topic: {dst}
{sink_extra}
state: {{type: local, path: {state_path}}}
"""


@pytest.fixture
def topics(broker):
    src, dst = unique_topic("src"), unique_topic("dst")
    create_topic(broker.bootstrap_servers, src, 3)
    create_topic(broker.bootstrap_servers, dst, 2)
    return src, dst


def orders(ids, **extra):
    return [{"order_id": i, "status": "new", "amount": float(i) / 2, **extra} for i in ids]


def test_incremental_append_resumes_exactly_where_it_stopped(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    for p in range(3):
        # Several producer batches per partition.
        produce_json(bs, src, orders(range(p * 1000, p * 1000 + 40)), partition=p)
        produce_json(bs, src, orders(range(p * 1000 + 40, p * 1000 + 60)), partition=p)
    text = manifest_text(src, dst, tmp_path, "  strategy: {mode: incremental_append, unique_key: order_id}")
    manifest = parse_manifest(text)

    first = run_pipeline(manifest, spark)
    assert (first.rows_extracted, first.messages_produced) == (180, 180)
    assert first.committed_offsets == {0: 60, 1: 60, 2: 60}
    assert [r["start"] for r in first.offset_ranges] == [0, 0, 0]

    produce_json(bs, src, orders(range(5000, 5007)), partition=1)
    second = run_pipeline(manifest, spark)
    assert (second.rows_extracted, second.messages_produced) == (7, 7)
    assert second.committed_offsets == {0: 60, 1: 67, 2: 60}
    assert [r for r in second.offset_ranges if r["partition"] == 1] == [{"partition": 1, "start": 60, "end": 67}]

    third = run_pipeline(manifest, spark)
    assert (third.rows_extracted, third.messages_produced) == (0, 0)

    out = consume_all(bs, dst)
    assert len(out) == 187
    assert sorted(int(r["key"]) for r in out) == sorted([*range(0, 60), *range(1000, 1060), *range(2000, 2060), *range(5000, 5007)])
    assert all(r["value"]["amount"] == int(r["key"]) / 2 for r in out)
    runs = LocalStateStore(str(tmp_path)).list_runs("k2k")
    assert [r.status for r in runs] == ["success", "success", "success"]


def test_incremental_merge_keep_last_emits_one_upsert_per_key(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    events = [{"order_id": i % 10, "version": i} for i in range(50)]
    produce_json(bs, src, events, partition=0, key=lambda r: r["order_id"])
    sink = "  strategy: {mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink)), spark)
    assert result.rows_extracted == 50 and result.messages_produced == 10 and result.duplicates_removed == 40
    out = consume_all(bs, dst)
    assert {int(r["key"]): r["value"]["version"] for r in out} == {k: 40 + k for k in range(10)}


@pytest.mark.parametrize("broadcast_keys", [1_000_000, 0], ids=["broadcast-winners", "sorted-window"])
def test_keep_last_across_partitions_by_either_plan(broker, spark, kafka_env, tmp_path, monkeypatch, broadcast_keys):
    """Duplicated keys are resolved with a broadcast of the winners, or beyond the limit by a sort
    of the whole batch; both keep the newest record per key, with keys spread over partitions."""
    import dpone_dagster.engine.stages.shape as shape_stage

    monkeypatch.setattr(shape_stage, "BROADCAST_DEDUPE_KEYS", broadcast_keys)
    bs = broker.bootstrap_servers
    src, dst = unique_topic("src"), unique_topic("dst")
    create_topic(bs, src, 3)
    create_topic(bs, dst, 2)
    base = 1_700_000_000_000
    # Key k gets versions 0..2 in different partitions; the newest timestamp wins.
    for version in range(3):
        rows = [{"order_id": k, "version": version} for k in range(20)]
        produce_json(bs, src, rows, partition=version, timestamps=[base + version * 1000 + k for k in range(20)])
    produce_json(bs, src, [{"order_id": 100 + k, "version": 9} for k in range(5)], partition=0)  # unique keys
    sink = "  strategy: {mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink)), spark)
    assert (result.rows_extracted, result.messages_produced, result.duplicates_removed) == (65, 25, 40)
    got = {int(r["key"]): r["value"]["version"] for r in consume_all(bs, dst)}
    assert got == {**{k: 2 for k in range(20)}, **{100 + k: 9 for k in range(5)}}


def test_unique_keys_skip_the_dedupe(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    produce_json(bs, src, [{"order_id": i} for i in range(30)], partition=1)
    sink = "  strategy: {mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink)), spark)
    assert (result.messages_produced, result.duplicates_removed) == (30, 0)
    assert sorted(int(r["key"]) for r in consume_all(bs, dst)) == list(range(30))


def test_keep_first_and_allow_keep_order(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src = unique_topic("src")
    create_topic(bs, src, 1)
    events = [{"order_id": i % 3, "version": i} for i in range(12)]
    produce_json(bs, src, events, partition=0)

    dst_first = unique_topic("dst")
    create_topic(bs, dst_first, 1)
    sink = "  strategy: {mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_first}"
    run_pipeline(parse_manifest(manifest_text(src, dst_first, tmp_path / "a", sink)), spark)
    assert {int(r["key"]): r["value"]["version"] for r in consume_all(bs, dst_first)} == {0: 0, 1: 1, 2: 2}

    dst_all = unique_topic("dst")
    create_topic(bs, dst_all, 1)
    sink = "  strategy: {mode: incremental_merge, unique_key: order_id, duplicate_policy: allow}"
    result = run_pipeline(parse_manifest(manifest_text(src, dst_all, tmp_path / "b", sink)), spark)
    assert result.messages_produced == 12
    out = sorted(consume_all(bs, dst_all), key=lambda r: r["offset"])
    for key in ("0", "1", "2"):
        versions = [r["value"]["version"] for r in out if r["key"] == key]
        assert versions == sorted(versions) and len(versions) == 4  # source order kept per key


def test_duplicate_policy_fail_produces_nothing_and_keeps_state(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    produce_json(bs, src, [{"order_id": 1, "v": 1}, {"order_id": 2, "v": 1}, {"order_id": 1, "v": 2}], partition=0)
    sink = "  strategy: {mode: incremental_merge, unique_key: order_id, duplicate_policy: fail}"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, sink))
    with pytest.raises(RunFailed, match=r"duplicate_policy: fail — 1 key\(s\) occur more than once .*'1'"):
        run_pipeline(manifest, spark)
    assert consume_all(bs, dst) == []
    store = LocalStateStore(str(tmp_path))
    assert store.load_offsets(src, f"g_{src}") == {}
    assert store.list_runs("k2k")[0].status == "failed"
    assert "duplicate_policy" in store.list_runs("k2k")[0].error


def test_composite_and_hash_row_and_null_keys(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src = unique_topic("src")
    create_topic(bs, src, 1)
    rows = [{"region": "eu", "order_id": 1, "amount": 2.5}, {"region": "us", "order_id": 1, "amount": None}]
    produce_json(bs, src, rows, partition=0)

    cases = {
        "composite": "  strategy: {mode: incremental_merge, unique_key: [region, order_id]}",
        "hash_row": "  strategy: {mode: incremental_append}\n  options: {key: {mode: hash_row}}",
        "null": "  strategy: {mode: incremental_append}\n  options: {key: {mode: 'null'}}",
    }
    keys = {}
    for name, sink in cases.items():
        dst = unique_topic(name)
        create_topic(bs, dst, 1)
        run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path / name, sink)), spark)
        keys[name] = sorted((r["key"] or "") for r in consume_all(bs, dst))
    assert keys["composite"] == ['{"region":"eu","order_id":1}', '{"region":"us","order_id":1}']
    canonical = json.dumps({"amount": 2.5, "order_id": 1, "region": "eu"}, separators=(",", ":"))
    assert hashlib.sha256(canonical.encode()).hexdigest() in keys["hash_row"]
    assert all(len(k) == 64 for k in keys["hash_row"])
    assert keys["null"] == ["", ""]


def test_dpone_envelope_tombstones_and_source_deletes(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src = unique_topic("src")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"order_id": 1, "v": "a"}, {"order_id": 2, "v": "b"}], partition=0, key=lambda r: r["order_id"])
    produce_json(bs, src, [None], partition=0, key="2")  # a source tombstone deletes key 2

    dst = unique_topic("env")
    create_topic(bs, dst, 1)
    sink = """  strategy: {mode: incremental_merge, unique_key: order_id}
  options:
    envelope: dpone
    deletes: {enabled: true}"""
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path / "env", sink)), spark)
    assert result.messages_produced == 2  # keep_last: key 2's delete wins over its upsert
    by_key = {r["key"]: r["value"] for r in consume_all(bs, dst)}
    assert by_key["1"]["op"] == "upsert" and by_key["1"]["data"] == {"order_id": 1, "v": "a"}
    assert by_key["1"]["metadata"]["strategy"] == "incremental_merge" and by_key["1"]["schema_version"] == 1
    assert by_key["2"]["op"] == "delete"

    dst_tomb = unique_topic("tomb")
    create_topic(bs, dst_tomb, 1)
    sink = """  strategy: {mode: incremental_merge, unique_key: order_id}
  options:
    envelope: flat
    deletes: {enabled: true, tombstone: true}"""
    result = run_pipeline(parse_manifest(manifest_text(src, dst_tomb, tmp_path / "tomb", sink)), spark)
    assert result.tombstones == 1
    assert {r["key"]: r["value"] for r in consume_all(bs, dst_tomb)} == {"1": {"order_id": 1, "v": "a"}, "2": None}

    # Deletes with deletes disabled: the run fails before producing (never silently an upsert)...
    dst_off = unique_topic("off")
    create_topic(bs, dst_off, 1)
    sink = "  strategy: {mode: incremental_merge, unique_key: order_id}"
    with pytest.raises(RunFailed, match="1 delete\\(s\\) but sink.options.deletes.enabled is false"):
        run_pipeline(parse_manifest(manifest_text(src, dst_off, tmp_path / "off", sink)), spark)
    assert consume_all(bs, dst_off) == []
    # ... or skips them when asked to, and says how many.
    sink += "\n  options: {deletes: {when_disabled: skip}}"
    result = run_pipeline(parse_manifest(manifest_text(src, dst_off, tmp_path / "skip", sink)), spark)
    assert result.deletes_skipped == 1
    assert sorted(r["key"] for r in consume_all(bs, dst_off)) == ["1", "2"]


def test_source_dpone_envelope_is_detected_and_unwrapped(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("src"), unique_topic("dst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    rows = [
        {"op": "upsert", "data": {"id": 1, "name": "Ada"}, "metadata": {}, "source": {}, "schema_version": 1},
        {"op": "delete", "data": {"id": 2}, "metadata": {}, "source": {}, "schema_version": 1},
    ]
    produce_json(bs, src, rows, partition=0)
    sink = "  strategy: {mode: incremental_merge, unique_key: id}\n  options: {deletes: {enabled: true, tombstone: true}}"
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink)), spark)
    assert "envelope: dpone (detected)" in result.notes
    assert {r["key"]: r["value"] for r in consume_all(bs, dst)} == {"1": {"id": 1, "name": "Ada"}, "2": None}


def test_headers_static_and_lineage(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    produce_json(bs, src, [{"order_id": 7}], partition=2)
    sink = """  strategy: {mode: incremental_append}
  options:
    headers: {static: {team: dwh}, lineage: true}"""
    run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink)), spark)
    [record] = consume_all(bs, dst)
    assert record["headers"] == {
        "team": "dwh",
        "dpone.source.topic": src,
        "dpone.source.partition": "2",
        "dpone.source.offset": "0",
    }


@pytest.mark.parametrize("mode", ["at_least_once", "idempotent"])
def test_delivery_modes_and_producer_settings(broker, spark, kafka_env, topics, tmp_path, mode):
    src, dst = topics
    bs = broker.bootstrap_servers
    produce_json(bs, src, orders(range(300)), partition=0)
    sink = f"""  strategy: {{mode: incremental_append, unique_key: order_id}}
  options:
    delivery: {{mode: {mode}, compression_type: zstd, linger_ms: 5, batch_num_messages: 50}}"""
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink)), spark)
    assert result.messages_produced == 300
    assert sorted(int(r["key"]) for r in consume_all(bs, dst)) == list(range(300))


def test_missing_sink_topic_leaves_state_and_rerun_delivers_everything(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("src"), unique_topic("missing")
    create_topic(bs, src, 2)
    produce_json(bs, src, orders(range(25)), partition=0)
    produce_json(bs, src, orders(range(25, 40)), partition=1)
    sink = "  strategy: {mode: incremental_append, unique_key: order_id}"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, sink))
    with pytest.raises(ConfigError, match=f"sink topic '{dst}' does not exist"):
        run_pipeline(manifest, spark)
    store = LocalStateStore(str(tmp_path))
    assert store.load_offsets(src, f"g_{src}") == {}
    assert store.list_runs("k2k")[0].status == "failed"

    create_topic(bs, dst, 2)
    result = run_pipeline(manifest, spark)
    assert result.messages_produced == 40
    assert sorted(int(r["key"]) for r in consume_all(bs, dst)) == list(range(40))
    assert store.load_offsets(src, f"g_{src}") == {0: 25, 1: 15}


def test_create_topic_when_asked(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("src"), unique_topic("created")
    create_topic(bs, src, 1)
    produce_json(bs, src, orders(range(3)), partition=0)
    sink = """  strategy: {mode: incremental_append}
  options:
    create_topic: {enabled: true, partitions: 4, configs: {cleanup.policy: compact}}"""
    run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink)), spark)
    from confluent_kafka.admin import AdminClient

    assert len(AdminClient({"bootstrap.servers": bs}).list_topics(timeout=10).topics[dst].partitions) == 4
    assert len(consume_all(bs, dst)) == 3


def test_max_records_and_start_from_latest(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    for p in range(3):
        produce_json(bs, src, orders(range(p * 100, p * 100 + 10)), partition=p)
    source = "    read_mode: max_records\n    max_records: 12"
    sink = "  strategy: {mode: incremental_append, unique_key: order_id}"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, sink, source))
    first = run_pipeline(manifest, spark)
    assert first.rows_extracted == 12 and first.committed_offsets == {0: 4, 1: 4, 2: 4}
    second = run_pipeline(manifest, spark)
    assert second.rows_extracted == 12 and second.committed_offsets == {0: 8, 1: 8, 2: 8}
    third = run_pipeline(manifest, spark)
    assert third.rows_extracted == 6 and third.committed_offsets == {0: 10, 1: 10, 2: 10}
    assert sorted(int(r["key"]) for r in consume_all(bs, dst)) == sorted(i for p in range(3) for i in range(p * 100, p * 100 + 10))

    other = unique_topic("x")
    create_topic(bs, other, 1)
    latest = parse_manifest(manifest_text(src, other, tmp_path / "l", sink, "    start_from: latest"))
    assert run_pipeline(latest, spark).rows_extracted == 0


def test_full_refresh_rereads_the_whole_topic(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    produce_json(bs, src, [{"order_id": i % 5, "v": i} for i in range(20)], partition=0)
    sink = "  strategy: {mode: full_refresh, unique_key: order_id}"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, sink))
    assert run_pipeline(manifest, spark).messages_produced == 5
    again = run_pipeline(manifest, spark)
    assert again.rows_extracted == 20 and again.messages_produced == 5  # stored offsets are ignored
    assert {int(r["key"]): r["value"]["v"] for r in consume_all(bs, dst)} == {k: 15 + k for k in range(5)}


def test_full_refresh_stores_its_offsets_once_at_the_commit(broker, spark, kafka_env, topics, tmp_path, monkeypatch):
    """A full_refresh rerun reads the whole topic whatever is stored, so storing offsets slice by
    slice bounds nothing: the direct path stores them once, with the run (an incremental run over
    the same slices stores them as they are delivered)."""
    from dpone_dagster.engine.offsets import OffsetStorage

    src, dst = topics
    bs = broker.bootstrap_servers
    for p in range(3):
        produce_json(bs, src, [{"order_id": p * 1000 + i} for i in range(300)], partition=p)
    real, stored = OffsetStorage.advance, []
    monkeypatch.setattr(OffsetStorage, "advance", lambda self, record, offsets: stored.append(dict(offsets)) or real(self, record, offsets))
    source = "    records_per_task: 50"
    outcomes = {}
    for mode in ("full_refresh", "incremental_merge"):
        stored.clear()
        sink = f"  strategy: {{mode: {mode}, unique_key: order_id}}"
        result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path / mode, sink, source)), spark)
        assert result.execution_path == "direct" and result.messages_produced == 900
        outcomes[mode] = (len(stored), result.committed_offsets)
    assert outcomes["full_refresh"] == (0, {0: 300, 1: 300, 2: 300})
    assert outcomes["incremental_merge"][0] > 0


def test_full_refresh_keyed_by_source_keys_judges_repeated_deletes(broker, spark, kafka_env, topics, tmp_path):
    """Without unique_key columns the deletes' keys are the source records' keys: two deletes of
    one key under duplicate_policy: fail refuse the batch before anything is produced."""
    src, dst = topics
    bs = broker.bootstrap_servers
    events = [{"op": "upsert", "data": {"order_id": 1}}, {"op": "delete", "data": {"order_id": 2}}, {"op": "delete", "data": {"order_id": 2}}]
    produce_json(bs, src, events, partition=0, key=lambda event: event["data"]["order_id"])
    sink = "  strategy: {mode: full_refresh, duplicate_policy: fail}\n  options: {envelope: dpone, deletes: {enabled: true, tombstone: false}}"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, sink, "    envelope: dpone"))
    with pytest.raises(RunFailed, match="duplicate_policy: fail"):
        run_pipeline(manifest, spark)
    assert consume_all(bs, dst) == []


def test_time_window_reads_records_by_timestamp(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    base = 1_700_000_000_000
    timestamps = [base + i * 60_000 for i in range(10)]  # one record per minute
    produce_json(bs, src, [{"order_id": i} for i in range(10)], partition=0, timestamps=timestamps)
    source = "    read_mode: time_window\n    start_timestamp: 2023-11-14T22:15:20Z\n    end_timestamp: 2023-11-14T22:18:20Z"
    # base = 2023-11-14T22:13:20Z, so the window holds minutes 2, 3, 4
    sink = "  strategy: {mode: incremental_append, unique_key: order_id}"
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink, source)), spark)
    assert sorted(int(r["key"]) for r in consume_all(bs, dst)) == [2, 3, 4]
    assert [r for r in result.offset_ranges if r["partition"] == 0] == [{"partition": 0, "start": 2, "end": 5}]


def test_undecodable_json_fails_before_producing(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    produce_json(bs, src, [{"order_id": 1}, b"{not json", {"order_id": 2}], partition=0)
    sink = "  strategy: {mode: incremental_append}"
    with pytest.raises(RunFailed, match=r"1 record\(s\) of '.*' could not be decoded .*0@1"):
        run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink)), spark)
    assert consume_all(bs, dst) == []


def test_schema_drift_beyond_the_sample_is_not_lost(broker, spark, kafka_env, topics, tmp_path):
    src, dst = topics
    bs = broker.bootstrap_servers
    rows = [{"order_id": i} for i in range(50)] + [{"order_id": 50, "late_field": "x"}]
    produce_json(bs, src, rows, partition=0)
    sink = "  strategy: {mode: incremental_append}"
    source = "    schema_sample_size: 5"
    result = run_pipeline(parse_manifest(manifest_text(src, dst, tmp_path, sink, source)), spark)
    assert any("late_field" in n for n in result.notes)
    late = [r["value"] for r in consume_all(bs, dst) if r["value"]["order_id"] == 50]
    assert late == [{"order_id": 50, "late_field": "x"}]


def test_offset_storage_kafka_commits_and_reads_back_the_group(broker, spark, kafka_env, topics, tmp_path):
    from confluent_kafka import Consumer, TopicPartition

    src, dst = topics
    bs = broker.bootstrap_servers
    produce_json(bs, src, orders(range(8)), partition=0)
    source = "    offset_storage: kafka"
    sink = "  strategy: {mode: incremental_append}"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, sink, source))
    assert run_pipeline(manifest, spark).rows_extracted == 8
    consumer = Consumer({"bootstrap.servers": bs, "group.id": f"g_{src}"})
    committed = consumer.committed([TopicPartition(src, p) for p in range(3)], timeout=10)
    consumer.close()
    assert {tp.partition: tp.offset for tp in committed if tp.offset >= 0} == {0: 8, 1: 0, 2: 0}
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{src}") == {}  # not in the dpone store
    produce_json(bs, src, orders(range(8, 11)), partition=0)
    assert run_pipeline(manifest, spark).rows_extracted == 3


def test_seed_manifest_000_runs_verbatim_with_env_connections(broker, spark, kafka_env, pg_env, pg_database):
    """Seed 000 exactly as published, except connection_type: env (vault has no server here)."""
    bs = broker.bootstrap_servers
    text = (Path(__file__).parent / "seed_manifests" / "seed000_kafka_to_kafka.yaml").read_text()
    text = text.replace("connection_type: vault", "connection_type: env")
    create_topic(bs, "orders_events", 3)
    create_topic(bs, "dwh.orders", 3)
    for p in range(3):
        produce_json(bs, "orders_events", orders(range(p * 10, p * 10 + 10)), partition=p)
    manifest = parse_manifest(text)
    result = run_pipeline(manifest, spark)
    assert result.messages_produced == 30
    assert sorted(int(r["key"]) for r in consume_all(bs, "dwh.orders")) == list(range(30))
    with psycopg2.connect(**pg_database) as conn, conn.cursor() as cur:
        cur.execute('select "partition", "offset" from etl_state.etl_kafka_offsets where group_id = %s order by 1', ("dpone.orders.batch",))
        assert cur.fetchall() == [(0, 10), (1, 10), (2, 10)]
        cur.execute("select status, counts->>'messages_produced' from etl_state.dpone_state where run_id = %s", (result.run_id,))
        assert cur.fetchone() == ("success", "30")
