"""Executor side of exactly-once replication: copy one source partition range to the target in
producer transactions that also write the control-topic offset.

`replicate_range(spec)` runs inside a Spark task (or directly, in tests). It receives plain data
only, so it pickles to any executor, and follows librdkafka's transactional error handling
(INTRODUCTION.md, "Transactional producer API" / "Error handling"):

- retriable   (error.retriable())          -> call the same API again, bounded, with backoff
- abortable   (error.txn_requires_abort())  -> abort_transaction(), then redo the transaction from
                                               the last committed offset (its records were discarded)
- fenced      (PRODUCER_FENCED / _FENCED)   -> stop: a newer task owns this partition; never retry
- fatal       (error.fatal(), or anything else) -> stop: the producer instance is unusable

Sequence per partition: init_transactions (fences a zombie attempt with the same transactional.id
and, on Kafka, aborts its open transaction) -> read the committed offset (after the fence, so it is
final) -> per chunk: begin -> copy [start, chunk_end) -> control record offset=chunk_end -> commit.

Over 500 lines on purpose: one task's whole life (error classes, the transactional producer,
reading the range, the transaction loop) stays in the order it happens, because the exactly-once
argument rests on that order; the record building in the middle is pure and tested on its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.config import driver_client_config, range_reader_config
from dpone_dagster.kafka.errors import classify_kafka
from dpone_dagster.replication.control_topic import (
    READ_MARGIN_S,
    control_partition,
    offset_record,
    read_control_topic,
    target_conflict,
)
from dpone_dagster.replication.mapping import record_headers, target_partition, tracing_headers

ErrorClass = Literal["fenced", "fatal", "retriable", "abortable"]
CrashPoint = Literal["after_data", "before_commit"]
_FENCED_CODES = (KafkaError.PRODUCER_FENCED, KafkaError._FENCED)
_MAGIC_BYTE = 0
# Bytes a task may hold in librdkafka's queues, per client: the consumer's prefetch and the
# producer's unacknowledged records. 64 MB is ~280,000 records of 230 bytes (far more than are in
# flight at full speed) and 70 records of 900 KB, so memory does not grow with the record size.
QUEUE_KBYTES = 65_536
FIRST_BATCH = 16  # records in a task's first consume(), before their size is known
BATCH_BYTES = 8 * 1024 * 1024


class ReplicationError(RunFailed):
    """A replication task failed; its open transaction (if any) was aborted or is left to fencing."""


class ProducerFenced(ReplicationError):
    """Another producer with the same transactional.id took over this source partition."""


class FatalTransactionError(ReplicationError):
    """The transactional producer hit a fatal error and cannot be used any more."""


class IncompleteRead(ReplicationError):
    """The source partition could not be read up to the planned end offset."""


class TargetChanged(ReplicationError):
    """The committed offset belongs to another target topic (the topic mapping changed)."""


class TransactionAbortable(ReplicationError):
    """The current transaction failed but can be aborted and redone."""


class SimulatedCrash(BaseException):
    """Test hook: a task dying between produce and commit (BaseException: no handler aborts it)."""


def classify(error: KafkaError) -> ErrorClass:
    """librdkafka's error classes for the transactional API, fencing first.

    Fencing is checked by code: depending on where the broker reports it, librdkafka flags
    PRODUCER_FENCED as fatal or as abortable, but either way redoing the transaction is wrong.
    """
    if error.code() in _FENCED_CODES:
        return "fenced"
    if error.fatal():
        return "fatal"
    if error.retriable():
        return "retriable"
    if error.txn_requires_abort():
        return "abortable"
    return "fatal"


def _classified(kind: ErrorClass, action: str, transactional_id: str, error: KafkaError) -> ReplicationError:
    text = f"{action} ({transactional_id}): {error.str()} [{error.name()}]"
    if kind == "fenced":
        return ProducerFenced(
            f"{text}: a newer producer with the same transactional.id fenced this one (a retried or "
            "concurrent task of the same pipeline and partition); this attempt stops without committing"
        )
    if kind == "abortable":
        return TransactionAbortable(text)
    hint = classify_kafka(error.name(), error.retriable())
    fix = f"; fix: {hint.fix}" if hint.kind == "fail_fast" and hint.cause != "Kafka error" else ""
    return FatalTransactionError(f"{text}: fatal transactional producer error{fix}")


def _backoff(attempt: int) -> float:
    return min(10.0, 0.5 * 2 ** (attempt - 1))


# --------------------------------------------------------------------------- spec (plain data)


@dataclass(frozen=True)
class ReplicationSpec:
    """Everything one task needs, as picklable values (no driver objects, no loggers)."""

    pipeline: str
    run_id: str
    source_config: dict[str, Any]  # librdkafka client settings of the source cluster
    target_config: dict[str, Any]  # librdkafka client settings of the target cluster
    producer_config: dict[str, Any]  # full producer settings for the target (no transactional.id)
    source_topic: str
    source_partition: int
    planned_start: int  # used only when the control topic has nothing for this partition
    end: int
    target_topic: str
    commit_group: str
    control_topic: str
    control_partitions: int = 1
    partition_mapping: str = "keep"
    target_partitions: int = 1
    replicate_headers: bool = True
    keep_timestamps: bool = True
    tracing_headers: bool = False
    transaction_timeout_ms: int = 60_000
    # Records per transaction (None: the whole range in one) and seconds per transaction (None: no
    # limit); see ReplicationOptions for the trade-off.
    records_per_transaction: int | None = None
    seconds_per_transaction: float | None = None
    schema_id_map: dict[int, int] | None = None  # source value schema id -> target id
    consumer_overrides: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 10_000
    poll_timeout_ms: int = 1_000
    max_empty_polls: int = 3
    max_attempts: int = 5
    init_timeout_s: float = 60.0
    # Test hook: die after producing, before commit_transaction ("exit": os._exit(1) like a killed
    # executor; "raise": SimulatedCrash, for direct calls outside Spark).
    crash: CrashPoint | None = None
    crash_mode: Literal["exit", "raise"] = "exit"

    @property
    def transactional_id(self) -> str:
        # Stable per commit group and source partition, the key its offsets are committed under: a
        # retried or zombie task reuses it and is fenced, and so is any other pipeline committing
        # the same offsets (a rename, a blue/green switch sharing the commit group). ':' never
        # occurs in a topic name (nor in a commit group, manifest rule), so no two keys share an id.
        return f"dpone:{self.commit_group}:{self.source_topic}:{self.source_partition}"

    def legacy_transactional_id(self, pipeline: str) -> str:
        """The id earlier versions gave `pipeline`'s task of this partition."""
        return f"dpone-{pipeline}-{self.source_topic}-{self.source_partition}"


