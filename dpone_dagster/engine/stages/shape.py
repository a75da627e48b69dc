"""Stage 5, shape: turn the decoded rows into the sink's messages — key, delete policy, rows
without their unique key, duplicate policy, the published-stage gates, Schema Registry evolution,
and the message size limit. Nothing is produced here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dpone_dagster import columns as C
from dpone_dagster.engine import bad_records
from dpone_dagster.engine.bad_records import handle_bad_records
from dpone_dagster.engine.clients import RunClients
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.extract import Batch, writes_registry_format
from dpone_dagster.engine.stages.gates import pre_publish_gates
from dpone_dagster.engine.stages.timing import KeptFrames, Log, stage
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.config import producer_config
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.sinks import kafka_messages
from dpone_dagster.sinks.dead_letters import DeadLetters
from dpone_dagster.sinks.registry import NO_REGISTRY, encodes_keys


@dataclass(frozen=True)
class Messages:
    """The sink's messages (key, value, headers, partition) and how many the delivery reports
    must account for."""

    frame: DataFrame
    expected: int


def shape_messages(
    manifest: Manifest,
    batch: Batch,
    letters: DeadLetters,
    sink_config: dict,
    clients: RunClients,
    incremental: bool,
    result: RunResult,
    kept: KeptFrames,
    log: Log,
    register: bool = True,
) -> Messages:
    """Apply key, delete policy, bad-key policy, duplicate policy, the published-stage gates and
    the size limit, with the facts the extract stage counted. Frames persisted on the way are
    added to `kept` (the producer tasks read them). `register` False (a checks-only run): a
    registry sink's schema is planned, not registered."""
    staged, ctx, counts = batch.staged, batch.ctx, batch.counts
    sink = manifest.sink
    options = sink.options
    deletes = int(counts["deletes"] or 0)
    batch = staged
    if deletes and not options.deletes.enabled:
        if options.deletes.when_disabled == "fail":
            raise deletes_disabled(deletes)
        batch = batch.where(F.col(C.OP) != C.DELETE)
        result.deletes_skipped = deletes
    keyed = kafka_messages.sink_key(batch, sink)
    if counts["keyless_deletes"]:
        # A SQL delete has no source key: its fix is its key columns, whatever the key format.
        raise bad_records.keyless_deletes(counts["keyless_deletes"], encodes_keys(sink) and isinstance(manifest.source, KafkaSource))
    keyless = counts["keyless_upserts"]
    if keyless:
        lineage = kafka_messages.lineage(keyed)  # null for a SQL source
        bad = keyed.where((F.col(C.OP) == C.UPSERT) & F.col(kafka_messages.KEY).isNull()).select(
            lineage[C.SOURCE_PARTITION].alias("partition"),
            lineage[C.SOURCE_OFFSET].alias("offset"),
            F.lit(f"missing unique key {list(sink.strategy.unique_key_columns)}").alias("reason"),
        )
        handle_bad_records(manifest, bad, keyless, letters, result, bad_records.KEYLESS)
        keyed = keyed.where(~((F.col(C.OP) == C.UPSERT) & F.col(kafka_messages.KEY).isNull()))
    keyed_rows = (
        result.rows_extracted - result.deletes_skipped - result.rows_dead_lettered - result.rows_skipped
    )
    removed = 0  # rows de-duplication drops
    if sink.strategy.mode in kafka_messages.DEDUPE_MODES and options.key.mode == "unique_key":
        policy = sink.strategy.duplicate_policy
        if policy == "fail":
            count, sample = kafka_messages.duplicate_keys(keyed)
            if count:
                raise kafka_messages.duplicates_refused(count, sample)
        elif policy in ("keep_last", "keep_first"):
            keyed, removed = _keep_one_per_key(manifest, keyed, policy, counts, kept)
    with stage(result, "quality_published", log):
        # The checks see the decoded rows, as at the extracted stage, without the sink key added here.
        pre_publish_gates(manifest, keyed.drop(kafka_messages.KEY), incremental, result, keyed_rows - removed, "published")
    if options.key.mode == "unique_key" and not kafka_messages.uses_dedupe(sink):
        keyed = kafka_messages.ordered_by_key(keyed)
    registry = _registry_plan(manifest, keyed, clients, result, register)
    messages = kafka_messages.to_messages(keyed, sink, ctx, registry)
    limit = int(producer_config(sink_config, options.delivery).get("message.max.bytes", 1_000_000))
    result.duplicates_removed = removed
    # The accounting is the expectation: reconciliation compares it with the delivery reports.
    expected = keyed_rows - removed
    bound = counts["size_bound"]
    if bound is not None and bound <= limit:
        return Messages(messages, expected)  # no message can be over the limit: the producer tasks encode
    return Messages(*_measured_messages(manifest, messages, limit, expected, letters, result, kept))


