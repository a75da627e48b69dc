"""Decode flat JSON record values with pyarrow's C++ JSON reader, inside the Spark read tasks.

This is the fast path of the JSON decoder: ~1.5 µs per 230-byte record against ~10 µs for Spark's
`from_json` plus the drift check. It is all-or-nothing per Arrow batch: a batch is decoded here
only when pyarrow can decode every value of it exactly as Spark would; otherwise it returns None
and the JVM decoder (`decode.decode_json`) handles that batch, corrupt records and drift included.

pyarrow is strict where Spark converts (a number in a string field, 1.0 in a long field, a
duplicated key, a stray control character: all errors), so strictness only ever sends a batch to
the JVM. The guards below keep pyarrow's line-based reader aligned with the records.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

# A first line that is an object: pyarrow crashes (SIGSEGV, 26.0) on a buffer whose first row
# is a JSON `null`; with this line first no later row can be the first.
_SENTINEL = b"{}"

T = TypeVar("T")


# Integer types a manifest may declare (`int`, `smallint`, `tinyint`): pyarrow reads only an
# integer token in the type's range, which Spark reads as the same value; any other token fails
# the Arrow batch, which the JVM then decodes by its own rules (1.0, "1", an overflow: corrupt;
# a tinyint from 128 to 255: wrapped to -128..-1, as Jackson's getByteValue reads it).
_INTEGERS = {LongType: pa.int64(), IntegerType: pa.int32(), ShortType: pa.int16(), ByteType: pa.int8()}


def arrow_type(dtype: DataType, iso_times: bool) -> pa.DataType | None:
    """The Arrow type the reader decodes `dtype` into, or None when the fast path does not
    support it (the types schema inference produces are supported, and declared integers,
    floats, decimals, and dates and timestamps where the session reads their text as ISO-8601 in
    UTC: `iso_times`, spark/session.iso_times)."""
    if type(dtype) in _INTEGERS:
        return _INTEGERS[type(dtype)]
    if isinstance(dtype, DoubleType):
        return pa.float64()
    if isinstance(dtype, FloatType):  # read as a double, then narrowed (_converted)
        return pa.float32()
    if isinstance(dtype, DecimalType):
        # pyarrow reads a number or a numeric string only where its digits fit the scale and the
        # precision (Spark rounds half up and reads strings with grouping commas: those batches
        # fail here and the JVM decodes them); the strings it reads, Java's BigDecimal reads alike.
        return pa.decimal128(dtype.precision, dtype.scale)
    if isinstance(dtype, DateType) and iso_times:  # read as text, then parsed (_temporal)
        return pa.date32()
    if isinstance(dtype, TimestampType) and iso_times:  # zone-less text is UTC then
        return pa.timestamp("us", tz="UTC")
    if isinstance(dtype, BooleanType):
        return pa.bool_()
    if isinstance(dtype, StringType):
        return pa.string()
    if isinstance(dtype, ArrayType):
        element = arrow_type(dtype.elementType, iso_times)
        return pa.list_(element) if element is not None else None
    if isinstance(dtype, StructType):
        fields = [(f.name, arrow_type(f.dataType, iso_times)) for f in dtype.fields]
        if any(t is None for _, t in fields) or len({name for name, _ in fields}) != len(fields):
            return None
        return pa.struct(fields)
    return None


def arrow_schema(schema: StructType, iso_times: bool) -> pa.Schema | None:
    """`arrow_type` of a payload schema."""
    struct = arrow_type(schema, iso_times)
    return pa.schema(list(struct)) if struct is not None else None


def _lines(values: pa.Array) -> pa.Buffer:
    """The sentinel line, then one line per value, joined by Arrow (a Python bytes object per
    value and the joins cost ~0.3 µs per record, measured)."""
    lines = pa.concat_arrays([pa.array([_SENTINEL], pa.binary()), values])
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines), b"\n")
    return joined[0].as_buffer()


def _refused_when_unreadable(decode: Callable[..., T]) -> Callable[..., T | None]:
    """`decode`, None (the JVM's batch) where the checks after the read cannot walk what Arrow
    inferred of the fields beyond the schema: nested past Python's recursion limit, or named by
    bytes that are not UTF-8 (Spark's decoder reads those as U+FFFD)."""

    @functools.wraps(decode)
    def guarded(*args: Any) -> T | None:
        try:
            return decode(*args)
        except (RecursionError, UnicodeDecodeError):
            return None

    return guarded


@_refused_when_unreadable
def decode_values(values: pa.Array, schema: pa.Schema) -> list[pa.Array] | None:
    """One array per schema field, aligned with `values` (null for null values = tombstones), or
    None when this batch must be decoded by the JVM."""
    read_schema = pa.schema([(f.name, _read_type(f.type)) for f in schema])
    table = _read(values, read_schema)
    # No field beyond the schema at any depth (the JVM reports drift and widens the schema).
    if table is None or table.schema != read_schema or not _decimals_confirmed(values, table):
        return None
    columns = _narrowed([table.column(i).slice(1).combine_chunks() for i in range(len(schema))], schema)
    return _aligned(values, columns) if columns is not None else None


@_refused_when_unreadable
def decode_envelopes(values: pa.Array, schema: pa.Schema) -> tuple[pa.Array, pa.Array, list[pa.Array]] | None:
    """dpone envelopes `{"op", "data", ...}`: the op text, whether the data is there, and one array
    per field of the data, aligned with `values` (nulls for null values), or None when this batch
    must be decoded by the JVM.
    Fields of the envelope beyond op and data (metadata, source, schema_version) are read past, as
    Spark's decoder reads past them; a field of the data beyond the schema is drift (None)."""
    data_type = _read_type(pa.struct(list(schema)))
    table = _read(values, pa.schema([("op", pa.string()), ("data", data_type)]))
    if table is None or table.schema.field("op").type != pa.string() or table.schema.field("data").type != data_type:
        return None
    if not _decimals_confirmed(values, table):
        return None
    op = table.column("op").slice(1).combine_chunks()
    data = table.column("data").slice(1).combine_chunks()
    read = _narrowed([data.field(i) for i in range(data_type.num_fields)], schema)
    if read is None:
        return None
    fields = read
    if data.null_count:  # a null data object: every field null
        fields = [pc.if_else(data.is_valid(), f, pa.scalar(None, f.type)) for f in fields]
    aligned = _aligned(values, [op, data.is_valid(), *fields])
    return aligned[0], pc.fill_null(aligned[1], False), aligned[2:]


def _retyped(kind: pa.DataType, leaf: Callable[[pa.DataType], pa.DataType]) -> pa.DataType:
    """`kind` with `leaf` applied to every type that is no struct or list, at any depth."""
    if pa.types.is_struct(kind):
        return pa.struct([(f.name, _retyped(f.type, leaf)) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(_retyped(kind.value_type, leaf))
    return leaf(kind)


def _read_type(kind: pa.DataType) -> pa.DataType:
    """The type Arrow's reader reads `kind` as: a float as a double, a date or a timestamp as text
    (converted after)."""
    return _retyped(kind, _read_leaf)


def _read_leaf(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_float32(kind):
        return pa.float64()
    if pa.types.is_date32(kind) or pa.types.is_timestamp(kind):
        return pa.string()
    return kind


def _decimals_confirmed(values: pa.Array, table: pa.Table) -> bool:
    """Whether the decimals of `table` (`values` as read) are the numbers written: read again as
    doubles, each within a billionth of its decimal. pyarrow's reader takes exponents Java's
    BigDecimal refuses (1e+-1, 1e0x1 in a string) and wraps a number past 128 bits when it scales
    it (4e20 into decimal(38,18)); Spark makes those records corrupt, and such a batch is the
    JVM's. A quoted number does not read as a double: the JVM reads it too."""
    if not any(_holds_decimal(f.type) for f in table.schema):
        return True
    as_doubles = pa.schema([(f.name, _retyped(f.type, lambda t: pa.float64() if pa.types.is_decimal(t) else t)) for f in table.schema])
    doubles = _read(values, as_doubles)
    if doubles is None or doubles.schema != as_doubles:
        return False
    pairs = [(table.column(i).combine_chunks(), doubles.column(i).combine_chunks(), f.type) for i, f in enumerate(table.schema)]
    return all(_agree(exact, double) for read, check, kind in pairs for exact, double in _decimal_leaves(read, check, kind))


def _holds_decimal(kind: pa.DataType) -> bool:
    if pa.types.is_decimal(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_holds_decimal(f.type) for f in kind)
    return pa.types.is_list(kind) and _holds_decimal(kind.value_type)


def _decimal_leaves(read: pa.Array, check: pa.Array, kind: pa.DataType) -> Iterator[tuple[pa.Array, pa.Array]]:
    """The decimal values of `read` beside the doubles `check` read at the same places."""
    if pa.types.is_decimal(kind):
        yield read, check
    elif pa.types.is_struct(kind):
        for i, field in enumerate(kind):
            yield from _decimal_leaves(read.field(i), check.field(i), field.type)
    elif pa.types.is_list(kind):
        yield from _decimal_leaves(read.values, check.values, kind.value_type)


def _agree(exact: pa.Array, double: pa.Array) -> bool:
    if not exact.is_null().equals(double.is_null()):
        return False
    wanted = double.fill_null(0.0).to_numpy(zero_copy_only=False)
    got = exact.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
    return bool((np.abs(got - wanted) <= 1e-9 * np.abs(wanted)).all())


def _narrowed(columns: list[pa.Array], schema: pa.Schema) -> list[pa.Array] | None:
    """The columns as read, converted to the schema's types, or None when a value may read
    otherwise in Spark (the JVM decodes that batch)."""
    converted = [_converted(column, field.type) for column, field in zip(columns, schema, strict=True)]
    return None if any(c is None for c in converted) else converted  # type: ignore[return-value]


def _converted(column: pa.Array, kind: pa.DataType) -> pa.Array | None:
    """`column` (of `_read_type(kind)`) as `kind`, or None."""
    if column.type == kind:
        return column
    if pa.types.is_float32(kind):
        return column.cast(kind, safe=False) if _rounds_as_parsed(column.fill_null(0.0).to_numpy(zero_copy_only=False)) else None
    if pa.types.is_date32(kind) or pa.types.is_timestamp(kind):
        return _temporal(column, kind)
    if pa.types.is_struct(kind):
        fields = [_converted(column.field(i), field.type) for i, field in enumerate(kind)]  # field(): sliced as the struct
        if any(f is None for f in fields):
            return None
        return pa.StructArray.from_arrays(fields, fields=list(kind), mask=column.is_null() if column.null_count else None)
    if pa.types.is_list(kind):
        values = _converted(column.values, kind.value_type)  # all the values, past a slice's rows too
        if values is None:
            return None
        offsets = pa.array(column.offsets.to_numpy())  # unsliced: Arrow builds no nulls over sliced offsets
        return pa.ListArray.from_arrays(offsets, values, type=kind, mask=column.is_null() if column.null_count else None)
    return None


def _rounds_as_parsed(doubles: np.ndarray) -> bool:
    """Whether each double, narrowed to a float, is the float nearest the number it was read from,
    as Java's Float.parseFloat (Spark's reader) rounds it.
    A double is the nearest double to the text; narrowing rounds it again, which differs from one
    rounding only where the double is exactly halfway between two floats (every such halfway
    point is a double, so text and double lie on the same side of all others), or past the
    largest float (a double rounding to infinity): those batches are left to the JVM."""
    with np.errstate(over="ignore"):
        singles = doubles.astype(np.float32)
        finite = np.isfinite(doubles)
        if (finite & ~np.isfinite(singles)).any():
            return False
        back = singles.astype(np.float64)
        inexact = finite & (back != doubles)
        if not inexact.any():
            return True
        wanted, nearest = doubles[inexact], back[inexact]
        towards = np.where(wanted > nearest, np.float32(np.inf), np.float32(-np.inf))
        other = np.nextafter(singles[inexact], towards).astype(np.float64)  # the float on the text's other side
        return not ((nearest + other) / 2 == wanted).any()


# The date and timestamp texts read here: ISO-8601 in full, years 0001-9999, up to microseconds,
# the zone Z or ±hh:mm (hours to 17). Spark's reader takes more (2024-1-5, a date alone as a
# timestamp, spaces around, an epoch number, more fraction digits): any other text leaves the
# batch to the JVM.
_DATE = r"^(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})$"
_TIMESTAMP = (
    r"^(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})[T ](?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})"
    r"(?:\.(?P<f>\d{1,6}))?(?P<z>Z|[+-](?:0\d|1[0-7]):[0-5]\d)?$"
)
_MICROS_PER_DAY = 86_400_000_000
_MICROS_OF_YEARS = (-719_162 * _MICROS_PER_DAY, 2_932_897 * _MICROS_PER_DAY - 1)  # 0001-01-01 to 9999-12-31


def _temporal(texts: pa.Array, kind: pa.DataType) -> pa.Array | None:
    """Date or timestamp texts as `kind` (dates as days, timestamps as UTC microseconds), or None
    when one is not in the form read here or is not a real date or time of day."""
    parts = pc.extract_regex(texts, pattern=_DATE if pa.types.is_date32(kind) else _TIMESTAMP)
    if parts.null_count != texts.null_count:  # a text of another form
        return None

    def text(name: str) -> pa.Array:
        return pc.fill_null(parts.field(name), "")  # "" where the part is absent (or the text null)

    def number(digits: pa.Array) -> np.ndarray:
        return pc.cast(pc.if_else(pc.equal(digits, ""), "0", digits), pa.int64()).to_numpy(zero_copy_only=False)

    year, month, day = number(text("y")), number(text("m")), number(text("d"))
    valid = parts.is_valid().to_numpy(zero_copy_only=False)
    ok = (year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= _days_in_month(year, month))
    days = _days_from_civil(year, month, day)
    if pa.types.is_date32(kind):
        return pa.array(days.astype(np.int32), pa.date32(), mask=~valid) if ok[valid].all() else None
    hour, minute, second = number(text("H")), number(text("M")), number(text("S"))
    ok &= (hour <= 23) & (minute <= 59) & (second <= 59)
    fraction = number(pc.utf8_rpad(text("f"), 6, "0"))  # microseconds
    zone = text("z")  # Z, ±hh:mm, or "" (the session's zone, UTC)
    sign = np.where(pc.starts_with(zone, "-").to_numpy(zero_copy_only=False), -1, 1)
    shift = sign * (number(pc.utf8_slice_codeunits(zone, 1, 3)) * 60 + number(pc.utf8_slice_codeunits(zone, 4, 6)))
    micros = ((days * 24 + hour) * 60 + minute - shift) * 60_000_000 + second * 1_000_000 + fraction
    ok &= (micros >= _MICROS_OF_YEARS[0]) & (micros <= _MICROS_OF_YEARS[1])
    return pa.array(micros, kind, mask=~valid) if ok[valid].all() else None


def _days_in_month(year: np.ndarray, month: np.ndarray) -> np.ndarray:
    """Days of each month in the proleptic Gregorian calendar (Spark's since 3.0)."""
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    lengths = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31, 31])  # index 12: a month out of range
    return lengths[np.clip(month - 1, 0, 12)] + ((month == 2) & leap)


def _days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (eras of 400 years from March)."""
    y = year - (month <= 2)
    era = np.floor_divide(y, 400)
    year_of_era = y - era * 400
    day_of_year = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def _read(values: pa.Array, schema: pa.Schema) -> pa.Table | None:
    """The non-null values read with `schema` (unexpected fields inferred), the sentinel row first;
    None when pyarrow cannot read them exactly as Spark would."""
    present = values.drop_null() if values.null_count else values
    n = len(present)
    if n == 0:
        return pa.table({f.name: pa.nulls(1, f.type) for f in schema}, schema=schema)
    # Every value one object on one line: starts with '{', holds no line break (JSON escapes
    # them inside strings, so a raw one is formatting — or two records in one value).
    if not pc.all(pc.starts_with(present, "{")).as_py():
        return None
    # ... and ends with '}': a value cut short can never join the next one into made-up rows.
    if not pc.all(pc.ends_with(present, "}")).as_py():
        return None
    try:
        buffer = _lines(present)
    except pa.ArrowException:  # joined past 2 GiB (one batch of huge records): Spark reads it
        return None
    octets = np.frombuffer(buffer, np.uint8)
    newlines = np.flatnonzero(octets == ord("\n"))
    if newlines.size != n or (octets == ord("\r")).any():
        return None
    if _deepest(octets, newlines) > MAX_OPENINGS:
        return None
    if pc.any(pc.greater_equal(pc.binary_length(present), LONG_NUMBER)).as_py() and _LONG_NUMBER.search(buffer):
        return None
    try:
        table = pa_json.read_json(
            buffer,
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(1 << 20, buffer.size + 1)),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
        )
        # The reader does not check UTF-8 (nor what escapes decode to); Spark's rules apply.
        table.validate(full=True)
    except (pa.ArrowException, UnicodeDecodeError, ValueError):
        return None
    if _floats_hold(table, _non_finite) and _NOT_JACKSONS.search(buffer):  # a record Spark finds corrupt
        return None
    if _floats_hold(table, _negative_zero) and _MINUS_ZERO_INTEGER.search(buffer):  # Spark reads 0.0
        return None
    # One row per value (a value holding two objects would add rows).
    return table if table.num_rows == n + 1 else None


# Jackson (Spark's decoder) refuses a number token longer than 1,000 characters (its
# maxNumberLength): Spark makes the record corrupt where Arrow reads it. A run of number characters
# about that long anywhere (a long digit string too, which Spark then reads) leaves the batch to
# Spark; only values at least that long are looked at.
LONG_NUMBER = 990
_LONG_NUMBER = re.compile(rb"[0-9][0-9.eE+\-]{%d,}" % (LONG_NUMBER - 1))


# Non-numeric numbers Arrow's reader takes but Jackson's (Spark's, allowNonNumericNumbers) does
# not: -NaN, Inf, -Inf, where a value starts. Looked for only in a batch that decoded a NaN or an
# infinity; a string holding such text after a colon sends that batch to Spark's decoder, which
# reads it alike.
_NOT_JACKSONS = re.compile(rb"[:,\[][ \t\r\n]*(?:-NaN|-?Inf(?!inity))")


# The integer token -0, which Jackson reads as the integer 0 (so the double 0.0, where Arrow's
# reader keeps the sign); looked for only in a batch that decoded a negative zero.
_MINUS_ZERO_INTEGER = re.compile(rb"[:,\[][ \t\r\n]*-0(?![.eE0-9])")


def _non_finite(values: pa.Array) -> bool:
    return not pc.all(pc.is_finite(values)).as_py()


def _negative_zero(values: pa.Array) -> bool:
    numbers = values.to_numpy(zero_copy_only=False)
    return bool(((numbers == 0) & np.signbit(numbers)).any())


def _floats_hold(data: pa.Table | pa.Array, test: Callable[[pa.Array], bool]) -> bool:
    """Whether `test` holds for the floating values anywhere in `data` (nested fields, lists, map
    values; nulls left out)."""
    if isinstance(data, pa.Table):  # chunk by chunk: no column is copied
        return any(_floats_hold(chunk, test) for column in data.columns for chunk in column.chunks)
    kind = data.type
    if pa.types.is_floating(kind):
        return test(data.drop_null()) if len(data) - data.null_count else False
    if pa.types.is_struct(kind):
        return any(_floats_hold(data.field(i), test) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _floats_hold(data.items, test) or _floats_hold(data.keys, test)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _floats_hold(data.values, test)
    return False


# Arrow's reader recurses into the nesting of fields it infers: a value nested ~9,000 levels deep
# crashes the process. A value opening more objects and arrays than this (a bound on its depth) is
# left to Spark.
MAX_OPENINGS = 4096


def _deepest(octets: np.ndarray, newlines: np.ndarray) -> int:
    """The most '{' and '[' any line of the joined values holds (`newlines`: where lines end)."""
    openings = np.flatnonzero((octets == ord("{")) | (octets == ord("[")))
    return int(np.bincount(np.searchsorted(newlines, openings)).max()) if openings.size else 0


def _aligned(values: pa.Array, columns: list[pa.Array]) -> list[pa.Array]:
    """Columns of the non-null values spread back over `values` (null where the value is null)."""
    if not values.null_count:
        return columns
    if values.null_count == len(values):
        return [pa.nulls(len(values), c.type) for c in columns]
    positions = pc.subtract(pc.cumulative_sum(pc.cast(values.is_valid(), pa.int64())), 1)
    indices = pc.if_else(values.is_valid(), positions, pa.scalar(None, pa.int64()))
    return [column.take(indices) for column in columns]
