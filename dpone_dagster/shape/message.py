"""A message's key and value from a batch of decoded rows (pure, Arrow): the one rule the direct
path's tasks (direct/task.py for Kafka sources, direct/sql_task.py for SQL sources) write
messages with.

The key follows sink.options.key (shape/keys.py); with key.format avro | json_schema the key
sent is the key columns' record in the key subject's format (`registry_key`); the value is the row's JSON as Spark's `to_json`
writes it (sinks/json_encode.py), in the dpone envelope when asked (shape/envelope.py), or the
registered schema's bytes, unframed (formats/registry_values.py). A delete becomes what
`deletes` says: a tombstone (no value), an envelope with op delete, or, disabled, the row as any
other (the caller leaves it out or fails). Rows without their key keep a null key: the caller
judges them (bad records, or a delete's source key).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from dpone_dagster.formats import registry_values
from dpone_dagster.shape import envelope, keys
from dpone_dagster.sinks import json_encode

# A registry sink's value: format, schema, and for protobuf the message indexes and imported files.
ValueFormat = tuple[str, str, tuple[int, ...] | None, tuple[tuple[str, str], ...]]


class Unwritable(Exception):
    """A value (or a type) the rule cannot write as the sink expects; the message says which."""


@dataclass(frozen=True)
class MessageRule:
    key_columns: tuple[int, ...] | None  # fields of a unique_key; None: no key (null)
    hash_row: bool = False  # key: the hex SHA-256 of the row's canonical JSON
    value_format: ValueFormat | None = None  # a registry sink (None: JSON)
    envelope: tuple[str, str] | None = None  # the dpone envelope's text around each row's JSON
    # "tombstone", "event" (an envelope with op delete: `delete_envelope`), "skip" or "fail".
    deletes: str = "fail"
    delete_envelope: tuple[str, str] | None = None
    # key.mode unique_key: a delete whose key columns give no key takes the source record's key.
    source_key_for_deletes: bool = False
    # Registry-encoded keys: the `-key` subject's format and schema; the key columns' record,
    # unframed (the frame with the schema id is added when the id is known), null when all are null.
    key_format: tuple[str, str] | None = None
    # on_type_change: new_column: (column, variant) whose values a registry value writes in the
    # variant column, the column itself null (sinks/registry.apply_routes on the Spark SQL path).
    routes: tuple[tuple[str, str], ...] = ()


def key_and_value(
    rule: MessageRule, columns: list[pa.Array], names: list[str], is_delete: pa.Array, source_key: pa.Array | None
) -> tuple[pa.Array, pa.Array]:
    """Each row's key and value (binary arrays; null where there is none). Raises Unwritable."""
    deletes = bool(pc.any(is_delete).as_py()) if len(is_delete) else False
    try:
        value = _value(rule, columns, names, is_delete, deletes)
    except (json_encode.Unencodable, registry_values.Unencodable) as exc:
        raise Unwritable(str(exc)) from exc
    if deletes and rule.deletes == "tombstone":
        value = pc.if_else(is_delete, pa.scalar(None, pa.binary()), value)
    return key_of(rule, columns, names, is_delete, source_key), value


def key_of(rule: MessageRule, columns: list[pa.Array], names: list[str], is_delete: pa.Array, source_key: pa.Array | None) -> pa.Array:
    """Each row's key (binary; null where there is none). Raises Unwritable."""
    try:
        key = keys.hash_row(columns, names) if rule.hash_row else keys.unique_key(columns, names, rule.key_columns)
    except json_encode.Unencodable as exc:
        raise Unwritable(str(exc)) from exc
    if rule.source_key_for_deletes and source_key is not None and len(is_delete) and pc.any(is_delete).as_py():
        key = pc.if_else(pc.and_(is_delete, key.is_null()), source_key, key)
    return key


def _value(rule: MessageRule, columns: list[pa.Array], names: list[str], is_delete: pa.Array, deletes: bool) -> pa.Array:
    if rule.value_format is not None:
        fmt, schema_str, indexes, references = rule.value_format
        columns, names = routed(columns, names, rule.routes)
        upserts = pc.invert(is_delete) if deletes and rule.deletes == "tombstone" else None  # a tombstone's value is never encoded
        return _encoded_where(upserts, columns, lambda cs: registry_values.encode_values(fmt, cs, names, schema_str, indexes, references))
    data = json_encode.encode_object(columns, names)
    value = envelope.wrap(data, rule.envelope) if rule.envelope is not None else data
    if deletes and rule.deletes == "event" and rule.delete_envelope is not None:
        value = pc.if_else(is_delete, envelope.wrap(data, rule.delete_envelope), value)
    return value.cast(pa.binary())


