"""Exactly-once Kafka -> Kafka replication: pure mapping/format rules, then real runs on the
embedded broker and the shared Spark session.

What the embedded broker (Tansu) can and cannot show: transactions, commit/abort, the last stable
offset of an OPEN transaction and fencing work; but read_committed does not hide ABORTED records
and a new init_transactions does not abort the previous open transaction (its records become
visible). Tests here therefore assert on the control topic (which only ever receives a record
inside a transaction that commits) and on the range a rerun produces; that a read_committed
reader of the target never sees an aborted attempt is proven only by the `real_kafka` tests.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from conftest import consume_raw, create_topic, produce_json, unique_topic

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.kafka.boundary import Watermarks
from dpone_dagster.manifest import manifest_from_dict
from dpone_dagster.manifest.models import ControlTopicOptions, ReplicationOptions
from dpone_dagster.replication.control_topic import (
    ControlTopicStore,
    decode_key,
    encode_key,
    fold_records,
    offset_record,
    read_committed_offsets,
)
from dpone_dagster.replication.eos_task import (
    ProducerFenced,
    ReplicationError,
    ReplicationSpec,
    SimulatedCrash,
    TransactionalProducer,
    classify,
    replicate_range,
    rewrite_schema_id,
)
from dpone_dagster.replication.mapping import (
    TRACE_PIPELINE,
    TRACE_SOURCE_OFFSET,
    TRACE_SOURCE_PARTITION,
    TRACE_SOURCE_TOPIC,
    record_headers,
    resolve_source_topics,
    resolve_targets,
    target_partition,
    target_topic,
    tracing_headers,
)
from dpone_dagster.replication.plan import plan_start
from dpone_dagster.replication.run import plan_replication, run_replication, task_failure_reason
from dpone_dagster.state.base import StateStore

REAL_KAFKA = os.environ.get("DPONE_TEST_REAL_KAFKA_BOOTSTRAP")
real_kafka = pytest.mark.real_kafka
needs_real_kafka = pytest.mark.skipif(
    not REAL_KAFKA,
    reason="exactly-once visibility needs a real Apache Kafka: the embedded broker's read_committed does not "
    "hide aborted records; set DPONE_TEST_REAL_KAFKA_BOOTSTRAP=host:port to run",
)


# =========================================================================== pure rules


def opts(**kwargs: Any) -> ReplicationOptions:
    return ReplicationOptions(**kwargs)


def test_target_topic_in_every_mapping_mode():
    assert target_topic("orders", opts()) == "orders"
    assert target_topic("orders", opts(topic_mapping="prefix", prefix="dr.")) == "dr.orders"
    assert target_topic("orders", opts(topic_mapping="suffix", suffix="_copy")) == "orders_copy"
    regex = opts(topic_mapping="regex", pattern=r"^eu\.(.+)$", replacement=r"us.\1")
    assert target_topic("eu.orders", regex) == "us.orders"


def test_target_topic_regex_and_name_validation():
    with pytest.raises(ConfigError, match="does not match source topic"):
        target_topic("orders", opts(topic_mapping="regex", pattern=r"^eu\.", replacement="us."))
    with pytest.raises(ConfigError, match="cannot be applied"):
        target_topic("orders", opts(topic_mapping="regex", pattern=r"(", replacement="x"))
    with pytest.raises(ConfigError, match="cannot be applied"):
        target_topic("orders", opts(topic_mapping="regex", pattern=r"orders", replacement=r"\2"))
    with pytest.raises(ConfigError, match="not a legal Kafka topic name"):
        target_topic("orders", opts(topic_mapping="prefix", prefix="dr/"))
    with pytest.raises(ConfigError, match="not a legal Kafka topic name"):
        target_topic("orders", opts(topic_mapping="regex", pattern=".*", replacement=""))


def test_resolve_source_topics_by_name_list_and_pattern():
    topics = ["orders", "orders_eu", "payments", "__consumer_offsets", "__orders_internal", "xorders"]
    assert resolve_source_topics(topics, "orders", None, None) == ["orders"]
    assert resolve_source_topics(topics, None, ["payments", "orders", "orders"], None) == ["orders", "payments"]
    # Full match: "xorders" contains the pattern's text but is not selected; internal topics never are.
    assert resolve_source_topics(topics, None, None, r"_*orders.*") == ["orders", "orders_eu"]
    with pytest.raises(ConfigError, match="do not exist"):
        resolve_source_topics(topics, None, ["orders", "missing"], None)
    with pytest.raises(ConfigError, match="matches no topic"):
        resolve_source_topics(topics, None, None, r"nothing.*")
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        resolve_source_topics(topics, None, None, r"(")


def test_resolve_targets_rules():
    assert resolve_targets(["a"], opts(), sink_topic="b") == {"a": "b"}
    assert resolve_targets(["a", "b"], opts(topic_mapping="prefix", prefix="dr.")) == {"a": "dr.a", "b": "dr.b"}
    with pytest.raises(ConfigError, match="conflicts with topic_mapping"):
        resolve_targets(["a"], opts(topic_mapping="prefix", prefix="dr."), sink_topic="b")
    with pytest.raises(ConfigError, match="names one target"):
        resolve_targets(["a", "b"], opts(), sink_topic="c")
    with pytest.raises(ConfigError, match="same cluster"):
        resolve_targets(["a", "b"], opts(), same_cluster=True)
    assert resolve_targets(["a"], opts(), sink_topic="a_copy", same_cluster=True) == {"a": "a_copy"}


def test_target_partition_keep_and_partitioner():
    assert target_partition(2, 3, "keep") == 2
    assert target_partition(2, 1, "partitioner") is None
    with pytest.raises(ConfigError, match="source partition 3 has no counterpart"):
        target_partition(3, 3, "keep")


def test_tracing_and_replicated_headers():
    trace = tracing_headers("k2k", "orders", 2, 41)
    assert trace == [
        (TRACE_SOURCE_TOPIC, b"orders"),
        (TRACE_SOURCE_PARTITION, b"2"),
        (TRACE_SOURCE_OFFSET, b"41"),
        (TRACE_PIPELINE, b"k2k"),
    ]
    source = [("h", b"1"), ("empty", None), (TRACE_SOURCE_OFFSET, b"7")]
    assert record_headers(source, True, None) == source
    assert record_headers(source, False, None) is None
    # An earlier hop's trace headers are replaced by this hop's.
    assert record_headers(source, True, trace) == [("h", b"1"), ("empty", None), *trace]
    assert record_headers(None, True, trace) == trace


def test_control_record_format_and_latest_value_per_key():
    key, value = offset_record("grp", "orders", 3, 1200, "k2k", "run1", "dr.orders")
    assert key == b'["grp","orders",3]'
    assert decode_key(key) == ("grp", "orders", 3)
    data = json.loads(value)
    assert data["offset"] == 1200 and data["pipeline"] == "k2k" and data["run_id"] == "run1"
    assert data["target_topic"] == "dr.orders" and data["v"] == 1 and data["committed_at"].endswith("+00:00")
    assert decode_key(b"not json") is None and decode_key(b'["a","b","c"]') is None

    def rec(group, topic, partition, offset, position, ctl_partition=0, ts=0):
        k, v = offset_record(group, topic, partition, offset, "p", "r") if offset is not None else (
            encode_key(group, topic, partition), None)
        return k, v, ctl_partition, position, ts

    records = [
        rec("grp", "orders", 0, 10, 0),
        rec("grp", "orders", 0, 25, 1),  # compaction has not run: the later one wins
        rec("other", "orders", 0, 99, 2),  # another pipeline sharing the topic
        rec("grp", "orders", 1, 5, 3),
        rec("grp", "orders", 1, None, 4),  # tombstone: forgotten
        rec("grp", "payments", 0, 7, 5),
        (b"foreign", b"{}", 0, 6, 0),
    ]
    folded = fold_records(records, "grp", ["orders"])
    assert {k: e.offset for k, e in folded.items()} == {("orders", 0): 25}
    assert {k: e.offset for k, e in fold_records(records, "grp").items()} == {("orders", 0): 25, ("payments", 0): 7}
    # Across control partitions (partition count changed) the newer timestamp wins.
    moved = [rec("grp", "t", 0, 50, 9, ctl_partition=0, ts=100), rec("grp", "t", 0, 60, 1, ctl_partition=1, ts=200)]
    assert fold_records(moved, "grp")[("t", 0)].offset == 60


def test_transactional_error_classes():
    assert classify(KafkaError(KafkaError.PRODUCER_FENCED, "x", txn_requires_abort=True)) == "fenced"
    assert classify(KafkaError(KafkaError._FENCED, "x", fatal=True)) == "fenced"
    assert classify(KafkaError(KafkaError._STATE, "x", fatal=True)) == "fatal"
    assert classify(KafkaError(KafkaError._TIMED_OUT, "x", retriable=True)) == "retriable"
    assert classify(KafkaError(KafkaError._STATE, "x", txn_requires_abort=True)) == "abortable"
    assert classify(KafkaError(KafkaError._STATE, "x")) == "fatal"


def test_plan_start_committed_wins_and_gaps_fail():
    wm = Watermarks(10, 50)
    assert plan_start("t", 0, wm, 30, "earliest", "g") == (30, None)
    assert plan_start("t", 0, wm, 50, "latest", "g") == (50, None)
    assert plan_start("t", 0, wm, None, "latest", "g")[0] == 50
    assert plan_start("t", 0, wm, None, "stored", "g")[0] == 10
    with pytest.raises(RunFailed, match="retention deleted 5 record"):
        plan_start("t", 0, wm, 5, "stored", "g")
    with pytest.raises(RunFailed, match="beyond the high watermark"):
        plan_start("t", 0, wm, 51, "stored", "g")
    # A provisional read (open transaction) may hold an older offset: the task re-reads and decides.
    assert plan_start("t", 0, wm, 5, "stored", "g", provisional=True) == (5, None)
    with pytest.raises(RunFailed, match="beyond the high watermark"):
        plan_start("t", 0, wm, 51, "stored", "g", provisional=True)


def test_schema_id_rewrite():
    framed = b"\x00" + (7).to_bytes(4, "big") + b"\x00payload"
    assert rewrite_schema_id(framed, {7: 300}, "t[0]@1") == b"\x00" + (300).to_bytes(4, "big") + b"\x00payload"
    assert rewrite_schema_id(None, {7: 300}, "t[0]@1") is None
    assert rewrite_schema_id(b'{"a":1}', None, "t[0]@1") == b'{"a":1}'
    with pytest.raises(ReplicationError, match="not in the Schema Registry wire format"):
        rewrite_schema_id(b'{"a":1}', {7: 300}, "t[0]@1")
    with pytest.raises(ReplicationError, match="schema id 8 has no registered counterpart"):
        rewrite_schema_id(b"\x00" + (8).to_bytes(4, "big") + b"x", {7: 300}, "t[0]@1")


def test_task_failure_reason_finds_the_task_error():
    text = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "eos_task.py", line 1, in commit\n'
        "dpone_dagster.replication.eos_task.ProducerFenced: commit_transaction (dpone-p-t-0): fenced\n"
        "\tat org.apache.spark..."
    )
    assert task_failure_reason(text) == "ProducerFenced: commit_transaction (dpone-p-t-0): fenced"
    assert "died" in task_failure_reason("SparkException: Python worker exited unexpectedly (crashed)")


# =========================================================================== helpers for runs


def replication_manifest(
    name: str,
    source: dict[str, Any],
    replication: dict[str, Any],
    control_topic: str,
    sink_topic: str | None = None,
    create_topic: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
):
    sink: dict[str, Any] = {
        "type": "kafka",
        "connection_id": "kafka_cluster",
        "options": {
            "delivery": {"mode": "exactly_once"},
            "create_topic": create_topic if create_topic is not None else {"enabled": True, "partitions": 1},
            "replication": {**replication, "control_topic": {"name": control_topic}},
        },
    }
    if sink_topic:
        sink["topic"] = sink_topic
    return manifest_from_dict(
        {
            "name": name,
            "source": {"type": "kafka", "connection_id": "kafka_cluster", **source, "options": source_options or {}},
            "sink": sink,
        }
    )


def control_offsets(bootstrap: str, control_topic: str, group: str, transaction_timeout_ms: int = 60_000) -> dict[tuple[str, int], int]:
    """What a read_committed reader of the control topic sees (waits for open transactions to end)."""
    return read_committed_offsets(
        {"bootstrap.servers": bootstrap}, ControlTopicOptions(name=control_topic), group,
        transaction_timeout_ms=transaction_timeout_ms, missing_ok=True,
    )


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as a signed 32-bit int."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length % 4
    rest = data[length - tail :]
    if tail >= 3:
        h ^= rest[2] << 16
    if tail >= 2:
        h ^= rest[1] << 8
    if tail >= 1:
        h ^= rest[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """The Java producer's default partition of a keyed record: toPositive(murmur2(key)) % n."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def payloads(records: list[dict[str, Any]], partition: int | None = None) -> list[bytes]:
    return [r["value"] for r in sorted(records, key=lambda r: (r["partition"], r["offset"]))
            if partition is None or r["partition"] == partition]


