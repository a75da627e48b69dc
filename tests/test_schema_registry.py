"""Schema Registry formats (avro, json_schema, protobuf): schema mapping, registration, the wire
format, and Spark round trips checked against confluent-kafka's own serializers/deserializers on
the same in-memory registry (driver side), plus an end-to-end trip through the embedded broker."""

from __future__ import annotations

import base64
import importlib
import json
import sys
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.schema_registry import topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from conftest import create_topic, unique_topic
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from dpone_dagster import columns as C
from dpone_dagster.errors import ConfigError
from dpone_dagster.kafka.boundary import ReadTask
from dpone_dagster.schema import avro, json_schema, protobuf, registry
from dpone_dagster.schema.evolution import plan_evolution
from dpone_dagster.schema.registry import (
    ensure_registered,
    fetch_latest,
    schemas_by_id,
    subject_name,
)
from dpone_dagster.schema.wire_format import WireFormatError, frame, unframe
from dpone_dagster.sinks.kafka import ProducerSettings, produce
from dpone_dagster.sources.kafka_reader import RAW_SCHEMA, ReaderSettings, read_ranges
from dpone_dagster.spark.decode import decode_json
from dpone_dagster.spark.registry_codec import (
    KeyEncoding,
    apply_routes,
    decode_registry,
    distinct_schema_ids,
    encode_registry,
    key_schema,
)

try:  # confluent's protobuf serde imports google.type (package googleapis-common-protos)
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
except ImportError:  # pragma: no cover - depends on the installed extras
    ProtobufDeserializer = ProtobufSerializer = None  # type: ignore[assignment,misc]

needs_confluent_protobuf = pytest.mark.skipif(
    ProtobufSerializer is None,
    reason="confluent's ProtobufSerializer needs googleapis-common-protos (add it to the dev extra)",
)
PROTO_DIR = Path(__file__).parent / "proto"

# --------------------------------------------------------------------------- fixtures and data


@pytest.fixture(scope="module")
def pb():
    """The generated test message module (tests/proto/dpone_test_orders.proto)."""
    sys.path.insert(0, str(PROTO_DIR))
    try:
        yield importlib.import_module("dpone_test_orders_pb2")
    finally:
        sys.path.remove(str(PROTO_DIR))


@pytest.fixture
def client():
    return registry.registry_client({"url": f"mock://{uuid.uuid4().hex}"})


ADDRESS = StructType([StructField("city", StringType()), StructField("zip", StringType())])
LINE = StructType([StructField("sku", StringType()), StructField("qty", IntegerType())])
SCHEMA = StructType(
    [
        StructField("id", LongType(), False),
        StructField("name", StringType()),
        StructField("amount", DecimalType(18, 2)),
        StructField("big", DecimalType(38, 10)),
        StructField("ts", TimestampType()),
        StructField("local_ts", TimestampNTZType()),
        StructField("day", DateType()),
        StructField("score", DoubleType()),
        StructField("ratio", FloatType()),
        StructField("qty", IntegerType()),
        StructField("active", BooleanType()),
        StructField("blob", BinaryType()),
        StructField("tags", ArrayType(StringType())),
        StructField("address", ADDRESS),
        StructField("lines", ArrayType(LINE)),
        StructField("attrs", MapType(StringType(), LongType())),
    ]
)
EMPTY = {f.name: None for f in SCHEMA.fields}
ROWS: list[dict[str, Any]] = [
    {
        "id": 1,
        "name": "Ada",
        "amount": Decimal("1234567890123456.78"),
        "big": Decimal("-1234567890123456789012345678.0123456789"),
        "ts": datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        "local_ts": datetime(2024, 1, 2, 23, 59, 59, 1),
        "day": date(2024, 2, 29),
        "score": 0.1,
        "ratio": 0.5,
        "qty": -7,
        "active": True,
        "blob": b"\x00\xffbin",
        "tags": ["a", "b"],
        "address": {"city": "Paris", "zip": None},
        "lines": [{"sku": "s1", "qty": 2}, {"sku": None, "qty": None}],
        "attrs": {"k": 1, "z": -2},
    },
    {**EMPTY, "id": 2},
    {**EMPTY, "id": 3, "amount": Decimal("-0.05"), "tags": [], "lines": [], "attrs": {}, "address": {"city": None, "zip": "75"}},
]


