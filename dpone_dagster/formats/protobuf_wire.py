"""Protobuf values written column-wise in the wire format, for messages whose fields the batch's
columns fill as they are: integers (varint), doubles, booleans, strings and lists of strings.
The bytes the protobuf runtime writes for the same rows (formats/protobuf_values.py and the
registry codec's row encoder): fields in field-number order, a null left out, a field without
presence (proto3's default) left out at its zero value (-0.0 is not zero), a field with presence
written whenever it is set. Anything else returns None (the row path writes that batch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.descriptor import FieldDescriptor

_FD = FieldDescriptor
_VARINT, _FIXED64, _LENGTH = 0, 1, 2
_SIGNED = {_FD.TYPE_INT64: 64, _FD.TYPE_INT32: 32}
_UNSIGNED = {_FD.TYPE_UINT64: 64, _FD.TYPE_UINT32: 32}
_EMPTY = pa.scalar(b"", pa.binary())


def encode_columns(columns: list[pa.Array], names: list[str], message_class: Any) -> pa.Array | None:
    """The unframed message of each row, or None when a field or a value needs the row path."""
    fields = message_class.DESCRIPTOR.fields_by_name
    used = sorted(((fields[n], c) for n, c in zip(names, columns, strict=True) if n in fields), key=lambda fc: fc[0].number)
    rows = len(columns[0]) if columns else 0
    parts = []
    for field, column in used:
        part = _field(field, column)
        if part is None:
            return None
        parts.append(part)
    if not parts:
        return pa.array([b""] * rows, pa.binary())
    return pc.binary_join_element_wise(*parts, b"") if len(parts) > 1 else parts[0]


def _field(field: Any, column: pa.Array) -> pa.Array | None:
    """Each row's bytes of one field (tag and value; empty where it is left out)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_null(column.type):
        return pa.array([b""] * len(column), pa.binary())
    if field.label == _FD.LABEL_REPEATED:
        if field.type != _FD.TYPE_STRING or not pa.types.is_list(column.type) or not pa.types.is_string(column.type.value_type):
            return None
        return _repeated_strings(field, column)
    presence = field.has_presence
    kind = field.type
    if kind in _SIGNED or kind in _UNSIGNED or kind == _FD.TYPE_BOOL:
        if kind == _FD.TYPE_BOOL:
            if not pa.types.is_boolean(column.type):
                return None
            values = pc.fill_null(column, False).to_numpy(zero_copy_only=False).astype(np.uint64)
        else:
            if not pa.types.is_int64(column.type):
                return None
            signed = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            if not _in_range(signed, kind):
                return None
            values = signed.view(np.uint64)  # a negative value: ten bytes of two's complement
        wanted = _wanted(column, None if presence else values != 0)
        return _tagged(field.number, _VARINT, _varints(values), wanted)
    if kind == _FD.TYPE_DOUBLE:
        if not (pa.types.is_float64(column.type) or pa.types.is_int64(column.type)):
            return None
        doubles = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.float64)
        wanted = _wanted(column, None if presence else doubles.view(np.uint64) != 0)
        return _tagged(field.number, _FIXED64, _fixed(doubles.view(np.uint8), 8), wanted)
    if kind == _FD.TYPE_STRING:
        if not pa.types.is_string(column.type):
            return None
        lengths = pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False).astype(np.uint64)
        wanted = _wanted(column, None if presence else lengths != 0)
        body = pc.binary_join_element_wise(_varints(lengths), pc.fill_null(column.cast(pa.binary()), b""), b"")
        return _tagged(field.number, _LENGTH, body, wanted)
    return None  # floats, fixed and zigzag integers, bytes, enums, messages: the row path


def _repeated_strings(field: Any, column: pa.Array) -> pa.Array | None:
    """Each element as its own tagged length-delimited record, the elements of a row joined."""
    items = column.flatten()
    if items.null_count:
        return None  # a null inside a repeated field: the row path refuses it with the reason
    lengths = pc.binary_length(items).to_numpy(zero_copy_only=False).astype(np.uint64)
    body = pc.binary_join_element_wise(_varints(lengths), items.cast(pa.binary()), b"")
    encoded = _tagged(field.number, _LENGTH, body, None)
    offsets = pc.subtract(pc.fill_null(column.offsets, 0), column.offsets[0]) if len(column) else column.offsets
    lists = pa.ListArray.from_arrays(offsets, encoded)
    return pc.fill_null(pc.binary_join(lists, b""), _EMPTY)


def _in_range(values: np.ndarray, kind: int) -> bool:
    if kind in _UNSIGNED:
        return bool((values >= 0).all()) and (kind != _FD.TYPE_UINT32 or bool((values < 2**32).all()))
    return kind != _FD.TYPE_INT32 or bool(((values >= -(2**31)) & (values < 2**31)).all())


def _wanted(column: pa.Array, nonzero: np.ndarray | None) -> np.ndarray:
    """Rows where the field is written: not null, and for a field without presence not zero."""
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return valid if nonzero is None else valid & nonzero


def _tagged(number: int, wire_type: int, body: pa.Array, wanted: np.ndarray | None) -> pa.Array:
    tag = _varints(np.array([(number << 3) | wire_type], np.uint64))[0]
    joined = pc.binary_join_element_wise(pa.scalar(tag.as_py(), pa.binary()), body, b"")
    return joined if wanted is None else pc.if_else(pa.array(wanted), joined, _EMPTY)


def _varints(values: np.ndarray) -> pa.Array:
    """Base-128 varints of unsigned 64-bit values, one binary value each."""
    rows = len(values)
    out = np.zeros((rows, 10), np.uint8)
    lengths = np.ones(rows, np.int64)
    rest = values.astype(np.uint64, copy=True)
    for i in range(10):
        low = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest >>= np.uint64(7)
        more = rest != 0
        out[:, i] = low | (more.astype(np.uint8) << 7)
        lengths += more
    lengths = np.minimum(lengths, 10)
    data = out[np.arange(10) < lengths[:, None]]
    return _from_lengths(data, lengths)


def _fixed(data: np.ndarray, width: int) -> pa.Array:
    return _from_lengths(data, np.full(len(data) // width, width, np.int64))


def _from_lengths(data: np.ndarray, lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))])