def run(manifest, spark, bootstrap: str, **kwargs: Any):
    config = {"bootstrap.servers": bootstrap}
    return run_replication(manifest, spark, config, dict(config), uuid.uuid4().hex, **kwargs)


# =========================================================================== runs on the embedded broker


def test_replication_commits_offsets_with_the_records(broker, spark):
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("src"), unique_topic("ctl")
    dst = f"{src}_copy"
    create_topic(bs, src, 2)
    for p in range(2):
        rows = [{"id": p * 100 + i} for i in range(30)]
        produce_json(bs, src, rows, partition=p, key=lambda r: f"k{r['id']}", timestamps=[1_600_000_000_000 + i for i in range(30)])
    producer = Producer({"bootstrap.servers": bs})
    producer.produce(src, value=b"with-headers", key=b"hk", partition=1, headers=[("trace", b"abc"), ("nil", None)])
    producer.produce(src, value=None, key=b"deleted", partition=1)  # tombstone stays a tombstone
    assert producer.flush(10) == 0

    manifest = replication_manifest("k2k_basic", {"topic": src}, {}, ctl, sink_topic=dst)
    result = run(manifest, spark, bs)

    assert result.targets == {src: dst}
    assert result.committed_offsets == {src: {0: 30, 1: 32}}
    assert sorted((r["partition"], r["start"], r["end"]) for r in result.committed_ranges) == [(0, 0, 30), (1, 0, 32)]
    assert result.records == 62
    # The control topic (read_committed) holds offset = end for every partition.
    assert control_offsets(bs, ctl, "k2k_basic") == {(src, 0): 30, (src, 1): 32}
    store = ControlTopicStore({"bootstrap.servers": bs}, ControlTopicOptions(name=ctl), "k2k_basic")
    assert isinstance(store, StateStore)
    assert store.load_offsets(src) == {0: 30, 1: 32}
    with pytest.raises(ConfigError, match="read-only"):
        store.reset_offsets(src, "k2k_basic", None)

    source, target = consume_raw(bs, src), consume_raw(bs, dst)
    assert len(target) == 62
    for p in range(2):  # partition kept, order kept, bytes identical
        src_p = [r for r in source if r["partition"] == p]
        dst_p = [r for r in target if r["partition"] == p]
        assert [(r["key"], r["value"], r["headers"], r["timestamp"]) for r in dst_p] == [
            (r["key"], r["value"], r["headers"], r["timestamp"]) for r in src_p
        ]
    with_headers = next(r for r in target if r["key"] == b"hk")
    assert with_headers["headers"] == [("trace", b"abc"), ("nil", None)]
    assert next(r for r in target if r["key"] == b"deleted")["value"] is None
    assert target[0]["timestamp"] == 1_600_000_000_000

    # Nothing new: no task commits anything; new records: only they are replicated.
    again = run(manifest, spark, bs)
    assert again.records == 0 and again.partitions == []
    produce_json(bs, src, [{"id": 999}], partition=0)
    third = run(manifest, spark, bs)
    assert third.committed_ranges == [{"topic": src, "partition": 0, "start": 30, "end": 31}]
    assert control_offsets(bs, ctl, "k2k_basic") == {(src, 0): 31, (src, 1): 32}
    assert len(consume_raw(bs, dst)) == 63


