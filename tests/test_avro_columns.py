"""The column-wise Avro reader against the record decoder (pure: no broker, no Spark session): on
random schemas, random values, older writer schemas and corrupted values, whatever the column
reader returns is what the record decoder returns, and clean batches are read column-wise."""

from __future__ import annotations

import copy
import io
import json
import math
import random
import struct
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from dpone_dagster.formats import avro_columns, registry_source
from dpone_dagster.schema.avro import avro_to_spark
from dpone_dagster.sources.kafka import RegistryPlan

SCHEMA_ID = 7
FRAME = b"\x00" + SCHEMA_ID.to_bytes(4, "big")
LOGICAL = [
    ("int", "date", (-719_162, 2_932_896)),
    ("long", "timestamp-millis", (-62_135_596_800_000, 253_402_300_799_999)),
    ("long", "timestamp-micros", (-62_135_596_800_000_000, 253_402_300_799_999_999)),
    ("long", "local-timestamp-millis", (-62_135_596_800_000, 253_402_300_799_999)),
    ("long", "local-timestamp-micros", (-62_135_596_800_000_000, 253_402_300_799_999_999)),
]
PRIMITIVES = ["boolean", "int", "long", "float", "double", "string", "bytes"]


def random_type(rng: random.Random, depth: int, names: list[int]) -> Any:
    choice = rng.randrange(14 if depth < 2 else 11)
    if choice < 7:
        return PRIMITIVES[choice]
    if choice == 7:
        base, logical, _ = rng.choice(LOGICAL)
        return {"type": base, "logicalType": logical}
    if choice == 10:
        precision = rng.randint(1, 18)
        decimal = {"logicalType": "decimal", "precision": precision, "scale": rng.randint(0, precision)}
        names.append(len(names))
        return {"type": "bytes", **decimal} if rng.random() < 0.5 else {"type": "fixed", "name": f"D{names[-1]}", "size": 8, **decimal}
    if choice in (11, 12):
        items = random_type(rng, depth + 1, names)
        return {"type": "array", "items": ["null", items] if rng.random() < 0.3 else items}
    names.append(len(names))
    if choice == 8:
        return {"type": "enum", "name": f"E{names[-1]}", "symbols": [f"S{i}" for i in range(rng.randint(1, 5))]}
    if choice == 9:
        return {"type": "fixed", "name": f"F{names[-1]}", "size": rng.randint(0, 6)}
    return random_record(rng, depth + 1, names, f"R{names[-1]}")


def random_record(rng: random.Random, depth: int, names: list[int], name: str) -> dict:
    fields = []
    for i in range(rng.randint(1, 6)):
        kind = random_type(rng, depth, names)
        if rng.random() < 0.4:
            kind = ["null", kind] if rng.random() < 0.7 else [kind, "null"]
        fields.append({"name": f"f{i}", "type": kind})
    return {"type": "record", "name": name, "fields": fields}