def _python(value: Any, dtype: DataType) -> Any:
    """A collected Spark value in the form of ROWS (dicts, UTC-aware timestamps)."""
    if value is None:
        return None
    if isinstance(dtype, StructType):
        return {f.name: _python(value[f.name], f.dataType) for f in dtype.fields}
    if isinstance(dtype, ArrayType):
        return [_python(v, dtype.elementType) for v in value]
    if isinstance(dtype, MapType):
        return {k: _python(v, dtype.valueType) for k, v in value.items()}
    if isinstance(dtype, TimestampType):
        return value.astimezone(UTC)  # PySpark collects naive local time
    if isinstance(dtype, BinaryType):
        return bytes(value)
    return value


def collect_rows(df: DataFrame, schema: StructType) -> list[dict[str, Any]]:
    return [_python(row, schema) for row in df.select(*schema.names).orderBy("id").collect()]


def raw_df(spark, values: list[bytes | None], topic: str = "src", partition: int = 0) -> DataFrame:
    rows = [(topic, partition, offset, 1_700_000_000_000 + offset, None, v, None) for offset, v in enumerate(values)]
    return spark.createDataFrame(rows, RAW_SCHEMA)


def ctx(topic: str, field: str = MessageField.VALUE) -> SerializationContext:
    return SerializationContext(topic, field)


SERDE_CONF = {"subject.name.strategy": topic_subject_name_strategy}


