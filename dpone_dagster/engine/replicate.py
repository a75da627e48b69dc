"""Exactly-once Kafka → Kafka (delivery: exactly_once with replication:): the gates read the
planned ranges, each Spark task copies one source partition range and writes the new source
offset to the control topic in the same transaction (replication/), then reconciliation."""

from __future__ import annotations

from typing import Any

from pyspark import StorageLevel
from pyspark.sql import SparkSession

from dpone_dagster.engine.clients import RunClients
from dpone_dagster.engine.request import RunRequest
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.commit import Output, StateMove, commit_run, finish_checks_only, reconciles
from dpone_dagster.engine.stages.gates import pre_publish_gates
from dpone_dagster.engine.stages.timing import Log, stage
from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.quality.target import KafkaTargets
from dpone_dagster.sources.kafka import KafkaBatchSource
from dpone_dagster.spark.session import is_connect
from dpone_dagster.state.base import RunRecord, StateStore


def replicate(
    manifest: Manifest,
    spark: SparkSession,
    request: RunRequest,
    store: StateStore,
    record: RunRecord,
    result: RunResult,
    clients: RunClients,
) -> None:
    """Exactly-once Kafka -> Kafka: each Spark task copies one source partition range and writes the
    new source offset to the control topic in the same transaction. Offsets live only there."""
    from dpone_dagster.replication.run import plan_replication, run_replication

    result.execution_path = "replication"
    if is_connect(spark):
        raise ConfigError(
            "exactly_once replication schedules its transactional tasks as an RDD, which a Spark Connect "
            "session cannot run; run this pipeline without DPONE_SPARK_REMOTE (a classic session)"
        )

    log = request.log
    source_config, target_config = clients.kafka(manifest.source), clients.kafka(manifest.sink)
    mapping = manifest.sink.options.replication.schema_mapping
    registries = (
        (clients.registry(manifest.source), clients.registry(manifest.sink)) if mapping else (None, None)
    )
    plan = None
    if manifest.quality.checks:
        with stage(result, "quality_pre", log):
            # Gates read the planned ranges before any transaction begins; the replication copies
            # exactly these ranges (one plan from the gates to the commit).
            plan = plan_replication(manifest, source_config, target_config, log)
            _replication_gates(manifest, spark, plan, source_config, clients, result, log)
    if not request.publish:
        finish_checks_only(store, record, result, log)
        return
    targets, target_before = None, None
    if plan is not None and reconciles(manifest):
        # Committed end offsets (read_committed); a topic the run creates starts empty.
        targets = KafkaTargets(target_config, list(plan.targets.values()), transactional=True)
        target_before = targets.ends_of(set(targets.topics) & set(plan.target_partitions))
    planned_rows = result.rows_extracted
    with stage(result, "replicate", log):
        replicated = run_replication(
            manifest, spark, source_config, target_config, result.run_id, log, None, *registries, plan=plan
        )
    result.rows_extracted = replicated.records
    result.messages_produced = replicated.records
    result.bytes_produced = replicated.bytes
    result.notes.extend(replicated.notes)
    result.executors = sorted({p.executor for p in replicated.partitions if p.executor})
    result.boundary = {
        "method": "replication",
        "control_topic": replicated.control_topic,
        "commit_group": replicated.commit_group,
        "targets": replicated.targets,
        "partitions": replicated.committed_ranges,
    }
    offsets = replicated.committed_offsets
    committed = dict(next(iter(offsets.values()))) if len(offsets) == 1 else {}
    result.committed_offsets = committed  # committed with the records, whatever step 2 finds

    def run_row(success: RunRecord) -> dict[int, int]:
        # The offsets were committed with the records; only the run row is written here.
        store.finish_run_success(success, None, None, None)
        return committed

    # Steps 1 and 4's offsets happened in the transactions; step 2 runs when a check reads the target.
    output = Output(planned_rows, planned_rows, replicated.records, targets, target_before, True) if targets else None
    commit_run(manifest, output, StateMove(run_row), record, result, log)


def _replication_gates(
    manifest: Manifest,
    spark: SparkSession,
    plan: Any,
    source_config: dict,
    clients: RunClients,
    result: RunResult,
    log: Log,
) -> None:
    """Decode the planned ranges (per source topic) and run the pre-publish gates on them."""
    from dpone_dagster.kafka.boundary import Boundary, PartitionRange

    frames = []
    registry = clients.registry(manifest.source) if manifest.source.options.message_format != "json" else None
    for topic in sorted({p.topic for p in plan.planned}):
        ranges = tuple(PartitionRange(p.partition, p.start, p.end) for p in plan.planned if p.topic == topic)
        single = manifest.model_copy(update={"source": replace_topic(manifest.source, topic)})
        extracted = KafkaBatchSource(single, source_config, registry).extract(
            spark, Boundary(topic, "offsets", ranges), log
        )
        frames.append(extracted.df)
    if not frames:
        return
    staged = frames[0]
    for frame in frames[1:]:
        staged = staged.unionByName(frame, allowMissingColumns=True)
    staged = staged.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        result.rows_extracted = staged.count()
        pre_publish_gates(manifest, staged, True, result, result.rows_extracted)
    finally:
        staged.unpersist()


def replace_topic(source: KafkaSource, topic: str) -> KafkaSource:
    return source.model_copy(update={"topic": topic, "topics": None, "topic_pattern": None})