def random_value(rng: random.Random, kind: Any, edges: bool) -> Any:
    if isinstance(kind, list):
        inner = next(k for k in kind if k != "null")
        return None if rng.random() < 0.3 else random_value(rng, inner, edges)
    if isinstance(kind, dict):
        if kind["type"] == "record":
            return {f["name"]: random_value(rng, f["type"], edges) for f in kind["fields"]}
        if kind["type"] == "array":
            return [random_value(rng, kind["items"], edges) for _ in range(rng.choice([0, 1, 2, 5]))]
        if kind.get("logicalType") == "decimal":  # written as its unscaled bytes (big-endian)
            limit = 10 ** kind["precision"]
            unscaled = rng.choice([limit - 1, -(limit - 1), 0, -1, rng.randrange(-limit + 1, limit)])
            if edges and rng.random() < 0.3:
                unscaled = rng.choice([limit, -limit])  # beyond the precision: refused
            size = kind.get("size") or max(1, (unscaled.bit_length() + 8) // 8)
            return unscaled.to_bytes(size, "big", signed=True)
        if kind["type"] == "enum":
            return rng.choice(kind["symbols"])
        if kind["type"] == "fixed":
            return rng.randbytes(kind["size"])
        low, high = next(r for b, logical, r in LOGICAL if logical == kind["logicalType"])
        if edges and rng.random() < 0.3:  # past datetime's range: the record decoder refuses it
            wide = 31 if kind["type"] == "int" else 62
            return rng.choice([low - 1, high + 1, -(1 << wide), (1 << wide) - 1])
        return rng.choice([low, high, 0, rng.randint(low, high)])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind in ("int", "long"):
        bits = 32 if kind == "int" else 64
        extreme = [-(1 << (bits - 1)), (1 << (bits - 1)) - 1, 0, -1, 63, 64, -64, -65]
        return rng.choice(extreme) if rng.random() < 0.3 else rng.randint(-(1 << (bits - 1)), (1 << (bits - 1)) - 1) >> rng.randrange(bits)
    if kind == "float":
        return struct.unpack("<f", struct.pack("<f", rng.choice([0.0, -0.0, math.inf, rng.uniform(-1e6, 1e6)])))[0]
    if kind == "double":
        return rng.choice([0.0, -0.0, -math.inf, 5e-324, 1.7976931348623157e308, rng.uniform(-1e300, 1e300), rng.random()])
    if kind == "string":
        return "".join(rng.choice("ab\"\\\n\u00e9\u4e2d\U0001f600") for _ in range(rng.randint(0, 8)))
    return rng.randbytes(rng.randint(0, 8))


def physical(kind: Any) -> Any:
    """`kind` without logical types: values are written as the plain integers they stand for."""
    if isinstance(kind, list):
        return [physical(k) for k in kind]
    if isinstance(kind, dict):
        if kind["type"] == "record":
            return {**kind, "fields": [{**f, "type": physical(f["type"])} for f in kind["fields"]]}
        if kind["type"] == "array":
            return {**kind, "items": physical(kind["items"])}
        if "logicalType" in kind:
            return {k: v for k, v in kind.items() if k not in ("logicalType", "precision", "scale")} if kind["type"] == "fixed" else kind["type"]
    return kind


def evolved(rng: random.Random, writer: dict) -> dict:
    """The payload's schema: the writer's with fields dropped, added, widened or made nullable."""
    reader = copy.deepcopy(writer)
    fields = [f for f in reader["fields"] if rng.random() < 0.8] or reader["fields"][:1]
    for field in fields:
        if field["type"] == "int" and rng.random() < 0.5:
            field["type"] = "long"
        elif field["type"] == "long" and rng.random() < 0.5:
            field["type"] = "int"  # narrowed: a long beyond int's range must be refused
        elif field["type"] == "float" and rng.random() < 0.5:
            field["type"] = "double"
        elif isinstance(field["type"], str) and rng.random() < 0.2:
            field["type"] = ["null", field["type"]]
    if rng.random() < 0.5:
        fields.append({"name": "added", "type": ["null", "string"], "default": None})
    reader["fields"] = fields
    return reader


def corrupt(rng: random.Random, value: bytes) -> bytes:
    how = rng.randrange(6)
    if how == 0:
        return value[: rng.randrange(len(value))]
    if how == 1:
        return value + rng.randbytes(rng.randint(1, 4))
    if how == 2:
        at = rng.randrange(len(value))
        return value[:at] + bytes([rng.randrange(256)]) + value[at + 1 :]
    if how == 3:
        return value[:1] + (SCHEMA_ID + 1).to_bytes(4, "big") + value[5:]
    if how == 4:
        return b"\x01" + value[1:]
    return value[5:] + b"\xff" * rng.randint(0, 12)


def framed(record: dict, rows: list[dict]) -> list[bytes]:
    parsed = fastavro.parse_schema(physical(record))
    out = []
    for row in rows:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, row)
        out.append(b"\x00" + SCHEMA_ID.to_bytes(4, "big") + buffer.getvalue())
    return out


def record_path(plan: RegistryPlan, values: pa.Array, schema: pa.Schema) -> list[pa.Array] | None:
    raw = pa.RecordBatch.from_arrays([values, pa.array(range(len(values))), pa.array([0] * len(values))], ["value", "offset", "partition"])
    try:
        return registry_source.decode_records(plan, raw, schema)
    except registry_source.Undecodable:
        return None


def same(left: list[pa.Array], right: list[pa.Array]) -> bool:
    """Equal values (repr: a NaN equals a NaN, -0.0 differs from 0.0) of equal types."""
    return all(a.type == b.type and repr(a.to_pylist()) == repr(b.to_pylist()) for a, b in zip(left, right, strict=True))


