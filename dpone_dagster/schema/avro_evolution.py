"""The Avro schema to register when a subject evolves: the registered schema plus the planned
changes (pure; no registry calls).

Evolution is planned on Spark types (`schema.evolution`), which cannot express everything a
registered schema holds: record name and namespace, enums, fixed, timestamp-millis and other logical
types, field defaults, docs, aliases, custom properties and the order of the fields. Writing the
evolved schema from the Spark struct would change all of them, and old records would no longer
resolve against it. So `evolve_avro_schema` starts from the registered schema and touches only what
the plan changed:

- a node whose Spark view the plan left as it was is kept exactly as registered;
- records, arrays, maps and null unions are walked into (a named record referenced elsewhere is
  changed where it is defined, so every use sees the same type);
- a changed type (widen; retype under NONE) is written from the Spark type, in place, keeping the
  union's null branch where it was;
- a field the plan made nullable (compatibility NONE) becomes a null union with default null;
- new fields are appended in the plan's order, nullable with default null; nested records they
  need are named `<Parent>_<field>` and kept unique among the schema's named types.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from dpone_dagster.errors import ConfigError
from dpone_dagster.schema import avro


def evolve_avro_schema(registered: Mapping[str, Any] | str, result: StructType) -> dict[str, Any]:
    """The registered record schema changed to take `result` (an evolution plan's result_schema)."""
    schema = copy.deepcopy(json.loads(registered) if isinstance(registered, str) else dict(registered))
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError("the registered Avro schema must be a record at the top level")
    _Evolver(schema).record(schema, result, schema.get("namespace"), "")
    missing = _missing_fields(result, avro.avro_to_spark(schema))
    if missing:  # never register a schema the encoder would silently leave fields out of
        raise ConfigError(f"the registered Avro schema could not take field(s) {missing} of the batch; nothing was registered")
    return schema


def _missing_fields(wanted: DataType, have: DataType, path: str = "") -> list[str]:
    """Field paths of `wanted` that `have` lacks (pure)."""
    if isinstance(wanted, StructType) and isinstance(have, StructType):
        present = {f.name: f.dataType for f in have.fields}
        out: list[str] = []
        for field in wanted.fields:
            if field.name not in present:
                out.append(f"{path}{field.name}")
            else:
                out.extend(_missing_fields(field.dataType, present[field.name], f"{path}{field.name}."))
        return out
    if isinstance(wanted, ArrayType) and isinstance(have, ArrayType):
        return _missing_fields(wanted.elementType, have.elementType, f"{path}[]")
    if isinstance(wanted, MapType) and isinstance(have, MapType):
        return _missing_fields(wanted.valueType, have.valueType, f"{path}{{}}")
    return []


def _plain(dtype: DataType) -> DataType:
    """`dtype` without field metadata (defaults), nullability kept: what decides "unchanged"."""
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, _plain(f.dataType), f.nullable) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return ArrayType(_plain(dtype.elementType), dtype.containsNull)
    if isinstance(dtype, MapType):
        return MapType(_plain(dtype.keyType), _plain(dtype.valueType), dtype.valueContainsNull)
    return dtype


def _is_null(node: Any) -> bool:
    return node == "null" or (isinstance(node, Mapping) and node.get("type") == "null")


def _simple_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Evolver:
    def __init__(self, schema: dict[str, Any]):
        # Reading the whole schema once registers every named type's node (of this copy) by full name.
        self.reader = avro.AvroReader()
        self.reader.read(schema, schema.get("namespace"))
        self.used = {_simple_name(name) for name in self.reader.named}

    def view(self, node: Any, namespace: str | None) -> tuple[DataType, bool]:
        return self.reader.read(node, namespace)

    def record(self, node: dict[str, Any], struct: StructType, namespace: str | None, path: str) -> None:
        """Change a record node in place to take `struct`."""
        name = str(node["name"])
        ns = name.rsplit(".", 1)[0] if "." in name else node.get("namespace", namespace)
        wanted = {f.name: f for f in struct.fields}
        fields: list[dict[str, Any]] = node.setdefault("fields", [])
        for field in fields:
            target = wanted.get(str(field["name"]))
            if target is not None:
                self.field(field, target, ns, f"{path}{field['name']}", f"{_simple_name(name)}_{field['name']}")
        present = {str(f["name"]) for f in fields}
        for target in struct.fields:
            if target.name not in present:
                item = avro.to_avro_type(target.dataType, f"{_simple_name(name)}_{target.name}", self.used, f"{path}{target.name}")
                fields.append(avro.avro_field(target, item))

    def field(self, field: dict[str, Any], target: StructField, namespace: str | None, path: str, record_name: str) -> None:
        _, was_nullable = self.view(field["type"], namespace)
        changed = self.type(field["type"], target.dataType, namespace, path, record_name)
        if target.nullable and not was_nullable:
            # Only compatibility NONE makes a required field nullable; a null first branch takes the null default.
            has_value_default = field.get("default") is not None
            changed = [changed, "null"] if has_value_default else ["null", changed]
            if not has_value_default:
                field["default"] = None
        field["type"] = changed

    def type(self, node: Any, dtype: DataType, namespace: str | None, path: str, record_name: str) -> Any:
        """`node` taking values of `dtype` (nullability of `node` itself is kept)."""
        current, _ = self.view(node, namespace)
        if _plain(current) == _plain(dtype):
            return node
        if isinstance(node, list):
            branches = [b for b in node if not _is_null(b)]
            if len(branches) == 1:  # a nullable type: change the one branch where it stands
                index = node.index(branches[0])
                return [*node[:index], self.type(branches[0], dtype, namespace, path, record_name), *node[index + 1 :]]
            return ["null", self.fresh(dtype, record_name, path)] if len(branches) < len(node) else self.fresh(dtype, record_name, path)
        if isinstance(node, str):
            found = self.reader.definition(node, namespace)
            if found is not None and isinstance(dtype, StructType) and found[1].get("type") in ("record", "error"):
                # Changed where it is defined, at every reference: each use may add fields of its own
                # (record() adds only what is missing, so a second use costs nothing).
                _, definition, ns = found
                self.record(definition, dtype, ns, f"{path}.")
                return node
            return self.fresh(dtype, record_name, path)
        if isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "error") and isinstance(dtype, StructType):
                self.record(node, dtype, namespace, f"{path}.")
                return node
            if kind == "array" and isinstance(dtype, ArrayType):
                node["items"] = self.type(node["items"], dtype.elementType, namespace, f"{path}[]", record_name)
                return node
            if kind == "map" and isinstance(dtype, MapType):
                node["values"] = self.type(node["values"], dtype.valueType, namespace, f"{path}{{}}", record_name)
                return node
        return self.fresh(dtype, record_name, path)

    def fresh(self, dtype: DataType, record_name: str, path: str) -> Any:
        """A changed type, written from the Spark type (widened or retyped by the plan)."""
        return avro.to_avro_type(dtype, record_name, self.used, path)
