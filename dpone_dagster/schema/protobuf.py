"""Protobuf messages <-> Spark schema and rows (pure; no registry calls).

What is required:
- `schema_registry.protobuf_message` names a *generated* message class, "pkg.module:Message" or
  "pkg.module.Message" (nested: "pkg.module:Outer.Inner"). It must be importable **on the driver**,
  which registers the class's file (base64 FileDescriptorProto, exactly what confluent's
  ProtobufSerializer registers; non-well-known imports are registered as references under their
  file name) and derives the Spark schema from it.
- Executors do not import the class: they rebuild the message type from the registered file
  descriptor (plus references) shipped in the task closure, and select the message by the
  Confluent message indexes (`message_indexes`). They only need the protobuf runtime; imports of
  google/type/* files additionally need googleapis-common-protos.

Type mapping: int32/sint32/sfixed32 -> int; int64/sint64/sfixed64 and uint32/fixed32 -> long;
uint64/fixed64 -> decimal(20,0) (Spark has no unsigned long); float, double, bool, string, bytes ->
the same; enum -> string (symbol name); nested message -> struct; repeated -> array; map -> map;
google.protobuf.Timestamp -> timestamp; google.protobuf.*Value wrappers -> the nullable scalar;
google.type.Date -> date. Nullability follows presence: message fields, `optional` scalars and
oneof members are nullable; plain proto3 scalars always have a value (their zero default), so a
null written into one comes back as the default; repeated and map fields are non-null (empty).
"""

from __future__ import annotations

import base64
import binascii
import importlib
from collections.abc import Mapping, Sequence
from datetime import UTC, date
from decimal import Decimal
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from pyspark.sql import types as T

from dpone_dagster.errors import ConfigError
from dpone_dagster.schema.registry import ReferencedFile
from dpone_dagster.schema.values import to_spark_value

_FD = FieldDescriptor
_SCALARS: dict[int, T.DataType] = {
    _FD.TYPE_INT32: T.IntegerType(),
    _FD.TYPE_SINT32: T.IntegerType(),
    _FD.TYPE_SFIXED32: T.IntegerType(),
    _FD.TYPE_INT64: T.LongType(),
    _FD.TYPE_SINT64: T.LongType(),
    _FD.TYPE_SFIXED64: T.LongType(),
    _FD.TYPE_UINT32: T.LongType(),
    _FD.TYPE_FIXED32: T.LongType(),
    _FD.TYPE_UINT64: T.DecimalType(20, 0),
    _FD.TYPE_FIXED64: T.DecimalType(20, 0),
    _FD.TYPE_FLOAT: T.FloatType(),
    _FD.TYPE_DOUBLE: T.DoubleType(),
    _FD.TYPE_BOOL: T.BooleanType(),
    _FD.TYPE_STRING: T.StringType(),
    _FD.TYPE_BYTES: T.BinaryType(),
    _FD.TYPE_ENUM: T.StringType(),
}
TIMESTAMP = "google.protobuf.Timestamp"
DATE = "google.type.Date"
_WRAPPERS: dict[str, T.DataType] = {
    "google.protobuf.DoubleValue": T.DoubleType(),
    "google.protobuf.FloatValue": T.FloatType(),
    "google.protobuf.Int64Value": T.LongType(),
    "google.protobuf.UInt64Value": T.DecimalType(20, 0),
    "google.protobuf.Int32Value": T.IntegerType(),
    "google.protobuf.UInt32Value": T.LongType(),
    "google.protobuf.BoolValue": T.BooleanType(),
    "google.protobuf.StringValue": T.StringType(),
    "google.protobuf.BytesValue": T.BinaryType(),
}


def is_builtin(file_name: str) -> bool:
    """Well-known files confluent never registers as references (skip.known.types)."""
    return file_name.startswith(("google/protobuf/", "google/type/", "confluent/"))


def load_message_class(path: str) -> type[Message]:
    """Import a generated message class from "pkg.module:Message" or "pkg.module.Message"."""
    if ":" in path:
        module_name, _, qualname = path.partition(":")
        candidates = [(module_name, qualname)]
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]
    for module_name, qualname in candidates:
        try:
            target: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            for part in qualname.split("."):
                target = getattr(target, part)
        except AttributeError:
            continue
        if isinstance(target, type) and issubclass(target, Message):
            return target
    raise ConfigError(
        f"schema_registry.protobuf_message {path!r}: no generated protobuf message class found; use "
        "'package.module_pb2:Message' and make the module importable on the driver"
    )


def _descriptor(message: type[Message] | Message | Descriptor) -> Descriptor:
    return message if isinstance(message, Descriptor) else message.DESCRIPTOR


# --------------------------------------------------------------------------- registration


def schema_string(message: type[Message] | Descriptor) -> str:
    """The registry schema of a message's file: base64 FileDescriptorProto (confluent's format)."""
    return _file_string(_descriptor(message).file)


