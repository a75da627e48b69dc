"""Stage 2, extract: read the planned boundary once on Spark, keep the decoded batch and count, in
the same pass, what the later stages decide on (rows, undecodable records, deletes, keys that
repeat, a bound on message sizes)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from dpone_dagster import columns as C
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.boundary import PlannedRead
from dpone_dagster.engine.stages.timing import KeptFrames, Log
from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.manifest.rules import REGISTRY_FORMATS
from dpone_dagster.sinks import kafka_messages
from dpone_dagster.sinks.registry import encodes_keys
from dpone_dagster.sources.kafka_reader import JSON_OK
from dpone_dagster.spark.keep import keep_batch


@dataclass(frozen=True)
class Batch:
    """The extracted batch, kept: one row per source record (undecodable ones flagged in
    columns.CORRUPT), its counts, and the raw records dead letters are made of."""

    staged: DataFrame
    counts: dict[str, Any]
    ctx: kafka_messages.ShapeContext
    raw: DataFrame | None


def extract(
    manifest: Manifest,
    spark: SparkSession,
    planned: PlannedRead,
    result: RunResult,
    kept: KeptFrames,
    log: Log,
) -> Batch:
    extracted = planned.source.extract(spark, planned.boundary, log)
    if extracted.raw is not None:
        kept.add(extracted.raw)  # registry formats keep the raw batch (schema ids, dead letters)
    ctx = shape_context(manifest, result)
    persisted, staged, counts = _stage_batch(manifest, extracted, ctx, kept)
    if counts["unknown"]:
        # Records with keys the schema sample missed: widen the schema, read again.
        extracted = planned.source.widen(spark, planned.boundary, extracted, staged, log)
        if extracted.raw is not None:
            kept.add(extracted.raw)
        kept.release(persisted)
        _, staged, counts = _stage_batch(manifest, extracted, ctx, kept)
    result.notes.extend(extracted.notes)
    result.rows_extracted = int(counts["rows"])
    return Batch(staged.drop(C.UNKNOWN_KEYS, C.UNKNOWN_TEXT), counts, ctx, extracted.raw)


def shape_context(manifest: Manifest, result: RunResult) -> kafka_messages.ShapeContext:
    return kafka_messages.ShapeContext(
        pipeline=manifest.name,
        run_id=result.run_id,
        strategy=manifest.sink.strategy.mode,
        source_fields={"topic": manifest.source.topic} if isinstance(manifest.source, KafkaSource) else {},
    )


def writes_registry_format(manifest: Manifest) -> bool:
    return manifest.sink.options.message_format in REGISTRY_FORMATS


def _stage_batch(
    manifest: Manifest, extracted: Any, ctx: kafka_messages.ShapeContext, kept: KeptFrames
) -> tuple[DataFrame, DataFrame, dict[str, Any]]:
    """Keep the extracted batch (the one pass over the source) in `kept` and read it once for its
    counts and the facts shaping needs. Returns the kept frame, the batch as read from it and the
    counts.

    Flat JSON keeps the read tasks' output as it is when they decoded every record (no row copy
    before keeping it; each pass renames the columns). When some record needs the JVM decoder,
    the decoded batch is kept instead, so that such records are parsed once; the first counting
    pass is then repeated on it (drift past the schema sample always takes this way)."""
    if extracted.records is not None:
        records = kept.add(keep_batch(extracted.records))
        decoded_in_tasks, decoded = extracted.decode_kept(records)
        counts = _batch_counts(manifest, decoded_in_tasks, ctx)
        if not counts[UNDECODED]:
            return records, decoded_in_tasks.drop(JSON_OK), counts
        decoded_kept = kept.add(keep_batch(decoded().drop(*extracted.rebuildable)))
        staged = _rebuilt(decoded_kept, extracted.rebuildable)
        counts = _batch_counts(manifest, staged, ctx)  # decoded from the kept read output
        kept.release(records)
        return decoded_kept, staged, counts
    decoded_kept = kept.add(keep_batch(extracted.df.drop(*extracted.rebuildable)))
    staged = _rebuilt(decoded_kept, extracted.rebuildable)
    return decoded_kept, staged, _batch_counts(manifest, staged, ctx)


def _rebuilt(kept: DataFrame, rebuildable: dict[str, Column]) -> DataFrame:
    """`kept` with the columns rebuilt from its own (a SQL source has none; Spark Connect refuses
    an empty withColumns)."""
    return kept.withColumns(rebuildable) if rebuildable else kept


UNDECODED = "undecoded"  # records a read task left to the JVM decoder


def _batch_counts(manifest: Manifest, staged: DataFrame, ctx: kafka_messages.ShapeContext) -> dict[str, Any]:
    """Rows, corrupt records, deletes, drift and the facts shaping checks (`_shape_facts`), in one
    pass; with keep_last/keep_first also the repeated keys (`_counts_by_key`)."""
    try:
        keyed = kafka_messages.sink_key(staged, manifest.sink)
        facts = _shape_facts(manifest, keyed, ctx)
    except ConfigError:
        keyed, facts = None, {}  # the key columns are missing: shaping reports it, if it comes to that
    columns = {
        "rows": F.count(F.lit(1)),
        "corrupt": F.count(F.col(C.CORRUPT)),
        "deletes": F.count(F.when(F.col(C.OP) == C.DELETE, 1)),
        "unknown": F.count(F.col(C.UNKNOWN_KEYS))
        if C.UNKNOWN_KEYS in staged.columns
        else F.count(F.lit(None)),
        UNDECODED: F.count(F.when(~F.col(JSON_OK), 1)) if JSON_OK in staged.columns else F.count(F.lit(None)),
        **facts,
    }
    defaults = {"keyless_deletes": 0, "keyless_upserts": 0, "size_bound": None}
    if keyed is not None and _keeps_one_per_key(manifest):
        return {**defaults, **_counts_by_key(manifest, keyed, columns)}
    counts = (
        (keyed if keyed is not None else staged)
        .agg(*[column.alias(name) for name, column in columns.items()])
        .first()
    )
    return {**defaults, **counts.asDict()}


def _keeps_one_per_key(manifest: Manifest) -> bool:
    return kafka_messages.uses_dedupe(manifest.sink) and manifest.sink.strategy.duplicate_policy in (
        "keep_last",
        "keep_first",
    )


def _counts_by_key(manifest: Manifest, keyed: DataFrame, columns: dict[str, Column]) -> dict[str, Any]:
    """The batch counts and, in the same pass, the keys that repeat among the rows shaping keeps
    (decoded, and not a delete that is skipped): `duplicated_keys` and `duplicates` (rows beyond
    the first per key). One aggregate per key, then one over the keys."""
    kept = F.col(C.CORRUPT).isNull()
    if not manifest.sink.options.deletes.enabled:
        kept = kept & (F.col(C.OP) != C.DELETE)
    per_key = keyed.groupBy(kafka_messages.KEY).agg(
        *[column.alias(name) for name, column in columns.items()], F.count(F.when(kept, 1)).alias("__kept")
    )
    repeated = F.col(kafka_messages.KEY).isNotNull() & (F.col("__kept") > 1)
    totals = [F.max(name) if name == "size_bound" else F.coalesce(F.sum(name), F.lit(0)) for name in columns]
    counts = per_key.agg(
        *[total.alias(name) for total, name in zip(totals, columns, strict=True)],
        F.count(F.when(repeated, 1)).alias("duplicated_keys"),
        F.coalesce(F.sum(F.when(repeated, F.col("__kept") - 1)), F.lit(0)).alias("duplicates"),
    )
    return counts.first().asDict()


def _shape_facts(manifest: Manifest, keyed: DataFrame, ctx: kafka_messages.ShapeContext) -> dict[str, Column]:
    """Aggregates of the keyed batch that shaping checks: deletes without a key (a tombstone needs
    one), decoded upserts without their unique key, and the bound on message sizes (JSON sinks;
    absent when a payload type has none)."""
    sink = manifest.sink
    key_missing = F.col(kafka_messages.KEY).isNull() & F.col(C.CORRUPT).isNull()
    facts: dict[str, Column] = {}
    if sink.options.deletes.tombstone:
        # A registry-encoded key is the key columns' record: a delete without them has none,
        # whatever its source key (the text key falls back to it).
        no_key = (
            reduce(lambda a, b: a & b, [F.col(c).isNull() for c in sink.strategy.unique_key_columns]) & F.col(C.CORRUPT).isNull()
            if encodes_keys(sink) and sink.strategy.unique_key_columns
            else key_missing
        )
        facts["keyless_deletes"] = F.count(F.when((F.col(C.OP) == C.DELETE) & no_key, 1))
    if sink.options.key.mode == "unique_key" and sink.strategy.unique_key_columns:
        facts["keyless_upserts"] = F.count(F.when((F.col(C.OP) == C.UPSERT) & key_missing, 1))
    if not writes_registry_format(manifest):
        bound = kafka_messages.message_size_bound(keyed, sink, ctx)
        if bound is not None:
            facts["size_bound"] = F.max(bound)
    return facts
