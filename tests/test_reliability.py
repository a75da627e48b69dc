"""Failure handling: every failure retries, fails fast with a clear message, or is routed — and no
data is lost and no state advances past what was delivered. Runs against the embedded broker
(a dedicated one where a test stops it), real Spark and real state stores."""

from __future__ import annotations

import json

import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic

from dpone_dagster.embedded_broker import EmbeddedBroker
from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.kafka.errors import classify_kafka, classify_registry, classify_text, message_too_large
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.state.local import LocalStateStore


def manifest(src: str, dst: str, state, source_options: str = "", sink_options: str = "") -> str:
    return f"""
name: rel
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options:
    group_id: g_{src}
{source_options}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
  strategy: {{mode: incremental_merge, unique_key: order_id}}
  options:
    delivery: {{producer_config: {{message.timeout.ms: 5000}}}}
{sink_options}
state: {{type: local, path: {state}}}
"""


@pytest.fixture
def bad_input(broker, kafka_env):
    """Good rows, one undecodable value, one row without its unique key."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("bad"), unique_topic("out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": 1}, {"order_id": 2}], partition=0, key="k")
    produce_json(bs, src, [b"{oops"], partition=0, key="broken")
    produce_json(bs, src, [{"order_id": None, "note": "no key"}, {"order_id": 3}], partition=0)
    return src, dst


def test_bad_input_fails_by_default_and_names_the_records(broker, spark, bad_input, tmp_path):
    src, dst = bad_input
    with pytest.raises(RunFailed, match=r"1 record\(s\) of .* could not be decoded \(partition@offset: 0@2 \(value is not JSON"):
        run_pipeline(parse_manifest(manifest(src, dst, tmp_path)), spark)
    assert consume_all(broker.bootstrap_servers, dst) == []
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{src}") == {}


def test_skip_counts_every_bad_record(broker, spark, bad_input, tmp_path):
    src, dst = bad_input
    result = run_pipeline(parse_manifest(manifest(src, dst, tmp_path, "    on_error: skip")), spark)
    assert result.rows_skipped == 2 and result.messages_produced == 3
    # Input = output + dead-lettered + skipped (+ rows merged away by the duplicate policy).
    assert result.rows_extracted == result.messages_produced + result.duplicates_removed + result.rows_skipped + result.rows_dead_lettered
    assert sorted(r["value"]["order_id"] for r in consume_all(broker.bootstrap_servers, dst)) == [1, 2, 3]
    assert result.committed_offsets == {0: 5}


def test_dead_letter_keeps_the_original_record_and_says_why(broker, spark, bad_input, tmp_path):
    src, dst = bad_input
    dlq = unique_topic("dlq")
    options = f"    on_error: dead_letter\n    dead_letter: {{topic: {dlq}, create: true}}"
    result = run_pipeline(parse_manifest(manifest(src, dst, tmp_path, options)), spark, RunRequest(run_id="run-dlq"))
    assert result.rows_dead_lettered == 2 and result.messages_produced == 3
    letters = {}
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "dlq-reader"})
    consumer.assign([TopicPartition(dlq, 0, 0)])
    while len(letters) < 2:
        m = consumer.poll(10)
        assert m is not None and not m.error()
        letters[m.value()] = (m.key(), dict((k, v.decode()) for k, v in m.headers()))
    consumer.close()
    key, headers = letters[b"{oops"]
    assert key == b"broken"
    assert headers["dpone.error.reason"] == "value is not JSON matching the schema at 0@2"
    assert (headers["dpone.error.source.topic"], headers["dpone.error.source.partition"], headers["dpone.error.source.offset"]) == (src, "0", "2")
    assert (headers["dpone.error.pipeline"], headers["dpone.error.run_id"]) == ("rel", "run-dlq")
    _, headers = letters[json.dumps({"order_id": None, "note": "no key"}).encode()]
    assert headers["dpone.error.reason"] == "missing unique key ['order_id']"


def test_message_too_large_is_caught_before_producing(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("big"), unique_topic("bigout")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": 1, "blob": "x"}, {"order_id": 2, "blob": "y" * 5000}], partition=0)
    sink = "    delivery: {producer_config: {message.max.bytes: 2000}}"
    text = manifest(src, dst, tmp_path, sink_options="").replace(
        "    delivery: {producer_config: {message.timeout.ms: 5000}}", sink
    )
    with pytest.raises(RunFailed, match=r"1 message\(s\) exceed message.max.bytes 2000 .*0@1 \(message of 50\d\d bytes"):
        run_pipeline(parse_manifest(text), spark)
    assert consume_all(bs, dst) == []  # nothing half-written
    skipping = text.replace(f"    group_id: g_{src}", f"    group_id: g_{src}\n    on_error: skip")
    result = run_pipeline(parse_manifest(skipping), spark)
    assert result.rows_skipped == 1 and [r["value"]["order_id"] for r in consume_all(bs, dst)] == [1]


def test_messages_near_the_limit_are_measured_exactly(broker, spark, kafka_env, tmp_path):
    """The size bound (6 bytes per string byte) exceeds the limit here while no message does: the
    run measures the encoded messages, finds none too large and delivers all, de-duplicated."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("near"), unique_topic("nearout")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    rows = [{"order_id": 1, "blob": "a" * 1500}, {"order_id": 2, "blob": "b" * 1500}, {"order_id": 1, "blob": "c" * 1500}]
    produce_json(bs, src, rows, partition=0)
    text = manifest(src, dst, tmp_path).replace("message.timeout.ms: 5000", "message.timeout.ms: 5000, message.max.bytes: 2000")
    result = run_pipeline(parse_manifest(text), spark)
    assert (result.messages_produced, result.duplicates_removed, result.rows_skipped) == (2, 1, 0)
    assert sorted((r["value"]["order_id"], r["value"]["blob"][0]) for r in consume_all(bs, dst)) == [(1, "c"), (2, "b")]