def _file_string(file: FileDescriptor) -> str:
    return base64.standard_b64encode(file.serialized_pb).decode("ascii")


def message_indexes(message: type[Message] | Descriptor) -> list[int]:
    """Position of the message in its file: top-level index, then nested indexes (wire format)."""
    descriptor = _descriptor(message)
    path: list[int] = []
    while descriptor.containing_type is not None:
        parent = descriptor.containing_type
        path.append(list(parent.nested_types).index(descriptor))
        descriptor = parent
    # Declaration order of the file's top-level messages, from the file itself.
    top_level = [m.name for m in descriptor_pb2.FileDescriptorProto.FromString(descriptor.file.serialized_pb).message_type]
    path.append(top_level.index(descriptor.name))
    return list(reversed(path))


def dependency_files(message: type[Message] | Descriptor) -> list[ReferencedFile]:
    """Non-well-known imports of the message's file, dependencies first (to register as references)."""
    ordered: dict[str, ReferencedFile] = {}

    def visit(file: FileDescriptor) -> None:
        for dep in file.dependencies:
            if is_builtin(dep.name) or dep.name in ordered:
                continue
            visit(dep)
            imports = tuple(d.name for d in dep.dependencies if not is_builtin(d.name))
            ordered[dep.name] = ReferencedFile(dep.name, _file_string(dep), imports)

    visit(_descriptor(message).file)
    return list(ordered.values())


def direct_imports(message: type[Message] | Descriptor) -> list[str]:
    """Names of the non-well-known files the message's own file imports (its references)."""
    return [d.name for d in _descriptor(message).file.dependencies if not is_builtin(d.name)]


# --------------------------------------------------------------------------- executors: rebuild


def _builtin_module(file_name: str) -> Any:
    stem = file_name[: -len(".proto")].replace("/", ".")
    if file_name.startswith("confluent/"):
        return importlib.import_module(f"confluent_kafka.schema_registry.{stem}_pb2")
    return importlib.import_module(f"{stem}_pb2")


def _add_builtin(pool: DescriptorPool, file: FileDescriptor, added: set[str]) -> None:
    if file.name in added:
        return
    for dep in file.dependencies:
        _add_builtin(pool, dep, added)
    pool.AddSerializedFile(file.serialized_pb)
    added.add(file.name)


def _parse_file(name: str, schema_str: str) -> descriptor_pb2.FileDescriptorProto:
    try:
        serialized = base64.b64decode(schema_str, validate=True)
    except (binascii.Error, ValueError):
        # .proto text: what a registry answers when a read does not ask for format=serialized.
        raise ValueError(
            f"protobuf schema {name} is .proto text, not a base64 FileDescriptorProto; read it from the "
            "registry with format=serialized"
        ) from None
    proto = descriptor_pb2.FileDescriptorProto()
    proto.ParseFromString(serialized)
    if not proto.name:
        proto.name = name
    return proto


def message_class_from_schema(
    schema_str: str, indexes: Sequence[int], references: Sequence[tuple[str, str]] = ()
) -> type[Message]:
    """Rebuild the message class a registered schema + message indexes designate (no import of
    the generated module needed). `references` are (file name, schema_str), dependencies first."""
    pool = DescriptorPool()
    added: set[str] = set()
    files = [_parse_file(name, text) for name, text in references]
    main = _parse_file("dpone_registered.proto", schema_str)
    for proto in [*files, main]:
        for dep in proto.dependency:
            if is_builtin(dep) and dep not in added:
                _add_builtin(pool, _builtin_module(dep).DESCRIPTOR, added)
    for proto in files:
        if proto.name not in added:
            pool.Add(proto)
            added.add(proto.name)
    pool.Add(main)
    return GetMessageClass(pool.FindMessageTypeByName(_full_name(main, indexes)))


def _full_name(file: descriptor_pb2.FileDescriptorProto, indexes: Sequence[int]) -> str:
    if not indexes:
        raise ValueError("empty protobuf message indexes")
    try:
        message = file.message_type[indexes[0]]
        names = [message.name]
        for index in indexes[1:]:
            message = message.nested_type[index]
            names.append(message.name)
    except IndexError:
        raise ValueError(f"message indexes {list(indexes)} do not exist in {file.name}") from None
    return ".".join([file.package, *names] if file.package else names)


# --------------------------------------------------------------------------- Spark schema


def message_to_spark(message: type[Message] | Descriptor) -> T.StructType:
    """The Spark struct of a message (see the module docstring for the mapping)."""
    return _struct(_descriptor(message), ())


def _is_repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # newer runtimes deprecate `label`
    return bool(flag) if flag is not None else field.label == _FD.LABEL_REPEATED


def _is_map(field: FieldDescriptor) -> bool:
    return _is_repeated(field) and field.message_type is not None and field.message_type.GetOptions().map_entry