def routed(columns: list[pa.Array], names: list[str], routes: tuple[tuple[str, str], ...]) -> tuple[list[pa.Array], list[str]]:
    """The columns with each routed column's values moved to its variant column (added last), the
    column itself all null."""
    if not routes:
        return columns, names
    columns, names = list(columns), list(names)
    for column, variant in routes:
        i = names.index(column)
        columns.append(columns[i])
        names.append(variant)
        columns[i] = pa.nulls(len(columns[i]), columns[i].type)
    return columns, names


def registry_key(rule: MessageRule, columns: list[pa.Array], names: list[str]) -> pa.Array | None:
    """The key sent when keys are registry-encoded (unframed), None otherwise. A key is still
    identified by `key_of`'s text, as the Spark SQL path identifies it: the key subject's schema
    may map two texts to one record (a default for a null, a narrower type). Raises Unwritable."""
    if rule.key_format is None or rule.key_columns is None:
        return None
    try:
        return _registry_key(rule.key_format, [columns[i] for i in rule.key_columns], [names[i] for i in rule.key_columns])
    except (json_encode.Unencodable, registry_values.Unencodable) as exc:
        raise Unwritable(str(exc)) from exc


def _registry_key(key_format: tuple[str, str], columns: list[pa.Array], names: list[str]) -> pa.Array:
    """The key columns' record in the key subject's format, null where every column is null."""
    fmt, schema_str = key_format
    any_set = functools.reduce(pc.or_, [c.is_valid() for c in columns])
    return _encoded_where(any_set, columns, lambda cs: registry_values.encode_values(fmt, cs, names, schema_str))


def _encoded_where(where: pa.Array | None, columns: list[pa.Array], encode: Callable[[list[pa.Array]], pa.Array]) -> pa.Array:
    """`encode(columns)` for the rows of `where` only (None: every row), null in the others, so a
    row that is not sent is never encoded."""
    if where is None or not len(where) or pc.all(where).as_py():
        return encode(columns)
    return _spread(encode([c.filter(where) for c in columns]), where)


def _spread(values: pa.Array, where: pa.Array) -> pa.Array:
    """`values` (one per true of `where`) back in the rows of `where`, null elsewhere."""
    positions = pc.subtract(pc.cumulative_sum(pc.cast(where, pa.int64())), 1)
    return values.take(pc.if_else(where, positions, pa.scalar(None, pa.int64())))


def unwritable_type(schema: pa.Schema, key_columns: tuple[int, ...] | None, json_value: bool, hash_row: bool, iso_times: bool) -> str | None:
    """Why the rule cannot write a message of `schema`'s rows whatever their values (a type the
    JSON encoder or a key's text does not write as Spark does), or None. `iso_times`: whether the
    Spark session writes date and timestamp text as the rule does (ISO-8601 in UTC,
    spark/session.iso_times)."""
    in_json = schema if json_value or hash_row else None
    if in_json is None and key_columns is not None and len(key_columns) > 1:
        in_json = pa.schema([schema.field(i) for i in key_columns])
    reason = json_encode.unencodable_type(in_json) if in_json is not None else None
    if reason is not None:
        return f"a message whose JSON holds {reason}"
    as_text = list(in_json or []) + ([schema.field(key_columns[0])] if key_columns is not None and len(key_columns) == 1 else [])
    if not iso_times and any(_holds_time(f.type) for f in as_text):
        return (
            "a date or timestamp written as text in the session's time zone or calendar "
            "(spark.sql.session.timeZone other than UTC, or spark.sql.legacy.timeParserPolicy LEGACY; the tasks write ISO-8601 in UTC)"
        )
    if key_columns is not None and len(key_columns) == 1:
        field = schema.field(key_columns[0])
        try:
            keys.as_text(pa.array([], field.type))
        except json_encode.Unencodable as exc:
            return f"the key {field.name}: {exc}"
    return None


def _holds_time(kind: pa.DataType) -> bool:
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_holds_time(f.type) for f in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _holds_time(kind.value_type)
    if pa.types.is_map(kind):
        return _holds_time(kind.key_type) or _holds_time(kind.item_type)
    return False
