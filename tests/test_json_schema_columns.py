"""JSON Schema source values read by Arrow's JSON reader against the record decoder (json.loads,
then the value rules; pure: no broker, no Spark session): whatever the column read returns is what
the record decoder returns, on random flat payloads and values written every way JSON allows, and
clean batches are read column-wise."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from test_avro_columns import record_path, same  # the record decoder's output, compared exactly

from dpone_dagster.formats import registry_source
from dpone_dagster.sources.kafka import RegistryPlan

SCHEMA_ID = 3
TYPES = [pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.bool_()]


def spark_struct(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def clean_value(rng: random.Random, kind: pa.DataType) -> str:
    """A value written as a JSON encoder writes it (the column read must take these)."""
    if rng.random() < 0.15:
        return "null"
    if kind == pa.int64():
        return str(rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randint(-10**12, 10**12)]))
    if kind == pa.int32():
        return str(rng.choice([0, 2**31 - 1, -(2**31), rng.randint(-1000, 1000)]))
    if kind == pa.float64():
        return rng.choice([repr(rng.uniform(-1e9, 1e9)), repr(rng.random() * 10 ** rng.randint(-300, 300)), "0.0", "1E5", "3", "12345678901234567891", "2.5e-310"])
    if kind == pa.string():
        return json.dumps("".join(rng.choice("ab \"\\/\n\t\u00e9\u4e2d\U0001f600\u0000") for _ in range(rng.randint(0, 8))), ensure_ascii=rng.random() < 0.5)
    return rng.choice(["true", "false"])


def odd_value(rng: random.Random, kind: pa.DataType) -> str:
    """A value the two readers may take differently, or not at all."""
    return rng.choice([
        "-0", "-0.0", "1.0", "1e2", "NaN", "Infinity", "-Infinity", "1e400", '"5"', "5", "true", "{}", "[1]", '{"a": 1}',
        '"\\ud800"', '"\\ud83d\\ude00"', "99999999999999999999", "2147483648", '"\\u0000"', "0.1",
    ])


def document(rng: random.Random, schema: pa.Schema, odd: bool) -> bytes:
    members = []
    for field in schema:
        if rng.random() < 0.1:
            continue  # missing: null
        value = odd_value(rng, field.type) if odd and rng.random() < 0.2 else clean_value(rng, field.type)
        members.append(f'"{field.name}": {value}')
    if odd and rng.random() < 0.2:
        members.append(rng.choice(['"extra": 1', '"extra": {"x": [1, 2]}', f'"{schema[0].name}": 1', '"extra": NaN']))
    rng.shuffle(members)
    text = "{" + ", ".join(members) + "}"
    if odd and rng.random() < 0.15:
        text = rng.choice([" " + text, text + " ", "\ufeff" + text, text + text, "null", "[]", "", text[:-1], text.replace("{", "{\n", 1), "\"x\""])
    raw = text.encode("utf-8", "surrogatepass")
    if odd and rng.random() < 0.05:
        raw = raw.replace(b"a", b"\xff", 1)
    return raw


def framed(rng: random.Random, payload: bytes, odd: bool) -> bytes:
    frame = b"\x00" + SCHEMA_ID.to_bytes(4, "big")
    if odd and rng.random() < 0.05:
        frame = rng.choice([b"\x01" + frame[1:], b"\x00" + (SCHEMA_ID + 1).to_bytes(4, "big"), b"\x00\x00"])
    return frame + payload


@pytest.mark.parametrize("seed", range(60))
def test_the_json_reader_reads_what_the_record_decoder_reads(seed):
    rng = random.Random(seed)
    schema = pa.schema([pa.field(f"f{i}", rng.choice(TYPES)) for i in range(rng.randint(1, 6))])
    plan = RegistryPlan("json_schema", {SCHEMA_ID: ("JSON", '{"type": "object"}')}, None, spark_struct(schema))
    read_clean = 0
    for batch in range(10):
        odd = batch % 2 == 1
        values = [framed(rng, document(rng, schema, odd), odd) for _ in range(rng.randint(0, 30))]
        values = [None if rng.random() < 0.1 else v for v in values]  # tombstones
        array = pa.array(values, pa.binary())
        if len(array) > 2 and rng.random() < 0.5:
            array = array.slice(1, len(array) - 2)
        columns = registry_source._json_columns(plan, array, schema)
        expected = record_path(plan, array, schema)
        if columns is not None:
            assert expected is not None, f"read a batch the record decoder refuses: {array.to_pylist()}"
            assert same(columns, expected), array.to_pylist()
        if not odd:
            assert columns is not None and expected is not None
            read_clean += 1
    assert read_clean == 5


ODD = [
    "-0", "-0.0", "1.0", "1e2", "NaN", "Infinity", "-Infinity", "1e400", '"5"', "5", "true", "{}", "[1]", '{"a": 1}',
    '"\\ud800"', '"\\ud83d\\ude00"', "99999999999999999999", "2147483648", '"\\u0000"', "0.1", "null",
    "Inf", "-Inf", "-NaN", "1" + "0" * 400, "-" + "1" * 309,
]


@pytest.mark.parametrize("kind", TYPES, ids=str)
@pytest.mark.parametrize("odd", ODD)
def test_each_odd_value_is_read_as_the_record_decoder_reads_it(kind, odd):
    schema = pa.schema([pa.field("x", kind), pa.field("y", pa.int64())])
    plan = RegistryPlan("json_schema", {SCHEMA_ID: ("JSON", "{}")}, None, spark_struct(schema))
    frame = b"\x00" + SCHEMA_ID.to_bytes(4, "big")
    values = pa.array([frame + b'{"y": 1}', frame + f'{{"x": {odd}, "y": 2}}'.encode()], pa.binary())
    columns = registry_source._json_columns(plan, values, schema)
    expected = record_path(plan, values, schema)
    if columns is not None:
        assert expected is not None and same(columns, expected)


@pytest.mark.parametrize("registered", [{}, {SCHEMA_ID: ("AVRO", "{}")}], ids=["an id the subject lacks", "an id of another format"])
def test_values_framed_with_another_schema_are_read_record_by_record(registered):
    schema = pa.schema([pa.field("y", pa.int64())])
    plan = RegistryPlan("json_schema", {SCHEMA_ID + 1: ("JSON", "{}"), **registered}, None, spark_struct(schema))
    values = pa.array([b"\x00" + (SCHEMA_ID + 1).to_bytes(4, "big") + b'{"y": 1}', b"\x00" + SCHEMA_ID.to_bytes(4, "big") + b'{"y": 2}'], pa.binary())
    assert registry_source._json_columns(plan, values, schema) is None


@pytest.mark.parametrize("schema_text", ["true", "not json", "[]"])
def test_a_schema_the_record_decoder_cannot_read_with_leaves_the_batch_to_it(schema_text):
    schema = pa.schema([pa.field("y", pa.int64())])
    plan = RegistryPlan("json_schema", {SCHEMA_ID: ("JSON", schema_text)}, None, spark_struct(schema))
    values = pa.array([b"\x00" + SCHEMA_ID.to_bytes(4, "big") + b'{"y": 1}'], pa.binary())
    assert record_path(plan, values, schema) is None
    assert registry_source._json_columns(plan, values, schema) is None


def test_payloads_of_other_types_are_read_record_by_record():
    schema = pa.schema([pa.field("at", pa.timestamp("us", tz="UTC"))])
    plan = RegistryPlan("json_schema", {SCHEMA_ID: ("JSON", "{}")}, None, spark_struct(schema))
    values = pa.array([b"\x00" + SCHEMA_ID.to_bytes(4, "big") + b'{"at": "2026-01-01T00:00:00Z"}'], pa.binary())
    assert registry_source._json_columns(plan, values, schema) is None
    assert record_path(plan, values, schema) is not None