def json_ready(value: Any) -> Any:
    """Independent JSON form of ROWS values for confluent's JSONSerializer (decimals as text)."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def registered(client, topic: str, fmt: str, schema: StructType = SCHEMA) -> tuple[int, str]:
    if fmt == "avro":
        text = json.dumps(avro.spark_to_avro(schema, "Order", "dpone.test"))
    else:
        text = json.dumps(json_schema.spark_to_json_schema(schema, "Order"))
    return ensure_registered(client, f"{topic}-value", text, fmt, auto_register=True), text


# --------------------------------------------------------------------------- subjects and registration


def test_subject_name_strategies():
    assert subject_name("topic", "orders", None) == "orders-value"
    assert subject_name("topic", "orders", "x.Order", is_key=True) == "orders-key"
    assert subject_name("record", "orders", "dpone.test.Order") == "dpone.test.Order"
    assert subject_name("topic_record", "orders", "dpone.test.Order") == "orders-dpone.test.Order"
    with pytest.raises(ConfigError, match="record_name"):
        subject_name("record", "orders", None)


def test_record_fullnames_for_record_strategies(pb):
    schema = avro.spark_to_avro(SCHEMA, "Order", "dpone.test")
    assert avro.avro_fullname(schema) == "dpone.test.Order"
    assert json_schema.json_schema_title(json_schema.spark_to_json_schema(SCHEMA, "Order")) == "Order"
    assert pb.Order.DESCRIPTOR.full_name == "dpone.test.Order"
    assert avro.safe_name("orders.events-v1") == "orders_events_v1"


def test_auto_register_on_registers_once(client):
    text = json.dumps(avro.spark_to_avro(SCHEMA, "Order", "dpone.test"))
    first = ensure_registered(client, "orders-value", text, "avro", auto_register=True)
    assert ensure_registered(client, "orders-value", text, "AVRO", auto_register=True) == first
    latest = fetch_latest(client, "orders-value")
    assert latest is not None and latest.schema_id == first and latest.version == 1
    assert fetch_latest(client, "missing-value") is None


def test_auto_register_off_needs_the_subject(client):
    text = json.dumps(avro.spark_to_avro(SCHEMA, "Order", "dpone.test"))
    with pytest.raises(ConfigError) as missing:
        ensure_registered(client, "orders-value", text, "avro", auto_register=False)
    message = str(missing.value)
    assert "'orders-value' does not exist" in message and "auto_register_schemas: true" in message
    schema_id = ensure_registered(client, "orders-value", text, "avro", auto_register=True)
    assert ensure_registered(client, "orders-value", text, "avro", auto_register=False) == schema_id
    other = json.dumps(avro.spark_to_avro(StructType(SCHEMA.fields[:3]), "Order", "dpone.test"))
    with pytest.raises(ConfigError, match="not registered under 'orders-value'.*latest is version 1"):
        ensure_registered(client, "orders-value", other, "avro", auto_register=False)


def test_schemas_by_id_leaves_unknown_ids_out(client):
    schema_id, text = registered(client, "orders", "json_schema")
    assert schemas_by_id(client, [schema_id, 999]) == {schema_id: ("JSON", text)}


def test_mock_urls_share_one_registry_per_process():
    url = f"mock://{uuid.uuid4().hex}"
    assert registry.registry_client({"url": url}) is registry.registry_client({"url": url})


# --------------------------------------------------------------------------- wire format


@pytest.mark.parametrize(
    ("indexes", "encoded"), [([0], b"\x00"), ([1], b"\x02\x02"), ([0, 0], b"\x04\x00\x00"), ([2, 70], b"\x04\x04\x8c\x01")]
)
def test_message_index_framing(indexes, encoded):
    framed = frame(7, b"payload", indexes)
    assert framed == b"\x00\x00\x00\x00\x07" + encoded + b"payload"
    assert unframe(framed, with_indexes=True) == (7, indexes, b"payload")


@needs_confluent_protobuf
@pytest.mark.parametrize("indexes", [[0], [1], [0, 0], [2, 70]])
def test_message_index_encoding_matches_confluent(indexes):
    import io

    buffer = io.BytesIO()  # the same bytes as confluent's own encoder
    ProtobufSerializer._encode_varints(buffer, indexes)
    assert frame(7, b"", indexes) == b"\x00\x00\x00\x00\x07" + buffer.getvalue()


def test_unframe_errors():
    assert unframe(frame(258, b"x")) == (258, None, b"x")
    with pytest.raises(WireFormatError, match="wrong magic byte 0x7b"):
        unframe(b'{"id": 1}')
    with pytest.raises(WireFormatError, match="too short"):
        unframe(b"\x00\x00\x01")
    with pytest.raises(WireFormatError, match="truncated"):
        unframe(b"\x00\x00\x00\x00\x01\x02\x82\x80", with_indexes=True)
    with pytest.raises(WireFormatError, match="bad protobuf message index count"):
        unframe(b"\x00\x00\x00\x00\x01\x04\x02", with_indexes=True)


# --------------------------------------------------------------------------- schema mapping


def test_spark_to_avro_mapping():
    schema = avro.spark_to_avro(SCHEMA, "Order", "dpone.test")
    fields = {f["name"]: f for f in schema["fields"]}
    assert schema["name"] == "Order" and schema["namespace"] == "dpone.test"
    assert fields["id"] == {"name": "id", "type": "long"}
    assert fields["amount"] == {
        "name": "amount",
        "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 2}],
        "default": None,
    }
    assert fields["ts"]["type"][1] == {"type": "long", "logicalType": "timestamp-micros"}
    assert fields["local_ts"]["type"][1] == {"type": "long", "logicalType": "local-timestamp-micros"}
    assert fields["day"]["type"][1] == {"type": "int", "logicalType": "date"}
    assert fields["address"]["type"][1]["name"] == "Order_address"
    assert fields["lines"]["type"][1]["items"][1]["name"] == "Order_lines"
    assert fields["attrs"]["type"][1] == {"type": "map", "values": ["null", "long"]}
    assert avro.avro_to_spark(schema) == SCHEMA
    assert avro.avro_to_spark(json.dumps(schema)) == SCHEMA


def test_avro_to_spark_reads_foreign_schemas():
    foreign = {
        "type": "record",
        "name": "Event",
        "namespace": "x",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
            {"name": "again", "type": ["null", "Kind"], "default": None},
            {"name": "price", "type": {"type": "fixed", "name": "P", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 3}},
            {"name": "either", "type": ["null", "string", "long"], "default": None},
            {"name": "retries", "type": "int", "default": 3},
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        ],
    }
    spark_schema = avro.avro_to_spark(foreign)
    assert [(f.name, f.dataType, f.nullable) for f in spark_schema.fields] == [
        ("at", TimestampType(), False),
        ("kind", StringType(), False),
        ("again", StringType(), True),
        ("price", DecimalType(12, 3), False),
        ("either", StringType(), True),
        ("retries", IntegerType(), False),
        ("id", StringType(), False),
    ]
    assert spark_schema["retries"].metadata == {registry.DEFAULT_KEY: 3}


def test_avro_mapping_refuses_what_it_cannot_represent():
    recursive = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    with pytest.raises(ConfigError, match="recursive Avro type Node"):
        avro.avro_to_spark(recursive)
    with pytest.raises(ConfigError, match="not valid Avro names"):
        avro.spark_to_avro(StructType([StructField("order-id", LongType())]), "R", None)
    with pytest.raises(ConfigError, match="map keys are strings"):
        avro.spark_to_avro(StructType([StructField("m", MapType(LongType(), LongType()))]), "R", None)


def test_json_schema_mapping_round_trips_and_reads_foreign_schemas():
    schema = json_schema.spark_to_json_schema(SCHEMA, "Order")
    assert schema["$schema"].startswith("http://json-schema.org/draft-07")
    assert schema["required"] == ["id"]
    assert schema["properties"]["amount"] == {
        "type": ["string", "null"],
        "pattern": r"^-?[0-9]+(\.[0-9]+)?$",
        "x-dpone-type": "decimal(18,2)",
    }
    assert schema["properties"]["ts"] == {"type": ["string", "null"], "format": "date-time"}
    assert json_schema.json_schema_to_spark(schema) == SCHEMA

    foreign = {
        "type": "object",
        "definitions": {"Money": {"type": "number"}},
        "properties": {
            "n": {"type": "integer"},
            "price": {"$ref": "#/definitions/Money"},
            "maybe": {"oneOf": [{"type": "null"}, {"type": "string", "format": "date"}]},
            "color": {"enum": ["red", "blue"]},
            "free": {},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["n"],
    }
    assert [(f.name, f.dataType, f.nullable) for f in json_schema.json_schema_to_spark(foreign).fields] == [
        ("n", LongType(), False),
        ("price", DoubleType(), True),
        ("maybe", DateType(), True),
        ("color", StringType(), True),
        ("free", StringType(), True),
        ("labels", MapType(StringType(), StringType(), False), True),
    ]


def test_protobuf_class_to_spark_schema(pb):
    assert protobuf.load_message_class("dpone_test_orders_pb2:Order") is pb.Order
    assert protobuf.load_message_class("dpone_test_orders_pb2.Order.Line") is pb.Order.Line
    with pytest.raises(ConfigError, match="protobuf_message"):
        protobuf.load_message_class("dpone_test_orders_pb2:Nope")
    schema = protobuf.message_to_spark(pb.Order)
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields] == [
        ("id", "bigint", False),
        ("name", "string", True),
        ("amount", "double", True),
        ("created_at", "timestamp", True),
        ("tags", "array<string>", False),
        ("address", "struct<city:string,zip:string>", True),
        ("counts", "map<string,bigint>", False),
        ("status", "string", False),
        ("lines", "array<struct<sku:string,qty:int>>", False),
        ("qty", "int", True),
        ("active", "boolean", False),
        ("blob", "binary", True),
        ("score", "bigint", True),
        ("big", "decimal(20,0)", False),
    ]
    assert protobuf.message_indexes(pb.Order) == [0]
    assert protobuf.message_indexes(pb.Address) == [1]
    assert protobuf.message_indexes(pb.Order.Line) == [0, 0]
    assert protobuf.dependency_files(pb.Order) == []  # only well-known imports


@needs_confluent_protobuf
def test_protobuf_registration_matches_confluent(client, pb):
    """Our registration of the class is the very schema confluent's serializer registers."""
    ours = ensure_registered(client, "orders-value", protobuf.schema_string(pb.Order), "protobuf", True)
    serializer = ProtobufSerializer(pb.Order, client, {"auto.register.schemas": False, **SERDE_CONF})
    value = serializer(pb.Order(id=1), ctx("orders"))
    assert unframe(value, with_indexes=True)[:2] == (ours, [0])


