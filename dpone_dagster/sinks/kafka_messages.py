"""Shape a staged batch into Kafka messages on Spark: strategy semantics, keys, envelopes,
deletes and headers. The output has the columns the producer tasks expect:
`key binary, value binary, headers array<struct<key,value>>, partition int` plus `__dpone__op`.

Key encodings (stable, documented in the README):
- unique_key, one column: the value as text (numbers in plain decimal, strings as they are);
- unique_key, several columns: compact JSON object of the key columns in the declared order;
- hash_row: hex SHA-256 of the row's canonical JSON (payload columns sorted by name, nulls kept);
- null: no key.
A delete that came from a source tombstone carries no payload; its key is the source key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from dpone_dagster import columns as C
from dpone_dagster.errors import RunFailed
from dpone_dagster.manifest.models import KafkaSink
from dpone_dagster.shape.keys import unique_key_positions
from dpone_dagster.spark.json_size import length_bound

if TYPE_CHECKING:
    from dpone_dagster.sinks.registry import RegistryWritePlan

JSON_WRITE_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "dateFormat": "yyyy-MM-dd",
}
KEY = "__dpone__key_out"
TOMBSTONE = "__dpone__tombstone"
DEDUPE_MODES = ("incremental_merge", "full_refresh", "replace", "snapshot_reconciliation", "cdc")


@dataclass(frozen=True)
class ShapeContext:
    pipeline: str
    run_id: str
    strategy: str
    # Literal fields describing the source in the dpone envelope, e.g. {"schema": "dbo", "table": "orders"}.
    source_fields: dict[str, str] = field(default_factory=dict)
    schema_version: int = 1


def sink_key(df: DataFrame, sink: KafkaSink) -> DataFrame:
    """Add the produced message key as bytes (null when the key mode yields none)."""
    mode = sink.options.key.mode
    payload = C.payload_columns(df.columns)
    if mode == "null":
        key: Column = F.lit(None).cast("binary")
    elif mode == "hash_row":
        canonical = F.to_json(F.struct(*[F.col(c) for c in sorted(payload)]), JSON_WRITE_OPTIONS)
        key = F.sha2(canonical, 256).cast("binary")
    else:
        unique_key_positions(sink, payload)  # a column not in the batch fails the run
        key_columns = sink.strategy.unique_key_columns
        if not key_columns:
            value = F.lit(None).cast("string")  # seed 001: no unique_key -> the fallback key is null
        elif len(key_columns) == 1:
            value = F.col(key_columns[0]).cast("string")
        else:
            struct = F.struct(*[F.col(c) for c in key_columns])
            any_set = reduce(lambda a, b: a | b, [F.col(c).isNotNull() for c in key_columns])
            value = F.when(any_set, F.to_json(struct, JSON_WRITE_OPTIONS))
        source_key = F.col(C.SOURCE_KEY) if C.SOURCE_KEY in df.columns else F.lit(None).cast("binary")
        key = F.when(value.isNull() & (F.col(C.OP) == C.DELETE), source_key).otherwise(value.cast("binary"))
    return df.withColumn(KEY, key)


def uses_dedupe(sink: KafkaSink) -> bool:
    strategy = sink.strategy
    return (
        strategy.mode in DEDUPE_MODES
        and strategy.duplicate_policy in ("keep_last", "keep_first")
        and sink.options.key.mode == "unique_key"
    )


def refuses_duplicates(sink: KafkaSink) -> bool:
    """duplicate_policy: fail, where keys are unique by the strategy: a batch whose keys repeat is
    refused whole (`duplicates_refused`)."""
    return sink.strategy.mode in DEDUPE_MODES and sink.strategy.duplicate_policy == "fail" and sink.options.key.mode == "unique_key"


def duplicate_keys(keyed: DataFrame, limit: int = 10) -> tuple[int, list[str]]:
    """(number of keys occurring more than once, a sample of them)."""
    dupes = keyed.where(F.col(KEY).isNotNull()).groupBy(KEY).count().where(F.col("count") > 1)
    count = dupes.count()
    sample = [bytes(row[KEY]).decode("utf-8", "replace") for row in dupes.limit(limit).collect()] if count else []
    return count, sample


def duplicates_refused(count: int, sample: list[str]) -> RunFailed:
    """The failure of a batch whose keys repeat under duplicate_policy: fail (both paths)."""
    return RunFailed(
        f"duplicate_policy: fail — {count} key(s) occur more than once in the batch "
        f"(e.g. {sample}); nothing was produced. Use keep_last/keep_first to keep one row per key"
    )


WINNER = "__dpone__winner"


def duplicated_keys(keyed: DataFrame) -> DataFrame:
    """Keys occurring more than once, with their `count`. A hash aggregate of the keys alone
    (fixed-width buffer, map-side pre-aggregation): the rows are not shuffled."""
    return keyed.where(F.col(KEY).isNotNull()).groupBy(KEY).count().where(F.col("count") > 1)


def duplicate_winners(keyed: DataFrame, duplicated: DataFrame, policy: str) -> DataFrame:
    """Per duplicated key (a broadcast set): the source order of the row to keep."""
    order = F.max(C.ORDER) if policy == "keep_last" else F.min(C.ORDER)
    rows = keyed.join(F.broadcast(duplicated.select(KEY)), on=KEY, how="left_semi")
    return rows.groupBy(KEY).agg(order.alias(WINNER))


def keep_winners(keyed: DataFrame, winners: DataFrame) -> DataFrame:
    """Drop the rows of duplicated keys that are not the winner (a broadcast join: the rows stay
    where they are). The source order must be unique per row, as it is for one Kafka topic."""
    joined = keyed.join(F.broadcast(winners), on=KEY, how="left")
    return joined.where(F.col(WINNER).isNull() | (F.col(C.ORDER) == F.col(WINNER))).drop(WINNER)


def dedupe(keyed: DataFrame, policy: str, tie_break: tuple[str, ...] = ()) -> DataFrame:
    """One row per key by source order, then by the `tie_break` columns (without them, rows whose
    source order ties are ranked in any order); rows without a key are all kept."""
    order = [F.col(c).desc() if policy == "keep_last" else F.col(c).asc() for c in (C.ORDER, *tie_break)]
    rank = F.row_number().over(Window.partitionBy(KEY).orderBy(*order))
    with_key = keyed.where(F.col(KEY).isNotNull()).withColumn("__rank", rank).where("__rank = 1").drop("__rank")
    return with_key.unionByName(keyed.where(F.col(KEY).isNull()))


def _value_struct(keyed: DataFrame, sink: KafkaSink, ctx: ShapeContext) -> Column:
    """What a JSON message value encodes: the payload, or the dpone envelope around it."""
    payload = [c for c in C.payload_columns(keyed.columns) if c != KEY]
    data = F.struct(*[F.col(c) for c in payload])
    if sink.options.envelope != "dpone":
        return data
    return F.struct(
        F.col(C.OP).alias("op"),
        data.alias("data"),
        F.struct(F.lit(ctx.strategy).alias("strategy"), F.lit(ctx.run_id).alias("run_id")).alias("metadata"),
        F.struct(*[F.lit(v).alias(k) for k, v in ctx.source_fields.items()]).alias("source")
        if ctx.source_fields
        else F.lit(None).alias("source"),
        F.lit(ctx.schema_version).alias("schema_version"),
    )


def message_size(key: Column, value_length: Column, headers: Column) -> Column:
    """Bytes of a message as message.max.bytes counts them: key, value, header keys and values."""
    header_bytes = F.aggregate(
        headers, F.lit(0).cast("long"), lambda acc, h: acc + F.octet_length(h["key"]) + F.coalesce(F.octet_length(h["value"]), F.lit(0))
    )
    return F.coalesce(F.octet_length(key), F.lit(0)) + F.coalesce(value_length, F.lit(0)) + F.coalesce(header_bytes, F.lit(0))


def message_size_bound(keyed: DataFrame, sink: KafkaSink, ctx: ShapeContext) -> Column | None:
    """Per row, an upper bound on the size of the JSON message `to_messages` makes of it, without
    encoding it (see spark/json_size.py); None when the payload has a type without a bound."""
    value = _value_struct(keyed, sink, ctx)
    bound = length_bound(value, keyed.select(value).schema[0].dataType)
    # A row hash is 64 hex characters: no need to compute it for its length.
    key = F.lit(b"0" * 64) if sink.options.key.mode == "hash_row" else F.col(KEY)
    return message_size(key, bound, _headers(keyed, sink)) if bound is not None else None


def to_messages(keyed: DataFrame, sink: KafkaSink, ctx: ShapeContext, registry: RegistryWritePlan | None = None) -> DataFrame:
    """Encode key/value/headers (JSON, or Schema Registry formats when `registry` is given).
    Deletes must already be allowed (see engine pre-publish checks)."""
    options = sink.options
    payload = [c for c in C.payload_columns(keyed.columns) if c != KEY]
    value = F.to_json(_value_struct(keyed, sink, ctx), JSON_WRITE_OPTIONS)
    is_delete = F.col(C.OP) == C.DELETE
    tombstone = is_delete if options.deletes.enabled and options.deletes.tombstone else F.lit(False)
    if registry is not None:
        from dpone_dagster.sinks.registry import encode_messages

        staged = keyed.select(
            F.col(KEY).alias("key"),
            _headers(keyed, sink).alias("headers"),
            F.lit(-1).cast("int").alias("partition"),
            F.col(C.OP),
            tombstone.alias(TOMBSTONE),
            *[v.alias(k) for k, v in lineage(keyed).items()],
            *[F.col(c) for c in payload],
        )
        encoded = encode_messages(staged, registry, payload, TOMBSTONE)
        return encoded.select("key", "value", "headers", "partition", C.OP, *LINEAGE)
    value = F.when(tombstone, F.lit(None).cast("string")).otherwise(value)
    return keyed.select(
        F.col(KEY).alias("key"),
        value.cast("binary").alias("value"),
        _headers(keyed, sink).alias("headers"),
        F.lit(-1).cast("int").alias("partition"),
        F.col(C.OP),
        *[v.alias(k) for k, v in lineage(keyed).items()],
    )


LINEAGE = (C.SOURCE_PARTITION, C.SOURCE_OFFSET)


def lineage(df: DataFrame) -> dict[str, Column]:
    """Source partition/offset travel with each message so a bad one can be traced (null for SQL)."""
    return {
        C.SOURCE_PARTITION: F.col(C.SOURCE_PARTITION) if C.SOURCE_PARTITION in df.columns else F.lit(None).cast("int"),
        C.SOURCE_OFFSET: F.col(C.SOURCE_OFFSET) if C.SOURCE_OFFSET in df.columns else F.lit(None).cast("long"),
    }


def has_headers(sink: KafkaSink) -> bool:
    """Whether messages to this sink may carry headers (`_headers` is not a null literal)."""
    options = sink.options.headers
    return bool(options.static) or options.lineage or options.replicate_source


def _headers(df: DataFrame, sink: KafkaSink) -> Column:
    options = sink.options.headers
    entries: list[Column] = [
        F.struct(F.lit(k).alias("key"), F.lit(v).cast("binary").alias("value")) for k, v in options.static.items()
    ]
    if options.lineage and C.SOURCE_TOPIC in df.columns:
        for name, column in (
            ("dpone.source.topic", C.SOURCE_TOPIC),
            ("dpone.source.partition", C.SOURCE_PARTITION),
            ("dpone.source.offset", C.SOURCE_OFFSET),
        ):
            entries.append(F.struct(F.lit(name).alias("key"), F.col(column).cast("string").cast("binary").alias("value")))
    headers = F.array(*entries) if entries else F.lit(None).cast("array<struct<key:string,value:binary>>")
    if options.replicate_source and C.SOURCE_HEADERS in df.columns:
        source = F.coalesce(F.col(C.SOURCE_HEADERS), F.array().cast("array<struct<key:string,value:binary>>"))
        headers = F.concat(source, F.coalesce(headers, F.array().cast("array<struct<key:string,value:binary>>")))
    return headers


def ordered_by_key(keyed: DataFrame, tie_break: tuple[str, ...] = ()) -> DataFrame:
    """Events of one key go to one producing task, in source order (then by the `tie_break`
    columns), so the topic keeps their order."""
    return keyed.repartition(F.col(KEY)).sortWithinPartitions(C.ORDER, *tie_break)
