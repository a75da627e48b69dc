"""The Kafka sink: produce shaped messages from Spark tasks, bring back only delivery statistics.

Each task owns one confluent-kafka producer, checks every delivery report, handles a full local
queue (BufferError) by serving callbacks and retrying, and flushes before it reports. The driver
sums the reports; the batch itself is never collected.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dpone_dagster.kafka.delivery import STATS_COLUMNS, UNASSIGNED, DeliveryStats, aggregate
from dpone_dagster.spark.jobs import BoundedJobs, deadline_s
from dpone_dagster.spark.slots import local_task_slots

HEADERS_TYPE = "array<struct<key:string,value:binary>>"


@dataclass(frozen=True)
class ProducerSettings:
    topic: str
    config: tuple[tuple[str, Any], ...]
    flush_timeout_s: float = 120.0
    # False when no message has headers or an explicit partition: only keys and values are
    # handed to the tasks (the two other columns cost the JVM's Arrow writer per row).
    headers_or_partitions: bool = True
    # Epoch seconds after which a task sends nothing more (its job's bound, spark/jobs.py): a task
    # the driver gave up on (a lost executor, a Connect operation its client left) cannot publish
    # after a rerun has moved on. None: no such bound.
    deadline_epoch_s: float | None = None

    def bounded(self, seconds: float) -> ProducerSettings:
        """These settings for a job the driver waits for at most `seconds` from now: the tasks stop a
        little earlier, so their own error, not the driver's time-out, names the cause."""
        return replace(self, deadline_epoch_s=time.time() + seconds - min(5.0, seconds / 10))


def produce(messages: DataFrame, settings: ProducerSettings, records: int) -> DeliveryStats:
    """Produce every message to `settings.topic`, one confluent-kafka producer per Spark task; the
    driver waits at most the bound of a job of `records` messages (spark/jobs.py)."""

    seconds = deadline_s(records, settings.flush_timeout_s)
    bounded = settings.bounded(seconds)

    def produce_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from produce_batches(bounded, batches)

    if settings.headers_or_partitions:
        # Null header lists cost the JVM → Arrow transfer ~6x more than empty ones (measured).
        headers = F.coalesce(F.col("headers"), F.array().cast(HEADERS_TYPE)).alias("headers")
        handed = messages.select("key", "value", headers, "partition")
    else:
        handed = messages.select("key", "value")
    slots = local_task_slots(messages.sparkSession)
    if slots is not None:
        handed = handed.coalesce(slots)  # one producer per task slot: one start, one flush wait each
    stats = handed.mapInArrow(produce_task, STATS_COLUMNS)
    jobs = BoundedJobs(messages.sparkSession, f"produce-{uuid.uuid4().hex}")
    rows = jobs.run(stats.collect, seconds, f"the produce of {records} message(s) to '{settings.topic}'")
    return aggregate(row.asDict() for row in rows)


class KafkaSink:
    """The Kafka sink as the engine sees it (sinks.base.Sink)."""

    def produce(self, messages: DataFrame, settings: ProducerSettings, records: int) -> DeliveryStats:
        return produce(messages, settings, records)


class _TaskReport:
    """Delivery callback state of one task: what reconciliation needs, per partition."""

    def __init__(self) -> None:
        self.delivered: dict[int, list[int]] = {}  # partition -> [count, min_offset, max_offset]
        self.failed = 0
        self.tombstones = 0
        self.bytes = 0
        self.first_error: str | None = None

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = f"{msg.topic()}: {err.str()} (code {err.name()})"
            return
        offset = msg.offset()
        acc = self.delivered.get(msg.partition())
        if acc is None:
            self.delivered[msg.partition()] = [1, offset, offset]
        else:
            acc[0] += 1
            if offset < acc[1]:
                acc[1] = offset
            elif offset > acc[2]:
                acc[2] = offset

    def rows(self, executor: str) -> pa.RecordBatch:
        rows = [
            (p, acc[0], 0, 0, 0, acc[1], acc[2], None) for p, acc in sorted(self.delivered.items())
        ]
        rows.append((UNASSIGNED, 0, self.failed, self.tombstones, self.bytes, -1, -1, self.first_error))
        names = ["partition", "delivered", "failed", "tombstones", "bytes", "min_offset", "max_offset", "first_error"]
        data = {name: [r[i] for r in rows] for i, name in enumerate(names)}
        data["executor"] = [executor] * len(rows)
        return pa.RecordBatch.from_pydict(
            data,
            schema=pa.schema(
                [
                    ("partition", pa.int32()),
                    ("delivered", pa.int64()),
                    ("failed", pa.int64()),
                    ("tombstones", pa.int64()),
                    ("bytes", pa.int64()),
                    ("min_offset", pa.int64()),
                    ("max_offset", pa.int64()),
                    ("first_error", pa.string()),
                    ("executor", pa.string()),
                ]
            ),
        )


def _executor_id() -> str:
    """Which executor ran the task (from the environment each cluster manager gives executors)."""
    from dpone_dagster.spark.cluster import executor_id

    return executor_id()