# --------------------------------------------------------------------------- Spark round trips: avro


def test_avro_encode_is_readable_by_confluent(spark, client):
    schema_id, text = registered(client, "orders", "avro")
    df = spark.createDataFrame([tuple(r[n] for n in SCHEMA.names) for r in ROWS], SCHEMA)
    encoded = encode_registry(df, "avro", schema_id, text, SCHEMA.names).orderBy("id").collect()
    deserializer = AvroDeserializer(client)
    decoded = [deserializer(row["value"], ctx("orders")) for row in encoded]
    assert decoded == ROWS
    assert all(unframe(row["value"])[0] == schema_id for row in encoded)


def test_avro_decode_of_confluent_records(spark, client):
    schema_id, text = registered(client, "orders", "avro")
    serializer = AvroSerializer(client, text, conf={"auto.register.schemas": False, **SERDE_CONF})
    values = [serializer(row, ctx("orders")) for row in ROWS]
    raw = raw_df(spark, values)
    ids = distinct_schema_ids(raw)
    assert ids == [schema_id]
    decoded = decode_registry(raw, "avro", schemas_by_id(client, ids), SCHEMA)
    assert decoded.columns == decode_json(raw, SCHEMA, "flat").columns
    assert collect_rows(decoded, SCHEMA) == ROWS
    meta = decoded.orderBy("id").select(C.OP, C.CORRUPT, C.SOURCE_OFFSET, C.ORDER).collect()
    assert [(m[C.OP], m[C.CORRUPT], m[C.SOURCE_OFFSET]) for m in meta] == [("upsert", None, 0), ("upsert", None, 1), ("upsert", None, 2)]


