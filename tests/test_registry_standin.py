"""Runs against a Schema Registry that behaves like the real server where confluent-kafka's in-memory
`mock://` client does not: protobuf schemas served as `.proto` text unless `format=serialized` is
asked, and 409 for a version that breaks the subject's compatibility (decided by the Apache `avro`
package). No registry server can be installed here, so `registry_standin.py` is a small real HTTP
stand-in for one (see its docstring for what it does and does not do).

Covered: a protobuf source written by confluent's ProtobufSerializer decodes; an Avro subject another
producer registered evolves from its registered schema (record name, enum, timestamp-millis,
defaults, docs, field order kept), and old and new records resolve against the new version; a truly
incompatible change is refused by the project before anything is produced.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from conftest import consume_all, consume_raw, create_topic, kafka_pipeline_yaml, produce_json, unique_topic
from registry_standin import RegistryStandIn, running_standin
from registry_standin import registry_standin as registry_standin_fixture

from dpone_dagster.engine.run import run_pipeline
from dpone_dagster.errors import ConfigError, DataRefused
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.schema import protobuf
from dpone_dagster.schema.registry import registry_client, schemas_by_id
from dpone_dagster.schema.wire_format import unframe

registry_standin = registry_standin_fixture  # the fixture, under the name the tests ask for

# The subject as another producer registered it: a named record with an enum, timestamp-millis, a
# field with a default and docs. A batch adding one nullable column must keep all of it.
SHOP_ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "com.acme",
    "doc": "An order as the shop writes it",
    "fields": [
        {"name": "order_id", "type": "long", "doc": "shop order number"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "channel", "type": "string", "default": "web"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "amount",
            "type": [
                "null",
                {"type": "fixed", "name": "Amount", "size": 5, "logicalType": "decimal", "precision": 10, "scale": 2},
            ],
            "default": None,
        },
    ],
}
OLD_ROWS = [
    {"order_id": 1, "status": "PAID", "created": datetime(2024, 4, 30, 9, 0, 0, 250_000, UTC), "channel": "app",
     "note": None, "amount": Decimal("12.50")},
    {"order_id": 2, "status": "NEW", "created": datetime(2024, 4, 30, 9, 5, 0, 0, UTC), "channel": "web",
     "note": "call first", "amount": None},
]
DECLARED = (
    "[{name: order_id, type: long}, {name: status, type: string}, {name: created, type: timestamp}, "
    "{name: note, type: string}"
)


@pytest.fixture
def proto_module(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "proto"))
    import dpone_test_orders_pb2

    return dpone_test_orders_pb2


def _manifest(src: str, dst: str, tmp_path, sink_options: str, source_options: str, key: str = "order_id"):
    strategy = f"{{mode: incremental_append, unique_key: {key}}}"
    text = kafka_pipeline_yaml("standin", src, dst, tmp_path, strategy, sink_options, source_options=source_options)
    return parse_manifest(text)


def _topics(bs: str, *prefixes: str) -> list[str]:
    names = [unique_topic(p) for p in prefixes]
    for name in names:
        create_topic(bs, name, 1)
    return names


def _other_producer_writes(registry: RegistryStandIn, bs: str, topic: str) -> int:
    """The shop's producer: registers SHOP_ORDER under `<topic>-value` and writes OLD_ROWS."""
    client = SchemaRegistryClient({"url": registry.url})
    serializer = AvroSerializer(client, json.dumps(SHOP_ORDER))
    producer = Producer({"bootstrap.servers": bs})
    for row in OLD_ROWS:
        producer.produce(topic, key=str(row["order_id"]), value=serializer(row, SerializationContext(topic, MessageField.VALUE)))
    assert producer.flush(30) == 0
    return registry.latest(f"{topic}-value")[1].schema_id


def _read(value: bytes, writer: dict, reader: dict) -> dict:
    _, _, payload = unframe(value)
    return fastavro.schemaless_reader(io.BytesIO(payload), fastavro.parse_schema(writer), fastavro.parse_schema(reader))


