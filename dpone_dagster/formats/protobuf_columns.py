"""Protobuf source values decoded column by column (pure): the wire format of a batch read one
field at a time for every message at once (formats/byte_columns.py), instead of one message object
and one dict per record.

It yields what the record decoder (spark/registry_codec.RecordDecoder: the protobuf runtime, then
schema/protobuf.message_to_row) yields for the same values, or nothing: a message it does not
cover gives no Reader, and a batch with anything it does not read as the runtime would (a
truncated or malformed message, a known field with another wire type, a group, a string that is
not UTF-8, a frame of other message indexes) gives None; the caller then decodes that batch record
by record.

Covered: messages whose every field is a singular int32, int64, sint32, sint64, bool, double,
float, string or bytes (implicit presence: the type's zero when absent; explicit presence, proto3
`optional`: null), read in any order, the last of repeated occurrences winning, unknown fields
skipped. Not covered: repeated fields, maps, messages, enums, unsigned and fixed-width integers,
oneofs, required fields, messages with extension ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.descriptor import FieldDescriptor

from dpone_dagster.formats.byte_columns import (
    Cursor,
    Inexact,
    batch_cursor,
    gather,
    payload_columns,
    raw_varints,
    schema_ids,
    zigzag,
)

_FD = FieldDescriptor
_HEADER = 6  # magic byte, schema id, message indexes [0] (one zero byte)
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_WIRE = {
    _FD.TYPE_INT32: _VARINT, _FD.TYPE_INT64: _VARINT, _FD.TYPE_SINT32: _VARINT, _FD.TYPE_SINT64: _VARINT,
    _FD.TYPE_BOOL: _VARINT, _FD.TYPE_DOUBLE: _FIXED64, _FD.TYPE_FLOAT: _FIXED32, _FD.TYPE_STRING: _LENGTH,
    _FD.TYPE_BYTES: _LENGTH,
}
# The payload column each type is read into, and the wider ones the record decoder also fills exactly.
_TARGETS = {
    _FD.TYPE_INT32: (pa.int32(), pa.int64()), _FD.TYPE_SINT32: (pa.int32(), pa.int64()),
    _FD.TYPE_INT64: (pa.int64(),), _FD.TYPE_SINT64: (pa.int64(),), _FD.TYPE_BOOL: (pa.bool_(),),
    _FD.TYPE_DOUBLE: (pa.float64(),), _FD.TYPE_FLOAT: (pa.float32(), pa.float64()),
    _FD.TYPE_STRING: (pa.string(),), _FD.TYPE_BYTES: (pa.binary(),),
}
# Fields read per message, and different fields at one read, before a batch is cheaper record by
# record (each is a numpy pass).
MAX_READS = 256
MAX_TAGS = 64


@dataclass(frozen=True)
class _Field:
    name: str
    kind: int  # FieldDescriptor.TYPE_*
    presence: bool  # absent reads as null (else as the type's zero)
    target: pa.DataType | None  # the payload's column (None: read, then dropped)


@dataclass(frozen=True)
class Reader:
    """Reads the messages of one registered schema (its first message) into the payload's schema."""

    schema_id: int
    fields: dict[int, _Field]  # by field number
    schema: pa.Schema

    def decode(self, values: pa.Array) -> list[pa.Array] | None:
        """One array per payload field, aligned with `values` (registry-framed); a null value (a
        tombstone) gives nulls. None: a batch the record decoder must judge."""
        batch = batch_cursor(values, _HEADER)
        if batch is None:
            return None
        cursor, live, headers = batch
        if bool((headers[:, 0] != 0).any() or (schema_ids(headers) != self.schema_id).any() or (headers[:, 5] != 0).any()):
            return None
        try:
            read = self._read(cursor)
        except Inexact:
            return None
        by_name = {field.name: read[number] for number, field in self.fields.items() if field.target is not None}
        return payload_columns(by_name, self.schema, live, len(values))

    def _read(self, cursor: Cursor) -> dict[int, pa.Array]:
        """Every field's column over the messages at the cursor: tags read one per message at a
        time (so a message's last occurrence of a field is the one kept), values by wire type."""
        rows = cursor.pos.size
        seen = {number: np.zeros(rows, bool) for number in self.fields}
        raw = {number: np.zeros(rows, np.uint64) for number in self.fields}  # varints and fixed widths
        runs = {number: (np.zeros(rows, np.int64), np.zeros(rows, np.int64)) for number, f in self.fields.items() if _WIRE[f.kind] == _LENGTH}
        active = np.flatnonzero(cursor.pos < cursor.end)
        for _ in range(MAX_READS):
            if not active.size:
                break
            at = cursor.at(active)
            tag, after = raw_varints(at)
            if bool((after - at.pos > 5).any()):
                raise Inexact("a tag longer than 5 bytes")  # the runtime refuses them
            at.advance(after)
            if bool(((tag >> np.uint64(3)) == 0).any() or (tag >= np.uint64(1 << 32)).any()):
                raise Inexact("a field number of 0 or beyond 2**29")
            kinds = np.unique(tag)
            if kinds.size > MAX_TAGS:
                raise Inexact(f"more than {MAX_TAGS} different fields at one read")
            for kind in kinds:
                chosen = np.flatnonzero(tag == kind)
                field_number, field_wire = int(kind) >> 3, int(kind) & 7
                one = at.at(chosen)
                value = _value(one, field_wire)
                at.pos[chosen] = one.pos
                field = self.fields.get(field_number)
                if field is None:
                    continue  # an unknown field: skipped, as the runtime keeps it aside
                if field_wire != _WIRE[field.kind]:
                    raise Inexact(f"field {field_number} with wire type {field_wire}")
                target_rows = active[chosen]
                if field.kind == _FD.TYPE_STRING and bool(seen[field_number][target_rows].any()):
                    raise Inexact("a string field twice in a message")  # the runtime checks each one's UTF-8
                seen[field_number][target_rows] = True
                if field_number in runs:
                    starts, lengths = runs[field_number]
                    starts[target_rows], lengths[target_rows] = value
                else:
                    raw[field_number][target_rows] = value
            cursor.pos[active] = at.pos
            active = active[cursor.pos[active] < cursor.end[active]]
        else:
            if active.size:
                raise Inexact(f"a message of more than {MAX_READS} fields")
        return {number: _column(field, raw.get(number), runs.get(number), seen[number], cursor) for number, field in self.fields.items()}