def produce_batches(settings: ProducerSettings, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Produce every row; bytes and tombstones are counted per Arrow batch (a run with any failed
    delivery fails, so produced equals delivered when the counts are used)."""
    from confluent_kafka import Producer

    producer = Producer(_bounded_config(settings))
    report = _TaskReport()
    topic, on_delivery, produce = settings.topic, report.on_delivery, producer.produce
    for batch in batches:
        _check_deadline(producer, settings)
        key_column, value_column = batch.column("key"), batch.column("value")
        report.bytes += _total_length(key_column) + _total_length(value_column)
        report.tombstones += value_column.null_count
        plain = batch.num_columns == 2 or (_all_empty(batch.column("headers")) and _all_unassigned(batch.column("partition")))
        rows = zip(key_column.to_pylist(), value_column.to_pylist(), strict=True)
        if plain:
            for key, value in rows:
                try:  # the common case inline: one Python call per message
                    produce(topic, value, key, on_delivery=on_delivery)
                except BufferError:
                    _produce(producer, topic, key, value, on_delivery, settings)
        else:
            headers = _header_lists(batch.column("headers"))
            partitions = None if _all_unassigned(batch.column("partition")) else batch.column("partition").to_pylist()
            for i, (key, value) in enumerate(rows):
                extra: dict[str, Any] = {"headers": headers[i]}
                if partitions is not None and partitions[i] is not None and partitions[i] >= 0:
                    extra["partition"] = partitions[i]
                try:
                    produce(topic, value, key, on_delivery=on_delivery, **extra)
                except BufferError:
                    _produce(producer, topic, key, value, on_delivery, settings, **extra)
        producer.poll(0)
    flush_s = settings.flush_timeout_s
    if settings.deadline_epoch_s is not None:
        flush_s = max(0.0, min(flush_s, settings.deadline_epoch_s - time.time()))
    remaining = producer.flush(flush_s)
    if remaining:
        report.first_error = report.first_error or (
            f"{topic}: {remaining} message(s) not delivered within flush timeout {flush_s:.0f}s (delivery.flush_timeout_s)"
        )
        producer.purge()  # what is still queued is never sent, nor sent after this task ended
        producer.flush(1)  # serves the purged messages' reports: counted as failed
        report.failed += len(producer)  # any report still missing
    yield report.rows(_executor_id())


def _bounded_config(settings: ProducerSettings) -> dict[str, Any]:
    """The producer's settings; under a deadline librdkafka itself gives up on a message by then."""
    config = dict(settings.config)
    if settings.deadline_epoch_s is None:
        return config
    left_ms = max(1_000, int((settings.deadline_epoch_s - time.time()) * 1000))
    for name in ("message.timeout.ms", "delivery.timeout.ms"):
        if name in config:
            config[name] = min(int(config[name]) or left_ms, left_ms)
    if "message.timeout.ms" not in config and "delivery.timeout.ms" not in config:
        config["message.timeout.ms"] = min(300_000, left_ms)  # librdkafka's default, or less
    return config


def _check_deadline(producer: Any, settings: ProducerSettings) -> None:
    if settings.deadline_epoch_s is not None and time.time() > settings.deadline_epoch_s:
        producer.purge()
        raise RuntimeError(
            f"{settings.topic}: the task passed its bound (the driver no longer waits for it); it stopped "
            "producing and dropped what it had queued"
        )


def _produce(producer: Any, topic: str, key: Any, value: Any, on_delivery: Any, settings: ProducerSettings, **extra: Any) -> None:
    """Produce one message; on a full local queue serve delivery reports until there is room, for
    at most delivery.flush_timeout_s without a single report (the broker acknowledges nothing:
    raise, naming it) and never past the task's deadline."""
    give_up_s = settings.flush_timeout_s
    waited_since = None
    while True:
        try:
            producer.produce(topic, value, key, on_delivery=on_delivery, **extra)
            return
        except BufferError:
            _check_deadline(producer, settings)
            if producer.poll(0.05):
                waited_since = None
                continue
            now = time.monotonic()
            waited_since = waited_since or now
            if now - waited_since >= give_up_s:
                raise RuntimeError(
                    f"{topic}: the local producer queue stayed full for {give_up_s:.0f} s without a delivery report "
                    "(the broker acknowledges nothing); the task stopped producing (delivery.flush_timeout_s)"
                ) from None


def _total_length(column: pa.Array) -> int:
    return int(pc.sum(pc.binary_length(column)).as_py() or 0)


def _header_lists(headers: pa.Array) -> list[list[tuple[str, bytes | None]] | None]:
    """Each message's headers as (key, value) pairs, None where it has none; the keys and values
    are converted once for the whole batch, not header by header."""
    offsets = headers.offsets.to_numpy()
    flat = headers.values.slice(offsets[0], offsets[-1] - offsets[0])
    pairs = list(zip(flat.field("key").to_pylist(), flat.field("value").to_pylist(), strict=True))
    starts = (offsets - offsets[0]).tolist()
    return [pairs[starts[i] : starts[i + 1]] or None for i in range(len(headers))]


def _all_empty(headers: pa.Array) -> bool:
    return headers.null_count == len(headers) or (pc.max(pc.list_value_length(headers)).as_py() or 0) == 0


def _all_unassigned(partitions: pa.Array) -> bool:
    return partitions.null_count == len(partitions) or pc.max(partitions).as_py() < 0