def test_records_of_900_kb_replicate_byte_exact(broker, spark):
    """Records near the broker's default message size limit pass through the task's byte-bounded
    consume batches unchanged (memory per task is bounded by bytes, not by record count)."""
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("large"), unique_topic("ctl")
    dst = f"{src}_copy"
    create_topic(bs, src, 1)
    producer = Producer({"bootstrap.servers": bs, "message.max.bytes": 2_000_000})
    values = [os.urandom(900_000) if i % 2 == 0 else b"small-%d" % i for i in range(8)]
    for i, value in enumerate(values):
        producer.produce(src, value=value, key=b"k%d" % i, partition=0)
    assert producer.flush(30) == 0

    manifest = replication_manifest("k2k_large", {"topic": src}, {}, ctl, sink_topic=dst)
    result = run(manifest, spark, bs)

    assert result.records == 8 and result.committed_offsets == {src: {0: 8}}
    assert [(r["key"], r["value"]) for r in consume_raw(bs, dst)] == [(b"k%d" % i, v) for i, v in enumerate(values)]
    assert control_offsets(bs, ctl, "k2k_large") == {(src, 0): 8}


def test_crash_before_commit_leaves_control_topic_and_rerun_resumes(broker, spark):
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("src"), unique_topic("ctl")
    create_topic(bs, src, 2)
    for p in range(2):
        produce_json(bs, src, [{"n": i} for i in range(10)], partition=p)
    manifest = replication_manifest(
        "k2k_crash", {"topic": src}, {"topic_mapping": "prefix", "prefix": "dr."}, ctl,
        create_topic={"enabled": True, "partitions": 2},
    )
    run(manifest, spark, bs)
    before = control_offsets(bs, ctl, "k2k_crash")
    assert before == {(src, 0): 10, (src, 1): 10}

    # New records in partition 0 only, so the crashing task is the only task of the run.
    produce_json(bs, src, [{"n": i} for i in range(10, 25)], partition=0)
    with pytest.raises(RunFailed, match="Python worker died"):
        run(manifest, spark, bs, fail_after_produce_for_tests=(src, 0, "after_data", "exit"))
    # The task produced its 15 records and died before producing the offset and committing:
    # the control topic is unchanged.
    assert control_offsets(bs, ctl, "k2k_crash") == before

    rerun = run(manifest, spark, bs)
    assert rerun.committed_ranges == [{"topic": src, "partition": 0, "start": 10, "end": 25}]
    assert rerun.records == 15
    assert control_offsets(bs, ctl, "k2k_crash") == {(src, 0): 25, (src, 1): 10}
    # On this broker the crashed attempt's records REMAIN visible in the target (read_committed
    # does not hide them there; real Kafka aborts them: see the real_kafka test). Only the rerun's
    # range is asserted: the last 15 records of target partition 0 are source offsets 10..24.
    target_p0 = payloads(consume_raw(bs, f"dr.{src}"), 0)
    assert target_p0[-15:] == payloads(consume_raw(bs, src), 0)[10:25]
    # The crash really came after producing: the log holds the first run's 10, the crashed
    # attempt's 15 and the rerun's 15 (read_uncommitted, on any broker).
    assert len(payloads(consume_raw(bs, f"dr.{src}", "read_uncommitted"), 0)) == 40


