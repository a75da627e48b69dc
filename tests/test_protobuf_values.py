"""formats/protobuf_wire.py and formats/protobuf_values.py against the registry codec's row
encoder (the Spark SQL path's): the same bytes for every batch they take, None (the next writer
then decides) for the rest. No broker, no Spark."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from dpone_dagster.formats import protobuf_values, protobuf_wire, registry_values
from dpone_dagster.schema import protobuf
from dpone_dagster.spark.registry_codec import RecordEncoder


@pytest.fixture
def order(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "proto"))
    message = protobuf.load_message_class("dpone_test_orders_pb2:Order")
    schema_str = protobuf.schema_string(message)
    refs = tuple((f.name, f.schema_str) for f in protobuf.dependency_files(message))
    return RecordEncoder("protobuf", 0, schema_str, [0], refs), schema_str, refs


def batch(n: int, seed: int) -> tuple[list[pa.Array], list[str]]:
    rng = random.Random(seed)
    def maybe(value):
        return None if rng.random() < 0.2 else value
    columns = {
        "id": pa.array([maybe(rng.randint(-2**63, 2**63 - 1)) for _ in range(n)], pa.int64()),
        "name": pa.array([maybe(rng.choice(["", "é€😀", 'say "hi"\n', "x" * 300])) for _ in range(n)], pa.string()),
        "amount": pa.array([maybe(rng.choice([0.0, -0.0, 1e300, 5e-324, rng.random()])) for _ in range(n)], pa.float64()),
        "tags": pa.array([maybe([f"t{j}" for j in range(rng.randint(0, 3))]) for _ in range(n)], pa.list_(pa.string())),
        "qty": pa.array([maybe(rng.randint(-2**31, 2**31 - 1)) for _ in range(n)], pa.int64()),
        "active": pa.array([maybe(rng.random() < 0.5) for _ in range(n)], pa.bool_()),
        "big": pa.array([maybe(rng.randint(0, 2**63 - 1)) for _ in range(n)], pa.int64()),
        "not_in_the_message": pa.array([rng.random() for _ in range(n)], pa.float64()),
    }
    return list(columns.values()), list(columns)


def by_rows(encoder: RecordEncoder, columns: list[pa.Array], names: list[str]) -> list[bytes]:
    return [encoder.encode(row)[6:] for row in pa.Table.from_arrays(columns, names=names).to_pylist()]


WRITERS = {"wire": protobuf_wire.encode_columns, "rows": protobuf_values.encode_rows}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("seed", range(5))
def test_the_same_bytes_as_the_row_encoder(order, seed, writer):
    encoder, _, _ = order
    columns, names = batch(500, seed)
    if seed == 4:  # sliced arrays, as a filtered batch hands them over
        columns = [c.slice(100, 300) for c in columns]
    encoded = WRITERS[writer](columns, names, encoder.message_class)
    assert encoded is not None
    assert encoded.to_pylist() == by_rows(encoder, columns, names)


def test_fields_without_presence_are_left_out_at_zero_but_not_at_minus_zero():
    """The bench's message (proto3, no `optional`): 0, 0.0, "", false are not written; -0.0 is."""
    from bench.orders_pb2 import Order

    columns = [
        pa.array([0, 1, -1, None, 2**63 - 1], pa.int64()),
        pa.array([0.0, -0.0, 1.5, None, 3.0], pa.float64()),
        pa.array(["", "x", None, "é", ""], pa.string()),
        pa.array([0, 5, 7, None, 2**62], pa.int64()),
    ]
    names = ["order_id", "amount", "note", "items"]
    expected = [Order(**{k: v for k, v in row.items() if v is not None}).SerializeToString() for row in pa.Table.from_arrays(columns, names=names).to_pylist()]
    assert protobuf_wire.encode_columns(columns, names, Order).to_pylist() == expected


def test_integers_into_a_double_field_are_taken_as_the_row_encoder_takes_them(order):
    encoder, _, _ = order
    columns, names = [pa.array([0, 3, -7, None], pa.int64())], ["amount"]
    assert protobuf_values.encode_rows(columns, names, encoder.message_class).to_pylist() == by_rows(encoder, columns, names)


@pytest.mark.parametrize(
    ("name", "column"),
    [
        ("tags", pa.array([["a", None]], pa.list_(pa.string()))),  # a null inside a repeated field
        ("qty", pa.array([2**40], pa.int64())),  # out of int32's range
        ("id", pa.array([1.5], pa.float64())),  # a double into an integer field
        ("status", pa.array(["NEW"], pa.string())),  # an enum: its symbol is converted
        ("created_at", pa.array([1], pa.int64())),  # a message (Timestamp)
        ("blob", pa.array([b"x"], pa.binary())),
    ],
)
def test_what_needs_the_row_encoder_is_left_to_it(order, name, column):
    encoder, schema_str, refs = order
    assert protobuf_values.encode_rows([column], [name], encoder.message_class) is None
    assert protobuf_wire.encode_columns([column], [name], encoder.message_class) is None
    # encode_values then takes the row encoder: its bytes, or its refusal.
    try:
        expected = by_rows(encoder, [column], [name])
    except Exception:  # noqa: BLE001
        with pytest.raises(registry_values.Unencodable):
            registry_values.encode_values("protobuf", [column], [name], schema_str, (0,), refs)
    else:
        assert registry_values.encode_values("protobuf", [column], [name], schema_str, (0,), refs).to_pylist() == expected