# --------------------------------------------------------------------------- transactional producer


class TransactionalProducer:
    """A confluent-kafka transactional producer with librdkafka's error classes applied."""

    def __init__(self, producer_config: dict[str, Any], transactional_id: str, transaction_timeout_ms: int,
                 max_attempts: int = 5):
        self.transactional_id = transactional_id
        self.max_attempts = max_attempts
        config = {
            **producer_config,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": transaction_timeout_ms,
            # Delivery reports only for failures: a failed record already makes commit_transaction
            # fail (abortable), the report only names it; a Python callback per record costs ~1 µs.
            "on_delivery": self._on_delivery,
            "delivery.report.only.error": True,
        }
        self._producer = Producer(driver_client_config(config))
        self.first_delivery_error: str | None = None

    def _retrying(self, action: str, call: Any) -> Any:
        for attempt in range(1, self.max_attempts + 1):
            try:
                return call()
            except KafkaException as exc:
                error = exc.args[0]
                kind = classify(error)
                if kind == "retriable" and attempt < self.max_attempts:
                    time.sleep(_backoff(attempt))
                    continue
                if kind == "retriable":
                    # Out of retries: the outcome is unknown; the next attempt's init_transactions settles it.
                    kind = "fatal"
                raise _classified(kind, action, self.transactional_id, error) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def init(self, timeout_s: float = 60.0) -> None:
        self._retrying("init_transactions", lambda: self._producer.init_transactions(timeout_s))

    def begin(self) -> None:
        self.first_delivery_error = None
        self._retrying("begin_transaction", self._producer.begin_transaction)

    def produce(self, topic: str, **kwargs: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, **kwargs)
                return
            except BufferError:
                # Local queue full: serve delivery reports until there is room again.
                self._producer.poll(0.005)
            except KafkaException as exc:
                error = exc.args[0]
                kind = classify(error)
                # A produce call is never retried on its own: the transaction is redone instead.
                raise _classified("abortable" if kind == "retriable" else kind, "produce", self.transactional_id, error) from None

    def poll(self, timeout_s: float = 0) -> None:
        self._producer.poll(timeout_s)

    def produce_batch(self, topic: str, partition: int, messages: list[Any], headers: bool, timestamps: bool) -> int:
        """Copy consumed messages as they are (key, value, and optionally headers and timestamp)
        to `partition` (-1: the partitioner decides); returns the key + value bytes. The hot loop of
        a replication: one C call per record and nothing else that scales with the records."""
        produce, nbytes = self._producer.produce, 0
        try:
            for message in messages:
                key, value = message.key(), message.value()
                timestamp = 0  # librdkafka's "now", as for a record without one
                if timestamps:
                    kind, ts = message.timestamp()
                    if kind != TIMESTAMP_NOT_AVAILABLE and ts >= 0:
                        timestamp = ts
                while True:
                    try:
                        produce(topic, value, key, partition, timestamp=timestamp,
                                headers=message.headers() if headers else None)
                        break
                    except BufferError:
                        # Local queue full: wait for the broker's acks (only errors are reported,
                        # so a poll returns after its timeout, not at the first ack).
                        self._producer.poll(0.005)
                nbytes += (len(key) if key else 0) + (len(value) if value else 0)
        except KafkaException as exc:
            error = exc.args[0]
            kind = classify(error)
            raise _classified("abortable" if kind == "retriable" else kind, "produce", self.transactional_id, error) from None
        return nbytes

    def flush(self, timeout_s: float = 60.0) -> int:
        return self._producer.flush(timeout_s)

    def commit(self) -> None:
        # No timeout argument: librdkafka then uses the remaining transaction time (its advice).
        try:
            self._retrying("commit_transaction", self._producer.commit_transaction)
        except TransactionAbortable as exc:
            if self.first_delivery_error:
                raise TransactionAbortable(f"{exc}; first delivery error: {self.first_delivery_error}") from None
            raise

    def abort(self) -> None:
        try:
            self._retrying("abort_transaction", self._producer.abort_transaction)
        except TransactionAbortable as exc:  # abort itself cannot be redone: treat as fatal
            raise FatalTransactionError(str(exc)) from None

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None and self.first_delivery_error is None:
            self.first_delivery_error = f"{msg.topic()}[{msg.partition()}]: {err.str()} ({err.name()})"