# --------------------------------------------------------------------------- the stand-in itself


def test_the_standin_serves_proto_text_unless_serialized_is_asked_and_refuses_incompatible_versions(proto_module):
    with running_standin() as registry:
        client = SchemaRegistryClient({"url": registry.url})
        schema_id = client.register_schema("orders-value", Schema(protobuf.schema_string(proto_module.Order), "PROTOBUF"))
        text = SchemaRegistryClient({"url": registry.url}).get_schema(schema_id).schema_str
        assert text.startswith('syntax = "proto3";') and "message Order {" in text
        serialized = SchemaRegistryClient({"url": registry.url}).get_schema(schema_id, fmt="serialized").schema_str
        assert serialized == protobuf.schema_string(proto_module.Order)

        client.register_schema("shop-value", Schema(json.dumps(SHOP_ORDER), "AVRO"))
        renamed = {**SHOP_ORDER, "name": "orders", "namespace": "dpone"}
        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema("shop-value", Schema(json.dumps(renamed), "AVRO"))
        assert refused.value.http_status_code == 409


# --------------------------------------------------------------------------- (a) protobuf source


def test_protobuf_source_written_by_confluents_serializer_decodes_every_record(
    broker, spark, registry_standin, proto_module, tmp_path
):
    pb = proto_module
    bs = broker.bootstrap_servers
    src, dst = _topics(bs, "pbsrc", "pbdst")
    serializer = ProtobufSerializer(pb.Order, SchemaRegistryClient({"url": registry_standin.url}), {"use.deprecated.format": False})
    orders = [
        pb.Order(id=1, name="Ada", amount=2.5, tags=["a", "b"], status=pb.SHIPPED, address=pb.Address(city="Oslo"),
                 counts={"x": 3}, lines=[pb.Order.Line(sku="s1", qty=2)]),
        pb.Order(id=2, status=pb.NEW),
        pb.Order(id=3, name="Bo", qty=7, active=True),
    ]
    producer = Producer({"bootstrap.servers": bs})
    for order in orders:
        producer.produce(src, key=str(order.id), value=serializer(order, SerializationContext(src, MessageField.VALUE)))
    assert producer.flush(30) == 0

    source = f"{{group_id: g_{src}, message_format: protobuf, schema_registry: {{enabled: true}}}}"
    result = run_pipeline(_manifest(src, dst, tmp_path, "{message_format: json}", source, key="id"), spark)

    assert result.messages_produced == 3
    values = {r["value"]["id"]: r["value"] for r in consume_all(bs, dst)}
    assert values[1]["name"] == "Ada" and values[1]["amount"] == 2.5 and values[1]["tags"] == ["a", "b"]
    assert values[1]["status"] == "SHIPPED" and values[1]["address"]["city"] == "Oslo"
    assert values[1]["counts"] == {"x": 3} and values[1]["lines"] == [{"sku": "s1", "qty": 2}]
    assert values[2]["status"] == "NEW" and values[2].get("name") is None
    assert values[3]["name"] == "Bo" and values[3]["qty"] == 7 and values[3]["active"] is True
    # The project asked for the serialized form: a registry serves .proto text otherwise.
    reads = [e for e in registry_standin.exchanges if e.method == "GET" and e.status == 200]
    assert any(e.query.get("format") == "serialized" for e in reads)


def test_protobuf_schema_read_with_format_serialized_at_once(proto_module):
    with running_standin() as registry:
        schema_id = SchemaRegistryClient({"url": registry.url}).register_schema(
            "orders-value", Schema(protobuf.schema_string(proto_module.Order), "PROTOBUF")
        )
        found = schemas_by_id(registry_client({"url": registry.url}), [schema_id], message_format="protobuf")
        assert found == {schema_id: ("PROTOBUF", protobuf.schema_string(proto_module.Order))}
        assert [e.query.get("format") for e in registry.exchanges if e.path.startswith("/schemas/ids/")] == ["serialized"]


