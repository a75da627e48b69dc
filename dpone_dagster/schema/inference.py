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

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
)


@dataclass
class FieldStats:
    """Counts used to report nullability and confidence of an inferred field."""

    seen: int = 0
    nulls: int = 0
    types: dict[str, int] = field(default_factory=dict)


def infer_type(value: Any) -> DataType:
    if value is None:
        return NullType()
    if isinstance(value, bool):
        return BooleanType()
    if isinstance(value, int):
        return LongType()
    if isinstance(value, float):
        return DoubleType()
    if isinstance(value, str):
        return StringType()
    if isinstance(value, dict):
        return StructType([StructField(str(k), infer_type(v), True) for k, v in value.items()])
    if isinstance(value, list):
        element: DataType = NullType()
        for item in value:
            element = merge_types(element, infer_type(item))
        return ArrayType(element, True)
    return StringType()


def merge_types(a: DataType, b: DataType) -> DataType:
    if isinstance(a, NullType):
        return b
    if isinstance(b, NullType) or a == b:
        return a
    if {type(a), type(b)} == {LongType, DoubleType}:
        return DoubleType()
    if isinstance(a, StructType) and isinstance(b, StructType):
        return merge_structs(a, b)
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return ArrayType(merge_types(a.elementType, b.elementType), True)
    return StringType()


def merge_structs(a: StructType, b: StructType) -> StructType:
    fields = {f.name: f.dataType for f in a.fields}
    for f in b.fields:
        fields[f.name] = merge_types(fields[f.name], f.dataType) if f.name in fields else f.dataType
    return StructType([StructField(name, dtype, True) for name, dtype in fields.items()])


def finalize(dtype: DataType) -> DataType:
    """Replace types never seen with a value (NullType) by string."""
    if isinstance(dtype, NullType):
        return StringType()
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, finalize(f.dataType), True) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return ArrayType(finalize(dtype.elementType), True)
    return dtype


def infer_schema(rows: Iterable[dict[str, Any]]) -> StructType:
    schema = StructType([])
    for row in rows:
        inferred = infer_type(row)
        if isinstance(inferred, StructType):
            schema = merge_structs(schema, inferred)
    result = finalize(schema)
    assert isinstance(result, StructType)
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