def _struct(descriptor: Descriptor, stack: tuple[str, ...]) -> T.StructType:
    if descriptor.full_name in stack:
        raise ConfigError(f"recursive protobuf message {descriptor.full_name} cannot be mapped to a Spark schema")
    inner = (*stack, descriptor.full_name)
    fields = []
    for field in descriptor.fields:
        if _is_map(field):
            entry = field.message_type
            key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
            dtype: T.DataType = T.MapType(_single_type(key, inner), _single_type(value, inner), False)
            nullable = False
        elif _is_repeated(field):
            dtype, nullable = T.ArrayType(_single_type(field, inner), False), False
        else:
            dtype, nullable = _single_type(field, inner), field.has_presence
        fields.append(T.StructField(field.name, dtype, nullable))
    return T.StructType(fields)


def _single_type(field: FieldDescriptor, stack: tuple[str, ...]) -> T.DataType:
    if field.type in (_FD.TYPE_MESSAGE, _FD.TYPE_GROUP):
        name = field.message_type.full_name
        if name == TIMESTAMP:
            return T.TimestampType()
        if name == DATE:
            return T.DateType()
        if name in _WRAPPERS:
            return _WRAPPERS[name]
        return _struct(field.message_type, stack)
    return _SCALARS[field.type]


# --------------------------------------------------------------------------- values


def message_to_row(message: Message, schema: T.StructType) -> dict[str, Any]:
    """A decoded message as a row for `schema` (fields projected by name)."""
    return to_spark_value(_message_values(message), schema)


def _message_values(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value_out(value_field, v) for k, v in value.items()}
        elif _is_repeated(field):
            out[field.name] = [_value_out(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _value_out(field, value)
    return out


def _value_out(field: FieldDescriptor, value: Any) -> Any:
    if field.type == _FD.TYPE_ENUM:
        symbol = field.enum_type.values_by_number.get(value)
        return symbol.name if symbol is not None else str(value)
    if field.type not in (_FD.TYPE_MESSAGE, _FD.TYPE_GROUP):
        return value
    name = field.message_type.full_name
    if name == TIMESTAMP:
        return value.ToDatetime(tzinfo=UTC)
    if name == DATE:
        return date(value.year, value.month, value.day) if value.year else None
    if name in _WRAPPERS:
        return value.value
    return _message_values(value)


def row_to_message(row: Mapping[str, Any], message_class: type[Message]) -> Message:
    """A row (Arrow `to_pylist` form) as a message; columns the message lacks are ignored, nulls
    leave fields unset."""
    message = message_class()
    _fill(message, row)
    return message


def _fill(message: Message, row: Mapping[str, Any]) -> None:
    for field in message.DESCRIPTOR.fields:
        value = row.get(field.name)
        if value is None:
            continue
        target = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            for k, v in value.items() if isinstance(value, Mapping) else value:
                if v is None:
                    raise ValueError(f"{field.name}{{{k}}}: protobuf map values cannot be null")
                if value_field.type == _FD.TYPE_MESSAGE:
                    _set_message(target[k], value_field, v)
                else:
                    target[k] = _scalar_in(value_field, v)
        elif _is_repeated(field):
            for v in value:
                if v is None:
                    raise ValueError(f"{field.name}: protobuf repeated fields cannot hold nulls")
                if field.type == _FD.TYPE_MESSAGE:
                    _set_message(target.add(), field, v)
                else:
                    target.append(_scalar_in(field, v))
        elif field.type == _FD.TYPE_MESSAGE:
            _set_message(target, field, value)
        else:
            setattr(message, field.name, _scalar_in(field, value))


def _set_message(target: Message, field: FieldDescriptor, value: Any) -> None:
    name = field.message_type.full_name
    target.SetInParent()
    if name == TIMESTAMP:
        target.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))
    elif name == DATE:
        target.year, target.month, target.day = value.year, value.month, value.day
    elif name in _WRAPPERS:
        target.value = _scalar_in(field.message_type.fields_by_name["value"], value)
    else:
        _fill(target, value)


def _scalar_in(field: FieldDescriptor, value: Any) -> Any:
    kind = field.type
    if kind == _FD.TYPE_ENUM:
        if isinstance(value, str):
            symbol = field.enum_type.values_by_name.get(value)
            if symbol is None:
                raise ValueError(f"{field.name}: {value!r} is not a symbol of enum {field.enum_type.full_name}")
            return symbol.number
        return int(value)
    if kind in (_FD.TYPE_FLOAT, _FD.TYPE_DOUBLE):
        return float(value)
    if kind == _FD.TYPE_BOOL:
        return bool(value)
    if kind == _FD.TYPE_STRING:
        return str(value)
    if kind == _FD.TYPE_BYTES:
        return bytes(value)
    if isinstance(value, Decimal | float):
        if value != int(value):
            raise ValueError(f"{field.name}: {value} is not an integer")
    return int(value)