def test_crash_raising_in_a_direct_task_call_keeps_the_offset(broker):
    """The same, without Spark: the task dies (SimulatedCrash) after producing the data and the
    control record, before commit_transaction; a new attempt fences it and commits."""
    bs = broker.bootstrap_servers
    src, dst, ctl = unique_topic("src"), unique_topic("dst"), unique_topic("ctl")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    create_topic(bs, ctl, 1, {"cleanup.policy": "compact"})
    produce_json(bs, src, [{"n": i} for i in range(5)])
    config = {"bootstrap.servers": bs}
    spec = ReplicationSpec(
        pipeline="direct", run_id="r1", source_config=config, target_config=config,
        producer_config={**config, "linger.ms": 5}, source_topic=src, source_partition=0,
        planned_start=0, end=5, target_topic=dst, commit_group="direct", control_topic=ctl,
        crash="after_data", crash_mode="raise",
    )
    with pytest.raises(SimulatedCrash):
        replicate_range(spec)
    assert control_offsets(bs, ctl, "direct") == {}
    stats = replicate_range(replace(spec, crash=None, run_id="r2"))
    assert (stats["start"], stats["end"], stats["records"], stats["committed"]) == (0, 5, 5, True)
    assert control_offsets(bs, ctl, "direct") == {(src, 0): 5}
    # A repeated attempt finds the range committed and does nothing.
    assert replicate_range(replace(spec, crash=None))["committed"] is False


