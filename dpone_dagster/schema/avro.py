"""Avro <-> Spark schema mapping and the value converters used with fastavro (pure; no registry).

Type mapping (Spark -> Avro; the reverse accepts these and a few more):
- boolean, int (also byte/short), long, float, double, string, binary -> the Avro primitive;
- decimal(p,s) -> bytes with logicalType decimal, precision p, scale s (exact; Avro's usual form);
- timestamp -> long timestamp-micros (UTC instant, Spark's precision; timestamp-millis is read too);
- timestamp_ntz -> long local-timestamp-micros; date -> int date;
- struct -> a named record; nested records are named <parent>_<field> (stable across runs, so an
  evolved schema keeps its nested names), unique within the schema;
- array -> array, map<string,V> -> map (Avro map keys are strings; other key types are refused).
Nullable fields are ["null", T] unions with default null. Reading: enum, uuid and fixed map to
string/string/binary, a union of null and one type is that type nullable, and any other union is a
string column holding the value as JSON text (writing into such a union only works through its
string branch). A non-null field default is kept in the StructField metadata (`dpone.default`) so
that evolution knows the field has one and a re-registered schema keeps it.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import fastavro
from pyspark.sql import types as T

from dpone_dagster.errors import ConfigError
from dpone_dagster.schema.values import DEFAULT_KEY, to_spark_value, walk_row

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PRIMITIVES: dict[type, str] = {
    T.BooleanType: "boolean",
    T.ByteType: "int",
    T.ShortType: "int",
    T.IntegerType: "int",
    T.LongType: "long",
    T.FloatType: "float",
    T.DoubleType: "double",
    T.StringType: "string",
    T.BinaryType: "bytes",
    T.NullType: "null",
}
_LOGICAL: dict[type, dict[str, str]] = {
    T.TimestampType: {"type": "long", "logicalType": "timestamp-micros"},
    T.TimestampNTZType: {"type": "long", "logicalType": "local-timestamp-micros"},
    T.DateType: {"type": "int", "logicalType": "date"},
}
_FROM_PRIMITIVE: dict[str, T.DataType] = {
    "null": T.NullType(),
    "boolean": T.BooleanType(),
    "int": T.IntegerType(),
    "long": T.LongType(),
    "float": T.FloatType(),
    "double": T.DoubleType(),
    "bytes": T.BinaryType(),
    "string": T.StringType(),
}
_FROM_LOGICAL: dict[str, T.DataType] = {
    "date": T.DateType(),
    "timestamp-millis": T.TimestampType(),
    "timestamp-micros": T.TimestampType(),
    "local-timestamp-millis": T.TimestampNTZType(),
    "local-timestamp-micros": T.TimestampNTZType(),
    "uuid": T.StringType(),
    # Spark has no time-of-day type the Arrow bridge maps; fastavro yields datetime.time -> "HH:MM:SS[.ffffff]".
    "time-millis": T.StringType(),
    "time-micros": T.StringType(),
}


def safe_name(text: str) -> str:
    """An Avro name from free text (e.g. a topic): invalid characters become underscores."""
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", text) or "record"
    return cleaned if _NAME.match(cleaned) else f"_{cleaned}"


def avro_fullname(schema: Mapping[str, Any] | str) -> str:
    """namespace.name of a record schema (what record/topic_record subject strategies use)."""
    parsed = json.loads(schema) if isinstance(schema, str) else schema
    name = str(parsed["name"])
    namespace = parsed.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


# --------------------------------------------------------------------------- Spark -> Avro


def spark_to_avro(schema: T.StructType, name: str, namespace: str | None = None) -> dict[str, Any]:
    """The Avro record schema of a Spark struct (see the module docstring for the mapping)."""
    if not _NAME.match(name):
        raise ConfigError(f"Avro record name {name!r} is invalid; use letters, digits and underscores")
    record = _record(schema, name, set(), path=name)
    if namespace:
        record = {"type": "record", "name": name, "namespace": namespace, "fields": record["fields"]}
    return record


def unique_name(name: str, used: set[str]) -> str:
    """`name`, or `name_2`, `name_3`, ... when taken; the result is added to `used`."""
    candidate, n = name, 2
    while candidate in used:
        candidate, n = f"{name}_{n}", n + 1
    used.add(candidate)
    return candidate


def _record(struct: T.StructType, name: str, used: set[str], path: str) -> dict[str, Any]:
    record_name = unique_name(name, used)
    bad = [f.name for f in struct.fields if not _NAME.match(f.name)]
    if bad:
        raise ConfigError(
            f"column name(s) {bad} in {path} are not valid Avro names ([A-Za-z_][A-Za-z0-9_]*); "
            "rename them before writing Avro"
        )
    fields = [
        avro_field(f, to_avro_type(f.dataType, f"{record_name}_{f.name}", used, f"{path}.{f.name}")) for f in struct.fields
    ]
    return {"type": "record", "name": record_name, "fields": fields}


def avro_field(field: T.StructField, avro_type: Any) -> dict[str, Any]:
    """The record field for a Spark field of Avro type `avro_type` (nullability and default)."""
    default = field.metadata.get(DEFAULT_KEY)
    if isinstance(field.dataType, T.NullType):
        return {"name": field.name, "type": "null", "default": None}
    if field.nullable:
        if default is not None:  # Avro: a default must match the first union branch
            return {"name": field.name, "type": [avro_type, "null"], "default": default}
        return {"name": field.name, "type": ["null", avro_type], "default": None}
    out: dict[str, Any] = {"name": field.name, "type": avro_type}
    if default is not None:
        out["default"] = default
    return out


def _nullable(avro_type: Any, nullable: bool) -> Any:
    return ["null", avro_type] if nullable and avro_type != "null" else avro_type


def to_avro_type(dtype: T.DataType, record_name: str, used: set[str], path: str) -> Any:
    """The Avro type of a Spark type; records are named `record_name` (made unique in `used`)."""
    if type(dtype) in _PRIMITIVES:
        return _PRIMITIVES[type(dtype)]
    if type(dtype) in _LOGICAL:
        return dict(_LOGICAL[type(dtype)])
    if isinstance(dtype, T.DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": dtype.precision, "scale": dtype.scale}
    if isinstance(dtype, T.StructType):
        return _record(dtype, record_name, used, path)
    if isinstance(dtype, T.ArrayType):
        return {"type": "array", "items": _nullable(to_avro_type(dtype.elementType, record_name, used, path), dtype.containsNull)}
    if isinstance(dtype, T.MapType):
        if not isinstance(dtype.keyType, T.StringType):
            raise ConfigError(f"{path}: Avro map keys are strings; cast the {dtype.keyType.simpleString()} keys to string")
        values = to_avro_type(dtype.valueType, record_name, used, path)
        return {"type": "map", "values": _nullable(values, dtype.valueContainsNull)}
    raise ConfigError(f"{path}: Spark type {dtype.simpleString()} has no Avro mapping")


# --------------------------------------------------------------------------- Avro -> Spark


def avro_to_spark(schema: Mapping[str, Any] | str) -> T.StructType:
    """The Spark struct of an Avro record schema (JSON text or parsed)."""
    parsed = json.loads(schema) if isinstance(schema, str) else schema
    if not isinstance(parsed, Mapping) or parsed.get("type") != "record":
        raise ConfigError("the Avro schema must be a record at the top level")
    dtype, _ = AvroReader().read(parsed, parsed.get("namespace"))
    assert isinstance(dtype, T.StructType)
    return dtype


class AvroReader:
    """Walks an Avro schema resolving named types (records, enums, fixed) by full name; `named`
    holds each definition node seen (the node itself, not a copy) and its namespace."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.in_progress: set[str] = set()

    def read(self, node: Any, namespace: str | None) -> tuple[T.DataType, bool]:
        """(Spark type, nullable) of an Avro type node."""
        if isinstance(node, list):
            return self._union(node, namespace)
        if isinstance(node, str):
            if node in _FROM_PRIMITIVE:
                return _FROM_PRIMITIVE[node], node == "null"
            return self._named_reference(node, namespace)
        if not isinstance(node, Mapping):
            raise ConfigError(f"unsupported Avro schema node {node!r}")
        kind = node.get("type")
        logical = node.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            self._register(node, namespace)
            return self._decimal(node), False
        if logical in _FROM_LOGICAL and kind in ("int", "long", "string"):
            return _FROM_LOGICAL[logical], False
        if kind == "record" or kind == "error":
            return self._record(node, namespace), False
        if kind == "enum":
            self._register(node, namespace)
            return T.StringType(), False
        if kind == "fixed":
            self._register(node, namespace)
            return T.BinaryType(), False
        if kind == "array":
            items, items_null = self.read(node["items"], namespace)
            return T.ArrayType(items, items_null), False
        if kind == "map":
            values, values_null = self.read(node["values"], namespace)
            return T.MapType(T.StringType(), values, values_null), False
        return self.read(kind, namespace)  # {"type": "long"} and friends

    def _decimal(self, node: Mapping[str, Any]) -> T.DecimalType:
        precision, scale = int(node["precision"]), int(node.get("scale", 0))
        if precision > 38:
            raise ConfigError(f"Avro decimal precision {precision} exceeds Spark's maximum of 38")
        return T.DecimalType(precision, scale)

    def _union(self, branches: list[Any], namespace: str | None) -> tuple[T.DataType, bool]:
        non_null = [b for b in branches if b != "null" and not (isinstance(b, Mapping) and b.get("type") == "null")]
        nullable = len(non_null) < len(branches)
        if not non_null:
            return T.NullType(), True
        if len(non_null) == 1:
            dtype, inner_null = self.read(non_null[0], namespace)
            return dtype, nullable or inner_null
        for branch in non_null:  # still register the named types the branches define
            self.read(branch, namespace)
        return T.StringType(), nullable  # documented: multi-type unions surface as JSON text

    def _fullname(self, node: Mapping[str, Any], namespace: str | None) -> tuple[str, str | None]:
        name = str(node["name"])
        if "." in name:
            return name, name.rsplit(".", 1)[0]
        ns = node.get("namespace", namespace)
        return (f"{ns}.{name}" if ns else name), ns

    def _register(self, node: Mapping[str, Any], namespace: str | None) -> str | None:
        if "name" not in node:  # bytes decimals are anonymous
            return namespace
        fullname, ns = self._fullname(node, namespace)
        self.named[fullname] = (node, ns)
        return ns

    def definition(self, name: str, namespace: str | None) -> tuple[str, Any, str | None] | None:
        """(full name, definition node, its namespace) of a named type referenced as `name`."""
        candidates = [name] if "." in name else ([f"{namespace}.{name}"] if namespace else []) + [name]
        for candidate in candidates:
            if candidate in self.named:
                node, ns = self.named[candidate]
                return candidate, node, ns
        return None

    def _named_reference(self, name: str, namespace: str | None) -> tuple[T.DataType, bool]:
        found = self.definition(name, namespace)
        if found is None:
            raise ConfigError(f"unknown Avro type {name!r}")
        fullname, node, ns = found
        if fullname in self.in_progress:
            raise ConfigError(f"recursive Avro type {fullname} cannot be mapped to a Spark schema")
        return self.read(node, ns)

    def _record(self, node: Mapping[str, Any], namespace: str | None) -> T.StructType:
        fullname, ns = self._fullname(node, namespace)
        if fullname in self.in_progress:
            raise ConfigError(f"recursive Avro type {fullname} cannot be mapped to a Spark schema")
        self.named[fullname] = (node, ns)
        self.in_progress.add(fullname)
        fields = []
        for field in node.get("fields", []):
            dtype, nullable = self.read(field["type"], ns)
            metadata = {DEFAULT_KEY: field["default"]} if field.get("default") is not None else {}
            fields.append(T.StructField(str(field["name"]), dtype, nullable, metadata))
        self.in_progress.discard(fullname)
        return T.StructType(fields)


