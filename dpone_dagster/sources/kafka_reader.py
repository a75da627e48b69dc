"""Read planned Kafka offset ranges on Spark executors.

The driver fixes the ranges; a Spark task reads its slices (one, or in local mode its share of
them, `spark/slots.py`) one after another with a confluent-kafka consumer (`assign`, never
`subscribe`) and yields Arrow batches of raw records. Nothing in the task uses
driver-local state: everything it needs travels in the pickled closure.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dpone_dagster import columns as C
from dpone_dagster.kafka.boundary import ReadTask, pack_tasks
from dpone_dagster.kafka.config import range_reader_config
from dpone_dagster.spark import arrow_json
from dpone_dagster.spark.session import iso_times
from dpone_dagster.spark.slots import local_task_slots

RAW_SCHEMA = T.StructType(
    [
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.LongType()),
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("headers", T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))),
    ]
)

RAW_ARROW_SCHEMA = pa.schema(
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


JSON_OK = C.JSON_OK  # the record's value was decoded in the read task
json_column = C.json_column


@dataclass(frozen=True)
class ReaderSettings:
    client_config: dict[str, Any]
    group_id: str
    batch_size: int = 50_000
    poll_timeout_ms: int = 1_000
    max_empty_polls: int = 3
    arrow_batch_rows: int = 20_000
    consumer_overrides: tuple[tuple[str, Any], ...] = ()


def read_ranges(spark: SparkSession, tasks: list[ReadTask], settings: ReaderSettings, json_schema: T.StructType | None = None) -> DataFrame:
    """A DataFrame of raw records for every task; one Spark partition per task (in local mode per
    task slot, `pack_tasks`).

    With `json_schema` (flat JSON values, types `arrow_json` supports) the tasks also decode the
    values: columns `json_column(i)` per schema field and `JSON_OK` (false where the batch is left
    to the JVM decoder). A decoded record's value is not sent to the JVM again: it arrives empty
    (a tombstone stays null)."""
    return raw_records(read_records(spark, tasks, settings, json_schema), tasks)


def read_records(spark: SparkSession, tasks: list[ReadTask], settings: ReaderSettings, json_schema: T.StructType | None = None) -> DataFrame:
    """What the read tasks yield: the frame of `read_ranges` without its topic column when every
    task reads one topic (`raw_records` adds it). Keeping this frame keeps the batch as the
    tasks handed it over."""
    if not tasks:
        return spark.createDataFrame([], RAW_SCHEMA)
    specs = [(t.topic, t.partition, t.start, t.end) for t in tasks]
    output, decode_schema = RAW_SCHEMA, None
    if json_schema is not None:
        decode_schema = arrow_json.arrow_schema(json_schema, iso_times(spark))
        if decode_schema is not None:
            decoded = [T.StructField(json_column(i), f.dataType, True) for i, f in enumerate(json_schema.fields)]
            output = T.StructType([*RAW_SCHEMA.fields, *decoded, T.StructField(JSON_OK, T.BooleanType(), False)])
    # One topic (the usual read) is added on Spark's side instead of travelling with every record.
    topic = _single_topic(tasks)
    if topic is not None:
        output = T.StructType(output.fields[1:])

    # One Spark task per slice, or per task slot in local mode (slices read one after another).
    groups = [[specs[i] for i in group] for group in pack_tasks(tasks, local_task_slots(spark))]

    def read_tasks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for group in batch.column(0).to_pylist():
                for spec in groups[group]:
                    for raw in read_one_range(settings, *spec):
                        records = raw if decode_schema is None else _with_decoded(raw, decode_schema)
                        yield records.drop_columns(["topic"]) if topic is not None else records

    return spark.range(0, len(groups), 1, len(groups)).mapInArrow(read_tasks, output)


def raw_records(records: DataFrame, tasks: list[ReadTask]) -> DataFrame:
    """The frame of `read_ranges` from that of `read_records` (or a kept copy of it)."""
    topic = _single_topic(tasks)
    return records.select(F.lit(topic).alias("topic"), "*") if topic is not None else records


def _single_topic(tasks: list[ReadTask]) -> str | None:
    topics = {t.topic for t in tasks}
    return topics.pop() if len(topics) == 1 else None


reads_decoded = C.reads_decoded


def _with_decoded(raw: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    values = raw.column(5)
    decoded = arrow_json.decode_values(values, schema)
    ok = decoded is not None
    columns = decoded if decoded is not None else [pa.nulls(raw.num_rows, f.type) for f in schema]
    names = [*raw.schema.names, *[json_column(i) for i in range(len(schema))], JSON_OK]
    flags = pa.array([ok] * raw.num_rows, pa.bool_())
    # Half the bytes a read task hands to the JVM are values; decoded ones are not needed there.
    raw_columns = [*raw.columns[:5], _emptied(values), *raw.columns[6:]] if ok else raw.columns
    return pa.RecordBatch.from_arrays([*raw_columns, *columns, flags], names=names)


def _emptied(values: pa.Array) -> pa.Array:
    """`values` with every non-null value empty (nulls — tombstones — kept)."""
    validity = values.buffers()[0]
    offsets = pa.py_buffer(bytes(4 * (values.offset + len(values) + 1)))
    return pa.Array.from_buffers(pa.binary(), len(values), [validity, offsets, pa.py_buffer(b"")], values.null_count, values.offset)


def _consumer_config(settings: ReaderSettings) -> dict[str, Any]:
    return range_reader_config(settings.client_config, settings.group_id, 262_144, dict(settings.consumer_overrides))


def read_one_range(settings: ReaderSettings, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Yield records with start <= offset < end. Fails unless the position reaches `end`.

    Offsets may have gaps (compaction, transaction markers), so completion is judged by the
    consumer position, never by a record count or by a number of empty polls. Offsets rise
    within a partition, so the end is checked once per consumed batch.
    """
    from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

    consumer = Consumer(_consumer_config(settings))
    consumer.assign([TopicPartition(topic, partition, start)])
    pending: list[Any] = []  # consumed records not yet in an Arrow batch
    position = start
    empty_polls = 0
    timeout_s = settings.poll_timeout_ms / 1000
    try:
        while position < end:
            # Ask for no more than the range still holds, so the last call returns at once.
            wanted = max(1, min(settings.batch_size, end - position))
            messages = consumer.consume(num_messages=wanted, timeout=timeout_s)
            progressed = False
            if any(map(Message.error, messages)):  # an error is truthy, None is not
                for m in messages:
                    err = m.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"{topic}[{partition}] fetch error at offset {position}: {err}")
                messages = [m for m in messages if m.error() is None]
            if messages:
                if messages[-1].offset() >= end:
                    messages = messages[: bisect.bisect_left(messages, end, key=Message.offset)]
                    position = end
                if messages:
                    pending.extend(messages)
                    position = max(position, messages[-1].offset() + 1)
                    progressed = True
            if position < end:
                # Transaction markers and compacted gaps advance the position without records.
                current = consumer.position([TopicPartition(topic, partition)])[0].offset
                if current > position:
                    position = current
                    progressed = True
            if len(pending) >= settings.arrow_batch_rows:
                yield _to_batch(pending, topic, partition)
                pending = []
            empty_polls = 0 if progressed else empty_polls + 1
            if empty_polls >= settings.max_empty_polls and position < end:
                raise RuntimeError(
                    f"{INCOMPLETE_READ}: {topic}[{partition}] stopped at offset {position}, planned end {end} "
                    f"({settings.max_empty_polls} polls of {settings.poll_timeout_ms} ms without progress)"
                )
        if pending:
            yield _to_batch(pending, topic, partition)
    finally:
        consumer.close()


def _to_batch(messages: list[Any], topic: str, partition: int) -> pa.RecordBatch:
    """Column by column: topic and partition are constant in a task. The accessors are mapped as
    unbound methods (no bound-method object per call: ~40% of this function's time)."""
    from confluent_kafka import Message

    n = len(messages)
    headers = list(map(Message.headers, messages))
    if any(headers):
        header_values: list[Any] = [[{"key": k, "value": v} for k, v in h] if h else None for h in headers]
        header_array = pa.array(header_values, RAW_ARROW_SCHEMA.field("headers").type)
    else:
        header_array = pa.nulls(n, RAW_ARROW_SCHEMA.field("headers").type)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(list(map(Message.offset, messages)), pa.int64()),
            pa.array([timestamp for _, timestamp in map(Message.timestamp, messages)], pa.int64()),
            pa.array(list(map(Message.key, messages)), pa.binary()),
            pa.array(list(map(Message.value, messages)), pa.binary()),
            header_array,
        ],
        schema=RAW_ARROW_SCHEMA,
    )
