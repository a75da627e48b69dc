"""The replication driver: resolve topics, plan per-partition ranges, preflight the target, run one
Spark task per source partition (each commits its own transactions), aggregate the task stats.

There is no separate "advance state" step: every task commits its records and its control-topic
offset atomically, so a failed run keeps exactly the partitions (and chunks) that committed, and
the next run resumes from the control topic.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.kafka.admin import ensure_sink_topic, existing_topics
from dpone_dagster.kafka.config import driver_client_config, producer_config
from dpone_dagster.kafka.errors import client_failure
from dpone_dagster.kafka.inspect import make_consumer, topic_partitions, verified_watermarks
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.redact import redact_text
from dpone_dagster.replication.control_topic import (
    commit_group_of,
    ensure_control_topic,
    snapshot_control_topic,
    target_conflict,
)
from dpone_dagster.replication.eos_task import QUEUE_KBYTES, ReplicationSpec, run_task
from dpone_dagster.replication.mapping import resolve_source_topics, resolve_targets, target_partition
from dpone_dagster.replication.plan import PartitionPlan, plan_partitions
from dpone_dagster.spark.jobs import BoundedJobs, JobTimedOut, deadline_s, waves
from dpone_dagster.spark.slots import produce_slots

Log = Callable[[str], None]

# The driver's read of the control topic only plans (tasks re-read after fencing), so it does not
# wait out a crashed attempt's transaction: the rerun's own init_transactions aborts that at once.
DRIVER_CONTROL_WAIT_S = 10.0


@dataclass(frozen=True)
class PartitionReplication:
    """What one task did: [start, end) is the range it found uncommitted and replicated."""

    topic: str
    partition: int
    target_topic: str
    planned_start: int
    start: int
    end: int
    records: int
    bytes: int
    transactions: int
    aborted: int
    committed: bool
    executor: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ReplicationResult:
    run_id: str
    pipeline: str
    commit_group: str
    control_topic: str
    targets: dict[str, str] = field(default_factory=dict)
    planned: list[PartitionPlan] = field(default_factory=list)
    partitions: list[PartitionReplication] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    @property
    def committed_ranges(self) -> list[dict[str, Any]]:
        """Ranges this run committed (topic, partition, start, end)."""
        return [
            {"topic": p.topic, "partition": p.partition, "start": p.start, "end": p.end}
            for p in self.partitions
            if p.committed
        ]

    @property
    def committed_offsets(self) -> dict[str, dict[int, int]]:
        """Next source offset per topic and partition after this run (what the control topic holds)."""
        out: dict[str, dict[int, int]] = {}
        for plan in self.planned:
            if plan.committed is not None:
                out.setdefault(plan.topic, {})[plan.partition] = plan.committed
        for p in self.partitions:
            out.setdefault(p.topic, {})[p.partition] = max(p.start, p.end)
        return {topic: dict(sorted(parts.items())) for topic, parts in sorted(out.items())}

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "commit_group": self.commit_group,
            "control_topic": self.control_topic,
            "targets": dict(self.targets),
            "records": self.records,
            "bytes": self.bytes,
            "planned": [p.as_dict() for p in self.planned],
            "partitions": [p.as_dict() for p in self.partitions],
            "committed_offsets": {t: {str(p): o for p, o in parts.items()} for t, parts in self.committed_offsets.items()},
            "notes": list(self.notes),
        }


def _check_manifest(manifest: Manifest) -> KafkaSource:
    source = manifest.source
    if not isinstance(source, KafkaSource):
        raise ConfigError("replication needs a kafka source")
    if manifest.sink.options.delivery.mode != "exactly_once":
        raise ConfigError("replication runs with sink.options.delivery.mode: exactly_once only")
    if source.options.read_mode != "offsets":
        raise ConfigError(
            f"source.options.read_mode {source.options.read_mode} is not available for exactly_once replication: "
            "it resumes from committed offsets (read_mode: offsets)"
        )
    return source


def _source_layout(
    source: KafkaSource, source_config: dict[str, Any], pipeline: str
) -> tuple[list[str], dict[str, list[int]]]:
    consumer = make_consumer(source_config, f"dpone-replication-plan-{pipeline}")
    try:
        try:
            metadata = consumer.list_topics(timeout=10)
        except Exception as exc:
            raise ConfigError(client_failure("cannot reach the source Kafka cluster to list topics", consumer, exc)) from exc
        names = [name for name, info in metadata.topics.items() if info.error is None]
        sources = resolve_source_topics(names, source.topic, source.topics, source.topic_pattern)
        return sources, {topic: topic_partitions(consumer, topic) for topic in sources}
    finally:
        consumer.close()


def _source_watermarks(source_config: dict[str, Any], partitions: dict[str, list[int]], pipeline: str) -> dict:
    consumer = make_consumer(source_config, f"dpone-replication-plan-{pipeline}")
    try:
        return {topic: verified_watermarks(consumer, topic, parts) for topic, parts in partitions.items()}
    finally:
        consumer.close()


def _ensure_targets(
    manifest: Manifest, target_config: dict[str, Any], targets: dict[str, str], partitions: dict[str, list[int]]
) -> dict[str, int]:
    """Target topic -> partition count; `keep` needs as many partitions as its largest source."""
    options = manifest.sink.options
    keep = options.replication.partition_mapping == "keep"
    counts: dict[str, int] = {}
    for target in sorted(set(targets.values())):
        needed = max(max(partitions[s], default=-1) + 1 for s, t in targets.items() if t == target)
        creation = options.create_topic
        if keep and creation.partitions < needed:
            # Created by this run: mirror the source layout so partition numbers carry over.
            creation = creation.model_copy(update={"partitions": needed})
        counts[target] = ensure_sink_topic(target_config, target, creation)
        if keep and needed:
            target_partition(needed - 1, counts[target], "keep")  # raises a ConfigError when too few
    return counts


def _parse_crash_hook(hook: tuple | None) -> tuple[str, int, str, str] | None:
    if hook is None:
        return None
    topic, partition, *rest = hook
    point = rest[0] if rest else "after_data"
    mode = rest[1] if len(rest) > 1 else "exit"
    return str(topic), int(partition), point, mode


@dataclass
class ReplicationPlan:
    """Topics, targets and the fixed per-partition ranges of one run (what `dpone plan` shows)."""

    pipeline: str
    commit_group: str
    control_topic: str
    targets: dict[str, str]
    planned: list[PartitionPlan]
    notes: list[str]
    control_partitions: int | None  # None: the control topic does not exist yet
    target_partitions: dict[str, int]  # existing (or created) target topics only

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "commit_group": self.commit_group,
            "control_topic": self.control_topic,
            "targets": dict(self.targets),
            "partitions": [p.as_dict() for p in self.planned],
            "offsets_in_range": sum(p.size for p in self.planned),
            "notes": list(self.notes),
        }


def plan_replication(
    manifest: Manifest,
    source_config: dict[str, Any],
    target_config: dict[str, Any],
    log: Log = lambda message: None,
    create: bool = False,
) -> ReplicationPlan:
    """Resolve topics and fix every partition's [start, end). With `create`, the control topic and
    the target topics are ensured first (the run); without, nothing is written (a dry plan)."""
    source = _check_manifest(manifest)
    options = manifest.sink.options.replication
    control = options.control_topic
    commit_group = commit_group_of(manifest)
    notes: list[str] = []
    if source.options.offset_storage == "kafka":
        notes.append("source.options.offset_storage kafka is not used: replication offsets live in the control topic")

    sources, partitions = _source_layout(source, source_config, manifest.name)
    same_cluster = source_config.get("bootstrap.servers") == target_config.get("bootstrap.servers")
    if same_cluster and control.name in sources:
        raise ConfigError(
            f"the control topic '{control.name}' is selected as a source topic; exclude it from "
            "source.topics/topic_pattern (or give the control topic a '__' name, which patterns never select)"
        )
    targets = resolve_targets(sources, options, manifest.sink.topic, same_cluster)
    log(f"replication: {len(sources)} topic(s): " + ", ".join(f"{s} -> {t}" for s, t in targets.items()))

    if create:
        control_partitions: int | None = ensure_control_topic(target_config, control, log)
    else:
        control_partitions, target_partitions = _existing_target_layout(target_config, control.name, targets, notes)
    snapshot = snapshot_control_topic(
        target_config, control.name, commit_group, sources, DRIVER_CONTROL_WAIT_S, missing_ok=not create
    )
    conflicts = [
        conflict
        for (topic, partition), entry in sorted(snapshot.entries.items())
        if (conflict := target_conflict(topic, partition, entry, targets[topic], commit_group)) is not None
    ]
    if conflicts:  # refused before a target topic is created or anything is read
        raise ConfigError("; ".join(conflicts[:3]) + (f" (and {len(conflicts) - 3} more)" if len(conflicts) > 3 else ""))
    if create:
        target_partitions = _ensure_targets(manifest, target_config, targets, partitions)
    if not snapshot.complete:
        notes.append(
            f"control topic '{control.name}' has an open transaction (a running or crashed task); planned starts "
            "are provisional: each task re-reads its offset after fencing older attempts"
        )
    committed = snapshot.offsets
    watermarks = _source_watermarks(source_config, partitions, manifest.name)  # the fixed ends

    planned: list[PartitionPlan] = []
    for topic in sources:
        plans, topic_notes = plan_partitions(
            topic,
            targets[topic],
            watermarks[topic],
            {p: o for (t, p), o in committed.items() if t == topic},
            source.options.start_from,
            commit_group,
            provisional=not snapshot.complete,
        )
        planned.extend(plans)
        notes.extend(topic_notes)
    log(f"plan: {sum(p.size for p in planned)} offset(s) in {len(planned)} partition(s)")
    return ReplicationPlan(
        manifest.name, commit_group, control.name, targets, planned, notes, control_partitions, target_partitions
    )


def _prepare_targets(manifest: Manifest, target_config: dict[str, Any], plan: ReplicationPlan, log: Log) -> ReplicationPlan:
    """Ensure the control topic and the target topics of a plan fixed without writing anything;
    the planned ranges stay as they are (tasks still re-read their start after fencing)."""
    control_partitions = ensure_control_topic(target_config, manifest.sink.options.replication.control_topic, log)
    layout = {topic: [p.partition for p in plan.planned if p.topic == topic] for topic in plan.targets}
    target_partitions = _ensure_targets(manifest, target_config, plan.targets, layout)
    return replace(plan, control_partitions=control_partitions, target_partitions=target_partitions)


def _existing_target_layout(
    target_config: dict[str, Any], control_topic: str, targets: dict[str, str], notes: list[str]
) -> tuple[int | None, dict[str, int]]:
    existing = existing_topics(AdminClient(driver_client_config(target_config)))
    if control_topic not in existing:
        notes.append(f"control topic '{control_topic}' does not exist yet (created by the run when control_topic.create)")
    for target in sorted(set(targets.values()) - set(existing)):
        notes.append(f"target topic '{target}' does not exist yet (the run needs sink.options.create_topic.enabled)")
    return existing.get(control_topic), {t: n for t, n in existing.items() if t in set(targets.values())}


def run_replication(
    manifest: Manifest,
    spark: SparkSession,
    source_config: dict[str, Any],
    target_config: dict[str, Any],
    run_id: str,
    log: Log = lambda message: None,
    fail_after_produce_for_tests: tuple | None = None,
    source_registry: dict[str, Any] | None = None,
    target_registry: dict[str, Any] | None = None,
    plan: ReplicationPlan | None = None,
) -> ReplicationResult:
    """Replicate every selected source partition up to its high watermark fixed now, or up to the
    ends of `plan` when the caller already fixed them (the ranges its quality gates checked).

    `fail_after_produce_for_tests`: (topic, partition[, "after_data" | "before_commit"[, "exit" | "raise"]])
    makes that partition's task die after producing and before commit_transaction.
    """
    if plan is None:
        plan = plan_replication(manifest, source_config, target_config, log, create=True)
    else:
        plan = _prepare_targets(manifest, target_config, plan, log)
    options = manifest.sink.options.replication
    result = ReplicationResult(
        run_id, manifest.name, plan.commit_group, plan.control_topic, plan.targets, list(plan.planned), list(plan.notes)
    )
    control_partitions = plan.control_partitions or 1  # always set: create=True ensured the topic

    schema_maps: dict[str, dict[int, int]] = {}
    if options.schema_mapping:
        schema_maps = _schema_maps(manifest, spark, result, source_config, source_registry, target_registry)

    # Partitions never replicated get a task even when empty: committing their start offset keeps
    # `start_from: latest` from skipping what arrives before the next run.
    todo = [p for p in result.planned if p.size > 0 or p.committed is None]
    crash = _parse_crash_hook(fail_after_produce_for_tests)
    specs = [
        _spec(manifest, run_id, p, source_config, target_config, plan.commit_group, control_partitions,
              plan.target_partitions[p.target_topic], schema_maps.get(p.topic), crash)
        for p in todo
    ]
    if specs:
        result.partitions = _run_tasks(spark, specs)
    log(
        f"replication: {result.records} record(s) in {sum(p.transactions for p in result.partitions)} "
        f"transaction(s); committed {result.committed_offsets}"
    )
    return result


def _spec(
    manifest: Manifest,
    run_id: str,
    plan: PartitionPlan,
    source_config: dict[str, Any],
    target_config: dict[str, Any],
    commit_group: str,
    control_partitions: int,
    target_partitions: int,
    schema_map: dict[int, int] | None,
    crash: tuple[str, int, str, str] | None,
) -> ReplicationSpec:
    source = manifest.source
    assert isinstance(source, KafkaSource)
    options = manifest.sink.options
    replication = options.replication
    producer = producer_config(target_config, options.delivery)
    # Java clients' partitioner, so `partitioner` mapping places keys where the target's own
    # producers would (librdkafka's default hashes differently).
    producer.setdefault("partitioner", "murmur2_random")
    if "queue.buffering.max.kbytes" not in options.delivery.producer_config:
        producer["queue.buffering.max.kbytes"] = QUEUE_KBYTES  # bounded memory (see eos_task)
    spec = ReplicationSpec(
        pipeline=manifest.name,
        run_id=run_id,
        source_config=dict(source_config),
        target_config=dict(target_config),
        producer_config=producer,
        source_topic=plan.topic,
        source_partition=plan.partition,
        planned_start=plan.start,
        end=plan.end,
        target_topic=plan.target_topic,
        commit_group=commit_group,
        control_topic=replication.control_topic.name,
        control_partitions=control_partitions,
        partition_mapping=replication.partition_mapping,
        target_partitions=target_partitions,
        replicate_headers=replication.replicate_headers,
        keep_timestamps=replication.keep_timestamps,
        tracing_headers=replication.tracing_headers,
        transaction_timeout_ms=replication.transaction_timeout_ms,
        records_per_transaction=replication.records_per_transaction,
        # Checked between consumed batches: half the timeout leaves room for the last batch and the commit.
        seconds_per_transaction=min(replication.seconds_per_transaction, replication.transaction_timeout_ms / 2000),
        schema_id_map=schema_map,
        consumer_overrides=dict(source.options.consumer_config),
        batch_size=min(source.options.batch_size, 10_000),
        poll_timeout_ms=source.options.poll_timeout_ms,
        max_empty_polls=source.options.max_empty_polls,
    )
    if crash is not None and (crash[0], crash[1]) == (plan.topic, plan.partition):
        spec = replace(spec, crash=crash[2], crash_mode=crash[3])  # type: ignore[arg-type]
    return spec


def _schema_maps(
    manifest: Manifest,
    spark: SparkSession,
    result: ReplicationResult,
    source_config: dict[str, Any],
    source_registry: dict[str, Any] | None,
    target_registry: dict[str, Any] | None,
) -> dict[str, dict[int, int]]:
    from dpone_dagster.replication.schemas import schema_id_maps, value_schema_ids

    if not source_registry or not target_registry:
        raise ConfigError(
            "sink.options.replication.schema_mapping needs a schema_registry_url on both the source and the "
            "sink connection"
        )
    ids = value_schema_ids(spark, result.planned, source_config, f"dpone-replication-{manifest.name}")
    maps = schema_id_maps(ids, result.targets, source_registry, target_registry, manifest.sink.options.schema_registry)
    result.notes.extend(f"schema ids of '{t}' mapped {m}" for t, m in maps.items() if m)
    return maps


def _run_tasks(spark: SparkSession, specs: list[ReplicationSpec]) -> list[PartitionReplication]:
    """One Spark task per source partition; each returns one stats row.

    A plain RDD of indexes: its Python workers import only the task module (an Arrow UDF's
    workers would import pyarrow and pandas first, ~0.5 s per worker for one row of stats)."""
    tasks = spark.sparkContext.parallelize(range(len(specs)), len(specs)).map(partial(run_task, specs))
    largest = max(spec.end - spec.planned_start for spec in specs)
    broker_wait_s = max(spec.init_timeout_s + spec.transaction_timeout_ms / 1000 for spec in specs)
    jobs = BoundedJobs(spark, specs[0].run_id)
    try:
        seconds = deadline_s(largest, broker_wait_s, waves(len(specs), produce_slots(spark)))
        rows = jobs.run(tasks.collect, seconds, f"the replication of {len(specs)} partition(s)")
    except JobTimedOut:
        raise
    except Exception as exc:
        raise RunFailed(
            f"replication task failed: {task_failure_reason(str(exc))}. Partitions whose transactions "
            "committed keep their progress in the control topic; a rerun resumes from there"
        ) from None
    return sorted((PartitionReplication(**row) for row in rows), key=lambda p: (p.topic, p.partition))


_KNOWN_ERRORS = (
    "ProducerFenced",
    "FatalTransactionError",
    "TransactionAbortable",
    "IncompleteRead",
    "ReplicationError",
    "SimulatedCrash",
    "ConfigError",
    "RunFailed",
)
_ERROR_LINE = re.compile(r"(?:[\w.]+\.)?(" + "|".join(_KNOWN_ERRORS) + r"): (.+)")


def task_failure_reason(text: str) -> str:
    """The task's own error line out of a Spark failure text (tracebacks stay in the Spark logs)."""
    if "Python worker exited unexpectedly" in text:
        return "a task's Python worker died before finishing (crashed or killed)"
    found = [m for m in (_ERROR_LINE.search(line) for line in text.splitlines()) if m]
    if found:
        last = found[-1]
        return redact_text(f"{last.group(1)}: {last.group(2).strip()}")
    return redact_text(text.strip().splitlines()[0][:500] if text.strip() else "unknown error")
