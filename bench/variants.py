"""Candidate faster versions of the engine's per-message Python loops, for measurement only.

Each function is a drop-in replacement with the same contract as the engine function it names
(`dpone_dagster.spark.kafka_reader._read_one_range`, `dpone_dagster.spark.kafka_writer._produce_task`)
and can be swapped in with `patched()` so that `run_pipeline` runs with it. Nothing here is used by
the engine; docs/performance.md says which of these are recommended and by how much they help.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dpone_dagster.spark.kafka_reader import _ARROW_SCHEMA, INCOMPLETE_READ, ReaderSettings, _consumer_config

# --------------------------------------------------------------------------- reader


def read_one_range_fast(settings: ReaderSettings, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Same contract as kafka_reader._read_one_range, fewer Python operations per record:

    - topic and partition are constant in a task: filled once per Arrow batch, not per record;
    - per-column list comprehensions over the consumed batch instead of 7 dict-lookup appends;
    - the `offset >= end` check is done once per consumed batch (offsets rise within a
      partition), cutting the batch with a bisect only on the last call;
    - errors are found with one comprehension; the EOF event is dropped there.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(_consumer_config(settings))
    consumer.assign([TopicPartition(topic, partition, start)])
    pending: list[Any] = []  # consumed messages not yet turned into an Arrow batch
    position = start
    empty_polls = 0
    timeout_s = settings.poll_timeout_ms / 1000
    eof = KafkaError._PARTITION_EOF
    try:
        while position < end:
            wanted = max(1, min(settings.batch_size, end - position))
            messages = consumer.consume(num_messages=wanted, timeout=timeout_s)
            progressed = False
            if messages:
                errors = [m for m in messages if m.error() is not None]
                if errors:
                    for m in errors:
                        if m.error().code() != eof:
                            raise RuntimeError(f"{topic}[{partition}] fetch error at offset {position}: {m.error()}")
                    messages = [m for m in messages if m.error() is None]
            if messages:
                if messages[-1].offset() >= end:
                    lo, hi = 0, len(messages)
                    while lo < hi:  # first message with offset >= end
                        mid = (lo + hi) // 2
                        if messages[mid].offset() < end:
                            lo = mid + 1
                        else:
                            hi = mid
                    messages = messages[:lo]
                    position = end
                if messages:
                    pending.extend(messages)
                    position = max(position, messages[-1].offset() + 1)
                    progressed = True
            if position < end:
                current = consumer.position([TopicPartition(topic, partition)])[0].offset
                if current > position:
                    position = current
                    progressed = True
            if len(pending) >= settings.arrow_batch_rows:
                yield _messages_to_batch(pending, topic, partition)
                pending = []
            empty_polls = 0 if progressed else empty_polls + 1
            if empty_polls >= settings.max_empty_polls and position < end:
                raise RuntimeError(
                    f"{INCOMPLETE_READ}: {topic}[{partition}] stopped at offset {position}, planned end {end} "
                    f"({settings.max_empty_polls} polls of {settings.poll_timeout_ms} ms without progress)"
                )
        if pending:
            yield _messages_to_batch(pending, topic, partition)
    finally:
        consumer.close()


def _messages_to_batch(messages: list[Any], topic: str, partition: int) -> pa.RecordBatch:
    n = len(messages)
    headers = [m.headers() for m in messages]
    if any(headers):
        header_values: list[Any] = [[{"key": k, "value": v} for k, v in h] if h else None for h in headers]
    else:
        header_values = [None] * n
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array([m.offset() for m in messages], pa.int64()),
            pa.array([m.timestamp()[1] for m in messages], pa.int64()),
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.array(header_values, _ARROW_SCHEMA.field("headers").type),
        ],
        schema=_ARROW_SCHEMA,
    )


# --------------------------------------------------------------------------- writer


def produce_task_fast(settings: Any, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Same contract as kafka_writer._produce_task (same stats rows), fewer Python operations:

    - positional produce() arguments, no kwargs dict per message; headers only when present;
    - bytes and tombstones counted per Arrow batch with pyarrow.compute, not in the callback;
    - the delivery callback keeps only what reconciliation needs (per partition: count, first and
      last offset; failures) and reads two fields of the message.
    Bytes/tombstones count produced messages; a run with any failed delivery fails anyway.
    """
    from confluent_kafka import Producer

    from dpone_dagster.spark.kafka_writer import _executor_id, _TaskReport

    producer = Producer(dict(settings.config))
    report = _TaskReport()
    delivered = report.delivered

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            report.failed += 1
            if report.first_error is None:
                report.first_error = f"{msg.topic()}: {err.str()} (code {err.name()})"
            return
        offset = msg.offset()
        acc = delivered.get(msg.partition())
        if acc is None:
            delivered[msg.partition()] = [1, offset, offset]
        else:
            acc[0] += 1
            if offset < acc[1]:
                acc[1] = offset
            elif offset > acc[2]:
                acc[2] = offset

    topic = settings.topic
    produce, poll = producer.produce, producer.poll
    for batch in batches:
        key_col, value_col = batch.column("key"), batch.column("value")
        report.bytes += int(pc.sum(pc.binary_length(value_col)).as_py() or 0) + int(pc.sum(pc.binary_length(key_col)).as_py() or 0)
        report.tombstones += value_col.null_count
        keys, values = key_col.to_pylist(), value_col.to_pylist()
        header_col, partition_col = batch.column("headers"), batch.column("partition")
        # No headers: every entry null or an empty list.
        plain_headers = (pc.max(pc.list_value_length(header_col)).as_py() or 0) == 0
        plain_partitions = partition_col.null_count == len(batch) or pc.max(partition_col).as_py() < 0
        if plain_headers and plain_partitions:
            for key, value in zip(keys, values, strict=True):
                try:
                    produce(topic, value, key, on_delivery=on_delivery)
                except BufferError:
                    while True:
                        poll(0.05)
                        try:
                            produce(topic, value, key, on_delivery=on_delivery)
                            break
                        except BufferError:
                            continue
        else:
            headers, partitions = header_col.to_pylist(), partition_col.to_pylist()
            for key, value, header, partition in zip(keys, values, headers, partitions, strict=True):
                kwargs: dict[str, Any] = {"on_delivery": on_delivery}
                if header:
                    kwargs["headers"] = [(h["key"], h["value"]) for h in header]
                if partition is not None and partition >= 0:
                    kwargs["partition"] = partition
                while True:
                    try:
                        produce(topic, value, key, **kwargs)
                        break
                    except BufferError:
                        poll(0.05)
        poll(0)
    remaining = producer.flush(settings.flush_timeout_s)
    if remaining:
        report.failed += remaining
        report.first_error = report.first_error or (
            f"{topic}: {remaining} message(s) not delivered within flush timeout {settings.flush_timeout_s}s"
        )
    yield report.rows(_executor_id())


