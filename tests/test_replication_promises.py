"""Exactly-once replication keeps its promises where this machine's broker differs from the real
servers in ways the earlier tests did not look at:

- a source written in transactions, with one still open: the plan ends where a read_committed
  reader can read (the last stable offset), and the rest follows once it commits;
- a changed topic mapping: the run refuses, before creating the new target, instead of reporting
  success for an empty copy;
- two pipelines sharing a commit group: one transactional id per source partition and commit
  group, so the second fences the first (fencing between transactions works on the embedded
  broker; the aborted records' invisibility needs a real Kafka, see test_replication.py);
- the control topic and created targets take the cluster's default replication factor.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from conftest import consume_raw, create_topic, produce_json, unique_topic
from test_replication import control_offsets, payloads, replication_manifest, run

from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.errors import ConfigError
from dpone_dagster.kafka import inspect
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.replication.eos_task import ProducerFenced, ReplicationSpec, TransactionalProducer


def open_transaction(bootstrap: str, topic: str, values: list[bytes]) -> Producer:
    """A transactional producer left with `values` produced in a transaction it has not committed."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"writer-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, partition=0)
    producer.flush(30)
    return producer


def test_the_end_of_a_read_is_the_last_stable_offset(broker):
    """5 committed records, then 3 in an open transaction: a read_committed reader stops at 5,
    so the verified end is 5 (the high watermark is 8); after the commit it is 9, past the marker."""
    bs = broker.bootstrap_servers
    topic = unique_topic("lso")
    create_topic(bs, topic, 1)
    produce_json(bs, topic, [{"n": i} for i in range(5)], partition=0)
    writer = open_transaction(bs, topic, [b'{"n": 5}', b'{"n": 6}', b'{"n": 7}'])
    consumer = inspect.make_consumer({"bootstrap.servers": bs}, "lso-probe")
    try:
        assert inspect.verified_watermarks(consumer, topic, [0])[0].high == 5
        uncommitted = inspect.make_consumer({"bootstrap.servers": bs}, "lso-probe-2", {"isolation.level": "read_uncommitted"})
        assert inspect.verified_watermarks(uncommitted, topic, [0])[0].high == 8
        uncommitted.close()
        writer.commit_transaction(30)
        assert inspect.verified_watermarks(consumer, topic, [0])[0].high == 9  # the commit marker is offset 8
    finally:
        consumer.close()


def test_replicating_a_source_with_an_open_transaction(broker, spark):
    """The run copies what is committed and commits offset 5; the open transaction's records wait
    for the next run, which copies them once they are committed."""
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("txsrc"), unique_topic("ctl")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"n": i} for i in range(5)], partition=0)
    writer = open_transaction(bs, src, [b'{"n": 5}', b'{"n": 6}'])
    manifest = replication_manifest("k2k_lso", {"topic": src}, {"topic_mapping": "prefix", "prefix": "dr."}, ctl)
    first = run(manifest, spark, bs)
    assert first.committed_offsets == {src: {0: 5}}
    assert len(consume_raw(bs, f"dr.{src}")) == 5
    writer.commit_transaction(30)
    second = run(manifest, spark, bs)
    assert second.committed_offsets[src][0] > 5  # the commit marker takes an offset too
    assert payloads(consume_raw(bs, f"dr.{src}")) == [b'{"n": %d}' % i for i in range(7)]
    assert control_offsets(bs, ctl, "k2k_lso") == {(src, 0): second.committed_offsets[src][0]}


def test_a_changed_topic_mapping_is_refused_before_anything_is_written(broker, spark, kafka_env, tmp_path):
    """Replicated into a_<src>, then the prefix becomes b_: the run refuses with the fix, b_<src> is
    not created, the control topic is unchanged; under a commit group of its own the new target is
    copied from the start."""
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("map"), unique_topic("ctl")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"n": i} for i in range(4)], partition=0)

    def manifest(prefix: str, group: str = "orders_copy") -> str:
        return f"""
name: mapped
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  strategy: {{mode: incremental_append}}
  options:
    delivery: {{mode: exactly_once}}
    create_topic: {{enabled: true}}
    replication: {{topic_mapping: prefix, prefix: {prefix}, control_topic: {{name: {ctl}, commit_group: {group}}}}}
state: {{type: local, path: {tmp_path}}}
"""

    assert run_pipeline(parse_manifest(manifest("a_")), spark).messages_produced == 4
    with pytest.raises(ConfigError, match=rf"for target topic 'a_{src}', but the topic mapping now sends it to 'b_{src}'.*commit_group"):
        run_pipeline(parse_manifest(manifest("b_")), spark)
    probe = Consumer({"bootstrap.servers": bs, "group.id": "map-probe"})
    assert f"b_{src}" not in probe.list_topics(timeout=10).topics
    probe.close()
    assert control_offsets(bs, ctl, "orders_copy") == {(src, 0): 4}

    fresh = run_pipeline(parse_manifest(manifest("b_", group="orders_copy_b")), spark)
    assert fresh.messages_produced == 4
    assert payloads(consume_raw(bs, f"b_{src}")) == payloads(consume_raw(bs, src))


