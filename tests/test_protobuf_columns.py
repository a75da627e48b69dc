"""The column-wise protobuf reader against the record decoder (the protobuf runtime, then the value
rules; pure: no broker, no Spark session): on random flat messages, implicit and explicit presence,
fields in any order and repeated, unknown fields, other wire types and corrupted values, whatever
the column reader returns is what the record decoder returns, and clean batches are read
column-wise."""

from __future__ import annotations

import random
import struct
import uuid

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from test_avro_columns import record_path, same  # the record decoder's output, compared exactly

from dpone_dagster.formats import protobuf_columns, registry_source
from dpone_dagster.schema.protobuf import message_to_spark, schema_string
from dpone_dagster.sources.kafka import RegistryPlan

SCHEMA_ID = 11
HEADER = b"\x00" + SCHEMA_ID.to_bytes(4, "big") + b"\x00"
_T = descriptor_pb2.FieldDescriptorProto
KINDS = [_T.TYPE_INT32, _T.TYPE_INT64, _T.TYPE_SINT32, _T.TYPE_SINT64, _T.TYPE_BOOL, _T.TYPE_DOUBLE, _T.TYPE_FLOAT, _T.TYPE_STRING, _T.TYPE_BYTES]


def message_class(rng: random.Random, kinds: list[int] | None = None):
    """A proto3 message of random covered fields (some `optional`), built without protoc."""
    name = f"m{uuid.uuid4().hex[:8]}"
    file = descriptor_pb2.FileDescriptorProto(name=f"{name}.proto", package=name, syntax="proto3")
    message = file.message_type.add(name="Row")
    numbers = rng.sample(range(1, 40), 6)
    for i, kind in enumerate(kinds or [rng.choice(KINDS) for _ in range(rng.randint(1, 6))]):
        field = message.field.add(name=f"f{i}", number=numbers[i], type=kind, label=_T.LABEL_OPTIONAL)
        if rng.random() < 0.4:  # proto3 `optional`: explicit presence through a synthetic oneof
            message.oneof_decl.add(name=f"_f{i}")
            field.oneof_index = len(message.oneof_decl) - 1
            field.proto3_optional = True
    pool = descriptor_pool.DescriptorPool()
    return message_factory.GetMessageClass(pool.Add(file).message_types_by_name["Row"])


def random_value(rng: random.Random, kind: int):
    if kind == _T.TYPE_INT32 or kind == _T.TYPE_SINT32:
        return rng.choice([0, -1, 1, 2**31 - 1, -(2**31), rng.randint(-1000, 1000)])
    if kind in (_T.TYPE_INT64, _T.TYPE_SINT64):
        return rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randint(-10**15, 10**15)])
    if kind == _T.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == _T.TYPE_DOUBLE:
        return rng.choice([0.0, -0.0, 1e308, -5e-324, float("inf"), rng.uniform(-1e9, 1e9)])
    if kind == _T.TYPE_FLOAT:
        return struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0]
    if kind == _T.TYPE_STRING:
        return "".join(rng.choice("ab\u00e9\u4e2d\U0001f600\x00") for _ in range(rng.randint(0, 6)))
    return rng.randbytes(rng.randint(0, 6))


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out += bytes([low | 0x80])
        else:
            return out + bytes([low])


def extra(rng: random.Random, cls) -> bytes:
    """Wire-format additions: unknown fields of every wire type, or a known field again."""
    unknown = 100 + rng.randrange(100)
    # A known field again: the last one wins (a string twice is left to the runtime, which checks both).
    again = [f for f in cls.DESCRIPTOR.fields if f.type != _T.TYPE_STRING]
    return rng.choice([
        varint(unknown << 3) + varint(rng.randrange(1 << 40)),
        varint(unknown << 3 | 1) + rng.randbytes(8),
        varint(unknown << 3 | 2) + varint(3) + b"abc",
        varint(unknown << 3 | 5) + rng.randbytes(4),
        *([cls(**{again[0].name: random_value(rng, again[0].type)}).SerializeToString()] if again else []),
    ])


def corrupt(rng: random.Random, value: bytes, cls) -> bytes:
    number = cls.DESCRIPTOR.fields[0].number
    how = rng.randrange(8)
    if how == 0 and len(value) > len(HEADER):
        return value[: rng.randrange(len(HEADER), len(value))]
    if how == 1:
        return value + varint(number << 3 | rng.choice([0, 1, 2, 5]))  # a field cut short, maybe of another wire type
    if how == 2 and len(value) > len(HEADER):
        at = rng.randrange(len(HEADER), len(value))
        return value[:at] + bytes([rng.randrange(256)]) + value[at + 1 :]
    if how == 3:
        return value + varint(number << 3 | 3)  # a group
    if how == 4:
        return HEADER[:5] + b"\x02\x02" + value[6:]  # message indexes [1]
    if how == 5:
        return value + varint(number << 3 | 2) + varint(2) + b"\xff\xfe"  # bytes that are not UTF-8, if a string
    if how == 6:
        return value + varint(number << 3) + b"\xff" * 9 + b"\x7f"  # a varint wider than 64 bits
    return value + b"\x00"  # field number 0


def values_of(rng: random.Random, cls, broken: bool) -> list[bytes | None]:
    out: list[bytes | None] = []
    for _ in range(rng.randint(0, 30)):
        fields = {f.name: random_value(rng, f.type) for f in cls.DESCRIPTOR.fields if rng.random() < 0.7}
        value = HEADER + cls(**fields).SerializeToString()
        if rng.random() < 0.3:
            value += extra(rng, cls)
        out.append(None if rng.random() < 0.1 else value)
    if broken and out:
        at = rng.randrange(len(out))
        out[at] = corrupt(rng, out[at] or HEADER, cls)
    return out


