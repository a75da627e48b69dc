"""The value contract shared by every registry format (avro, json_schema, protobuf): a decoded
Python value becomes what Arrow expects for a Spark type (pure: no IO)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any, overload
from uuid import UUID

from pyspark.sql import types as T

# StructField metadata key carrying a non-null field default read from a registered schema.
DEFAULT_KEY = "dpone.default"


def to_spark_value(value: Any, dtype: T.DataType, path: str = "", enforce_nullability: bool = False) -> Any:
    """Convert a decoded Python value into what Arrow expects for `dtype` (raises ValueError).

    Shared by all registry formats: structs project by field name (missing -> null, extra keys
    ignored), maps become (key, value) pairs, timestamps become UTC-aware datetimes, decimals are
    rounded half-up to the scale and must fit the precision. Lenient where the source format has no
    native type: ISO strings for dates/timestamps, base64 strings for binary, strings or numbers for
    decimals (JSON). With `enforce_nullability`, a null in a non-nullable place raises (encoding).
    """
    if value is None:
        return None
    if isinstance(dtype, T.StructType):
        if not isinstance(value, Mapping):
            raise ValueError(f"{path or 'value'}: expected an object, got {type(value).__name__}")
        out = {}
        for field in dtype.fields:
            child = f"{path}.{field.name}" if path else field.name
            converted = to_spark_value(value.get(field.name), field.dataType, child, enforce_nullability)
            if converted is None and enforce_nullability and not field.nullable and DEFAULT_KEY not in field.metadata:
                raise ValueError(f"{child}: null in a field the schema requires")
            out[field.name] = converted
        return out
    if isinstance(dtype, T.ArrayType):
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
            raise ValueError(f"{path}: expected an array, got {type(value).__name__}")
        items = [to_spark_value(v, dtype.elementType, f"{path}[]", enforce_nullability) for v in value]
        if enforce_nullability and not dtype.containsNull and any(v is None for v in items):
            raise ValueError(f"{path}: null element in an array that does not allow nulls")
        return items
    if isinstance(dtype, T.MapType):
        pairs = value.items() if isinstance(value, Mapping) else value
        out_pairs = []
        for pair in pairs:
            k, v = pair
            key = to_spark_value(k, dtype.keyType, f"{path}{{}}", enforce_nullability)
            if key is None:
                raise ValueError(f"{path}: null map key")
            item = to_spark_value(v, dtype.valueType, f"{path}{{{k}}}", enforce_nullability)
            if item is None and enforce_nullability and not dtype.valueContainsNull:
                raise ValueError(f"{path}{{{k}}}: null map value where the schema allows none")
            out_pairs.append((key, item))
        return out_pairs
    converter = _SCALARS.get(type(dtype))
    if converter is None:
        raise ValueError(f"{path}: Spark type {dtype.simpleString()} is not supported by registry formats")
    try:
        return converter(value, dtype)
    except (TypeError, ValueError, ArithmeticError, InvalidOperation) as exc:
        raise ValueError(f"{path or 'value'}: {exc}") from None


_DECIMAL_CONTEXT = Context(prec=80)
_INT_BITS = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}


def _integral(value: Any, dtype: T.DataType) -> int:
    if isinstance(value, bool):
        raise TypeError("expected an integer, got a boolean")
    if isinstance(value, float | Decimal):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"expected an integer, got {value}")
        value = int(value)
    if not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    bits = _INT_BITS[type(dtype)]
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise ValueError(f"{value} does not fit {dtype.simpleString()}")
    return value


def _floating(value: Any, dtype: T.DataType) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _boolean(value: Any, dtype: T.DataType) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value


def _decimal(value: Any, dtype: T.DecimalType) -> Decimal:
    if isinstance(value, bool):
        raise TypeError("expected a decimal, got a boolean")
    if isinstance(value, float):
        value = repr(value)  # shortest repr: 0.1 stays 0.1, not its binary expansion
    if not isinstance(value, Decimal | int | str):
        raise TypeError(f"expected a decimal, got {type(value).__name__}")
    number = Decimal(value)
    if not number.is_finite():
        raise ValueError(f"{value} is not a finite decimal")
    # The default context keeps 28 digits; Spark decimals have up to 38.
    quantized = number.quantize(Decimal(1).scaleb(-dtype.scale), rounding=ROUND_HALF_UP, context=_DECIMAL_CONTEXT)
    if quantized.adjusted() >= dtype.precision - dtype.scale and quantized != 0:
        raise ValueError(f"{value} does not fit {dtype.simpleString()}")
    return quantized


def _string(value: Any, dtype: T.DataType) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping | list | tuple):
        # Values of types a string column stands in for (multi-branch unions, open objects).
        return json.dumps(value, default=str, separators=(",", ":"))
    if isinstance(value, date | datetime | time):
        return value.isoformat()
    if isinstance(value, int | float | Decimal | UUID):
        return str(value)
    raise TypeError(f"expected a string, got {type(value).__name__}")


def _binary(value: Any, dtype: T.DataType) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return base64.b64decode(value, validate=True)  # JSON carries bytes as base64
    raise TypeError(f"expected bytes, got {type(value).__name__}")


def _parse_datetime(text: str) -> datetime:
    return datetime.fromisoformat(text.strip())


def _timestamp(value: Any, dtype: T.DataType) -> datetime:
    if isinstance(value, str):
        value = _parse_datetime(value)
    if isinstance(value, datetime):
        # Naive values are taken as UTC, the session time zone the engine runs with.
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime.combine(value, time(), UTC)
    raise TypeError(f"expected a timestamp, got {type(value).__name__}")


def _timestamp_ntz(value: Any, dtype: T.DataType) -> datetime:
    if isinstance(value, str):
        value = _parse_datetime(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, date):
        return datetime.combine(value, time())
    raise TypeError(f"expected a local timestamp, got {type(value).__name__}")


def _date(value: Any, dtype: T.DataType) -> date:
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        return date.fromisoformat(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        return date(1970, 1, 1) + timedelta(days=value)  # Avro/epoch days
    raise TypeError(f"expected a date, got {type(value).__name__}")


_SCALARS: dict[type, Any] = {
    T.ByteType: _integral,
    T.ShortType: _integral,
    T.IntegerType: _integral,
    T.LongType: _integral,
    T.FloatType: _floating,
    T.DoubleType: _floating,
    T.BooleanType: _boolean,
    T.DecimalType: _decimal,
    T.StringType: _string,
    T.BinaryType: _binary,
    T.TimestampType: _timestamp,
    T.TimestampNTZType: _timestamp_ntz,
    T.DateType: _date,
    T.NullType: lambda value, dtype: None,
}


@overload
def nullable_schema(dtype: T.StructType) -> T.StructType: ...


@overload
def nullable_schema(dtype: T.DataType) -> T.DataType: ...


def nullable_schema(dtype: T.DataType) -> T.DataType:
    """`dtype` with every field/element/value nullable and no field metadata: a decoder's output,
    and the form in which two types are compared regardless of nullability."""
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, nullable_schema(f.dataType), True) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(nullable_schema(dtype.elementType), True)
    if isinstance(dtype, T.MapType):
        return T.MapType(nullable_schema(dtype.keyType), nullable_schema(dtype.valueType), True)
    return dtype


def walk_row(value: Any, dtype: T.DataType, leaf: Callable[[Any, T.DataType], Any], leaf_types: tuple[type, ...]) -> Any:
    """A row (Arrow `to_pylist` form: maps as pairs) rebuilt for a registry encoder: structs as
    dicts (a null of a required field with a default left out, for the reader to apply the
    default), lists as lists, maps as dicts with string keys; `leaf` converts the non-null values
    of `leaf_types` (the others are kept as they are: one call less per value on a hot path)."""
    if value is None:
        return None
    if isinstance(dtype, T.StructType):
        out = {}
        for field in dtype.fields:
            item = walk_row(value.get(field.name), field.dataType, leaf, leaf_types)
            if item is None and not field.nullable and DEFAULT_KEY in field.metadata:
                continue
            out[field.name] = item
        return out
    if isinstance(dtype, T.ArrayType):
        return [walk_row(v, dtype.elementType, leaf, leaf_types) for v in value]
    if isinstance(dtype, T.MapType):
        pairs = value.items() if isinstance(value, Mapping) else value
        return {str(k): walk_row(v, dtype.valueType, leaf, leaf_types) for k, v in pairs}
    return leaf(value, dtype) if isinstance(dtype, leaf_types) else value