# --------------------------------------------------------------------------- record building (pure)


def rewrite_schema_id(value: bytes | None, mapping: dict[int, int] | None, where: str) -> bytes | None:
    """Swap the Confluent wire-format schema id of a value (protobuf indexes and payload untouched)."""
    if value is None or not mapping:
        return value
    if len(value) < 5 or value[0] != _MAGIC_BYTE:
        raise ReplicationError(f"{where}: schema_mapping is on but the value is not in the Schema Registry wire format")
    source_id = int.from_bytes(value[1:5], "big")
    target_id = mapping.get(source_id)
    if target_id is None:
        raise ReplicationError(f"{where}: schema id {source_id} has no registered counterpart in the target registry")
    return value[:1] + int(target_id).to_bytes(4, "big") + value[5:]


def record_kwargs(spec: ReplicationSpec, message: Any) -> dict[str, Any]:
    """Producer keyword arguments replicating one consumed message."""
    offset = message.offset()
    value = message.value()
    if spec.schema_id_map:
        value = rewrite_schema_id(value, spec.schema_id_map, f"{spec.source_topic}[{spec.source_partition}]@{offset}")
    kwargs: dict[str, Any] = {"key": message.key(), "value": value}
    tracing = (
        tracing_headers(spec.pipeline, spec.source_topic, spec.source_partition, offset) if spec.tracing_headers else None
    )
    headers = record_headers(message.headers(), spec.replicate_headers, tracing)
    if headers:
        kwargs["headers"] = headers
    if spec.keep_timestamps:
        kind, ts = message.timestamp()
        if kind != TIMESTAMP_NOT_AVAILABLE and ts >= 0:
            kwargs["timestamp"] = ts
    partition = target_partition(spec.source_partition, spec.target_partitions, spec.partition_mapping)
    if partition is not None:
        kwargs["partition"] = partition
    return kwargs


