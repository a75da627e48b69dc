"""Avro binary values decoded column by column (pure): the inverse of formats/avro_arrow.py, for
the direct path's registry sources. A batch of records written with one schema is read field by
field for every record at once (numpy over the batch's bytes), instead of one fastavro call and
one value conversion per record.

It yields what the record decoder (spark/registry_codec.RecordDecoder: fastavro, then
schema/values.to_spark_value, then Arrow) yields for the same values, or nothing: a schema it
does not cover gives no `Reader`, and a batch with anything it does not read exactly as the record
decoder would (a corrupt or truncated value, an integer too wide for its column, a timestamp past
year 9999, bytes that are not UTF-8 in a string) gives None; the caller then decodes that batch
record by record, whose rules decide.

Covered: null, boolean, int, long, float, double, string, bytes, enum, fixed, arrays, records
(projected by field name onto the payload's structs, as the record decoder projects them), unions
of null and one type, and the logical types decimal (into the writer's scale), date,
timestamp-millis/micros and local-timestamp-millis/micros. Not covered (no Reader): maps (the
record decoder keeps the last of repeated keys), other unions, uuid and time logical types.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpone_dagster.formats.byte_columns import Cursor as _Cursor
from dpone_dagster.formats.byte_columns import Inexact as _Inexact
from dpone_dagster.formats.byte_columns import (
    batch_cursor,
    bytes_at,
    gather,
    payload_columns,
    raw_varints,
    schema_ids,
    spread,
    zigzag,
)

# datetime's range, years 1 to 9999 (fastavro's conversions raise outside it).
_MIN_US, _END_US = -62_135_596_800_000_000, 253_402_300_800_000_000
_MIN_DAY, _MAX_DAY = -719_162, 2_932_896
_FRAME = 5  # magic byte and schema id in front of every value


class _Uncovered(Exception):
    """A schema, or a schema type against a payload type, the column reader does not cover."""


# A field reader: the values at the cursor's positions (one per record), advancing it.
_Read = Callable[[_Cursor], pa.Array]


@dataclass(frozen=True)
class Reader:
    """Reads the values of one writer schema into the payload's Arrow schema."""

    schema_id: int
    fields: tuple[tuple[str, _Read], ...]  # every writer field, in order
    schema: pa.Schema

    def decode(self, values: pa.Array) -> list[pa.Array] | None:
        """One array per payload field, aligned with `values` (registry-framed binary values); a null
        value (a tombstone) gives nulls. None: a value the record decoder must judge (a frame
        without this reader's schema id among them)."""
        batch = batch_cursor(values, _FRAME)
        if batch is None:
            return None
        cursor, live, headers = batch
        if bool((headers[:, 0] != 0).any()) or bool((schema_ids(headers) != self.schema_id).any()):
            return None
        try:
            read = {name: read(cursor) for name, read in self.fields}
        except _Inexact:
            return None
        return payload_columns(read, self.schema, live, len(values))