def test_transactions_end_after_their_records_or_seconds(broker):
    """records_per_transaction cuts the range by offsets; seconds_per_transaction ends a transaction
    after the batch during which it ran out. Either way the control offset ends at the range end
    and every record is copied once, in order."""
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("src"), unique_topic("ctl")
    create_topic(bs, src, 1)
    create_topic(bs, ctl, 1, {"cleanup.policy": "compact"})
    produce_json(bs, src, [{"n": i} for i in range(50)])
    config = {"bootstrap.servers": bs}
    for name, limits, transactions in (
        ("records", {"records_per_transaction": 20}, 3),
        ("seconds", {"seconds_per_transaction": 1e-6}, None),
    ):
        dst = unique_topic(f"dst_{name}")
        create_topic(bs, dst, 1)
        spec = ReplicationSpec(
            pipeline=f"limits_{name}", run_id="r1", source_config=config, target_config=config,
            producer_config={**config, "linger.ms": 5}, source_topic=src, source_partition=0,
            planned_start=0, end=50, target_topic=dst, commit_group=f"limits_{name}", control_topic=ctl, **limits,
        )
        stats = replicate_range(spec)
        assert (stats["records"], stats["committed"]) == (50, True)
        if transactions is not None:
            assert stats["transactions"] == transactions
        else:
            assert stats["transactions"] > 1  # one batch per transaction
        assert control_offsets(bs, ctl, f"limits_{name}") == {(src, 0): 50}
        assert [json.loads(v)["n"] for v in payloads(consume_raw(bs, dst))] == list(range(50))