# --------------------------------------------------------------------------- reading the source


def _consumer_config(spec: ReplicationSpec) -> dict[str, Any]:
    group = f"dpone-replication-{spec.pipeline}"
    return driver_client_config(range_reader_config(spec.source_config, group, QUEUE_KBYTES, spec.consumer_overrides))


def read_batches(consumer: Consumer, spec: ReplicationSpec, start: int, end: int) -> Iterator[list[Any]]:
    """Lists of messages with start <= offset < end, in order; completion is judged by the consumer
    position (offsets may have gaps: compaction, transaction markers), and not reaching `end` raises."""
    topic, partition = spec.source_topic, spec.source_partition
    consumer.assign([TopicPartition(topic, partition, start)])
    position, empty_polls = start, 0
    # consume() gathers up to num_messages whatever their size (it drains the prefetch queue while
    # it waits), so the count is derived from the record size seen so far: a small first batch, then
    # about BATCH_BYTES per batch. Memory then stays flat from 200-byte to 1-MB records.
    per_batch = FIRST_BATCH
    while position < end:
        # Never more than what is left: consume() waits its whole timeout for a batch it cannot fill.
        wanted = max(1, min(per_batch, spec.batch_size, end - position))
        batch = consumer.consume(num_messages=wanted, timeout=spec.poll_timeout_ms / 1000)
        size = sum(len(m) for m in batch)
        if batch:
            per_batch = max(1, BATCH_BYTES * len(batch) // max(1, size))
        records: list[Any] = []
        for message in batch:
            err = message.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                hint = (
                    " (the offset is outside the log: did retention delete records before they were replicated?)"
                    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
                    else ""
                )
                raise IncompleteRead(f"{topic}[{partition}]: fetch error at offset {position}: {err}{hint}")
            if message.offset() >= end:
                position = end
                break
            records.append(message)
        progressed = bool(records)
        if records:
            position = max(position, records[-1].offset() + 1)
            yield records
        if position < end:
            current = consumer.position([TopicPartition(topic, partition)])[0].offset
            if current > position:
                position, progressed = current, True
        empty_polls = 0 if progressed else empty_polls + 1
        if empty_polls >= spec.max_empty_polls and position < end:
            raise IncompleteRead(
                f"{topic}[{partition}] stopped at offset {position}, planned end {end} "
                f"({spec.max_empty_polls} polls of {spec.poll_timeout_ms} ms without progress); nothing was committed "
                "for this range"
            )


# --------------------------------------------------------------------------- the task


def _crash(spec: ReplicationSpec, producer: TransactionalProducer) -> None:
    producer.flush(30)  # the records reach the broker, inside the still-open transaction
    if spec.crash_mode == "exit":
        os._exit(1)
    raise SimulatedCrash(f"simulated crash of {spec.transactional_id} before commit_transaction")


class RangeReader:
    """The records of [start, end) for consecutive transactions, from one consumer assignment:
    re-assigning per transaction would wait out the fetch in flight (the broker holds it up to
    fetch.wait.max.ms, 500 ms, at the end of the log)."""

    def __init__(self, consumer: Consumer, spec: ReplicationSpec, start: int) -> None:
        self._consumer, self._spec = consumer, spec
        self.rewind(start)

    def rewind(self, start: int) -> None:
        """Read again from `start` (an aborted transaction is redone from its first offset)."""
        self._batches = read_batches(self._consumer, self._spec, start, self._spec.end)
        self._left: list[Any] = []

    def take(self, limit: int) -> list[Any] | None:
        """At most `limit` (>= 1) next records; None once the range is read."""
        if not self._left:
            self._left = next(self._batches, [])
            if not self._left:
                return None
        taken, self._left = self._left[:limit], self._left[limit:]
        return taken


def _one_transaction(producer: TransactionalProducer, reader: RangeReader, spec: ReplicationSpec) -> tuple[int, int, int]:
    """Copy the next records in one transaction, up to `records_per_transaction` or until
    `seconds_per_transaction` ran out, and commit the offset after them with them;
    (records, bytes, next offset)."""
    producer.begin()
    records = nbytes = 0
    limit = spec.records_per_transaction or spec.end  # more than the range holds
    deadline = time.monotonic() + spec.seconds_per_transaction if spec.seconds_per_transaction else None
    next_offset = spec.end
    # Records copied as they are take the fast path; tracing headers and schema ids need a per-record rewrite.
    as_is = not spec.tracing_headers and not spec.schema_id_map
    partition = target_partition(spec.source_partition, spec.target_partitions, spec.partition_mapping)
    while True:
        batch = reader.take(limit - records)
        if batch is None:
            next_offset = spec.end  # the range is read (gaps after the last record included)
            break
        if as_is:
            nbytes += producer.produce_batch(
                spec.target_topic, -1 if partition is None else partition, batch, spec.replicate_headers,
                spec.keep_timestamps,
            )
        else:
            for message in batch:
                kwargs = record_kwargs(spec, message)
                producer.produce(spec.target_topic, **kwargs)
                nbytes += len(kwargs["key"] or b"") + len(kwargs["value"] or b"")
        records += len(batch)
        next_offset = batch[-1].offset() + 1
        producer.poll()  # serve delivery reports (errors only) and keep the queue moving
        if records >= limit or (deadline is not None and time.monotonic() > deadline):
            break  # the rest goes into the next transaction
    if spec.crash == "after_data":
        _crash(spec, producer)
    key, value = offset_record(
        spec.commit_group, spec.source_topic, spec.source_partition, next_offset, spec.pipeline, spec.run_id,
        spec.target_topic,
    )
    producer.produce(spec.control_topic, key=key, value=value, partition=control_partition(key, spec.control_partitions))
    if spec.crash == "before_commit":
        _crash(spec, producer)
    producer.commit()
    return records, nbytes, next_offset


def _abort_quietly(producer: TransactionalProducer) -> None:
    try:
        producer.abort()
    except ReplicationError:
        pass  # the original error is the one to report; fencing or the timeout clean up


def _transaction_with_retries(
    producer: TransactionalProducer, reader: RangeReader, spec: ReplicationSpec, start: int
) -> tuple[int, int, int, int]:
    """(records, bytes, next offset, aborted attempts) of the committed transaction from `start`."""
    for attempt in range(1, spec.max_attempts + 1):
        try:
            records, nbytes, next_offset = _one_transaction(producer, reader, spec)
            return records, nbytes, next_offset, attempt - 1
        except TransactionAbortable as exc:
            producer.abort()  # raises when even the abort fails (fatal)
            if attempt == spec.max_attempts:
                raise ReplicationError(
                    f"{spec.source_topic}[{spec.source_partition}] from offset {start}: transaction aborted "
                    f"{attempt} times, last: {exc}"
                ) from None
            time.sleep(_backoff(attempt))
            reader.rewind(start)  # the aborted records are redone
        except (ProducerFenced, FatalTransactionError):
            raise  # no abort: the producer is unusable / not ours any more
        except Exception:
            _abort_quietly(producer)  # e.g. an incomplete read: leave nothing open
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def committed_offset(spec: ReplicationSpec) -> int | None:
    """The control topic's offset for this partition, read after the producer fenced older ones.

    A task of an earlier version (an upgrade in progress, or the other pipeline of a blue/green
    pair still on it) used a per-pipeline id that the commit group's id does not fence: its id is
    fenced too (init_transactions aborts its open transaction) before the offset counts, the id of
    this pipeline and of the pipeline that committed the partition last."""
    fenced = {spec.legacy_transactional_id(spec.pipeline)}
    _fence(spec, spec.legacy_transactional_id(spec.pipeline))
    while True:
        entries = read_control_topic(
            spec.target_config,
            spec.control_topic,
            spec.commit_group,
            [spec.source_topic],
            timeout_s=spec.transaction_timeout_ms / 1000 + READ_MARGIN_S,
        )
        entry = entries.get((spec.source_topic, spec.source_partition))
        writer = entry.value.get("pipeline") if entry is not None else None
        legacy = spec.legacy_transactional_id(str(writer)) if writer else None
        if legacy is None or legacy in fenced:
            break
        fenced.add(legacy)
        _fence(spec, legacy)  # then read again: its transaction may have ended meanwhile
    if entry is None:
        return None
    conflict = target_conflict(spec.source_topic, spec.source_partition, entry, spec.target_topic, spec.commit_group)
    if conflict is not None:  # the plan checked it; a concurrent change of the mapping lands here
        raise TargetChanged(conflict)
    return entry.offset


def _fence(spec: ReplicationSpec, transactional_id: str) -> None:
    """Bump `transactional_id`'s epoch: a producer still holding it can commit nothing more."""
    TransactionalProducer(spec.producer_config, transactional_id, spec.transaction_timeout_ms, spec.max_attempts).init(spec.init_timeout_s)


def replicate_range(spec: ReplicationSpec) -> dict[str, Any]:
    """Replicate [committed or planned start, end) of one source partition; returns task stats."""
    stats: dict[str, Any] = {
        "topic": spec.source_topic,
        "partition": spec.source_partition,
        "target_topic": spec.target_topic,
        "planned_start": spec.planned_start,
        "start": spec.planned_start,
        "end": spec.end,
        "records": 0,
        "bytes": 0,
        "transactions": 0,
        "aborted": 0,
        "committed": False,
    }
    producer = TransactionalProducer(
        spec.producer_config, spec.transactional_id, spec.transaction_timeout_ms, spec.max_attempts
    )
    producer.init(spec.init_timeout_s)
    committed = committed_offset(spec)
    start = committed if committed is not None else spec.planned_start
    stats["start"] = start
    if start >= spec.end and committed is not None:
        return stats  # already replicated (by an earlier attempt or a concurrent run)
    consumer = Consumer(_consumer_config(spec))
    try:
        # A partition never committed gets at least one (possibly record-less) transaction, so its
        # start offset is recorded and the next run continues from it.
        position = start
        reader = RangeReader(consumer, spec, start)
        while True:
            records, nbytes, position, aborted = _transaction_with_retries(producer, reader, spec, position)
            stats["records"] += records
            stats["bytes"] += nbytes
            stats["aborted"] += aborted
            stats["transactions"] += 1
            stats["committed"] = True
            if position >= spec.end:
                break
    finally:
        consumer.close()
    return stats


def run_task(specs: list[ReplicationSpec], index: int) -> dict[str, Any]:
    """One Spark task: replicate `specs[index]`; its stats name the executor that ran it."""
    import socket

    return {**replicate_range(specs[index]), "executor": f"{socket.gethostname()}:{os.environ.get('SPARK_EXECUTOR_ID', 'driver')}"}