def reader(schema_id: int, writer_schema: str, payload: pa.Schema) -> Reader | None:
    """The column reader of values framed with `schema_id`, written with `writer_schema` (Avro JSON
    text), for the payload's Arrow schema; None when the schema is not covered (the record decoder
    reads them)."""
    import fastavro

    try:
        parsed = fastavro.parse_schema(json.loads(writer_schema), expand=True)
        if not isinstance(parsed, Mapping) or parsed.get("type") != "record":
            return None
        fields = _record_fields(parsed, {f.name: f.type for f in payload})
    except (_Uncovered, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - a schema fastavro does not expand: the record decoder judges it
        return None
    return Reader(schema_id, fields, payload)


def _record_fields(node: Mapping[str, Any], targets: Mapping[str, pa.DataType]) -> tuple[tuple[str, _Read], ...]:
    """Every writer field's reader; a field the payload lacks is still read (its bytes are there,
    and the record decoder fails on them as on any other), into its own type."""
    return tuple((str(f["name"]), _node(f["type"], targets.get(str(f["name"])))) for f in node["fields"])


def _node(node: Any, target: pa.DataType | None) -> _Read:
    """The reader of a writer type node into `target` (None: a field the payload does not have)."""
    if isinstance(node, list):
        return _union(node, target)
    if isinstance(node, str):
        node = {"type": node}
    kind, logical = node.get("type"), node.get("logicalType")
    if isinstance(kind, list | Mapping):
        if logical is not None:
            raise _Uncovered("a logical type around a complex type")
        return _node(kind, target)
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return _decimal(node, target)
    if logical is not None:
        return _logical(kind, logical, target)
    if kind == "array":
        return _array(node["items"], target)
    if kind == "record":
        if target is not None and not pa.types.is_struct(target):
            raise _Uncovered("a record into a non-struct column")
        return _struct(node, target)
    if kind == "enum":
        _expect(target, pa.string())
        return _enum(list(node["symbols"]))
    if kind == "fixed":
        _expect(target, pa.binary())
        return _fixed(int(node["size"]))
    scalar = _SCALARS.get(kind)
    if scalar is None:
        raise _Uncovered(f"Avro type {kind}")
    return scalar(target)


def _expect(target: pa.DataType | None, *covered: pa.DataType) -> None:
    if target is not None and target not in covered:
        raise _Uncovered(f"{target} from this Avro type")


def _union(branches: list[Any], target: pa.DataType | None) -> _Read:
    kinds = [b.get("type") if isinstance(b, Mapping) else b for b in branches]
    if len(branches) == 1:  # its branch index (0) is written all the same
        null_index = 1 if kinds[0] != "null" else 0
        inner = _node(branches[0], target)
    elif len(branches) == 2 and "null" in kinds:
        null_index = kinds.index("null")
        inner = _node(branches[1 - null_index], target)
    else:
        raise _Uncovered("a union of more than null and one type")

    def read(cursor: _Cursor) -> pa.Array:
        index, after = _varints(cursor)
        if bool(((index < 0) | (index >= len(branches))).any()):
            raise _Inexact("a union branch beyond the schema")
        cursor.advance(after)
        present = np.flatnonzero(index != null_index)
        sub = cursor.at(present)
        values = inner(sub)
        cursor.pos[present] = sub.pos
        return values if present.size == index.size else pc.take(values, spread(present, index.size))

    return read


def _struct(node: Mapping[str, Any], target: pa.DataType | None) -> _Read:
    fields = _record_fields(node, {f.name: f.type for f in target} if target is not None else {})

    def read(cursor: _Cursor) -> pa.Array:
        read_values = {name: read(cursor) for name, read in fields}
        rows = cursor.pos.size
        if target is None:  # read for the bytes it takes; the payload has no such column
            return pa.nulls(rows)
        if not target.num_fields:  # a record without fields: from_arrays would give no rows
            return pa.array([{}] * rows, target)
        children = [read_values[f.name] if f.name in read_values else pa.nulls(rows, f.type) for f in target]
        return pa.StructArray.from_arrays(children, fields=list(target))

    return read


def _logical(kind: str, logical: str, target: pa.DataType | None) -> _Read:
    if logical == "date" and kind == "int":
        _expect(target, pa.date32())

        def read_date(cursor: _Cursor) -> pa.Array:
            days = _long(cursor)
            _within(days, _MIN_DAY, _MAX_DAY + 1)
            return pa.array(days.astype(np.int32), pa.date32())

        return read_date
    units = {"timestamp-millis": 1000, "timestamp-micros": 1, "local-timestamp-millis": 1000, "local-timestamp-micros": 1}
    if logical not in units or kind != "long":
        raise _Uncovered(f"logical type {logical} on {kind}")
    unit = units[logical]
    zone = None if logical.startswith("local-") else "UTC"
    _expect(target, pa.timestamp("us", tz=zone))

    def read_timestamp(cursor: _Cursor) -> pa.Array:
        ticks = _long(cursor)
        _within(ticks, -(-_MIN_US // unit), _END_US // unit)
        return pa.array(ticks * unit, pa.timestamp("us", tz=zone))

    return read_timestamp


def _within(values: np.ndarray, low: int, end: int) -> None:
    if values.size and bool(((values < low) | (values >= end)).any()):
        raise _Inexact("a value outside its column's range")


_INTEGERS = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}


def _integer(target: pa.DataType | None) -> _Read:
    if target is not None and target not in _INTEGERS:
        raise _Uncovered(f"{target} from an Avro integer")
    bits = _INTEGERS.get(target, 64) if target is not None else 64
    out = target or pa.int64()

    def read(cursor: _Cursor) -> pa.Array:
        values = _long(cursor)
        if bits < 64:
            _within(values, -(1 << (bits - 1)), 1 << (bits - 1))
        return pa.array(values.astype(out.to_pandas_dtype()), out)

    return read


def _floating(width: int) -> Callable[[pa.DataType | None], _Read]:
    covered = (pa.float32(), pa.float64()) if width == 4 else (pa.float64(),)

    def build(target: pa.DataType | None) -> _Read:
        _expect(target, *covered)
        out = target or covered[-1]
        dtype = np.dtype("<f4" if width == 4 else "<f8")

        def read(cursor: _Cursor) -> pa.Array:
            raw = cursor.data[cursor.pos[:, None] + np.arange(width)]
            cursor.advance(cursor.pos + width)
            values = np.ascontiguousarray(raw).view(dtype).reshape(-1)
            with np.errstate(invalid="ignore"):  # a signalling NaN widened to a double stays a NaN
                return pa.array(values.astype(out.to_pandas_dtype()), out)

        return read

    return build


def _boolean(target: pa.DataType | None) -> _Read:
    _expect(target, pa.bool_())

    def read(cursor: _Cursor) -> pa.Array:
        raw = cursor.data[cursor.pos]
        if bool((raw > 1).any()):
            raise _Inexact("a boolean byte other than 0 or 1")
        cursor.advance(cursor.pos + 1)
        return pa.array(raw == 1, pa.bool_())

    return read


def _null(target: pa.DataType | None) -> _Read:
    out = target or pa.null()
    return lambda cursor: pa.nulls(cursor.pos.size, out)


def _sized(text: bool) -> Callable[[pa.DataType | None], _Read]:
    kind = pa.string() if text else pa.binary()

    def build(target: pa.DataType | None) -> _Read:
        _expect(target, kind)

        def read(cursor: _Cursor) -> pa.Array:
            return gather(cursor, _long(cursor), kind)  # a negative length is refused by the cursor

        return read

    return build


def _fixed(size: int) -> _Read:
    return lambda cursor: gather(cursor, np.full(cursor.pos.size, size, np.int64), pa.binary())


def _enum(symbols: list[str]) -> _Read:
    table = pa.array(symbols, pa.string())

    def read(cursor: _Cursor) -> pa.Array:
        index = _long(cursor)
        _within(index, 0, len(symbols))
        return table.take(pa.array(index))

    return read


def _decimal(node: Mapping[str, Any], target: pa.DataType | None) -> _Read:
    """Avro's decimal (big-endian two's complement bytes, the writer's scale) as Arrow's decimal128:
    exact when the payload's column has the writer's scale and at most its precision (the record
    decoder rounds otherwise); a value beyond the column's precision is refused."""
    scale, precision = int(node.get("scale", 0)), int(node["precision"])
    # fastavro rounds a value to the writer's precision: a wider column would show the difference.
    if target is not None and not (pa.types.is_decimal128(target) and target.scale == scale and target.precision <= precision):
        raise _Uncovered("a decimal into another scale or a wider precision")
    size = int(node["size"]) if node.get("type") == "fixed" else None

    def read(cursor: _Cursor) -> pa.Array:
        # A negative length is refused by the cursor (skip, bytes_at).
        lengths = _long(cursor) if size is None else np.full(cursor.pos.size, size, np.int64)
        if target is None:  # a field the payload lacks: the record decoder reads any width and drops it
            cursor.skip(lengths)
            return pa.nulls(lengths.size)
        if bool((lengths > 16).any()):
            raise _Inexact("a decimal wider than 16 bytes")
        data, offsets = bytes_at(cursor, lengths)
        rows = lengths.size
        little = np.zeros((rows, 16), np.uint8)  # decimal128: 16 bytes, little-endian
        row = np.repeat(np.arange(rows), lengths)
        nth = np.arange(data.size) - np.repeat(offsets[:-1], lengths)
        little[row, np.repeat(lengths, lengths) - 1 - nth] = data
        first = data[np.minimum(offsets[:-1], max(data.size - 1, 0))] if data.size else np.zeros(rows, np.uint8)
        negative = (lengths > 0) & (first >= 0x80)
        little[negative[:, None] & (np.arange(16) >= lengths[:, None])] = 0xFF  # sign extension
        array = pa.Array.from_buffers(target, rows, [None, pa.py_buffer(little)])
        try:
            array.validate(full=True)  # the column's precision, as the record decoder checks it
        except pa.ArrowInvalid as exc:
            raise _Inexact(str(exc)) from None
        return array

    return read


# Items of one array block are read one position at a time, and blocks one at a time (a row's
# items follow one another); past these, a batch is cheaper record by record.
MAX_BLOCK_ITEMS = 256
MAX_BLOCKS = 64


def _array(items: Mapping[str, Any] | str | list, target: pa.DataType | None) -> _Read:
    """Avro's array: blocks of (count, items), a negative count followed by the block's byte size,
    ended by a 0 count. Items are read a position at a time across the rows still in a block, then
    put back in row order."""
    if target is not None and not pa.types.is_list(target):
        raise _Uncovered("an array into a non-list column")
    item = _node(items, target.value_type if target is not None else None)

    def read(cursor: _Cursor) -> pa.Array:
        rows = cursor.pos.size
        counts = np.zeros(rows, np.int64)
        owners: list[np.ndarray] = []  # the row of each item read, in the order read
        values: list[pa.Array] = []
        active = np.arange(rows)
        blocks = 0
        while active.size:
            block = cursor.at(active)
            count, after = _varints(block)
            block.advance(after)
            sized = np.flatnonzero(count < 0)
            if sized.size:  # a negative count: the block's byte size follows (read, not needed)
                sizes = block.at(sized)
                _, after = _varints(sizes)
                block.pos[sized] = after
                block.advance(block.pos)
                count = np.abs(count)
            if bool(((count < 0) | (count > MAX_BLOCK_ITEMS)).any()):  # abs(-2**63) stays negative
                raise _Inexact(f"an array block of more than {MAX_BLOCK_ITEMS} items")
            blocks += 1
            if blocks > MAX_BLOCKS:
                raise _Inexact(f"an array of more than {MAX_BLOCKS} blocks")
            for nth in range(int(count.max()) if count.size else 0):
                reading = np.flatnonzero(count > nth)
                at = block.at(reading)
                values.append(item(at))
                block.pos[reading] = at.pos
                owners.append(active[reading])
            counts[active] += count
            cursor.pos[active] = block.pos
            active = active[count > 0]
        if target is None:  # read for the bytes it takes; the payload has no such column
            return pa.nulls(rows)
        offsets = np.zeros(rows + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        if not values:
            flat = pa.array([], target.value_type)
        else:
            owner = np.concatenate(owners)
            flat = pa.concat_arrays(values).take(pa.array(np.argsort(owner, kind="stable")))
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat, type=target)

    return read


_SCALARS: dict[str, Callable[[pa.DataType | None], _Read]] = {
    "null": _null,
    "boolean": _boolean,
    "int": _integer,
    "long": _integer,
    "float": _floating(4),
    "double": _floating(8),
    "string": _sized(text=True),
    "bytes": _sized(text=False),
}


def _varints(cursor: _Cursor) -> tuple[np.ndarray, np.ndarray]:
    """Avro's zigzag varints at the cursor (int64) and the positions after them (not advanced)."""
    raw, after = raw_varints(cursor)
    return zigzag(raw), after


def _long(cursor: _Cursor) -> np.ndarray:
    values, after = _varints(cursor)
    cursor.advance(after)
    return values
