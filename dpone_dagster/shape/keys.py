"""Message keys (pure), as the Spark SQL path renders them (sinks/kafka_messages.sink_key): a
unique key of one column as its text, of several as a compact JSON object of them (null when all
are null); hash_row the hex SHA-256 of the row's canonical JSON (fields sorted by name, nulls
kept); no key otherwise."""

from __future__ import annotations

import functools
import hashlib

import pyarrow as pa
import pyarrow.compute as pc

from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import KafkaSink
from dpone_dagster.sinks import json_encode


def unique_key_positions(sink: KafkaSink, payload: list[str]) -> tuple[int, ...] | None:
    """The positions in `payload` (the batch's payload columns) of the unique key's columns; None
    under another key.mode or without unique_key columns. A column not in the batch is a
    ConfigError naming the manifest's field and the batch's columns, on every path."""
    columns = sink.strategy.unique_key_columns
    if sink.options.key.mode != "unique_key" or not columns:
        return None
    missing = [c for c in columns if c not in payload]
    if missing:
        raise ConfigError(f"sink.strategy.unique_key: column(s) {missing} are not in the batch (columns: {payload})")
    return tuple(payload.index(c) for c in columns)


def unique_key(columns: list[pa.Array], names: list[str], key_columns: tuple[int, ...] | None) -> pa.Array:
    """The key of each row from the unique key's columns (their indexes in `columns`); all null
    when `key_columns` is None. Raises json_encode.Unencodable for a key type it cannot write."""
    n = len(columns[0]) if columns else 0
    if key_columns is None:
        return pa.nulls(n, pa.binary())
    if len(key_columns) == 1:
        return as_text(columns[key_columns[0]]).cast(pa.binary())
    chosen = [columns[i] for i in key_columns]
    encoded = json_encode.encode_object(chosen, [names[i] for i in key_columns])
    any_set = functools.reduce(pc.or_, [c.is_valid() for c in chosen])
    return pc.if_else(any_set, encoded, pa.scalar(None, pa.string())).cast(pa.binary())


def as_text(column: pa.Array) -> pa.Array:
    """A column as Spark's `cast(column as string)` writes it (binary stays its bytes). Raises
    json_encode.Unencodable for a type or value it cannot write exactly."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_binary(kind) or (pa.types.is_integer(kind) and pa.types.is_signed_integer(kind)):
        return pc.cast(column, pa.string()) if not pa.types.is_binary(kind) else column
    if pa.types.is_boolean(kind):
        return pc.if_else(column, "true", "false")
    if pa.types.is_float64(kind):
        return json_encode.double_texts(column)
    if pa.types.is_float32(kind):  # cast(float as string) is Float.toString, as to_json writes it
        return json_encode.float_texts(column)
    if pa.types.is_decimal128(kind):  # toPlainString: 0.0000000000, never 0E-10
        text = pc.cast(column, pa.string())
        scientific = pc.fill_null(pc.match_substring(text, "E"), False)
        if not pc.any(scientific).as_py():
            return text
        plain = [format(v, "f") for v in pc.filter(column, scientific).to_pylist()]
        return pc.replace_with_mask(text, scientific, pa.array(plain, pa.string()))
    if pa.types.is_timestamp(kind):  # 2026-01-01 00:01:01.5: the fraction without trailing zeros
        return pc.replace_substring_regex(json_encode.timestamp_text(column, " "), r"\.?0+$", "")
    if pa.types.is_date32(kind):
        return json_encode.date_text(column)
    raise json_encode.Unencodable(f"a unique key of type {kind}")


def hash_row(columns: list[pa.Array], names: list[str]) -> pa.Array:
    """The hex SHA-256 of each row's canonical JSON (fields sorted by name, nulls written)."""
    order = sorted(range(len(names)), key=lambda i: names[i])
    canonical = json_encode.encode_object([columns[i] for i in order], [names[i] for i in order])
    sha256 = hashlib.sha256
    return pa.array([sha256(text.encode()).hexdigest().encode() for text in canonical.to_pylist()], pa.binary())
