"""The column-wise Avro encoder against fastavro's record writer (pure: no broker, no Spark): on
random batches of every supported type, nested and nullable, each row's bytes are fastavro's."""

from __future__ import annotations

import io
import random

import fastavro
import pyarrow as pa
import pytest

from dpone_dagster.formats.avro_arrow import Unsupported, encode_records, zigzag_varints

SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "dpone",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "amount", "type": ["null", "double"], "default": None},
        {"name": "paid", "type": ["null", "boolean"], "default": None},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": ["null", {"type": "array", "items": ["null", "string"]}], "default": None},
        {"name": "counts", "type": {"type": "array", "items": "long"}},
        {
            "name": "address",
            "type": [
                "null",
                {"type": "record", "name": "Order_address", "fields": [
                    {"name": "city", "type": ["null", "string"], "default": None},
                    {"name": "lines", "type": ["null", {"type": "array", "items": {"type": "record", "name": "Line", "fields": [{"name": "n", "type": ["null", "long"]}]}}], "default": None},
                ]},
            ],
            "default": None,
        },
        {"name": "flag_first", "type": ["boolean", "null"]},
        {"name": "missing", "type": ["null", "string"], "default": None},
    ],
}

ARROW = pa.struct(
    [
        ("order_id", pa.int64()),
        ("amount", pa.float64()),
        ("paid", pa.bool_()),
        ("note", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("counts", pa.list_(pa.int64())),
        ("address", pa.struct([("city", pa.string()), ("lines", pa.list_(pa.struct([("n", pa.int64())])))])),
        ("flag_first", pa.bool_()),
    ]
)


def random_row(rng: random.Random) -> dict:
    def maybe(value):
        return None if rng.random() < 0.2 else value

    big = rng.choice([0, 1, -1, 63, 64, -65, 2**31, -(2**31), 2**62, -(2**63), 2**63 - 1, rng.randint(-(10**12), 10**12)])
    text = "".join(rng.choice(["a", "é", "€", "😀", '"', "\n", "\x01", " "]) for _ in range(rng.randint(0, 40)))
    return {
        "order_id": big,
        "amount": maybe(rng.choice([0.0, -0.0, 1.5, 1e300, -2.5e-300, rng.uniform(-1e6, 1e6)])),
        "paid": maybe(rng.random() < 0.5),
        "note": maybe(text),
        "tags": maybe([maybe(f"t{j}") for j in range(rng.randint(0, 3))]),
        "counts": [rng.randint(-(2**40), 2**40) for _ in range(rng.randint(0, 130))],
        "address": maybe({"city": maybe(text[:5]), "lines": maybe([{"n": maybe(rng.randint(-5, 5))} for _ in range(rng.randint(0, 2))])}),
        "flag_first": maybe(rng.random() < 0.5),
    }


def fastavro_bytes(row: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), row)
    return out.getvalue()


@pytest.mark.parametrize("seed", range(8))
def test_every_row_is_what_fastavro_writes(seed):
    rng = random.Random(seed)
    rows = [random_row(rng) for _ in range(400)]
    table = pa.Table.from_pylist(rows, schema=pa.schema(list(ARROW))).combine_chunks()
    # A slice, so that offsets inside the buffers are exercised too.
    sliced = table.slice(7, 350)
    columns = {name: sliced.column(name).chunk(0) for name in sliced.column_names}
    encoded = encode_records(columns, SCHEMA, sliced.num_rows).to_pylist()
    assert encoded == [fastavro_bytes(row) for row in rows[7:357]]


def test_zigzag_varints_at_every_length():
    values = [0, -1, 1, -64, 63, 64, -65, 8191, 8192, 2**63 - 1, -(2**63)]
    for k in range(1, 10):
        values += [2 ** (7 * k) // 2 - 1, 2 ** (7 * k) // 2, -(2 ** (7 * k) // 2), -(2 ** (7 * k) // 2) - 1]
    import numpy as np

    encoded = zigzag_varints(np.array(values, np.int64)).to_pylist()
    for value, got in zip(values, encoded, strict=True):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, "long", value)
        assert got == out.getvalue(), value


def test_what_it_does_not_write_is_refused():
    columns = {"order_id": pa.array([1, 2])}
    with pytest.raises(Unsupported):  # a required field the batch lacks
        encode_records(columns, {"type": "record", "name": "R", "fields": [{"name": "order_id", "type": "long"}, {"name": "x", "type": "long"}]}, 2)
    with pytest.raises(Unsupported):  # a logical type
        encode_records(columns, {"type": "record", "name": "R", "fields": [{"name": "order_id", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}, 2)
    with pytest.raises(Unsupported):  # a null where the schema requires a value
        encode_records({"order_id": pa.array([1, None])}, {"type": "record", "name": "R", "fields": [{"name": "order_id", "type": "long"}]}, 2)
    for kind, values in ((pa.map_(pa.string(), pa.int64()), [[("a", 1)], None]), (pa.binary(), [b"x", None])):
        with pytest.raises(Unsupported):  # a nullable type the columns are not written from: the row encoder writes it
            encode_records({"m": pa.array(values, kind)}, {"type": "record", "name": "R", "fields": [{"name": "m", "type": ["null", {"type": "map", "values": "long"} if pa.types.is_map(kind) else "bytes"]}]}, 2)
    with pytest.raises(Unsupported):  # an enum
        encode_records({"e": pa.array(["A"])}, {"type": "record", "name": "R", "fields": [{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}]}, 1)