@pytest.mark.parametrize("seed", range(40))
def test_the_column_reader_reads_what_the_record_decoder_reads(seed):
    rng = random.Random(seed)
    writer = random_record(rng, 0, [], "Row")
    payload_record = evolved(rng, writer) if seed % 2 else writer
    payload = registry_source.arrow_schema(avro_to_spark(payload_record))
    assert payload is not None
    writer_text = json.dumps(writer)
    plan = RegistryPlan("avro", {SCHEMA_ID: ("AVRO", writer_text)}, None, avro_to_spark(payload_record))
    reader = avro_columns.reader(SCHEMA_ID, writer_text, payload)
    assert reader is not None, "every type the generator writes is covered"
    read_clean = 0
    for batch in range(12):
        edges, broken = batch % 3 == 1, batch % 3 == 2
        values: list[bytes | None] = framed(writer, [random_value(rng, writer, edges) for _ in range(rng.randint(0, 40))])
        if broken and values:
            at = rng.randrange(len(values))
            values[at] = corrupt(rng, values[at])
        values = [None if rng.random() < 0.1 else v for v in values]  # tombstones
        array = pa.array(values, pa.binary())
        if len(array) > 2 and rng.random() < 0.5:
            array = array.slice(1, len(array) - 2)  # a slice of a batch: offsets into its buffers
        columns = reader.decode(array)
        expected = record_path(plan, array, payload)
        if columns is not None:
            assert expected is not None, "the column reader read a batch the record decoder refuses"
            assert same(columns, expected)
            assert [c.type for c in columns] == list(payload.types)
        if not broken and expected is not None:  # what the record decoder reads, the columns read
            assert columns is not None
            read_clean += 1
    assert read_clean >= 4 or payload_record is not writer  # a narrowed long may refuse clean batches


def test_arrays_in_several_blocks_are_read_as_the_record_decoder_reads_them():
    """fastavro writes one block per array; other writers split them, with a negative count
    followed by the block's size in bytes."""
    record = {"type": "record", "name": "R", "fields": [{"name": "tags", "type": {"type": "array", "items": "string"}}, {"name": "n", "type": "long"}]}
    payload = registry_source.arrow_schema(avro_to_spark(record))
    reader = avro_columns.reader(SCHEMA_ID, json.dumps(record), payload)
    blocks = b"\x03" + b"\x04" + b"\x02a\x02b" + b"\x02" + b"\x02c" + b"\x00"  # [-2 items, 4 bytes], [1 item], end
    values = pa.array([FRAME + blocks + b"\x02", FRAME + b"\x00\x04"], pa.binary())
    plan = RegistryPlan("avro", {SCHEMA_ID: ("AVRO", json.dumps(record))}, None, avro_to_spark(record))
    columns = reader.decode(values)
    assert columns is not None and same(columns, record_path(plan, values, payload))
    assert columns[0].to_pylist() == [["a", "b", "c"], []] and columns[1].to_pylist() == [1, 2]


@pytest.mark.parametrize(
    "fields, body",
    [
        pytest.param([{"name": "a", "type": ["long"]}, {"name": "b", "type": "long"}], b"\x00\x2a\x0a", id="a union of one type"),
        pytest.param([{"name": "a", "type": ["null"]}, {"name": "b", "type": "long"}], b"\x00\x0a", id="a union of null alone"),
        pytest.param([{"name": "e", "type": {"type": "record", "name": "E", "fields": []}}, {"name": "b", "type": "long"}], b"\x0a", id="a record without fields"),
        pytest.param([{"name": "e", "type": {"type": "array", "items": {"type": "record", "name": "E", "fields": []}}}], b"\x04\x00", id="an array of records without fields"),
    ],
)
def test_schemas_of_few_fields_read_as_the_record_decoder_reads_them(fields, body):
    record = {"type": "record", "name": "R", "fields": fields}
    payload = registry_source.arrow_schema(avro_to_spark(record))
    plan = RegistryPlan("avro", {SCHEMA_ID: ("AVRO", json.dumps(record))}, None, avro_to_spark(record))
    values = pa.array([FRAME + body, FRAME + body], pa.binary())
    columns = _reader_of(fields).decode(values)
    assert columns is not None and same(columns, record_path(plan, values, payload))