def test_second_producer_with_the_same_transactional_id_fences_the_first(broker):
    bs = broker.bootstrap_servers
    topic = unique_topic("fence")
    create_topic(bs, topic, 1)
    txn_id = f"dpone-fence-{topic}-0"
    first = TransactionalProducer({"bootstrap.servers": bs}, txn_id, 60_000)
    first.init()
    first.begin()
    first.produce(topic, value=b"a1")
    first.flush(10)

    second = TransactionalProducer({"bootstrap.servers": bs}, txn_id, 60_000)
    second.init()  # bumps the epoch: the first producer is now a zombie

    with pytest.raises(ProducerFenced, match="fenced"):
        first.produce(topic, value=b"a2")
        first.commit()
    second.begin()
    second.produce(topic, value=b"b1")
    second.commit()
    assert b"b1" in payloads(consume_raw(bs, topic))


def test_topics_list_prefix_mapping_headers_off_timestamps_off_tracing_on(broker, spark):
    bs = broker.bootstrap_servers
    a, b, ctl = unique_topic("ta"), unique_topic("tb"), unique_topic("ctl")
    create_topic(bs, a, 2)
    create_topic(bs, b, 1)
    old = 1_500_000_000_000
    producer = Producer({"bootstrap.servers": bs})
    for i in range(6):
        producer.produce(a, key=f"a{i}".encode(), value=f"va{i}".encode(), headers=[("h", b"x")], timestamp=old, partition=i % 2)
    for i in range(4):
        producer.produce(b, key=f"b{i}".encode(), value=f"vb{i}".encode(), headers=[("h", b"y")], timestamp=old)
    assert producer.flush(10) == 0
    manifest = replication_manifest(
        "k2k_list",
        {"topics": [a, b]},
        {"topic_mapping": "prefix", "prefix": "dr.", "partition_mapping": "partitioner",
         "replicate_headers": False, "keep_timestamps": False, "tracing_headers": True},
        ctl,
        create_topic={"enabled": True, "partitions": 3},
    )
    started = int(time.time() * 1000)
    result = run(manifest, spark, bs)
    assert result.targets == {a: f"dr.{a}", b: f"dr.{b}"}
    assert control_offsets(bs, ctl, "k2k_list") == {(a, 0): 3, (a, 1): 3, (b, 0): 4}

    for src, n in ((a, 6), (b, 4)):
        source = {r["key"]: r for r in consume_raw(bs, src)}
        target = consume_raw(bs, f"dr.{src}")
        assert len(target) == n
        for r in target:
            origin = source[r["key"]]
            assert r["value"] == origin["value"]
            headers = dict(r["headers"])
            assert "h" not in headers  # replicate_headers: false
            assert headers == {
                TRACE_SOURCE_TOPIC: src.encode(),
                TRACE_SOURCE_PARTITION: str(origin["partition"]).encode(),
                TRACE_SOURCE_OFFSET: str(origin["offset"]).encode(),
                TRACE_PIPELINE: b"k2k_list",
            }
            assert r["timestamp"] >= started - 5_000  # keep_timestamps: false -> produce time
    # partitioner mapping with keys: each key lands where the Java clients' murmur2 partitioner puts it.
    placed = {r["key"]: r["partition"] for r in consume_raw(bs, f"dr.{a}")}
    assert placed == {key: java_partition(key, 3) for key in placed} and len(placed) == 6


