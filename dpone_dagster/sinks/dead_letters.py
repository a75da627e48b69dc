"""The dead-letter topic: bad input records the engine routed there (engine/bad_records.py,
`on_error: dead_letter`), produced with the run's output.

Dead letters carry the ORIGINAL key, value and headers plus error headers. They are collected
while the batch is staged and shaped, and published only once every pre-publish gate has passed,
just before the sink messages (so a run stopped by a gate leaves the dead-letter topic untouched).
They are published once per source record across reruns: before publishing, the dead-letter topic
is read from the time of the oldest bad record on, and letters an earlier attempt of this pipeline
already published for the same source offsets are not produced again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, TopicPartition
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.admin import ensure_sink_topic
from dpone_dagster.kafka.config import producer_config
from dpone_dagster.kafka.inspect import make_consumer, topic_partitions, verified_watermarks
from dpone_dagster.manifest.models import KafkaSource, Manifest, TopicCreation
from dpone_dagster.sinks.kafka import ProducerSettings, produce
from dpone_dagster.sinks.kafka_messages import message_size

HEADER_TYPE = "array<struct<key:string,value:binary>>"
H_PIPELINE = "dpone.error.pipeline"
H_TOPIC = "dpone.error.source.topic"
H_PARTITION = "dpone.error.source.partition"
H_OFFSET = "dpone.error.source.offset"
H_VALUE_OMITTED = "dpone.error.value_omitted"
# Letters are looked for from the oldest bad record's timestamp on, less this allowance for clocks
# of source producers running ahead of the clock that stamped the letters.
CLOCK_SKEW_MS = 15 * 60 * 1000
SCAN_TIMEOUT_S = 60.0


@dataclass
class DeadLetters:
    """Bad records of one run routed to the dead-letter topic, held until the run publishes."""

    manifest: Manifest
    raw: DataFrame | None
    sink_config: dict[str, Any]
    pending: list[DataFrame] = field(default_factory=list)
    count: int = 0

    def add(self, bad: DataFrame, count: int) -> None:
        self.pending.append(bad.select("partition", "offset", "reason"))
        self.count += count

    def publish(self, result: RunResult) -> None:
        """Produce the collected letters (those no earlier attempt published); raises on failure."""
        if not self.pending:
            return
        source = self.manifest.source
        assert isinstance(source, KafkaSource) and source.options.dead_letter is not None and self.raw is not None
        options = source.options.dead_letter
        ensure_sink_topic(self.sink_config, options.topic, TopicCreation(enabled=options.create, partitions=options.partitions))
        bad = self.pending[0]
        for frame in self.pending[1:]:
            bad = bad.unionByName(frame)
        rows = self.raw.join(bad, on=["partition", "offset"])
        oldest = rows.agg(F.min("timestamp")).first()[0]
        published = _published_letters(
            self.sink_config, options.topic, self.manifest.name, source.topic or "", (oldest or 0) - CLOCK_SKEW_MS
        )
        if published:
            done = rows.sparkSession.createDataFrame(sorted(published), "partition int, offset long")
            rows = rows.join(done, on=["partition", "offset"], how="left_anti")
        todo = self.count - _overlap(bad, published)
        delivery = self.manifest.sink.options.delivery
        config = producer_config(self.sink_config, delivery)
        letters = _fit_letters(
            rows.select(
                F.col("key"),
                F.col("value"),
                F.concat(F.coalesce(F.col("headers"), F.array().cast(HEADER_TYPE)), _error_headers(self.manifest, result)).alias(
                    "headers"
                ),
                F.lit(-1).cast("int").alias("partition"),
            ),
            int(config.get("message.max.bytes", 1_000_000)),
        )
        stats = produce(letters, ProducerSettings(options.topic, tuple(config.items()), delivery.flush_timeout_s), todo)
        if not stats.ok or stats.delivered != todo:
            raise RunFailed(
                f"dead-lettering {todo} record(s) to '{options.topic}' failed ({stats.delivered} acknowledged; "
                f"{'; '.join(stats.errors)}); nothing was produced to the sink and no state advanced"
            )
        if todo < self.count:
            result.notes.append(
                f"{self.count - todo} dead letter(s) were already in '{options.topic}' from an earlier attempt; "
                "not produced again"
            )


def _fit_letters(letters: DataFrame, limit: int) -> DataFrame:
    """A letter over message.max.bytes (a record that was bad for being too large, say) keeps its
    key, headers and source coordinates, and carries an empty value with the header
    dpone.error.value_omitted (the original value's bytes): the record itself stays readable in
    the source topic at the offset the headers name. Without this it could never be dead-lettered."""
    size = message_size(F.col("key"), F.octet_length("value"), F.col("headers"))
    omitted = F.struct(F.lit(H_VALUE_OMITTED).alias("key"), F.octet_length("value").cast("string").cast("binary").alias("value"))
    too_large = size > F.lit(limit)
    return letters.select(
        "key",
        F.when(too_large, F.lit(b"")).otherwise(F.col("value")).alias("value"),
        F.when(too_large, F.concat(F.col("headers"), F.array(omitted))).otherwise(F.col("headers")).alias("headers"),
        "partition",
    )


def _error_headers(manifest: Manifest, result: RunResult) -> Any:
    def header(name: str, value: Any) -> Any:
        return F.struct(F.lit(name).alias("key"), value.cast("string").cast("binary").alias("value"))

    return F.array(
        header("dpone.error.reason", F.col("reason")),
        header(H_TOPIC, F.col("topic")),
        header(H_PARTITION, F.col("partition")),
        header(H_OFFSET, F.col("offset")),
        header(H_PIPELINE, F.lit(manifest.name)),
        header("dpone.error.run_id", F.lit(result.run_id)),
    )


def _overlap(bad: DataFrame, published: set[tuple[int, int]]) -> int:
    if not published:
        return 0
    done = bad.sparkSession.createDataFrame(sorted(published), "partition int, offset long")
    return bad.join(done, on=["partition", "offset"], how="left_semi").count()


def _published_letters(
    client_config: dict[str, Any], topic: str, pipeline: str, source_topic: str, since_ms: int
) -> set[tuple[int, int]]:
    """(source partition, source offset) of the letters `pipeline` published to `topic` for
    `source_topic` from `since_ms` on, read from the dead-letter topic itself."""
    consumer = make_consumer(client_config, f"dpone-dead-letters-{pipeline}")
    found: set[tuple[int, int]] = set()
    try:
        partitions = topic_partitions(consumer, topic)
        ends = {p: wm.high for p, wm in verified_watermarks(consumer, topic, partitions).items()}
        starts = consumer.offsets_for_times([TopicPartition(topic, p, max(0, since_ms)) for p in partitions], timeout=30)
        ranges = {s.partition: (s.offset, ends[s.partition]) for s in starts if 0 <= s.offset < ends[s.partition]}
        if not ranges:
            return found
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in ranges.items()])
        pending, deadline = set(ranges), time.monotonic() + SCAN_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                p, err = message.partition(), message.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RunFailed(f"reading dead-letter topic '{topic}'[{p}] failed: {err}")
                    pending.discard(p)
                    continue
                headers = {k: v for k, v in (message.headers() or [])}
                if headers.get(H_PIPELINE) == pipeline.encode() and headers.get(H_TOPIC) == source_topic.encode():
                    found.add((int(headers[H_PARTITION]), int(headers[H_OFFSET])))
                if message.offset() >= ranges[p][1] - 1:
                    pending.discard(p)
        if pending:
            raise RunFailed(
                f"could not read dead-letter topic '{topic}' partitions {sorted(pending)} within {SCAN_TIMEOUT_S}s "
                "to find letters of an earlier attempt; check broker health and retry"
            )
    finally:
        consumer.close()
    return found