def _value(cursor: Cursor, wire: int) -> Any:
    """The value of one wire type at each position (varints and fixed widths as uint64, runs as
    (start, length)), advancing past it."""
    if wire == _VARINT:
        value, after = raw_varints(cursor)
        cursor.advance(after)
        return value
    if wire in (_FIXED64, _FIXED32):
        width = 8 if wire == _FIXED64 else 4
        raw = np.ascontiguousarray(cursor.data[cursor.pos[:, None] + np.arange(width)])
        cursor.advance(cursor.pos + width)
        return raw.view("<u8" if width == 8 else "<u4").reshape(-1).astype(np.uint64)
    if wire == _LENGTH:
        length, after = raw_varints(cursor)
        cursor.advance(after)
        if bool((length >= 1 << 31).any()):
            raise Inexact("a length beyond 2 GiB")
        starts = cursor.pos.copy()
        cursor.skip(length.astype(np.int64))
        return starts, length.astype(np.int64)
    raise Inexact(f"wire type {wire} (groups and reserved types are left to the runtime)")


def _column(field: _Field, raw: np.ndarray | None, run: tuple[np.ndarray, np.ndarray] | None, seen: np.ndarray, cursor: Cursor) -> pa.Array:
    """One field's values as an Arrow column of its payload type (nulls where absent, with presence)."""
    kind = field.kind
    if run is not None:
        starts, lengths = run
        lengths = np.where(seen, lengths, 0)
        values = gather(Cursor(cursor.data, np.where(seen, starts, 0), np.where(seen, starts + lengths, 0)), lengths, pa.string() if kind == _FD.TYPE_STRING else pa.binary())
    else:
        assert raw is not None
        values = pa.array(_numbers(kind, raw), _TARGETS[kind][0])
    if field.presence and not bool(seen.all()):
        values = pc.if_else(pa.array(seen), values, pa.scalar(None, values.type))
    target = field.target
    return values.cast(target) if target is not None and target != values.type else values


def _numbers(kind: int, raw: np.ndarray) -> np.ndarray:
    """Numbers from raw varints or fixed-width bits, as the runtime converts them."""
    if kind == _FD.TYPE_INT64:
        return raw.view(np.int64)
    if kind == _FD.TYPE_INT32:  # the low 32 bits of the varint
        return (raw & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
    if kind == _FD.TYPE_SINT64:
        return zigzag(raw)
    if kind == _FD.TYPE_SINT32:  # zigzag over the low 32 bits
        return zigzag(raw & np.uint64(0xFFFFFFFF)).astype(np.int32)
    if kind == _FD.TYPE_BOOL:
        return raw != 0
    if kind == _FD.TYPE_DOUBLE:
        return raw.view(np.float64)
    return raw.astype(np.uint32).view(np.float32)  # float


def reader(schema_id: int, message_class: Any, payload: pa.Schema) -> Reader | None:
    """The column reader of values framed with `schema_id` and message indexes [0], holding
    messages of `message_class`, for the payload's Arrow schema; None when not covered."""
    targets = {f.name: f.type for f in payload}
    fields: dict[int, _Field] = {}
    if message_class.DESCRIPTOR.extension_ranges:
        return None  # extensions: the runtime parses (and checks) those it knows
    for field in message_class.DESCRIPTOR.fields:
        if field.type not in _WIRE or field.is_repeated or field.is_required:
            return None  # repeated, required, a message, an enum, an unsigned or fixed-width integer
        if field.containing_oneof is not None and len(field.containing_oneof.fields) > 1:
            return None  # a oneof: a later member clears an earlier one
        target = targets.get(field.name)
        if target is not None and target not in _TARGETS[field.type]:
            return None
        fields[field.number] = _Field(field.name, field.type, field.has_presence, target)
    return Reader(schema_id, fields, payload)