def test_avro_decode_projects_older_versions_onto_the_schema(spark, client):
    """Records written with an earlier version decode into the current schema (new fields null)."""
    old = StructType(SCHEMA.fields[:3])
    old_id, old_text = registered(client, "orders", "avro", old)
    new_id, _ = registered(client, "orders", "avro")
    assert new_id != old_id
    serializer = AvroSerializer(client, old_text, conf={"auto.register.schemas": False, **SERDE_CONF})
    raw = raw_df(spark, [serializer({"id": 9, "name": "old", "amount": Decimal("2.50")}, ctx("orders"))])
    decoded = decode_registry(raw, "avro", schemas_by_id(client, distinct_schema_ids(raw)), SCHEMA)
    assert collect_rows(decoded, SCHEMA) == [{**EMPTY, "id": 9, "name": "old", "amount": Decimal("2.50")}]


def test_corrupt_records_and_tombstones(spark, client):
    schema_id, _ = registered(client, "orders", "avro")
    json_id, _ = registered(client, "other", "json_schema")
    values = [
        b'{"id": 1}',  # plain JSON on a registry topic
        frame(424242, b"\x02"),  # unknown schema id
        None,  # tombstone
        b"\x00\x00",  # too short
        frame(schema_id, b"\xff\xff\xff"),  # undecodable payload
        frame(json_id, b'{"id": 1}'),  # a schema of another format
    ]
    raw = raw_df(spark, values)
    decoded = decode_registry(raw, "avro", schemas_by_id(client, distinct_schema_ids(raw)), SCHEMA)
    rows = decoded.orderBy(C.SOURCE_OFFSET).select("id", C.OP, C.CORRUPT).collect()
    assert [r["id"] for r in rows] == [None] * 6
    assert [r[C.OP] for r in rows] == ["upsert", "upsert", "delete", "upsert", "upsert", "upsert"]
    reasons = [r[C.CORRUPT] for r in rows]
    assert reasons[0] == "wrong magic byte 0x7b at 0@0"
    assert reasons[1] == "unknown schema id 424242 at 0@1"
    assert reasons[2] is None
    assert reasons[3].startswith("too short") and reasons[3].endswith("at 0@3")
    assert reasons[4].startswith("avro decode error at 0@4")
    assert reasons[5] == f"schema id {json_id} is JSON, expected AVRO at 0@5"


@pytest.mark.parametrize("key_format", ["avro", "json_schema"])
def test_registry_keys_under_the_key_subject(spark, client, key_format):
    schema_id, text = registered(client, "orders", "avro")
    key_struct = key_schema(SCHEMA, ["id", "name"])
    if key_format == "avro":
        key_text = json.dumps(avro.spark_to_avro(key_struct, "OrderKey", "dpone.test"))
        key_reader: Any = AvroDeserializer(client)
    else:
        key_text = json.dumps(json_schema.spark_to_json_schema(key_struct, "OrderKey"))
        key_reader = JSONDeserializer(None, schema_registry_client=client)
    key_subject = subject_name("topic", "orders", None, is_key=True)
    key_id = ensure_registered(client, key_subject, key_text, key_format, True)
    df = spark.createDataFrame([tuple(r[n] for n in SCHEMA.names) for r in ROWS], SCHEMA).withColumn(
        "tombstone", F.col("id") == 2
    )
    encoded = encode_registry(
        df, "avro", schema_id, text, SCHEMA.names, null_value_column="tombstone",
        key=KeyEncoding(key_format, key_id, key_text, ("id", "name")),
    ).orderBy("id").collect()
    keys = [key_reader(r["key"], ctx("orders", MessageField.KEY)) for r in encoded]
    assert keys == [{"id": 1, "name": "Ada"}, {"id": 2, "name": None}, {"id": 3, "name": None}]
    assert [unframe(r["key"])[0] for r in encoded] == [key_id] * 3
    assert [r["value"] is None for r in encoded] == [False, True, False]
    assert "tombstone" in encoded[0].asDict()  # other columns pass through


