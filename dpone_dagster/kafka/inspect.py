"""Driver-side reads of topic metadata: partitions, verified watermarks, timestamp lookups.

Brokers can under-report the high watermark in ListOffsets (seen on the embedded broker: it
answered the base offset of the last batch + 1). The high watermark carried in a Fetch response
is authoritative, so every end offset is confirmed with a fetch before a boundary is fixed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.kafka.boundary import Watermarks
from dpone_dagster.kafka.config import driver_client_config
from dpone_dagster.kafka.errors import client_failure
from dpone_dagster.kafka.timestamps import boundary_offset

INSPECT_DEFAULTS: dict[str, Any] = {
    # What the read tasks use (sources/kafka_reader.py): a planned end is where they can read to.
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "allow.auto.create.topics": False,
    "auto.offset.reset": "error",
    # Probes read single records; keep fetches small.
    "max.partition.fetch.bytes": 1_048_576,
    # At the end of a log the broker holds a fetch for fetch.wait.max.ms (500 ms by default)
    # before it answers; a probe wants the end-of-partition answer at once.
    "fetch.wait.max.ms": 10,
}

# One consume() call of a driver-side read: short, so that a read returns as soon as every
# partition answered (consume waits its whole timeout when fewer messages than asked arrive).
POLL_S = 0.05
# How long the end of a partition is chased while records keep arriving (verified_watermarks).
CHASE_S = 5.0


class TopicMissing(ConfigError):
    """The cluster answered: the topic does not exist."""


def make_consumer(client_config: dict[str, Any], group_id: str, overrides: dict[str, Any] | None = None) -> Consumer:
    config = {**client_config, **INSPECT_DEFAULTS, "group.id": group_id, **(overrides or {})}
    return Consumer(driver_client_config(config))


def topic_partitions(consumer: Consumer, topic: str, timeout_s: float = 10.0) -> list[int]:
    """Partitions of an existing topic. Lists all topics so that no broker auto-creates it."""
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except Exception as exc:
        raise ConfigError(client_failure(f"cannot reach the Kafka cluster to read metadata of '{topic}'", consumer, exc)) from exc
    info = metadata.topics.get(topic)
    if info is None:
        raise TopicMissing(f"topic '{topic}' does not exist; create it or fix the topic name in the manifest")
    if info.error is not None:
        raise ConfigError(f"topic '{topic}' metadata error: {info.error}")
    return sorted(info.partitions)


def verified_watermarks(
    consumer: Consumer, topic: str, partitions: Iterable[int], timeout_s: float = 30.0
) -> dict[int, Watermarks]:
    """Low watermark and end offset per partition: the end is where this consumer's read reaches
    its end of partition, read forward from the reported end. For a read_committed consumer (the
    default, and every read of this project's sources) that is the last stable offset: records of
    a transaction still open are beyond it, and a range planned up to the high watermark could
    never be read to its end while the transaction stays open. Reading forward also corrects a
    broker whose offset listing under-reports."""
    reported: dict[int, Watermarks] = {}
    for p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
        reported[p] = Watermarks(low, max(low, high))
    if not reported:
        return {}
    ends = {p: wm.high for p, wm in reported.items()}
    consumer.assign([TopicPartition(topic, p, wm.high) for p, wm in reported.items()])
    pending, answered = set(reported), set()
    started = time.monotonic()
    deadline = started + timeout_s
    try:
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=POLL_S):
                err = message.error()
                partition = message.partition()
                if partition not in pending:
                    continue
                answered.add(partition)
                if err is None:
                    ends[partition] = max(ends[partition], message.offset() + 1)
                elif err.code() == KafkaError._PARTITION_EOF:
                    ends[partition] = max(ends[partition], message.offset())
                    pending.discard(partition)
                else:
                    raise RunFailed(f"{topic}[{partition}]: fetch failed while verifying the end offset: {err}")
            if time.monotonic() - started > CHASE_S:
                # A partition written faster than it is read here never shows its end: every record
                # read is below its last stable offset, so the last one read + 1 is an end a run can reach.
                pending -= answered
    finally:
        consumer.unassign()
    if pending:
        raise RunFailed(
            f"{topic}: could not confirm the end offset of partitions {sorted(pending)} within {timeout_s}s; "
            "check broker health and retry"
        )
    return {p: Watermarks(wm.low, ends[p]) for p, wm in reported.items()}


class RecordProbe:
    """Reads single records to learn the timestamp at an offset (cached per run)."""

    def __init__(self, consumer: Consumer, topic: str, timeout_s: float = 10.0):
        self._consumer = consumer
        self._topic = topic
        self._timeout_s = timeout_s
        self._cache: dict[tuple[int, int], tuple[int, int] | None] = {}

    def first_at_or_after(self, partition: int, offset: int) -> tuple[int, int] | None:
        """(offset, timestamp_ms) of the first record at offset >= `offset`, None at the end."""
        key = (partition, offset)
        if key not in self._cache:
            self._read_from(partition, offset)
        return self._cache[key]

    # The timestamp rule looks at a record's neighbours: one fetch caches a few in a row.
    READ_AHEAD = 5

    def _read_from(self, partition: int, offset: int) -> None:
        self._consumer.assign([TopicPartition(self._topic, partition, offset)])
        deadline = time.monotonic() + self._timeout_s
        read: list[tuple[int, int]] = []
        try:
            while time.monotonic() < deadline:
                for message in self._consumer.consume(num_messages=self.READ_AHEAD - len(read), timeout=POLL_S):
                    err = message.error()
                    if err is None:
                        read.append((message.offset(), message.timestamp()[1]))
                    elif err.code() == KafkaError._PARTITION_EOF:
                        self._remember(partition, offset, read, at_end=True)
                        return
                    else:
                        raise RunFailed(f"{self._topic}[{partition}]@{offset}: fetch failed: {err}")
                if len(read) >= self.READ_AHEAD:
                    self._remember(partition, offset, read, at_end=False)
                    return
        finally:
            self._consumer.unassign()
        raise RunFailed(f"{self._topic}[{partition}]@{offset}: no answer within {self._timeout_s}s")

    def _remember(self, partition: int, offset: int, read: list[tuple[int, int]], at_end: bool) -> None:
        """Consecutive records answer 'first at or after' for the offset after each predecessor."""
        starts = [offset, *(record[0] + 1 for record in read)]
        for start, record in zip(starts, read, strict=False):
            self._cache[(partition, start)] = record
        if at_end:
            self._cache[(partition, starts[len(read)])] = None


def offsets_for_timestamp(
    consumer: Consumer,
    probe: RecordProbe,
    topic: str,
    watermarks: dict[int, Watermarks],
    timestamp_ms: int,
) -> dict[int, int]:
    """Where `timestamp_ms` starts, per partition (the rule of kafka/timestamps.py).

    The broker's index answer is a hint the search confirms against the records around it; the
    embedded broker answers from its write times instead of record timestamps, and a broker
    without an index answers nothing: the search then bisects.
    """
    query = [TopicPartition(topic, p, timestamp_ms) for p in sorted(watermarks)]
    try:
        answers = {tp.partition: tp.offset for tp in consumer.offsets_for_times(query, timeout=10)}
    except Exception:  # a broker without a timestamp index: search instead
        answers = {}
    result: dict[int, int] = {}
    for p, wm in watermarks.items():
        hint = answers.get(p)
        if hint is not None and (hint == OFFSET_END or hint < 0):
            hint = wm.high  # the index says no record is that new
        result[p] = boundary_offset(probe, p, wm, timestamp_ms, hint)
    return result