def test_topic_pattern_with_suffix_mapping(broker, spark):
    bs = broker.bootstrap_servers
    stem = unique_topic("pat")
    wanted, other, ctl = [f"{stem}.orders", f"{stem}.payments"], f"{stem}.orders.dlq", unique_topic("ctl")
    for topic in [*wanted, other]:
        create_topic(bs, topic, 1)
        produce_json(bs, topic, [{"t": topic, "i": i} for i in range(3)])
    manifest = replication_manifest(
        "k2k_pattern",
        {"topic_pattern": rf"{stem}\.(orders|payments)"},
        {"topic_mapping": "suffix", "suffix": ".mirror"},
        ctl,
    )
    result = run(manifest, spark, bs)
    assert sorted(result.targets) == wanted
    assert control_offsets(bs, ctl, "k2k_pattern") == {(t, 0): 3 for t in wanted}
    for topic in wanted:
        assert payloads(consume_raw(bs, f"{topic}.mirror")) == payloads(consume_raw(bs, topic))


def test_keep_mapping_refuses_a_target_with_fewer_partitions(broker, spark):
    bs = broker.bootstrap_servers
    src, dst, ctl = unique_topic("src"), unique_topic("dst"), unique_topic("ctl")
    create_topic(bs, src, 3)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"i": 1}], partition=2)
    manifest = replication_manifest("k2k_fewer", {"topic": src}, {}, ctl, sink_topic=dst)
    with pytest.raises(ConfigError, match="source partition 2 has no counterpart in a target topic of 1"):
        run(manifest, spark, bs)
    assert consume_raw(bs, dst) == []
    assert control_offsets(bs, ctl, "k2k_fewer") == {}


def test_missing_target_or_control_topic_fails_clearly(broker, spark):
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("src"), unique_topic("ctl")
    create_topic(bs, src, 1)
    no_target = replication_manifest("k2k_no_target", {"topic": src}, {}, ctl, sink_topic=f"{src}_x", create_topic={})
    with pytest.raises(ConfigError, match="create_topic.enabled"):
        run(no_target, spark, bs)
    no_control = manifest_from_dict(
        {
            **no_target.model_dump(by_alias=True, exclude_none=True),
            "sink": {
                **no_target.sink.model_dump(by_alias=True, exclude_none=True),
                "options": {
                    "delivery": {"mode": "exactly_once"},
                    "replication": {"control_topic": {"name": unique_topic("ctl"), "create": False}},
                },
            },
        }
    )
    with pytest.raises(ConfigError, match="control topic .* does not exist"):
        run(no_control, spark, bs)


def test_dry_plan_writes_nothing(broker):
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("src"), unique_topic("ctl")
    create_topic(bs, src, 2)
    produce_json(bs, src, [{"i": i} for i in range(3)], partition=1)
    manifest = replication_manifest("k2k_plan", {"topic": src}, {"topic_mapping": "prefix", "prefix": "dr."}, ctl)
    config = {"bootstrap.servers": bs}
    plan = plan_replication(manifest, config, dict(config))
    assert [(p.partition, p.start, p.end, p.committed) for p in plan.planned] == [(0, 0, 0, None), (1, 0, 3, None)]
    assert plan.as_dict()["offsets_in_range"] == 3
    assert any("control topic" in n and "does not exist yet" in n for n in plan.notes)
    assert any(f"dr.{src}" in n and "does not exist yet" in n for n in plan.notes)
    lister = Consumer({"bootstrap.servers": bs, "group.id": "x"})
    topics = lister.list_topics(timeout=10).topics
    lister.close()
    assert ctl not in topics and f"dr.{src}" not in topics


def test_start_from_latest_records_the_start_for_an_empty_range(broker, spark):
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("src"), unique_topic("ctl")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"old": i} for i in range(4)])
    manifest = replication_manifest(
        "k2k_latest", {"topic": src}, {}, ctl, sink_topic=f"{src}_copy", source_options={"start_from": "latest"}
    )
    first = run(manifest, spark, bs)
    assert first.records == 0
    # The start is committed, so records arriving before the next run are not skipped.
    assert control_offsets(bs, ctl, "k2k_latest") == {(src, 0): 4}
    produce_json(bs, src, [{"new": 1}])
    second = run(manifest, spark, bs)
    assert second.committed_ranges == [{"topic": src, "partition": 0, "start": 4, "end": 5}]
    assert [json.loads(v) for v in payloads(consume_raw(bs, f"{src}_copy"))] == [{"new": 1}]


