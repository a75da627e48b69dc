"""Infer a Spark schema from decoded JSON rows (pure; no Spark session needed).

Rules: booleans, integers (long), floats (double), strings, objects (struct, merged across rows),
arrays (element type merged). long and double merge to double; any other conflict widens to
string so that no value is rejected for its type; a field seen only as null becomes string.
Field order is the order of first appearance, so the payload keeps the source's column order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import types as T


@dataclass
class FieldStats:
    """Counts used to report nullability and confidence of an inferred field."""

    seen: int = 0
    nulls: int = 0
    types: dict[str, int] = field(default_factory=dict)


def infer_type(value: Any) -> T.DataType:
    if value is None:
        return T.NullType()
    if isinstance(value, bool):
        return T.BooleanType()
    if isinstance(value, int):
        return T.LongType()
    if isinstance(value, float):
        return T.DoubleType()
    if isinstance(value, str):
        return T.StringType()
    if isinstance(value, dict):
        return T.StructType([T.StructField(str(k), infer_type(v), True) for k, v in value.items()])
    if isinstance(value, list):
        element: T.DataType = T.NullType()
        for item in value:
            element = merge_types(element, infer_type(item))
        return T.ArrayType(element, True)
    return T.StringType()


def merge_types(a: T.DataType, b: T.DataType) -> T.DataType:
    if isinstance(a, T.NullType):
        return b
    if isinstance(b, T.NullType) or a == b:
        return a
    if {type(a), type(b)} == {T.LongType, T.DoubleType}:
        return T.DoubleType()
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        return merge_structs(a, b)
    if isinstance(a, T.ArrayType) and isinstance(b, T.ArrayType):
        return T.ArrayType(merge_types(a.elementType, b.elementType), True)
    return T.StringType()


def merge_structs(a: T.StructType, b: T.StructType) -> T.StructType:
    fields = {f.name: f.dataType for f in a.fields}
    for f in b.fields:
        fields[f.name] = merge_types(fields[f.name], f.dataType) if f.name in fields else f.dataType
    return T.StructType([T.StructField(name, dtype, True) for name, dtype in fields.items()])


def finalize(dtype: T.DataType) -> T.DataType:
    """Replace types never seen with a value (NullType) by string."""
    if isinstance(dtype, T.NullType):
        return T.StringType()
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, finalize(f.dataType), True) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(finalize(dtype.elementType), True)
    return dtype


def infer_schema(rows: Iterable[dict[str, Any]]) -> T.StructType:
    schema = T.StructType([])
    for row in rows:
        inferred = infer_type(row)
        if isinstance(inferred, T.StructType):
            schema = merge_structs(schema, inferred)
    result = finalize(schema)
    assert isinstance(result, T.StructType)
    return result


def field_stats(rows: Iterable[dict[str, Any]]) -> dict[str, FieldStats]:
    stats: dict[str, FieldStats] = {}
    for row in rows:
        for key, value in row.items():
            s = stats.setdefault(key, FieldStats())
            s.seen += 1
            if value is None:
                s.nulls += 1
            else:
                name = infer_type(value).simpleString()
                s.types[name] = s.types.get(name, 0) + 1
    return stats