def test_encode_refuses_columns_missing_from_the_registered_schema(spark, client):
    schema_id, text = registered(client, "orders", "avro", StructType(SCHEMA.fields[:2]))
    df = spark.createDataFrame([(1, "a", "extra")], "id long, name string, surprise string")
    with pytest.raises(ConfigError, match="surprise"):
        encode_registry(df, "avro", schema_id, text, df.columns)


def test_evolved_schema_routes_values_and_keeps_dropped_fields(spark, client):
    """Plan -> register -> apply_routes -> encode: routed values land in __dpone__nc__ columns."""
    target = StructType([StructField("id", LongType(), False), StructField("amount", LongType()), StructField("gone", StringType())])
    registered(client, "orders", "avro", target)
    source_df = spark.createDataFrame([(1, "12.5 EUR")], "id long, amount string")
    plan = plan_evolution(source_df.schema, avro.avro_to_spark(fetch_latest(client, "orders-value").schema.schema_str),
                          "BACKWARD", "new_column")
    assert not plan.breaking and plan.routes == (("amount", "__dpone__nc__amount"),)
    schema_id, text = registered(client, "orders", "avro", plan.result_schema)
    routed = apply_routes(source_df, plan)
    value = encode_registry(routed, "avro", schema_id, text, routed.columns).collect()[0]["value"]
    assert AvroDeserializer(client)(value, ctx("orders")) == {
        "id": 1, "amount": None, "gone": None, "__dpone__nc__amount": "12.5 EUR"
    }


# --------------------------------------------------------------------------- json_schema


def test_json_schema_encode_is_readable_by_confluent(spark, client):
    schema_id, text = registered(client, "orders", "json_schema")
    df = spark.createDataFrame([tuple(r[n] for n in SCHEMA.names) for r in ROWS], SCHEMA)
    encoded = encode_registry(df, "json_schema", schema_id, text, SCHEMA.names).orderBy("id").collect()
    deserializer = JSONDeserializer(None, schema_registry_client=client)  # validates against the registered schema
    decoded = [deserializer(row["value"], ctx("orders")) for row in encoded]
    first = decoded[0]
    assert first["amount"] == "1234567890123456.78" and first["big"] == "-1234567890123456789012345678.0123456789"
    assert first["ts"] == "2024-01-02T03:04:05.678901Z" and first["local_ts"] == "2024-01-02T23:59:59.000001"
    assert first["day"] == "2024-02-29" and first["blob"] == base64.b64encode(b"\x00\xffbin").decode()
    assert decoded[1] == {**EMPTY, "id": 2}  # nulls are written explicitly
    assert decoded == [json_ready(r) for r in ROWS]


def test_json_schema_decode_of_confluent_records(spark, client):
    _, text = registered(client, "orders", "json_schema")
    serializer = JSONSerializer(text, client, to_dict=lambda row, _ctx: json_ready(row),
                                conf={"auto.register.schemas": False, **SERDE_CONF})
    raw = raw_df(spark, [serializer(row, ctx("orders")) for row in ROWS] + [None])
    decoded = decode_registry(raw, "json_schema", schemas_by_id(client, distinct_schema_ids(raw)), SCHEMA)
    assert collect_rows(decoded.where(F.col("id").isNotNull()), SCHEMA) == ROWS
    assert decoded.where(F.col(C.OP) == "delete").count() == 1


def test_json_schema_decimals_may_arrive_as_numbers(spark, client):
    schema_id, _ = registered(client, "orders", "json_schema")
    raw = raw_df(spark, [frame(schema_id, b'{"id": 5, "amount": 12.345, "score": 1, "ts": "2024-05-01T10:00:00+02:00"}')])
    decoded = decode_registry(raw, "json_schema", schemas_by_id(client, [schema_id]), SCHEMA)
    row = collect_rows(decoded, SCHEMA)[0]
    assert row["amount"] == Decimal("12.35")  # rounded half-up to the column's scale
    assert row["score"] == 1.0 and row["ts"] == datetime(2024, 5, 1, 8, 0, tzinfo=UTC)


# --------------------------------------------------------------------------- protobuf


