"""Schema Registry formats through the whole engine: source decode, sink encode, subject
strategies, auto-register, evolution (add, widen, breaking, new_column routing), bad payloads.

No Confluent-compatible registry server can run here: the registry is confluent-kafka's own
in-memory client (`mock://`), the same serializers and wire format; Spark executors never call it.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from conftest import create_topic, produce_json, unique_topic

from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.schema.registry import registry_client

ORDER_AVRO = """{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "order_id", "type": "long"},
  {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}], "default": null},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "created", "type": {"type": "long", "logicalType": "timestamp-micros"}}
]}"""


@pytest.fixture
def registry(monkeypatch, kafka_env):
    url = f"mock://{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", url)
    return registry_client({"url": url})


def manifest(src: str, dst: str, tmp_path, sink_options: str, source_options: str = "", strategy: str = "incremental_append") -> str:
    return f"""
name: reg
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
  strategy: {{mode: {strategy}, unique_key: order_id}}
  options:
{sink_options}
state: {{type: local, path: {tmp_path}}}
"""


def read_values(bs: str, topic: str, deserializer) -> list[dict | None]:
    consumer = Consumer({"bootstrap.servers": bs, "group.id": uuid.uuid4().hex, "enable.partition.eof": True})
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    pending, out = set(partitions), []
    while pending:
        m = consumer.poll(10)
        assert m is not None, "timed out reading the sink topic"
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                pending.discard(m.partition())
            continue
        value = m.value()
        out.append(None if value is None else deserializer(value, SerializationContext(topic, MessageField.VALUE)))
    consumer.close()
    return out


def test_avro_source_to_avro_sink_round_trip(broker, spark, registry, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("asrc"), unique_topic("adst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    serializer = AvroSerializer(registry, ORDER_AVRO)
    producer = Producer({"bootstrap.servers": bs})
    rows = [
        {"order_id": 1, "amount": Decimal("12.34"), "note": None, "created": 1_700_000_000_123_456},
        {"order_id": 2, "amount": None, "note": "gift", "created": 1_700_000_100_000_000},
    ]
    from datetime import UTC, datetime

    for row in rows:
        datum = {**row, "created": datetime.fromtimestamp(row["created"] / 1e6, UTC)}
        producer.produce(src, key=str(row["order_id"]), value=serializer(datum, SerializationContext(src, MessageField.VALUE)))
    producer.flush(10)

    sink = "    message_format: avro\n    schema_registry: {enabled: true, subject_name_strategy: topic}"
    source = "    message_format: avro\n    schema_registry: {enabled: true}"
    result = run_pipeline(parse_manifest(manifest(src, dst, tmp_path, sink, source)), spark)
    assert result.messages_produced == 2
    assert result.schema_evolution["subject"] == f"{dst}-value"
    out = sorted(read_values(bs, dst, AvroDeserializer(registry)), key=lambda r: r["order_id"])
    assert out[0]["amount"] == Decimal("12.34") and out[0]["note"] is None
    assert out[1]["amount"] is None and out[1]["note"] == "gift"
    assert int(out[0]["created"].timestamp() * 1_000_000) == 1_700_000_000_123_456


def test_json_source_to_avro_sink_evolves_the_subject(broker, spark, registry, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("jsrc"), unique_topic("jdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    sink = "    message_format: avro\n    schema_registry: {enabled: true, record_name: Order, record_namespace: shop}"
    m = parse_manifest(manifest(src, dst, tmp_path, sink))

    produce_json(bs, src, [{"order_id": 1, "qty": 2}], partition=0)
    first = run_pipeline(m, spark)
    v1 = registry.get_latest_version(f"{dst}-value")
    assert first.schema_evolution["schema_id"] == v1.schema_id and '"name": "Order"' in v1.schema.schema_str

    # A new nullable field is a safe addition: registered as version 2.
    produce_json(bs, src, [{"order_id": 2, "qty": 3, "coupon": "X1"}], partition=0)
    second = run_pipeline(m, spark)
    kinds = {a["kind"] for a in second.schema_evolution["evolution"]["actions"]}
    assert "add" in kinds
    v2 = registry.get_latest_version(f"{dst}-value")
    assert v2.version == v1.version + 1 and "coupon" in v2.schema.schema_str

    values = read_values(bs, dst, AvroDeserializer(registry))
    assert {v["order_id"]: v.get("coupon") for v in values} == {1: None, 2: "X1"}

    # A breaking change (qty becomes text) fails before anything is produced.
    produce_json(bs, src, [{"order_id": 3, "qty": "many"}], partition=0)
    with pytest.raises(ConfigError, match=r"breaking schema change for subject .*qty"):
        run_pipeline(m, spark)
    assert len(read_values(bs, dst, AvroDeserializer(registry))) == 2


def test_type_change_routed_to_a_new_column(broker, spark, registry, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("rsrc"), unique_topic("rdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    sink = "    message_format: avro\n    on_type_change: new_column\n    schema_registry: {enabled: true}"
    m = parse_manifest(manifest(src, dst, tmp_path, sink))
    produce_json(bs, src, [{"order_id": 1, "qty": 2}], partition=0)
    run_pipeline(m, spark)
    produce_json(bs, src, [{"order_id": 2, "qty": "many"}], partition=0)
    result = run_pipeline(m, spark)
    assert any(a["kind"] == "route_new_column" for a in result.schema_evolution["evolution"]["actions"])
    values = {v["order_id"]: v for v in read_values(bs, dst, AvroDeserializer(registry))}
    assert values[1]["qty"] == 2
    assert values[2]["qty"] is None and values[2]["__dpone__nc__qty"] == "many"


def test_json_schema_sink_and_record_subject_strategy(broker, spark, registry, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("ssrc"), unique_topic("sdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": 5, "name": "Ada"}], partition=0)
    sink = (
        "    message_format: json_schema\n"
        "    schema_registry: {enabled: true, subject_name_strategy: record, record_name: Order, record_namespace: shop}"
    )
    result = run_pipeline(parse_manifest(manifest(src, dst, tmp_path, sink)), spark)
    assert result.schema_evolution["subject"] == "shop.Order"
    schema = registry.get_latest_version("shop.Order").schema
    [value] = read_values(bs, dst, JSONDeserializer(schema.schema_str, schema_registry_client=registry))
    assert value == {"order_id": 5, "name": "Ada"}


def test_auto_register_off_with_a_missing_subject_is_a_clear_error(broker, spark, registry, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("nsrc"), unique_topic("ndst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": 1}], partition=0)
    sink = "    message_format: avro\n    schema_registry: {enabled: true, auto_register_schemas: false}"
    with pytest.raises(ConfigError, match=rf"subject '{dst}-value' does not exist and auto_register_schemas is false"):
        run_pipeline(parse_manifest(manifest(src, dst, tmp_path, sink)), spark)


def test_wrong_magic_byte_and_unknown_schema_id_fail_with_the_reason(broker, spark, registry, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("bsrc"), unique_topic("bdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": 1}], partition=0)  # plain JSON: magic byte 0x7b
    producer = Producer({"bootstrap.servers": bs})
    producer.produce(src, value=b"\x00\x00\x00\x03\xe7\x02")  # schema id 999
    producer.flush(10)
    source = "    message_format: avro\n    schema_registry: {enabled: true}"
    with pytest.raises(RunFailed, match=r"2 record\(s\) .* could not be decoded (?=.*unknown schema id 999)(?=.*wrong magic byte 0x7b)"):
        run_pipeline(parse_manifest(manifest(src, dst, tmp_path, "    message_format: json", source)), spark)


def test_protobuf_sink_with_a_generated_class(broker, spark, registry, tmp_path, monkeypatch):
    from pathlib import Path

    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "proto"))
    import dpone_test_orders_pb2 as pb

    bs = broker.bootstrap_servers
    src, dst = unique_topic("psrc"), unique_topic("pdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"id": 7, "name": "Ada", "amount": 2.5, "tags": ["a", "b"]}], partition=0)
    sink = "    message_format: protobuf\n    schema_registry: {enabled: true, protobuf_message: 'dpone_test_orders_pb2:Order'}"
    text = manifest(src, dst, tmp_path, sink).replace("unique_key: order_id", "unique_key: id")
    result = run_pipeline(parse_manifest(text), spark)
    assert result.messages_produced == 1 and result.schema_evolution["subject"] == f"{dst}-value"
    [message] = read_values(bs, dst, ProtobufDeserializer(pb.Order, {"use.deprecated.format": False}))
    assert (message.id, message.name, message.amount, list(message.tags)) == (7, "Ada", 2.5, ["a", "b"])