def test_two_runs_of_one_pipeline_never_overlap(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("lock"), unique_topic("lockout")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": 1}], partition=0)
    holder = LocalStateStore(str(tmp_path))
    assert holder.try_lock("rel")  # another run holds the pipeline's lock
    with pytest.raises(RunFailed, match="another run holds pipeline 'rel'"):
        run_pipeline(parse_manifest(manifest(src, dst, tmp_path)), spark)
    assert consume_all(bs, dst) == []
    holder.unlock("rel")
    assert run_pipeline(parse_manifest(manifest(src, dst, tmp_path)), spark).messages_produced == 1


def test_postgres_advisory_lock_blocks_a_second_run(broker, spark, kafka_env, pg_env, pg_database):
    from dpone_dagster.state.postgres import PostgresStateStore

    bs = broker.bootstrap_servers
    src, dst = unique_topic("pglock"), unique_topic("pglockout")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    text = manifest(src, dst, "x").replace("state: {type: local, path: x}", "state: {type: postgres, connection_id: postgres_state}")
    holder = PostgresStateStore(
        {k: v for k, v in pg_database.items()},
        ("etl_state", "dpone_state"),
        ("etl_state", "etl_kafka_offsets"),
    )
    assert holder.try_lock("rel")
    with pytest.raises(RunFailed, match="another run holds pipeline 'rel'"):
        run_pipeline(parse_manifest(text), spark)
    holder.close()  # releases the advisory lock
    produce_json(bs, src, [{"order_id": 9}], partition=0)
    assert run_pipeline(parse_manifest(text), spark).messages_produced == 1


def test_unreachable_broker_fails_before_producing(spark, monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    with pytest.raises(ConfigError, match="cannot reach the Kafka cluster"):
        run_pipeline(parse_manifest(manifest("a", "b", tmp_path)), spark)
    assert LocalStateStore(str(tmp_path)).list_runs("rel")[0].status == "failed"


def test_unreachable_registry_fails_before_producing(broker, spark, kafka_env, monkeypatch, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("sr"), unique_topic("srout")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": 1}], partition=0)
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", "http://127.0.0.1:1")
    sink = "    message_format: avro\n    schema_registry: {enabled: true}"
    with pytest.raises(ConfigError, match="Schema Registry unavailable.*schema_registry_url"):
        run_pipeline(parse_manifest(manifest(src, dst, tmp_path, sink_options=sink)), spark)
    assert consume_all(bs, dst) == []


def test_broker_lost_during_delivery_fails_cleanly_and_keeps_state(spark, monkeypatch, tmp_path):
    """A dedicated broker is stopped after the batch is staged, while producing."""
    broker = EmbeddedBroker().start()
    try:
        bs = broker.bootstrap_servers
        monkeypatch.setenv("KAFKA_CLUSTER_BOOTSTRAP_SERVERS", bs)
        create_topic(bs, "src", 1)
        create_topic(bs, "dst", 1)
        produce_json(bs, "src", [{"order_id": i} for i in range(50)], partition=0)

        def log(message: str) -> None:
            if message == "load: started":
                broker.stop()

        with pytest.raises(RunFailed, match=r"were not delivered: (delivery timed out|broker unavailable|all brokers are down)"):
            run_pipeline(parse_manifest(manifest("src", "dst", tmp_path)), spark, RunRequest(log=log))
        store = LocalStateStore(str(tmp_path))
        assert store.load_offsets("src", "g_src") == {}
        assert store.list_runs("rel")[0].status == "failed"
    finally:
        broker.stop()


# --------------------------------------------------------------------------- classification (pure)


def test_classification_table():
    assert classify_kafka("_TRANSPORT").kind == "retriable"
    assert classify_kafka("NOT_LEADER_FOR_PARTITION").kind == "retriable"
    assert classify_kafka("SASL_AUTHENTICATION_FAILED").kind == "fail_fast"
    assert "sasl_password" in classify_kafka("SASL_AUTHENTICATION_FAILED").fix
    assert classify_kafka("TOPIC_AUTHORIZATION_FAILED").kind == "fail_fast"
    assert classify_kafka("_SSL").kind == "fail_fast"
    assert classify_kafka("MSG_SIZE_TOO_LARGE").kind == "permanent_message"
    assert classify_kafka("SOMETHING_NEW", retriable_flag=True).kind == "retriable"
    assert classify_registry(401).kind == "fail_fast" and classify_registry(503).kind == "retriable"
    assert classify_registry(None).cause == "Schema Registry unavailable"
    assert classify_text("dst: Local: Message timed out (code _MSG_TIMED_OUT)").cause == "delivery timed out"
    assert message_too_large(b"k", b"v" * 10, [("h", b"x")], 12) and not message_too_large(None, b"v", None, 12)


def test_repeated_keys_are_counted_only_among_the_rows_that_are_produced(broker, spark, kafka_env, tmp_path):
    """A key shared with an undecodable record (its key still parsed) or with a skipped delete is
    not a repeated key: reconciliation expects one message per key actually produced."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("shared"), unique_topic("out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    rows = [{"order_id": 1, "amount": 1.5}, {"order_id": 2, "amount": 2.5}, b'{"order_id": 2, "amount": "x"}', None, {"order_id": 3, "amount": 3.5}]
    produce_json(bs, src, rows, partition=0, key=lambda row: b"1" if row is None else None)
    options = "    on_error: skip\n    schema: [{name: order_id, type: long}, {name: amount, type: double}]"
    deletes = "    deletes: {enabled: false, when_disabled: skip}"
    result = run_pipeline(parse_manifest(manifest(src, dst, tmp_path, options, deletes)), spark)
    assert (result.rows_skipped, result.deletes_skipped, result.duplicates_removed) == (1, 1, 0)
    assert sorted(r["value"]["order_id"] for r in consume_all(bs, dst)) == [1, 2, 3]
    assert result.messages_produced == 3
