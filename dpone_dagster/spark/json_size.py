"""An upper bound on the length of Spark's `to_json` of a value, computed without encoding it.

The engine must find messages over message.max.bytes before producing anything. Encoding every
message only to measure it (and keeping the encoded batch) cost more than the encoding in the
producer tasks itself; a bound that is cheap arithmetic on the staged columns shows, for the usual
batch, that no message can be too large. Only when the bound exceeds the limit are the messages
encoded and measured exactly.

The bound follows Spark's JSON generator (Jackson): strings escape at most to six bytes per byte
(`\\u00XX`), numbers and temporal values have a longest text, nulls are `null`. Types without a
known bound (intervals, variants, maps with non-string keys, user types) give None: measure exactly.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

NULL = 4  # `null`
# Longest text of fixed-size values, quotes included: Long.MIN_VALUE is 20 characters, a double
# at most 24 (`-1.2345678901234567E-308`); dates and timestamps allow years past 9999.
_FIXED: dict[type, int] = {
    T.BooleanType: 5,
    T.ByteType: 20,
    T.ShortType: 20,
    T.IntegerType: 20,
    T.LongType: 20,
    T.FloatType: 26,
    T.DoubleType: 26,
    T.DateType: 24,
    T.TimestampType: 48,
    T.TimestampNTZType: 48,
    T.NullType: NULL,
}


def length_bound(value: Column, dtype: T.DataType) -> Column | None:
    """A long column >= the byte length of `to_json(value)` (for a struct `value`) or of the
    value's JSON text inside one; None when `dtype` has no bound here."""
    return _bound(value, dtype) if supported(dtype) else None


def supported(dtype: T.DataType) -> bool:
    if _static_bound(dtype) is not None or isinstance(dtype, T.StringType | T.BinaryType):
        return True
    if isinstance(dtype, T.StructType):
        return all(supported(f.dataType) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return supported(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return isinstance(dtype.keyType, T.StringType) and supported(dtype.valueType)
    return False


def _bound(value: Column, dtype: T.DataType) -> Column:
    static = _static_bound(dtype)
    if static is not None:
        return F.lit(static).cast("long")
    if isinstance(dtype, T.StringType):
        return _or_null(value, F.lit(2) + 6 * F.octet_length(value).cast("long"))
    if isinstance(dtype, T.BinaryType):
        # Base64 in quotes: 4 characters per 3 bytes, rounded up.
        return _or_null(value, F.lit(6) + 2 * F.octet_length(value).cast("long"))
    if isinstance(dtype, T.StructType):
        # Braces, commas, names and colons, and the fixed-width fields are one constant.
        constant = 1 + max(1, len(dtype.fields)) + sum(name_bound(f.name) + 1 for f in dtype.fields)
        total = None
        for f in dtype.fields:
            static = _static_bound(f.dataType)
            if static is not None:
                constant += static
            else:
                inner = _bound(value.getField(f.name), f.dataType)
                total = inner if total is None else total + inner
        return F.lit(max(constant, NULL)).cast("long") if total is None else _or_null(value, total + constant)
    if isinstance(dtype, T.ArrayType):
        element = dtype.elementType
        static = _static_bound(element)
        if static is not None:
            return _or_null(value, F.lit(2) + F.size(value).cast("long") * (static + 1))
        return _or_null(value, F.aggregate(value, F.lit(2).cast("long"), lambda acc, x: acc + _bound(x, element) + 1))
    assert isinstance(dtype, T.MapType)
    value_type = dtype.valueType
    entries = F.aggregate(
        F.map_entries(value),
        F.lit(2).cast("long"),
        lambda acc, e: acc + _bound(e["key"], T.StringType()) + _bound(e["value"], value_type) + 2,
    )
    return _or_null(value, entries)


def _static_bound(dtype: T.DataType) -> int | None:
    """The bound of a value whose text has a longest length (numbers, temporal values)."""
    if isinstance(dtype, T.DecimalType):
        return dtype.precision + 12  # digits, sign, point, exponent
    return _FIXED.get(type(dtype))


def name_bound(name: str) -> int:
    """Bytes of a field name as JSON text: quoted, control characters as `\\u00XX`."""
    escaped = sum(6 if ord(ch) < 0x20 else 2 if ch in '"\\' else len(ch.encode("utf-8", "surrogatepass")) for ch in name)
    return escaped + 2


def _or_null(value: Column, bound: Column) -> Column:
    return F.when(value.isNull(), F.lit(NULL).cast("long")).otherwise(bound)
