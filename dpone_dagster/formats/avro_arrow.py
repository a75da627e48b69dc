"""Avro binary encoding of whole Arrow columns (pure): one record per row, byte for byte what
fastavro's `schemaless_writer` writes for the same values, without a Python call per record.

Avro's binary form is a concatenation: a record is its fields in schema order, a long a zigzag
varint, a string its length then its UTF-8 bytes, a double 8 little-endian bytes, a union the
branch index then the value, an array blocks of (count, items) ended by a 0 count. So each field
is encoded for the whole column at once (numpy and Arrow kernels) and the fields are joined row
by row.

Covered: the types the JSON decoder yields (long, double, boolean, string, arrays, records), each
also as a union with null, written under a schema whose types match them exactly. Anything else
(an enum, a logical type, a field the batch lacks that is not nullable, an int where the schema
says double) raises `Unsupported`: the caller encodes those rows one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_EMPTY = pa.scalar(b"", pa.binary())


class Unsupported(Exception):
    """A schema or a value this encoder does not write (the caller falls back to fastavro)."""


def encode_records(columns: Mapping[str, pa.Array], schema: Mapping[str, Any], rows: int) -> pa.Array:
    """Each row of `columns` (by field name) as an Avro record of `schema` (a parsed JSON dict):
    a binary array of `rows` values."""
    if schema.get("type") != "record":
        raise Unsupported("the schema is not a record")
    return _record(dict(columns), schema, rows)


def _record(columns: dict[str, pa.Array], schema: Mapping[str, Any], rows: int) -> pa.Array:
    known = {str(f["name"]) for f in schema["fields"]}
    if set(columns) - known:
        raise Unsupported(f"column(s) {sorted(set(columns) - known)} are not in the schema")
    parts: list[pa.Array] = []
    for field in schema["fields"]:
        column = columns.get(str(field["name"]))
        if column is None:
            parts.append(_absent(field, rows))
        else:
            parts.append(_value(column, field["type"]))
    if not parts:
        return pa.array([b""] * rows, pa.binary())
    return pc.binary_join_element_wise(*parts, _EMPTY) if len(parts) > 1 else parts[0]


def _absent(field: Mapping[str, Any], rows: int) -> pa.Array:
    """A field the batch lacks: null, when the schema allows it (as fastavro writes None)."""
    kind = field["type"]
    if isinstance(kind, list) and "null" in kind:
        return pa.array([_varint_bytes(kind.index("null"))] * rows, pa.binary())
    raise Unsupported(f"field {field['name']!r} is not in the batch and is not nullable")


def _value(column: pa.Array, kind: Any) -> pa.Array:
    if isinstance(kind, list):
        return _union(column, kind)
    if column.null_count:
        raise Unsupported("a null where the schema requires a value")
    return _plain(column, kind)


def _union(column: pa.Array, branches: list[Any]) -> pa.Array:
    others = [b for b in branches if b != "null"]
    if len(others) != 1 or len(branches) != 2:
        raise Unsupported(f"union {branches}")
    null_index = branches.index("null")
    value_index = 1 - null_index
    if column.null_count == len(column):
        return pa.array([_varint_bytes(null_index)] * len(column), pa.binary())
    filled = _fill_nulls(column) if column.null_count else column
    encoded = pc.binary_join_element_wise(pa.scalar(_varint_bytes(value_index), pa.binary()), _plain(filled, others[0]), _EMPTY)
    if not column.null_count:
        return encoded
    return pc.if_else(column.is_valid(), encoded, pa.scalar(_varint_bytes(null_index), pa.binary()))


def _plain(column: pa.Array, kind: Any) -> pa.Array:
    name = kind.get("type") if isinstance(kind, dict) else kind
    if isinstance(kind, dict) and kind.get("logicalType"):
        raise Unsupported(f"logical type {kind['logicalType']}")
    arrow = column.type
    if name == "long" and pa.types.is_int64(arrow):
        return zigzag_varints(column.to_numpy(zero_copy_only=False).astype(np.int64))
    if name == "double" and pa.types.is_float64(arrow):
        return _fixed(np.ascontiguousarray(column.to_numpy(zero_copy_only=False), dtype="<f8").view(np.uint8), 8)
    if name == "float" and pa.types.is_float32(arrow):
        return _fixed(np.ascontiguousarray(column.to_numpy(zero_copy_only=False), dtype="<f4").view(np.uint8), 4)
    if name == "boolean" and pa.types.is_boolean(arrow):
        return _fixed(column.to_numpy(zero_copy_only=False).astype(np.uint8), 1)
    if name == "string" and pa.types.is_string(arrow):
        return _length_prefixed(column)
    if name == "array" and pa.types.is_list(arrow):
        return _array(column, kind["items"])
    if name == "record" and pa.types.is_struct(arrow):
        return _record({arrow.field(i).name: column.field(i) for i in range(arrow.num_fields)}, kind, len(column))
    raise Unsupported(f"Avro {name} from Arrow {arrow}")


def _array(column: pa.Array, items: Any) -> pa.Array:
    offsets = column.offsets.to_numpy().astype(np.int64)
    counts = np.diff(offsets)
    values = column.values.slice(offsets[0], offsets[-1] - offsets[0])
    encoded = _value(values, items) if len(values) else pa.array([], pa.binary())
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()), encoded), _EMPTY)
    blocks = pc.binary_join_element_wise(zigzag_varints(counts), joined, pa.scalar(b"\x00", pa.binary()), _EMPTY)
    # An empty array is its terminating 0 count alone.
    return pc.if_else(pa.array(counts > 0), blocks, pa.scalar(b"\x00", pa.binary()))


def _length_prefixed(column: pa.Array) -> pa.Array:
    data = column.cast(pa.binary())
    lengths = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(np.int64)
    return pc.binary_join_element_wise(zigzag_varints(lengths), data, _EMPTY)


def _fixed(octets: np.ndarray, width: int) -> pa.Array:
    rows = len(octets) // width
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), rows, [None, pa.py_buffer(np.ascontiguousarray(octets).tobytes())])
    return fixed.cast(pa.binary())


def zigzag_varints(values: np.ndarray) -> pa.Array:
    """Avro's long encoding of each value: zigzag, then 7 bits a byte, low bits first."""
    signed = values.astype(np.int64)
    zigzag = ((signed << 1) ^ (signed >> 63)).astype(np.uint64)
    sizes = np.ones(len(zigzag), np.int64)
    for k in range(1, 10):
        sizes += zigzag >= np.uint64(1 << (7 * k))
    positions = np.arange(10, dtype=np.uint64)
    groups = ((zigzag[:, None] >> (positions * np.uint64(7))[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    more = np.arange(10)[None, :] < (sizes[:, None] - 1)
    groups |= (more * 0x80).astype(np.uint8)
    data = groups[np.arange(10)[None, :] < sizes[:, None]]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    return pa.Array.from_buffers(pa.binary(), len(zigzag), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data.tobytes())])


def _varint_bytes(value: int) -> bytes:
    return zigzag_varints(np.array([value], np.int64))[0].as_py()


def _fill_nulls(column: pa.Array) -> pa.Array:
    """Null slots given a value of the type (the union writes the null branch there instead). A
    null record's fields are filled too; a present record's own null fields stay null."""
    kind = column.type
    if pa.types.is_struct(kind):
        valid = column.is_valid()
        children = [column.field(i) for i in range(kind.num_fields)]
        children = [pc.if_else(valid, child, _fill_deep(child)) for child in children]
        return pa.StructArray.from_arrays(children, fields=list(kind))
    return _fill_deep(column)


def _fill_deep(column: pa.Array) -> pa.Array:
    """Every null slot, at any depth, given a value of its type."""
    kind = column.type
    if pa.types.is_struct(kind):
        children = [_fill_deep(column.field(i)) for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(kind))
    if pa.types.is_list(kind):
        return pc.if_else(column.is_valid(), column, pa.scalar([], kind))
    if pa.types.is_string(kind):
        return pc.fill_null(column, "")
    if pa.types.is_boolean(kind):
        return pc.fill_null(column, False)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return pc.fill_null(column, pa.scalar(0, kind))
    raise Unsupported(f"a nullable {kind}")  # `_plain` writes no other type: the row encoder does