def proto_rows(pb) -> tuple[list[Any], list[dict[str, Any]]]:
    """Messages and the rows they decode to (proto3 scalars without presence read as defaults)."""
    ts = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    full = pb.Order(
        id=1, name="Ada", amount=12.5, tags=["a", "b"], address=pb.Address(city="Paris"),
        counts={"k": 1}, status=pb.SHIPPED, lines=[pb.Order.Line(sku="s1", qty=2)], qty=0, active=True,
        blob=b"\x00\x01", big=2**64 - 1,
    )
    full.created_at.FromDatetime(ts)
    full.score.value = -3
    empty = pb.Order(id=2)
    rows = [
        {
            "id": 1, "name": "Ada", "amount": 12.5, "created_at": ts, "tags": ["a", "b"],
            "address": {"city": "Paris", "zip": None}, "counts": {"k": 1}, "status": "SHIPPED",
            "lines": [{"sku": "s1", "qty": 2}], "qty": 0, "active": True, "blob": b"\x00\x01", "score": -3,
            "big": Decimal(2**64 - 1),
        },
        {
            "id": 2, "name": None, "amount": None, "created_at": None, "tags": [], "address": None, "counts": {},
            "status": "STATUS_UNKNOWN", "lines": [], "qty": None, "active": False, "blob": None, "score": None,
            "big": Decimal(0),
        },
    ]
    return [full, empty], rows


@needs_confluent_protobuf
def test_protobuf_decode_of_confluent_records(spark, client, pb):
    messages, rows = proto_rows(pb)
    serializer = ProtobufSerializer(pb.Order, client, {"auto.register.schemas": True, **SERDE_CONF})
    address_serializer = ProtobufSerializer(pb.Address, client, {"auto.register.schemas": True, **SERDE_CONF})
    values = [serializer(m, ctx("orders")) for m in messages]
    raw = raw_df(spark, [*values, address_serializer(pb.Address(city="x"), ctx("addresses"))])
    schema = protobuf.message_to_spark(pb.Order)
    decoded = decode_registry(raw, "protobuf", schemas_by_id(client, distinct_schema_ids(raw)), schema)
    assert collect_rows(decoded.where(F.col(C.SOURCE_OFFSET) < 2), schema) == rows
    # Message index [1] selects Address in the same file: by default projected by name onto the
    # Order schema (nothing matches); with expected_record it is corrupt.
    address_row = decoded.where(F.col(C.SOURCE_OFFSET) == 2).collect()[0]
    assert address_row[C.CORRUPT] is None and address_row["address"] is None and address_row["id"] is None
    strict = decode_registry(
        raw, "protobuf", schemas_by_id(client, distinct_schema_ids(raw)), schema, expected_record="dpone.test.Order"
    )
    reasons = [r[C.CORRUPT] for r in strict.orderBy(C.SOURCE_OFFSET).collect()]
    assert reasons == [None, None, "record dpone.test.Address is not the expected dpone.test.Order at 0@2"]


@needs_confluent_protobuf
def test_protobuf_references_are_registered_like_confluent(spark, client, pb):
    """A file importing another (non-well-known) file: the import is a schema reference."""
    ship = importlib.import_module("dpone_test_shipments_pb2")
    files = protobuf.dependency_files(ship.Shipment)
    assert [(f.name, f.imports) for f in files] == [("dpone_test_orders.proto", ())]
    refs = registry.ensure_references(client, files, auto_register=True)
    ours = ensure_registered(
        client, "ships-value", protobuf.schema_string(ship.Shipment), "protobuf", True,
        references=[refs[name] for name in protobuf.direct_imports(ship.Shipment)],
    )
    message = ship.Shipment(id="s1", to=pb.Address(city="Oslo"), status=pb.NEW)
    message.at.FromDatetime(datetime(2024, 6, 1, 12, 30, tzinfo=UTC))
    value = ProtobufSerializer(ship.Shipment, client, {"auto.register.schemas": False, **SERDE_CONF})(message, ctx("ships"))
    assert unframe(value, with_indexes=True)[:2] == (ours, [0])

    raw = raw_df(spark, [value])
    ids = distinct_schema_ids(raw)
    schema = protobuf.message_to_spark(ship.Shipment)
    decoded = decode_registry(
        raw, "protobuf", schemas_by_id(client, ids), schema,
        references=registry.references_by_id(client, ids), expected_record="dpone.test.ship.Shipment",
    )
    assert collect_rows(decoded, schema) == [
        {"id": "s1", "to": {"city": "Oslo", "zip": None}, "at": datetime(2024, 6, 1, 12, 30, tzinfo=UTC), "status": "NEW"}
    ]
    encoded = encode_registry(
        decoded, "protobuf", ours, protobuf.schema_string(ship.Shipment), schema.names,
        message_indexes=[0], references=tuple(registry.references_by_id(client, ids)[ours]),
    ).collect()[0]["value"]
    assert ProtobufDeserializer(ship.Shipment, {"use.deprecated.format": False})(encoded, ctx("ships")) == message


