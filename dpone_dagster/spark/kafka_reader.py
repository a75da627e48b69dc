"""Read planned Kafka offset ranges on Spark executors.

The driver fixes the ranges; each Spark task reads one slice with a confluent-kafka consumer
(`assign`, never `subscribe`) and yields Arrow batches of raw records. Nothing in the task uses
driver-local state: everything it needs travels in the pickled closure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from dpone_dagster.kafka.boundary import ReadTask

RAW_COLUMNS = "topic string, partition int, offset long, timestamp long, key binary, value binary, headers array<struct<key:string,value:binary>>"

_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)

INCOMPLETE_READ = "DPONE_INCOMPLETE_READ"


@dataclass(frozen=True)
class ReaderSettings:
    client_config: dict[str, Any]
    group_id: str
    batch_size: int = 50_000
    poll_timeout_ms: int = 1_000
    max_empty_polls: int = 3
    arrow_batch_rows: int = 20_000
    consumer_overrides: tuple[tuple[str, Any], ...] = ()


def read_ranges(spark: SparkSession, tasks: list[ReadTask], settings: ReaderSettings) -> DataFrame:
    """A DataFrame of raw records for every task; one Spark partition per task."""
    if not tasks:
        return spark.createDataFrame([], RAW_COLUMNS)
    specs = [(t.topic, t.partition, t.start, t.end) for t in tasks]

    def read_tasks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for task_id in batch.column(0).to_pylist():
                yield from _read_one_range(settings, *specs[task_id])

    return spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(read_tasks, RAW_COLUMNS)


def _consumer_config(settings: ReaderSettings) -> dict[str, Any]:
    return {
        **settings.client_config,
        "group.id": settings.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "allow.auto.create.topics": False,
        # Offsets were planned from the log's current range; an out-of-range start is an error,
        # never a silent jump.
        "auto.offset.reset": "error",
        "isolation.level": "read_committed",
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 10_485_760,
        "queued.max.messages.kbytes": 262_144,
        **dict(settings.consumer_overrides),
    }


def _read_one_range(settings: ReaderSettings, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Yield records with start <= offset < end. Fails unless the position reaches `end`.

    Offsets may have gaps (compaction, transaction markers), so completion is judged by the
    consumer position, never by a record count or by a number of empty polls.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(_consumer_config(settings))
    tp = TopicPartition(topic, partition, start)
    consumer.assign([tp])
    columns: dict[str, list[Any]] = {name: [] for name in _ARROW_SCHEMA.names}
    position = start
    empty_polls = 0
    timeout_s = settings.poll_timeout_ms / 1000
    try:
        while position < end:
            # Ask for no more than the range still holds, so the last call returns at once.
            wanted = max(1, min(settings.batch_size, end - position))
            messages = consumer.consume(num_messages=wanted, timeout=timeout_s)
            progressed = False
            for message in messages:
                err = message.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"{topic}[{partition}] fetch error at offset {position}: {err}")
                offset = message.offset()
                if offset >= end:
                    position = end
                    break
                _append(columns, message)
                position = offset + 1
                progressed = True
            if position < end:
                # Transaction markers and compacted gaps advance the position without records.
                current = consumer.position([TopicPartition(topic, partition)])[0].offset
                if current > position:
                    position = current
                    progressed = True
            if len(columns["offset"]) >= settings.arrow_batch_rows:
                yield _to_batch(columns)
                columns = {name: [] for name in _ARROW_SCHEMA.names}
            empty_polls = 0 if progressed else empty_polls + 1
            if empty_polls >= settings.max_empty_polls and position < end:
                raise RuntimeError(
                    f"{INCOMPLETE_READ}: {topic}[{partition}] stopped at offset {position}, planned end {end} "
                    f"({settings.max_empty_polls} polls of {settings.poll_timeout_ms} ms without progress)"
                )
        if columns["offset"]:
            yield _to_batch(columns)
    finally:
        consumer.close()


def _append(columns: dict[str, list[Any]], message: Any) -> None:
    columns["topic"].append(message.topic())
    columns["partition"].append(message.partition())
    columns["offset"].append(message.offset())
    columns["timestamp"].append(message.timestamp()[1])
    columns["key"].append(message.key())
    columns["value"].append(message.value())
    headers = message.headers()
    columns["headers"].append([{"key": k, "value": v} for k, v in headers] if headers else None)


def _to_batch(columns: dict[str, list[Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(columns, schema=_ARROW_SCHEMA)
