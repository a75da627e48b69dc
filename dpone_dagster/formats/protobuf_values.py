"""Protobuf values of a batch whose columns the message takes as they are (integers, doubles,
booleans, strings and lists of them): each row handed to the message's constructor, which the
protobuf runtime fills in C. Byte for byte what the registry codec's row encoder writes
(schema/protobuf.row_to_message: nulls unset, columns the message lacks ignored), without its
per-value conversions; anything else returns None and the row encoder writes the batch."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor

_FD = FieldDescriptor
_INTEGERS = {_FD.TYPE_INT64, _FD.TYPE_SINT64, _FD.TYPE_SFIXED64, _FD.TYPE_INT32, _FD.TYPE_SINT32, _FD.TYPE_SFIXED32,
             _FD.TYPE_UINT32, _FD.TYPE_UINT64, _FD.TYPE_FIXED32, _FD.TYPE_FIXED64}


def encode_rows(columns: list[pa.Array], names: list[str], message_class: Any) -> pa.Array | None:
    """The unframed bytes of each row, or None when a column needs the row encoder's conversions
    (or a value the constructor refuses: the row encoder then says why)."""
    fields = message_class.DESCRIPTOR.fields_by_name
    used = [(name, column) for name, column in zip(names, columns, strict=True) if name in fields]
    if not all(_takes(fields[name], column.type) for name, column in used):
        return None
    rows = pa.Table.from_arrays([c for _, c in used], names=[n for n, _ in used]).to_pylist() if used else [{}] * len(columns[0])
    try:
        return pa.array(
            [message_class(**{k: v for k, v in row.items() if v is not None}).SerializeToString() for row in rows], pa.binary()
        )
    except (TypeError, ValueError):  # a null inside a list, an integer out of the field's range
        return None


def _takes(field: Any, arrow_type: pa.DataType) -> bool:
    """Whether values of `arrow_type` go into `field` unconverted."""
    if pa.types.is_null(arrow_type):
        return True
    repeated = field.label == _FD.LABEL_REPEATED
    if repeated != pa.types.is_list(arrow_type):
        return False
    if repeated:
        arrow_type = arrow_type.value_type
    kind = field.type
    if kind in _INTEGERS:
        return pa.types.is_int64(arrow_type)
    if kind in (_FD.TYPE_DOUBLE, _FD.TYPE_FLOAT):
        return pa.types.is_float64(arrow_type) or pa.types.is_int64(arrow_type)
    if kind == _FD.TYPE_BOOL:
        return pa.types.is_boolean(arrow_type)
    if kind == _FD.TYPE_STRING:
        return pa.types.is_string(arrow_type)
    return False  # enums, messages (maps, well-known types), bytes: the row encoder converts them