# --------------------------------------------------------------------------- JVM -> Python transfer


EMPTY_HEADERS = "array<struct<key:string,value:binary>>"


def produce_with_empty_headers(messages: Any, settings: Any) -> Any:
    """kafka_writer.produce with null `headers` replaced by empty arrays before the JVM writes the
    Arrow batches for the Python producer tasks.

    Spark 4.3's BatchedPythonArrowInput checks the batch byte size after every row
    (ArrowWriter.sizeInBytes -> ListVector.setValueCount), and for a list column whose values are
    null, ListVector.setValueCount back-fills every null slot since the last non-null one: the
    cost grows with the rows already in the batch, i.e. quadratic per Arrow batch. A non-null
    (empty) list keeps it constant. The Python side treats [] like None (no headers)."""
    from pyspark.sql import functions as F

    from dpone_dagster.spark import kafka_writer

    fixed = messages.withColumn("headers", F.coalesce(F.col("headers"), F.array().cast(EMPTY_HEADERS)))
    return kafka_writer.produce(fixed, settings)


# --------------------------------------------------------------------------- swapping in


@contextmanager
def patched(reader: bool = False, writer: bool = False, arrow_batch_rows: int | None = None) -> Iterator[None]:
    """Run the engine with the variants above (the Spark tasks pickle the patched functions:
    `read_ranges` and `produce` look them up as module globals when their closures run)."""
    from dpone_dagster.spark import kafka_reader, kafka_writer

    saved = (kafka_reader._read_one_range, kafka_writer._produce_task, kafka_reader.ReaderSettings.__init__.__defaults__)
    try:
        if reader:
            kafka_reader._read_one_range = read_one_range_fast
        if writer:
            kafka_writer._produce_task = produce_task_fast
        if arrow_batch_rows is not None:
            defaults = list(kafka_reader.ReaderSettings.__init__.__defaults__ or ())
            # (batch_size, poll_timeout_ms, max_empty_polls, arrow_batch_rows, consumer_overrides)
            defaults[3] = arrow_batch_rows
            kafka_reader.ReaderSettings.__init__.__defaults__ = tuple(defaults)
        yield
    finally:
        kafka_reader._read_one_range, kafka_writer._produce_task, kafka_reader.ReaderSettings.__init__.__defaults__ = saved