def test_uncovered_schemas_have_no_column_reader():
    record = {"type": "record", "name": "R", "fields": [{"name": "tags", "type": {"type": "map", "values": "string"}}]}
    payload = registry_source.arrow_schema(avro_to_spark(record))
    assert avro_columns.reader(1, json.dumps(record), payload) is None
    decimal = {"type": "record", "name": "R", "fields": [{"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
    rescaled = pa.schema([pa.field("d", pa.decimal128(9, 3))])  # the record decoder rounds to the column's scale
    assert avro_columns.reader(1, json.dumps(decimal), rescaled) is None
    widened = pa.schema([pa.field("d", pa.decimal128(12, 2))])  # fastavro rounds to the writer's precision
    assert avro_columns.reader(1, json.dumps(decimal), widened) is None
    string_to_long = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "string"}]}
    long_payload = pa.schema([pa.field("x", pa.int64())])
    assert avro_columns.reader(1, json.dumps(string_to_long), long_payload) is None


def _reader_of(fields: list[dict], payload: pa.Schema | None = None) -> avro_columns.Reader:
    record = {"type": "record", "name": "R", "fields": fields}
    reader = avro_columns.reader(SCHEMA_ID, json.dumps(record), payload or registry_source.arrow_schema(avro_to_spark(record)))
    assert reader is not None
    return reader


@pytest.mark.parametrize(
    "fields, payload, body",
    [
        pytest.param([{"name": "b", "type": "boolean"}], None, b"\x02", id="a boolean byte of 2"),
        pytest.param([{"name": "u", "type": ["null", "long"]}], None, b"\x04\x02", id="a union branch beyond the schema"),
        pytest.param([{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}], None, b"\x04", id="an enum index beyond its symbols"),
        pytest.param([{"name": "n", "type": "long"}], None, b"\xff" * 10 + b"\x01", id="a varint of 11 bytes"),
        pytest.param([{"name": "n", "type": "long"}], None, b"\xff" * 9 + b"\x02", id="a varint wider than 64 bits"),
        pytest.param([{"name": "n", "type": "long"}], pa.schema([pa.field("n", pa.int32())]), b"\x80\x80\x80\x80\x10", id="a long beyond an int column"),
        pytest.param([{"name": "s", "type": "string"}], None, b"\x01", id="a negative length"),
        pytest.param([{"name": "a", "type": {"type": "array", "items": "long"}}], None, b"\x82\x04" + b"\x00" * 257 + b"\x00", id="an array block of 257 items"),
        pytest.param([{"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 1}}], None, b"\x04\x27\x10", id="a decimal beyond its precision"),
        pytest.param([{"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 0}}], None, b"\x22" + b"\x01" * 17, id="a decimal of 17 bytes"),
        pytest.param([{"name": "a", "type": {"type": "array", "items": "long"}}, {"name": "n", "type": "long"}], None, b'\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01' + b"\x00\x0a", id="an array block count of -2**63"),
        pytest.param([{"name": "a", "type": {"type": "array", "items": "long"}}], None, b"\x02\x02" * 65 + b"\x00", id="an array of 65 blocks"),
        pytest.param([{"name": "b", "type": "bytes"}], None, b'\xf0\xff\xff\xff\xff\xff\xff\xff\xff\x01' + b"abc", id="a length near 2**63"),
        pytest.param([{"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 0}}, {"name": "n", "type": "long"}], pa.schema([pa.field("n", pa.int64())]), b'\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01' + b"\x02", id="a skipped decimal of length 2**63-1"),
    ],
)
def test_values_the_column_reader_leaves_to_the_record_decoder(fields, payload, body):
    reader = _reader_of(fields, payload)
    good = FRAME + b"\x00" * 1  # a first record the reader reads: the batch is refused whole for the second
    assert reader.decode(pa.array([FRAME + body], pa.binary())) is None
    assert reader.decode(pa.array([good, FRAME + body], pa.binary())) is None


def test_one_corrupt_value_sends_the_whole_batch_to_the_record_decoder():
    record = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}
    payload = registry_source.arrow_schema(avro_to_spark(record))
    reader = avro_columns.reader(SCHEMA_ID, json.dumps(record), payload)
    values = framed(record, [{"id": i, "name": f"n{i}"} for i in range(5)])
    assert reader.decode(pa.array(values, pa.binary())) is not None
    truncated = [*values[:4], values[4][:-1]]
    assert reader.decode(pa.array(truncated, pa.binary())) is None
    bad_utf8 = [*values[:4], values[4][:-1] + b"\xff"]
    assert reader.decode(pa.array(bad_utf8, pa.binary())) is None