def test_a_registry_that_only_serves_proto_text_is_a_clear_error(proto_module, monkeypatch):
    with running_standin() as registry:
        schema_id = SchemaRegistryClient({"url": registry.url}).register_schema(
            "orders-value", Schema(protobuf.schema_string(proto_module.Order), "PROTOBUF")
        )
        text_only = RegistryStandIn._served
        monkeypatch.setattr(RegistryStandIn, "_served", lambda self, stored, fmt: text_only(self, stored, None))
        for message_format in (None, "protobuf"):
            with pytest.raises(ConfigError, match=r"came back as \.proto text although format=serialized was asked"):
                schemas_by_id(registry_client({"url": registry.url}), [schema_id], message_format=message_format)
    # A text schema reaching an executor names the cause, not "Incorrect padding".
    with pytest.raises(ValueError, match=r"is \.proto text, not a base64 FileDescriptorProto"):
        protobuf.message_class_from_schema('syntax = "proto3";\nmessage Order {\n  int64 id = 1;\n}\n', [0])


# --------------------------------------------------------------------------- (b) evolving another producer's subject


def test_evolving_another_producers_subject_keeps_its_schema_and_adds_the_column(broker, spark, registry_standin, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = _topics(bs, "evsrc", "evdst")
    subject = f"{dst}-value"
    old_id = _other_producer_writes(registry_standin, bs, dst)
    produce_json(bs, src, [
        {"order_id": 3, "status": "SHIPPED", "created": "2024-05-01T10:00:00.123Z", "note": "gift", "coupon": "X1"},
        {"order_id": 4, "status": "NEW", "created": "2024-05-01T11:30:00Z", "note": None, "coupon": None},
    ], partition=0)
    source = f"{{group_id: g_{src}, schema: {DECLARED}, {{name: coupon, type: string}}]}}"
    sink = "{message_format: avro, schema_registry: {enabled: true}}"

    result = run_pipeline(_manifest(src, dst, tmp_path, sink, source), spark)

    assert result.messages_produced == 2
    assert not registry_standin.answered(409)
    version, latest = registry_standin.latest(subject)
    assert version == 2 and result.schema_evolution["schema_id"] == latest.schema_id != old_id
    new = json.loads(latest.text)
    assert (new["name"], new["namespace"], new["doc"]) == ("Order", "com.acme", SHOP_ORDER["doc"])
    assert new["fields"][: len(SHOP_ORDER["fields"])] == SHOP_ORDER["fields"]  # types, defaults, docs, order
    assert new["fields"][len(SHOP_ORDER["fields"]):] == [{"name": "coupon", "type": ["null", "string"], "default": None}]

    records = consume_raw(bs, dst)
    old_records = [r for r in records if unframe(r["value"])[0] == old_id]
    run_records = [r for r in records if unframe(r["value"])[0] == latest.schema_id]
    assert len(old_records) == 2 and len(run_records) == 2
    # Records the other producer wrote resolve against the new version (reader schema).
    old_values = sorted((_read(r["value"], SHOP_ORDER, new) for r in old_records), key=lambda v: v["order_id"])
    assert [(v["order_id"], v["status"], v["created"], v["channel"], v["amount"], v["coupon"]) for v in old_values] == [
        (1, "PAID", OLD_ROWS[0]["created"], "app", Decimal("12.50"), None),
        (2, "NEW", OLD_ROWS[1]["created"], "web", None, None),
    ]
    # The run's records are written with exactly that version: enum symbols, milliseconds, defaults.
    values = sorted((_read(r["value"], new, new) for r in run_records), key=lambda v: v["order_id"])
    assert [(v["order_id"], v["status"], v["created"], v["channel"], v["note"], v["amount"], v["coupon"]) for v in values] == [
        (3, "SHIPPED", datetime(2024, 5, 1, 10, 0, 0, 123_000, UTC), "web", "gift", None, "X1"),
        (4, "NEW", datetime(2024, 5, 1, 11, 30, tzinfo=UTC), "web", None, None, None),
    ]
    # ... and readers still on the old version read them too.
    assert [_read(r["value"], new, SHOP_ORDER)["status"] for r in run_records] in (["SHIPPED", "NEW"], ["NEW", "SHIPPED"])


# --------------------------------------------------------------------------- (c) a truly incompatible change


@pytest.mark.parametrize(
    ("column", "declared", "value", "registry_would_see"),
    [
        # Spark sees decimal(10,2) -> decimal(20,2), a widening; in Avro the registered type is a
        # fixed of 5 bytes, which no wider decimal can replace: only an Avro-level check sees it.
        ("amount", "decimal(20,2)", 123456789012.25, {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 2}),
        ("order_id", "string", "A-7", "string"),
    ],
    ids=["fixed_decimal_widened", "long_to_string"],
)
def test_a_truly_incompatible_change_is_refused_before_producing(
    broker, spark, registry_standin, tmp_path, column, declared, value, registry_would_see
):
    bs = broker.bootstrap_servers
    src, dst = _topics(bs, "insrc", "indst")
    subject = f"{dst}-value"
    _other_producer_writes(registry_standin, bs, dst)
    row = {"order_id": 5, "status": "NEW", "created": "2024-05-02T08:00:00Z", "note": None, column: value}
    produce_json(bs, src, [row], partition=0)
    columns = DECLARED.replace("{name: order_id, type: long}", "{name: order_id, type: string}") if column == "order_id" else (
        f"{DECLARED}, {{name: {column}, type: '{declared}'}}"
    )
    source = f"{{group_id: g_{src}, schema: {columns}]}}"
    sink = "{message_format: avro, schema_registry: {enabled: true}}"
    posts_before = len([e for e in registry_standin.exchanges if e.method == "POST"])

    with pytest.raises(ConfigError, match=rf"breaking schema change for subject '{subject}' under BACKWARD.*{column}: "):
        run_pipeline(_manifest(src, dst, tmp_path, sink, source), spark)

    assert len(consume_raw(bs, dst)) == len(OLD_ROWS)  # nothing produced
    assert [e for e in registry_standin.exchanges if e.method == "POST"][posts_before:] == []  # nothing registered
    assert registry_standin.latest(subject)[0] == 1
    # The registry would have refused that change with 409.
    changed = json.loads(json.dumps(SHOP_ORDER))
    field = next(f for f in changed["fields"] if f["name"] == column)
    field["type"] = ["null", registry_would_see] if isinstance(field["type"], list) else registry_would_see
    with pytest.raises(SchemaRegistryError) as refused:
        SchemaRegistryClient({"url": registry_standin.url}).register_schema(subject, Schema(json.dumps(changed), "AVRO"))
    assert refused.value.http_status_code == 409


def test_a_value_that_is_not_a_symbol_of_the_registered_enum_is_refused_before_producing(
    broker, spark, registry_standin, tmp_path
):
    bs = broker.bootstrap_servers
    src, dst = _topics(bs, "ensrc", "endst")
    _other_producer_writes(registry_standin, bs, dst)
    produce_json(bs, src, [
        {"order_id": 6, "status": "PAID", "created": "2024-05-03T08:00:00Z", "note": None},
        {"order_id": 7, "status": "LOST", "created": "2024-05-03T09:00:00Z", "note": None},
    ], partition=0)
    source = f"{{group_id: g_{src}, schema: {DECLARED}]}}"
    sink = "{message_format: avro, schema_registry: {enabled: true}}"

    with pytest.raises(DataRefused, match=r"status: 1 value\(s\) such as 'LOST' are not symbols of enum com\.acme\.Status"):
        run_pipeline(_manifest(src, dst, tmp_path, sink, source), spark)
    assert len(consume_raw(bs, dst)) == len(OLD_ROWS)  # nothing produced