@pytest.mark.parametrize("seed", range(60))
def test_the_column_reader_reads_what_the_record_decoder_reads(seed):
    rng = random.Random(seed)
    cls = message_class(rng)
    struct_type = message_to_spark(cls)
    payload = registry_source.arrow_schema(struct_type)
    plan = RegistryPlan("protobuf", {SCHEMA_ID: ("PROTOBUF", schema_string(cls))}, None, struct_type)
    reader = protobuf_columns.reader(SCHEMA_ID, cls, payload)
    assert reader is not None, "every field the generator writes is covered"
    read_clean = 0
    for batch in range(10):
        broken = batch % 2 == 1
        array = pa.array(values_of(rng, cls, broken), pa.binary())
        if len(array) > 2 and rng.random() < 0.5:
            array = array.slice(1, len(array) - 2)
        columns = reader.decode(array)
        expected = record_path(plan, array, payload)
        if columns is not None:
            assert expected is not None, "the column reader read a batch the record decoder refuses"
            assert same(columns, expected)
        if not broken:
            assert columns is not None and expected is not None
            read_clean += 1
    assert read_clean == 5


def test_varints_wider_than_the_field_are_cut_as_the_runtime_cuts_them():
    """An int32 written as a 64-bit varint keeps its low 32 bits; a bool is any non-zero varint."""
    rng = random.Random(7)
    cls = message_class(rng, [_T.TYPE_INT32, _T.TYPE_BOOL, _T.TYPE_SINT32])
    numbers = [f.number for f in cls.DESCRIPTOR.fields]
    struct_type = message_to_spark(cls)
    payload = registry_source.arrow_schema(struct_type)
    plan = RegistryPlan("protobuf", {SCHEMA_ID: ("PROTOBUF", schema_string(cls))}, None, struct_type)
    body = varint(numbers[0] << 3) + varint((1 << 40) + 5) + varint(numbers[1] << 3) + varint(2) + varint(numbers[2] << 3) + varint((1 << 35) | 3)
    values = pa.array([HEADER + body], pa.binary())
    columns = protobuf_columns.reader(SCHEMA_ID, cls, payload).decode(values)
    expected = record_path(plan, values, payload)
    assert expected is not None and columns is not None and same(columns, expected)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x88\x80\x80\x80\x80\x00\x07", id="a tag of 6 bytes"),
        pytest.param(b"\x12\x02\xff\xfe\x12\x02ok", id="a string twice, the first not UTF-8"),
    ],
)
def test_messages_the_runtime_refuses_are_left_to_it(body):
    rng = random.Random(5)
    cls = message_class(rng, [_T.TYPE_INT64, _T.TYPE_STRING])
    numbers = [f.number for f in cls.DESCRIPTOR.fields]
    if body.startswith(b"\x88"):  # the tag of the first field, padded to 6 bytes
        tag = varint(numbers[0] << 3)
        body = bytes(b | 0x80 for b in tag) + b"\x80" * (5 - len(tag)) + b"\x00" + body[6:]
    else:
        body = body.replace(b"\x12", varint(numbers[1] << 3 | 2))
    struct_type = message_to_spark(cls)
    payload = registry_source.arrow_schema(struct_type)
    plan = RegistryPlan("protobuf", {SCHEMA_ID: ("PROTOBUF", schema_string(cls))}, None, struct_type)
    values = pa.array([HEADER + body], pa.binary())
    assert record_path(plan, values, payload) is None
    assert protobuf_columns.reader(SCHEMA_ID, cls, payload).decode(values) is None


def test_messages_it_does_not_cover_have_no_column_reader():
    rng = random.Random(3)
    for kind in (_T.TYPE_UINT64, _T.TYPE_FIXED32, _T.TYPE_UINT32, _T.TYPE_SFIXED64):
        cls = message_class(rng, [_T.TYPE_INT64, kind])
        assert protobuf_columns.reader(SCHEMA_ID, cls, registry_source.arrow_schema(message_to_spark(cls))) is None
    cls = message_class(rng, [_T.TYPE_STRING])
    assert protobuf_columns.reader(SCHEMA_ID, cls, pa.schema([pa.field("f0", pa.int64())])) is None
    file = descriptor_pb2.FileDescriptorProto(name="extended_row.proto", package="extended_row", syntax="proto2")
    message = file.message_type.add(name="Row")
    message.field.add(name="a", number=1, type=_T.TYPE_INT64, label=_T.LABEL_OPTIONAL)
    message.extension_range.add(start=100, end=200)
    cls = message_factory.GetMessageClass(descriptor_pool.DescriptorPool().Add(file).message_types_by_name["Row"])
    assert protobuf_columns.reader(SCHEMA_ID, cls, pa.schema([pa.field("a", pa.int64())])) is None  # extensions


def test_a_oneof_has_no_column_reader():
    """Setting a later member of a oneof clears an earlier one: the runtime keeps one of them."""
    file = descriptor_pb2.FileDescriptorProto(name="oneof_row.proto", package="oneof_row", syntax="proto3")
    message = file.message_type.add(name="Row")
    message.oneof_decl.add(name="choice")
    for number, kind in ((1, _T.TYPE_INT64), (2, _T.TYPE_STRING)):
        message.field.add(name=f"f{number}", number=number, type=kind, label=_T.LABEL_OPTIONAL, oneof_index=0)
    cls = message_factory.GetMessageClass(descriptor_pool.DescriptorPool().Add(file).message_types_by_name["Row"])
    assert protobuf_columns.reader(SCHEMA_ID, cls, registry_source.arrow_schema(message_to_spark(cls))) is None
