"""Stage 6, load: the run's output leaves the process — dead letters first, then the sink's
messages from Spark tasks (sinks: the Kafka producer), each delivery report checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.commit import reconciles
from dpone_dagster.engine.stages.timing import Log, stage
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.admin import ensure_sink_topic
from dpone_dagster.kafka.config import producer_config
from dpone_dagster.kafka.delivery import DeliveryStats
from dpone_dagster.kafka.errors import classify_text
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.quality.target import KafkaTargets
from dpone_dagster.sinks import kafka_messages
from dpone_dagster.sinks.dead_letters import DeadLetters
from dpone_dagster.sinks.kafka import ProducerSettings, produce


def prepare_sink(manifest: Manifest, sink_config: dict) -> tuple[KafkaTargets, dict[Any, int]] | None:
    """Check (or create) the sink topic; when a check reconciles against the target, the target
    and where its partitions end before this run writes."""
    ensure_sink_topic(sink_config, manifest.sink.topic, manifest.sink.options.create_topic)
    if not reconciles(manifest):
        return None
    target = KafkaTargets(sink_config, [manifest.sink.topic])
    return target, target.ends()


def publish_dead_letters(letters: DeadLetters | None, result: RunResult, log: Log) -> None:
    if letters is None or not letters.count:
        return
    with stage(result, "dead_letters", log):
        letters.publish(result)


@dataclass(frozen=True)
class Delivered:
    """What the load stage hands to reconciliation: the delivery reports and how many messages
    they must account for."""

    stats: DeliveryStats
    expected: int


class Judged:
    """A batch judged without producing (a checks-only run, or a batch with nothing in it): every
    gate ran, nothing was sent."""


JUDGED = Judged()


def load(manifest: Manifest, messages: DataFrame, records: int, sink_config: dict, result: RunResult) -> DeliveryStats:
    """Produce the `records` messages; any message not delivered fails the run (no state has moved)."""
    stats = produce(messages, producer_settings(manifest, sink_config), records)
    check_delivery(manifest, stats, result)
    return stats


def producer_settings(manifest: Manifest, sink_config: dict) -> ProducerSettings:
    delivery = manifest.sink.options.delivery
    return ProducerSettings(
        topic=manifest.sink.topic,
        config=tuple(producer_config(sink_config, delivery).items()),
        flush_timeout_s=delivery.flush_timeout_s,
        headers_or_partitions=kafka_messages.has_headers(manifest.sink),
    )


def check_delivery(manifest: Manifest, stats: DeliveryStats, result: RunResult) -> None:
    """Record the delivery reports in the result; any message not delivered fails the run."""
    result.messages_produced = stats.delivered
    result.tombstones = stats.tombstones
    result.bytes_produced = stats.bytes
    result.sink_partitions = [p.__dict__ for p in stats.partitions]
    result.executors = list(stats.executors)
    if not stats.ok:
        classified = classify_text(" ".join(stats.errors))
        raise RunFailed(
            f"{stats.failed} message(s) to '{manifest.sink.topic}' were not delivered: "
            + classified.message("; ".join(stats.errors))
            + "; no state was advanced, a rerun re-produces the batch"
        )