def test_schema_mapping_rewrites_value_schema_ids(broker, spark):
    from confluent_kafka.schema_registry import Schema

    from dpone_dagster.schema.registry import registry_client
    from dpone_dagster.schema.wire_format import frame, unframe

    bs = broker.bootstrap_servers
    src, ctl = unique_topic("src"), unique_topic("ctl")
    create_topic(bs, src, 1)
    source_registry = {"url": f"mock://src-{uuid.uuid4().hex[:6]}"}
    target_registry = {"url": f"mock://dst-{uuid.uuid4().hex[:6]}"}
    avro = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]})
    source_id = registry_client(source_registry).register_schema(f"{src}-value", Schema(avro, "AVRO"))
    # Occupy ids in the target so that the ids differ between the registries.
    for i in range(3):
        filler = json.dumps({"type": "record", "name": f"F{i}", "fields": [{"name": "x", "type": "int"}]})
        registry_client(target_registry).register_schema(f"filler{i}-value", Schema(filler, "AVRO"))
    produce_json(bs, src, [frame(source_id, bytes([2 * i])) for i in range(3)])
    manifest = replication_manifest(
        "k2k_schemas", {"topic": src}, {"topic_mapping": "prefix", "prefix": "dr.", "schema_mapping": True}, ctl
    )
    with pytest.raises(ConfigError, match="schema_registry_url"):
        run(manifest, spark, bs)
    run(manifest, spark, bs, source_registry=source_registry, target_registry=target_registry)

    target_id = registry_client(target_registry).get_latest_version(f"dr.{src}-value").schema_id
    assert target_id != source_id
    out = [unframe(v) for v in payloads(consume_raw(bs, f"dr.{src}"))]
    assert out == [(target_id, None, bytes([2 * i])) for i in range(3)]


# =========================================================================== real Kafka only


@real_kafka
@needs_real_kafka
def test_read_committed_reader_never_sees_an_aborted_attempt(spark):
    bs = REAL_KAFKA
    assert bs is not None
    src, ctl = unique_topic("src"), unique_topic("ctl")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"n": i} for i in range(20)])
    manifest = replication_manifest(
        "k2k_real", {"topic": src}, {"topic_mapping": "prefix", "prefix": "dr.", "transaction_timeout_ms": 10_000}, ctl
    )
    # The attempt produces all records AND the control record, then dies before committing.
    with pytest.raises(RunFailed):
        run(manifest, spark, bs, fail_after_produce_for_tests=(src, 0, "before_commit", "exit"))
    # Its records sit in the log (read_uncommitted sees them) but no committed reader does.
    assert len(consume_raw(bs, f"dr.{src}", "read_uncommitted")) == 20
    # Waits until the broker aborts the dead attempt (transaction.timeout.ms): nothing committed.
    assert control_offsets(bs, ctl, "k2k_real", transaction_timeout_ms=10_000) == {}
    assert consume_raw(bs, f"dr.{src}", "read_committed") == []

    rerun = run(manifest, spark, bs)
    assert rerun.committed_ranges == [{"topic": src, "partition": 0, "start": 0, "end": 20}]
    committed = consume_raw(bs, f"dr.{src}", "read_committed")
    assert payloads(committed) == payloads(consume_raw(bs, src))  # exactly once: no aborted copy
    assert control_offsets(bs, ctl, "k2k_real") == {(src, 0): 20}


@real_kafka
@needs_real_kafka
def test_aborted_transaction_is_invisible_to_read_committed():
    bs = REAL_KAFKA
    assert bs is not None
    topic = unique_topic("abort")
    create_topic(bs, topic, 1)
    producer = TransactionalProducer({"bootstrap.servers": bs}, f"dpone-test-{topic}", 10_000)
    producer.init()
    producer.begin()
    producer.produce(topic, value=b"aborted")
    producer.flush(10)
    producer.abort()
    producer.begin()
    producer.produce(topic, value=b"committed")
    producer.commit()
    assert payloads(consume_raw(bs, topic, "read_committed")) == [b"committed"]
    assert payloads(consume_raw(bs, topic, "read_uncommitted")) == [b"aborted", b"committed"]