def enum_fields(schema: Mapping[str, Any] | str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Top-level fields of a record schema whose type is an enum (or a null union of one):
    field name -> (enum full name, symbols). Spark sees these as strings; only symbols encode."""
    parsed = json.loads(schema) if isinstance(schema, str) else schema
    reader = AvroReader()
    reader.read(parsed, parsed.get("namespace"))
    namespace = parsed.get("namespace")
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for field in parsed.get("fields", []):
        node = field["type"]
        if isinstance(node, list):
            branches = [b for b in node if b != "null"]
            node = branches[0] if len(branches) == 1 else None
        if isinstance(node, str):
            definition = reader.definition(node, namespace)
            node = definition[1] if definition else None
        if isinstance(node, Mapping) and node.get("type") == "enum":
            name = str(node["name"])
            ns = node.get("namespace", namespace)
            fullname = name if "." in name or not ns else f"{ns}.{name}"
            found[str(field["name"])] = (fullname, tuple(str(s) for s in node.get("symbols", [])))
    return found


# --------------------------------------------------------------------------- values


def parse_avro_schema(schema_str: str) -> Any:
    """fastavro's parsed form (parse once per schema id, reuse for every record)."""
    return fastavro.parse_schema(json.loads(schema_str))


def write_avro(datum: Any, parsed_schema: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed_schema, datum)
    return buffer.getvalue()


def read_avro(payload: bytes, parsed_schema: Any) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(payload), parsed_schema, None)


def to_avro_datum(row: Mapping[str, Any], schema: T.StructType) -> dict[str, Any]:
    """A row (Arrow `to_pylist` form: maps as pairs, UTC-aware timestamps) as a fastavro datum.

    fastavro converts Decimal, datetime and date itself; this only reshapes containers, makes
    naive timestamps UTC, and leaves out nulls of required fields that have a default (fastavro
    then writes the default).
    """
    return walk_row(row, schema, _datum, (T.TimestampType,))  # type: ignore[return-value]


def _datum(value: Any, dtype: T.DataType) -> Any:
    """A leaf value as fastavro takes it: naive timestamps made UTC."""
    if isinstance(dtype, T.TimestampType) and isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def from_avro_datum(datum: Any, schema: T.StructType) -> dict[str, Any]:
    """A decoded fastavro datum as a row for `schema` (projection by field name; see
    `values.to_spark_value` for the value rules)."""
    return to_spark_value(datum, schema)