@needs_confluent_protobuf
def test_protobuf_encode_is_readable_by_confluent(spark, client, pb):
    messages, rows = proto_rows(pb)
    schema = protobuf.message_to_spark(pb.Order)
    schema_id = ensure_registered(client, "orders-value", protobuf.schema_string(pb.Order), "protobuf", True)
    df = spark.createDataFrame([tuple(r[n] for n in schema.names) for r in rows], schema)
    encoded = encode_registry(
        df, "protobuf", schema_id, protobuf.schema_string(pb.Order), schema.names,
        message_indexes=protobuf.message_indexes(pb.Order),
    ).orderBy("id").collect()
    deserializer = ProtobufDeserializer(pb.Order, {"use.deprecated.format": False})
    assert [deserializer(r["value"], ctx("orders")) for r in encoded] == messages
    # Nested message index: Order.Line is [0, 0] in the wire format.
    line_df = spark.createDataFrame([("s9", 4)], "sku string, qty int")
    line_value = encode_registry(
        line_df, "protobuf", schema_id, protobuf.schema_string(pb.Order), ["sku", "qty"], message_indexes=[0, 0]
    ).collect()[0]["value"]
    assert unframe(line_value, with_indexes=True)[1] == [0, 0]
    assert ProtobufDeserializer(pb.Order.Line, {"use.deprecated.format": False})(line_value, ctx("lines")) == pb.Order.Line(sku="s9", qty=4)


# --------------------------------------------------------------------------- end to end through the broker


def _consume_values(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[tuple[bytes | None, bytes | None]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}", "enable.partition.eof": True,
         "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[bytes | None, bytes | None]] = []
    import time

    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    break
                continue
            out.append((message.key(), message.value()))
    finally:
        consumer.close()
    return out


def test_end_to_end_avro_through_the_broker(spark, broker, client):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("sr_src"), unique_topic("sr_dst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    _, text = registered(client, src, "avro")
    serializer = AvroSerializer(client, text, conf={"auto.register.schemas": False, **SERDE_CONF})
    producer = Producer({"bootstrap.servers": bs})
    for row in ROWS:
        producer.produce(src, key=str(row["id"]).encode(), value=serializer(row, ctx(src)), headers=[("trace", b"t1")])
    producer.produce(src, key=b"2", value=None)  # tombstone
    assert producer.flush(30) == 0

    raw = read_ranges(spark, [ReadTask(0, src, 0, 0, len(ROWS) + 1)], ReaderSettings({"bootstrap.servers": bs}, "g-sr"))
    decoded = decode_registry(raw, "avro", schemas_by_id(client, distinct_schema_ids(raw)), SCHEMA)
    assert collect_rows(decoded.where(F.col(C.OP) == "upsert"), SCHEMA) == ROWS
    assert decoded.where(F.col(C.OP) == "delete").select(C.SOURCE_KEY).collect()[0][0] == b"2"
    headers = decoded.where(F.col("id") == 1).select(C.SOURCE_HEADERS).collect()[0][0]
    assert [(h["key"], bytes(h["value"])) for h in headers] == [("trace", b"t1")]

    out_id, out_text = registered(client, dst, "avro")
    upserts = decoded.where(F.col(C.OP) == "upsert")
    messages = encode_registry(
        upserts.withColumn("key", F.col(C.SOURCE_KEY)).withColumn("partition", F.col(C.SOURCE_PARTITION) * 0 - 1)
        .withColumn("headers", F.col(C.SOURCE_HEADERS)),
        "avro", out_id, out_text, SCHEMA.names,
    )
    stats = produce(messages, ProducerSettings(dst, (("bootstrap.servers", bs),)), messages.count())
    assert stats.ok
    deserializer = AvroDeserializer(client)
    received = _consume_values(bs, dst)
    assert sorted((deserializer(v, ctx(dst)) for _, v in received), key=lambda r: r["id"]) == ROWS
    assert sorted(k for k, _ in received) == [b"1", b"2", b"3"]


def test_the_registry_client_loads_only_when_a_run_uses_it():
    """confluent-kafka's registry client (with httpx and authlib, ~0.2 s to import) is loaded on
    first use, not by importing the engine or the CLI: a run without a registry starts without it."""
    import subprocess

    code = "import sys, dpone_dagster.cli, dpone_dagster.engine.run; print(sorted(m for m in ('confluent_kafka.schema_registry', 'httpx') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert loaded == "[]", loaded