def test_pipelines_sharing_a_commit_group_fence_each_other(broker):
    """Two pipelines (a rename, a blue/green switch) committing one commit group's offsets use one
    transactional id per source partition: the second's start fences the first, whose commit
    then fails instead of copying the same range twice."""
    bs = broker.bootstrap_servers
    topic = unique_topic("shared")
    create_topic(bs, topic, 1)

    def spec(pipeline: str) -> ReplicationSpec:
        config = {"bootstrap.servers": bs}
        return ReplicationSpec(
            pipeline=pipeline, run_id=uuid.uuid4().hex, source_config=config, target_config=config, producer_config=config,
            source_topic="orders", source_partition=0, planned_start=0, end=10, target_topic=topic,
            commit_group="orders_copy", control_topic="unused",
        )

    blue, green = spec("orders_blue"), spec("orders_green")
    assert blue.transactional_id == green.transactional_id == "dpone:orders_copy:orders:0"
    first = TransactionalProducer(blue.producer_config, blue.transactional_id, 60_000)
    first.init()
    first.begin()
    first.produce(topic, value=b"blue")
    first.flush(10)
    second = TransactionalProducer(green.producer_config, green.transactional_id, 60_000)
    second.init()
    with pytest.raises(ProducerFenced):
        first.produce(topic, value=b"blue again")
        first.commit()


def test_control_topic_and_targets_take_the_cluster_default_replication_factor(broker, spark):
    """Created with replication_factor -1 (the broker decides; here, one broker: one replica) and
    `dpone plan` says so."""
    from dpone_dagster.engine.plan import build_plan

    bs = broker.bootstrap_servers
    src, ctl = unique_topic("rf"), unique_topic("ctl")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"n": 1}], partition=0)
    manifest = replication_manifest("k2k_rf", {"topic": src}, {"topic_mapping": "prefix", "prefix": "dr."}, ctl, create_topic={"enabled": True})
    assert manifest.sink.options.replication.control_topic.replication_factor == -1
    assert manifest.sink.options.create_topic.replication_factor == -1
    run(manifest, spark, bs)
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "rf-probe"})
    topics = consumer.list_topics(timeout=10).topics
    consumer.close()
    assert ctl in topics and f"dr.{src}" in topics
    plan = build_plan(manifest, probe=False)
    assert plan["sink"]["replication"]["control_topic"]["replication_factor"] == "-1 (the cluster's default.replication.factor)"
    assert plan["sink"]["replication"]["transactional_ids"].startswith("dpone:k2k_rf:<source topic>:<partition>")


def test_a_plain_run_reads_up_to_the_last_stable_offset_too(broker, spark, kafka_env, tmp_path):
    """The same rule for every Kafka source (the read tasks use read_committed): an open
    transaction's records wait for a later run instead of stalling this one."""
    bs = broker.bootstrap_servers
    src, dst = unique_topic("plain_tx"), unique_topic("plain_tx_out")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"n": i} for i in range(3)], partition=0)
    writer = open_transaction(bs, src, [b'{"n": 3}'])
    text = f"""
name: plain_tx
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}}}
sink: {{type: kafka, connection_id: kafka_cluster, topic: {dst}, strategy: {{mode: incremental_append}}}}
state: {{type: local, path: {tmp_path}}}
"""
    m = parse_manifest(text)
    assert run_pipeline(m, spark).committed_offsets == {0: 3}
    writer.commit_transaction(30)
    second = run_pipeline(m, spark)
    assert second.messages_produced == 1
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "plain-tx-probe"})
    assert consumer.get_watermark_offsets(TopicPartition(src, 0), timeout=10)[1] >= second.committed_offsets[0]
    consumer.close()


def test_a_task_of_an_earlier_version_is_fenced_before_the_offset_counts(broker, spark):
    """During an upgrade a task of the earlier version (transactional id dpone-<pipeline>-<topic>-
    <partition>) may still hold a transaction: the new task fences that id before it reads the
    committed offset, so the old task can commit nothing more."""
    bs = broker.bootstrap_servers
    src, ctl = unique_topic("legacy"), unique_topic("ctl")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"n": i} for i in range(3)], partition=0)
    manifest = replication_manifest("k2k_legacy", {"topic": src}, {"topic_mapping": "prefix", "prefix": "dr."}, ctl)
    create_topic(bs, f"dr.{src}", 1)
    old = TransactionalProducer({"bootstrap.servers": bs}, f"dpone-k2k_legacy-{src}-0", 60_000)
    old.init()
    old.begin()
    old.produce(f"dr.{src}", value=b"old version")
    old.flush(10)
    assert run(manifest, spark, bs).committed_offsets == {src: {0: 3}}
    with pytest.raises(ProducerFenced):
        old.produce(f"dr.{src}", value=b"old version, again")
        old.commit()