def deletes_disabled(count: int) -> RunFailed:
    """The failure of a batch holding deletes a sink with deletes disabled may not drop."""
    return RunFailed(
        f"the batch holds {count} delete(s) but sink.options.deletes.enabled is false; enable deletes "
        "(with tombstone: true, or envelope: dpone) or set deletes.when_disabled: skip to drop them"
    )


# Duplicated keys up to this many are resolved with a broadcast of (key, winning order); more
# fall back to a sort of the whole batch by key.
BROADCAST_DEDUPE_KEYS = 1_000_000


def _keep_one_per_key(
    manifest: Manifest, keyed: DataFrame, policy: str, counts: dict[str, Any], kept: KeptFrames
) -> tuple[DataFrame, int]:
    """keep_last / keep_first: the de-duplicated rows and how many rows were dropped (`counts`
    says how many keys repeat, see `_counts_by_key`)."""
    keys, dropped = int(counts["duplicated_keys"]), int(counts["duplicates"])
    if keys == 0:
        return keyed, 0
    if not isinstance(manifest.source, KafkaSource) or keys > BROADCAST_DEDUPE_KEYS:
        # SQL source orders (watermark, key) can tie: the window picks exactly one row per key.
        return kafka_messages.dedupe(keyed, policy), dropped
    winners = kafka_messages.duplicate_winners(keyed, kafka_messages.duplicated_keys(keyed), policy).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    winners.count()
    kept.add(winners)
    return kafka_messages.keep_winners(keyed, winners), dropped


def _measured_messages(
    manifest: Manifest,
    messages: DataFrame,
    limit: int,
    expected: int,
    letters: DeadLetters,
    result: RunResult,
    kept: KeptFrames,
) -> tuple[DataFrame, int]:
    """Encode every message once, keep it (the producer tasks read the kept copy) and find those
    over message.max.bytes before producing (brokers may not enforce it); they are bad records.
    Returns (messages, expected count)."""
    size = kafka_messages.message_size(F.col("key"), F.octet_length("value"), F.col("headers"))
    sized = messages.withColumn("__size", size).persist(StorageLevel.MEMORY_AND_DISK)
    kept.add(sized)
    too_large = sized.where(F.col("__size") > limit).count()
    if not too_large:
        return sized.drop("__size"), expected
    bad = sized.where(F.col("__size") > limit).select(
        F.col(C.SOURCE_PARTITION).alias("partition"),  # the messages carry them (null for a SQL source)
        F.col(C.SOURCE_OFFSET).alias("offset"),
        F.concat(
            F.lit("message of "),
            F.col("__size").cast("string"),
            F.lit(f" bytes exceeds message.max.bytes {limit}"),
        ).alias("reason"),
    )
    handle_bad_records(manifest, bad, too_large, letters, result, bad_records.oversized(limit), bad_records.OVERSIZED_FIX)
    return sized.where(F.col("__size") <= limit).drop("__size"), expected - too_large


def _registry_plan(manifest: Manifest, keyed: DataFrame, clients: RunClients, result: RunResult, register: bool) -> Any:
    """Schema evolution against the sink subject (registry formats); None for JSON sinks."""
    if not writes_registry_format(manifest):
        result.schema_evolution = dict(NO_REGISTRY)
        return None
    from dpone_dagster.sinks.registry import plan_registry_write  # the registry clients: only when needed

    payload = StructType(
        [f for f in keyed.schema.fields if f.name in C.payload_columns(keyed.columns) and f.name != kafka_messages.KEY]
    )
    plan = plan_registry_write(manifest, payload, clients.registry(manifest.sink), register)
    result.schema_evolution = plan.as_dict()
    return plan
