"""JSON Schema (draft-07) <-> Spark schema mapping and JSON value converters (pure; no registry).

Spark -> JSON Schema:
- boolean -> boolean; long -> integer; double -> number; string -> string;
- int/short/byte -> integer and float -> number, tagged `"x-dpone-type"` so the reverse mapping
  restores the narrower Spark type (JSON itself has one integer and one number type);
- decimal(p,s) -> **string** with a numeric pattern, tagged `"x-dpone-type": "decimal(p,s)"`.
  Chosen over `number` because most JSON parsers (including Python's default and every JavaScript
  consumer) read numbers as binary doubles and silently lose digits; the text is exact. Readers
  accept both a string and a number for a decimal column;
- timestamp -> string format date-time (RFC 3339, UTC, microseconds, "Z");
- timestamp_ntz -> string tagged `"x-dpone-type": "timestamp_ntz"` (no offset; date-time needs one);
- date -> string format date; binary -> string with contentEncoding base64;
- struct -> object with properties (open content: extra properties are allowed, so adding fields
  stays readable by old consumers), array -> array with items, map<string,V> -> object with
  additionalProperties V.
Nullability: a nullable field has "null" in its type list and is not in `required`; a non-nullable
field is required and has no "null". JSON -> Spark also takes $ref (#/definitions, #/$defs),
oneOf/anyOf of null plus one schema (that schema, nullable); other unions, enums and untyped
schemas become string columns (the value as JSON text).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pyspark.sql import types as T

from dpone_dagster.errors import ConfigError
from dpone_dagster.schema.values import DEFAULT_KEY, to_spark_value, walk_row

DRAFT_07 = "http://json-schema.org/draft-07/schema#"
TYPE_TAG = "x-dpone-type"
_DECIMAL_PATTERN = r"^-?[0-9]+(\.[0-9]+)?$"
_TAGGED: dict[str, T.DataType] = {
    "byte": T.ByteType(),
    "short": T.ShortType(),
    "int": T.IntegerType(),
    "float": T.FloatType(),
    "timestamp_ntz": T.TimestampNTZType(),
}
_INT_TAGS: dict[type, str] = {T.ByteType: "byte", T.ShortType: "short", T.IntegerType: "int"}
_DECIMAL_TAG = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


# --------------------------------------------------------------------------- Spark -> JSON Schema


def spark_to_json_schema(schema: T.StructType, title: str) -> dict[str, Any]:
    """A draft-07 object schema for a Spark struct; `title` is the record name subject strategies use."""
    body = _object(schema)
    return {"$schema": DRAFT_07, "title": title, **body}


def _object(struct: T.StructType) -> dict[str, Any]:
    properties = {f.name: _field(f) for f in struct.fields}
    required = [f.name for f in struct.fields if not f.nullable]
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    return out


def _field(field: T.StructField) -> dict[str, Any]:
    node = _with_null(_to_json(field.dataType), field.nullable)
    default = field.metadata.get(DEFAULT_KEY)
    if default is not None:
        node["default"] = default
    return node


def _with_null(node: dict[str, Any], nullable: bool) -> dict[str, Any]:
    if not nullable or node.get("type") == "null":
        return node
    return {**node, "type": [node["type"], "null"]}


def _to_json(dtype: T.DataType) -> dict[str, Any]:
    if isinstance(dtype, T.BooleanType):
        return {"type": "boolean"}
    if isinstance(dtype, T.LongType):
        return {"type": "integer"}
    if isinstance(dtype, T.ByteType | T.ShortType | T.IntegerType):
        return {"type": "integer", TYPE_TAG: _INT_TAGS[type(dtype)]}
    if isinstance(dtype, T.DoubleType):
        return {"type": "number"}
    if isinstance(dtype, T.FloatType):
        return {"type": "number", TYPE_TAG: "float"}
    if isinstance(dtype, T.DecimalType):
        return {"type": "string", "pattern": _DECIMAL_PATTERN, TYPE_TAG: f"decimal({dtype.precision},{dtype.scale})"}
    if isinstance(dtype, T.StringType):
        return {"type": "string"}
    if isinstance(dtype, T.BinaryType):
        return {"type": "string", "contentEncoding": "base64"}
    if isinstance(dtype, T.DateType):
        return {"type": "string", "format": "date"}
    if isinstance(dtype, T.TimestampType):
        return {"type": "string", "format": "date-time"}
    if isinstance(dtype, T.TimestampNTZType):
        return {"type": "string", TYPE_TAG: "timestamp_ntz"}
    if isinstance(dtype, T.NullType):
        return {"type": "null"}
    if isinstance(dtype, T.StructType):
        return _object(dtype)
    if isinstance(dtype, T.ArrayType):
        return {"type": "array", "items": _with_null(_to_json(dtype.elementType), dtype.containsNull)}
    if isinstance(dtype, T.MapType):
        if not isinstance(dtype.keyType, T.StringType):
            raise ConfigError(f"JSON object keys are strings; cast the {dtype.keyType.simpleString()} map keys to string")
        return {"type": "object", "additionalProperties": _with_null(_to_json(dtype.valueType), dtype.valueContainsNull)}
    raise ConfigError(f"Spark type {dtype.simpleString()} has no JSON Schema mapping")


# --------------------------------------------------------------------------- JSON Schema -> Spark


def json_schema_to_spark(schema: Mapping[str, Any] | str) -> T.StructType:
    """The Spark struct of an object JSON Schema (JSON text or parsed)."""
    root = json.loads(schema) if isinstance(schema, str) else schema
    dtype, _ = _JsonReader(root).read(root)
    if not isinstance(dtype, T.StructType):
        raise ConfigError("the JSON Schema must describe an object with properties at the top level")
    return dtype


def json_schema_title(schema: Mapping[str, Any] | str) -> str | None:
    parsed = json.loads(schema) if isinstance(schema, str) else schema
    title = parsed.get("title")
    return str(title) if title else None


class _JsonReader:
    def __init__(self, root: Mapping[str, Any]):
        self.root = root
        self.in_progress: set[str] = set()

    def read(self, node: Any) -> tuple[T.DataType, bool]:
        """(Spark type, nullable) of a schema node."""
        if node is True or node == {}:
            return T.StringType(), True
        if not isinstance(node, Mapping):
            return T.StringType(), True
        if "$ref" in node:
            return self._ref(str(node["$ref"]))
        if TYPE_TAG in node:
            return self._tagged(node)
        for key in ("oneOf", "anyOf"):
            if key in node:
                return self._union(node[key])
        if "allOf" in node and len(node["allOf"]) == 1:
            return self.read(node["allOf"][0])
        if "enum" in node or "const" in node:
            return T.StringType(), None in node.get("enum", [node.get("const", "")])
        types = node.get("type")
        if types is None:
            types = ["object"] if "properties" in node else []
        type_list = [types] if isinstance(types, str) else list(types)
        nullable = "null" in type_list
        rest = [t for t in type_list if t != "null"]
        if not rest:
            return (T.NullType() if nullable else T.StringType()), True
        if set(rest) == {"integer", "number"}:
            return T.DoubleType(), nullable
        if len(rest) > 1:
            return T.StringType(), nullable
        return self._single(rest[0], node), nullable

    def _single(self, kind: str, node: Mapping[str, Any]) -> T.DataType:
        if kind == "object":
            return self._object(node)
        if kind == "array":
            items = node.get("items")
            if isinstance(items, Mapping):
                element, element_null = self.read(items)
                return T.ArrayType(element, element_null)
            return T.ArrayType(T.StringType(), True)
        if kind == "string":
            fmt = node.get("format")
            if fmt == "date-time":
                return T.TimestampType()
            if fmt == "date":
                return T.DateType()
            if node.get("contentEncoding") == "base64":
                return T.BinaryType()
            return T.StringType()
        simple = {"integer": T.LongType(), "number": T.DoubleType(), "boolean": T.BooleanType()}
        return simple.get(kind, T.StringType())

    def _object(self, node: Mapping[str, Any]) -> T.DataType:
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            required = set(node.get("required", []))
            fields = []
            for name, child in properties.items():
                dtype, nullable = self.read(child)
                default = child.get("default") if isinstance(child, Mapping) else None
                metadata = {DEFAULT_KEY: default} if default is not None else {}
                fields.append(T.StructField(str(name), dtype, nullable or name not in required, metadata))
            return T.StructType(fields)
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping) and extra:
            values, values_null = self.read(extra)
            return T.MapType(T.StringType(), values, values_null)
        return T.StringType()  # an open object without declared shape: keep it as JSON text

    def _tagged(self, node: Mapping[str, Any]) -> tuple[T.DataType, bool]:
        tag = str(node[TYPE_TAG])
        types = node.get("type", [])
        nullable = "null" in ([types] if isinstance(types, str) else types)
        match = _DECIMAL_TAG.match(tag)
        if match:
            return T.DecimalType(int(match.group(1)), int(match.group(2))), nullable
        if tag in _TAGGED:
            return _TAGGED[tag], nullable
        raise ConfigError(f"unknown {TYPE_TAG} {tag!r} in the JSON Schema")

    def _union(self, branches: list[Any]) -> tuple[T.DataType, bool]:
        non_null = [b for b in branches if not (isinstance(b, Mapping) and b.get("type") == "null")]
        nullable = len(non_null) < len(branches)
        if len(non_null) == 1:
            dtype, inner = self.read(non_null[0])
            return dtype, nullable or inner
        return T.StringType(), nullable

    def _ref(self, ref: str) -> tuple[T.DataType, bool]:
        if not ref.startswith("#"):
            raise ConfigError(f"JSON Schema $ref {ref!r}: only local references (#/...) are supported")
        if ref in self.in_progress:
            raise ConfigError(f"recursive JSON Schema reference {ref} cannot be mapped to a Spark schema")
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            node = node[part.replace("~1", "/").replace("~0", "~")]
        self.in_progress.add(ref)
        try:
            return self.read(node)
        finally:
            self.in_progress.discard(ref)


# --------------------------------------------------------------------------- values


def to_json_value(row: Any, schema: T.StructType) -> dict[str, Any]:
    """A row (Arrow `to_pylist` form) as a JSON-ready object following the mapping above."""
    return walk_row(row, schema, _json, _CONVERTED)  # type: ignore[return-value]


# The types whose values `_json` converts.
_CONVERTED = (T.DecimalType, T.TimestampType, T.TimestampNTZType, T.DateType, T.BinaryType, T.FloatType, T.DoubleType)


def _json(value: Any, dtype: T.DataType) -> Any:
    """A leaf value as its JSON text's Python form (the mapping above)."""
    if isinstance(dtype, T.DecimalType):
        return format(Decimal(value), "f")
    if isinstance(dtype, T.TimestampType):
        instant = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        return instant.isoformat(timespec="microseconds").replace("+00:00", "Z")
    if isinstance(dtype, T.TimestampNTZType):
        return value.replace(tzinfo=None).isoformat(timespec="microseconds")
    if isinstance(dtype, T.DateType):
        return (value.date() if isinstance(value, datetime) else value).isoformat()
    if isinstance(dtype, T.BinaryType):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(dtype, T.FloatType | T.DoubleType) and not math.isfinite(value):
        raise ValueError(f"{dtype.simpleString()} value {value} has no JSON representation")
    return value


def encode_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def decode_json(payload: bytes) -> Any:
    """Numbers with a fraction parse as Decimal so decimal columns keep every digit."""
    return json.loads(payload, parse_float=Decimal)


def from_json_value(obj: Any, schema: T.StructType) -> dict[str, Any]:
    """A decoded JSON object as a row for `schema` (see `values.to_spark_value`)."""
    return to_spark_value(obj, schema)
