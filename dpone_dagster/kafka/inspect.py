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

INSPECT_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "allow.auto.create.topics": False,
    "auto.offset.reset": "error",
    # Probes read single records; keep fetches small.
    "max.partition.fetch.bytes": 1_048_576,
}


def make_consumer(client_config: dict[str, Any], group_id: str, overrides: dict[str, Any] | None = None) -> Consumer:
    config = {**client_config, **INSPECT_DEFAULTS, "group.id": group_id, **(overrides or {})}
    return Consumer(driver_client_config(config))


def topic_partitions(consumer: Consumer, topic: str, timeout_s: float = 10.0) -> list[int]:
    """Partitions of an existing topic. Lists all topics so that no broker auto-creates it."""
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except Exception as exc:
        raise ConfigError(f"cannot reach the Kafka cluster to read metadata of '{topic}': {exc}") from exc
    info = metadata.topics.get(topic)
    if info is None:
        raise ConfigError(f"topic '{topic}' does not exist; create it or fix the topic name in the manifest")
    if info.error is not None:
        raise ConfigError(f"topic '{topic}' metadata error: {info.error}")
    return sorted(info.partitions)


def verified_watermarks(
    consumer: Consumer, topic: str, partitions: Iterable[int], timeout_s: float = 30.0
) -> dict[int, Watermarks]:
    """Low/high watermarks per partition, the high one confirmed by a fetch at the reported end."""
    reported: dict[int, Watermarks] = {}
    for p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
        reported[p] = Watermarks(low, max(low, high))
    if not reported:
        return {}
    consumer.assign([TopicPartition(topic, p, wm.high) for p, wm in reported.items()])
    pending = set(reported)
    deadline = time.monotonic() + timeout_s
    try:
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=len(pending) * 10, timeout=0.5):
                err = message.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise RunFailed(f"{topic}[{message.partition()}]: fetch failed while verifying the end offset: {err}")
                # A record or an EOF: either way the fetch response updated the cached watermarks.
                pending.discard(message.partition())
    finally:
        consumer.unassign()
    if pending:
        raise RunFailed(
            f"{topic}: could not confirm the end offset of partitions {sorted(pending)} within {timeout_s}s; "
            "check broker health and retry"
        )
    verified: dict[int, Watermarks] = {}
    for p, wm in reported.items():
        _, fetched_high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
        verified[p] = Watermarks(wm.low, max(wm.high, fetched_high))
    return verified


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
            self._cache[key] = self._read_one(partition, offset)
        return self._cache[key]

    def timestamps(self, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        """(offset, timestamp_ms) of the records in [start, end)."""
        self._consumer.assign([TopicPartition(self._topic, partition, start)])
        out: list[tuple[int, int]] = []
        deadline = time.monotonic() + self._timeout_s
        try:
            while time.monotonic() < deadline:
                for message in self._consumer.consume(num_messages=max(1, end - start), timeout=0.5):
                    err = message.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            return out
                        raise RunFailed(f"{self._topic}[{partition}]@{start}: fetch failed: {err}")
                    if message.offset() >= end:
                        return out
                    out.append((message.offset(), message.timestamp()[1]))
                    if message.offset() == end - 1:
                        return out
        finally:
            self._consumer.unassign()
        raise RunFailed(f"{self._topic}[{partition}]@{start}: no answer within {self._timeout_s}s")

    def _read_one(self, partition: int, offset: int) -> tuple[int, int] | None:
        self._consumer.assign([TopicPartition(self._topic, partition, offset)])
        deadline = time.monotonic() + self._timeout_s
        try:
            while time.monotonic() < deadline:
                for message in self._consumer.consume(num_messages=1, timeout=0.5):
                    err = message.error()
                    if err is None:
                        return message.offset(), message.timestamp()[1]
                    if err.code() == KafkaError._PARTITION_EOF:
                        return None
                    raise RunFailed(f"{self._topic}[{partition}]@{offset}: fetch failed: {err}")
        finally:
            self._consumer.unassign()
        raise RunFailed(f"{self._topic}[{partition}]@{offset}: no answer within {self._timeout_s}s")


def offsets_for_timestamp(
    consumer: Consumer,
    probe: RecordProbe,
    topic: str,
    watermarks: dict[int, Watermarks],
    timestamp_ms: int,
) -> dict[int, int]:
    """First offset whose record timestamp is >= `timestamp_ms`, per partition (high watermark if none).

    The broker's index answer is used when the records around it confirm it; otherwise (the
    embedded broker ignores record timestamps) a binary search over single-record reads decides.
    Timestamps are assumed non-decreasing within a partition; a record written late with an older
    timestamp stays in the window its position falls in (Kafka's own index behaves the same way).
    """
    query = [TopicPartition(topic, p, timestamp_ms) for p in sorted(watermarks)]
    try:
        answers = {tp.partition: tp.offset for tp in consumer.offsets_for_times(query, timeout=10)}
    except Exception:  # a broker without a timestamp index: search instead
        answers = {}
    result: dict[int, int] = {}
    for p, wm in watermarks.items():
        candidate = answers.get(p, -1)
        if candidate == OFFSET_END or candidate < 0:
            candidate = wm.high
        candidate = min(max(candidate, wm.low), wm.high)
        if _is_boundary(probe, p, wm, candidate, timestamp_ms):
            result[p] = candidate
        else:
            found = _binary_search(probe, p, wm, timestamp_ms)
            result[p] = _refine_backwards(probe, p, wm, found, timestamp_ms)
    return result


# Records read behind a binary-search answer to catch late (out-of-order) timestamps near it.
REFINE_WINDOW = 500


def _refine_backwards(probe: RecordProbe, partition: int, wm: Watermarks, offset: int, ts: int) -> int:
    """Kafka's index semantics: the boundary is the first offset whose running maximum timestamp
    reaches `ts`. Binary search assumes order; a record >= ts shortly before its answer (a late
    record sat on a probe point) moves the boundary back to that record."""
    start = max(wm.low, offset - REFINE_WINDOW)
    if start >= offset:
        return offset
    for found_offset, found_ts in probe.timestamps(partition, start, offset):
        if found_ts >= ts:
            return found_offset
    return offset


def _is_boundary(probe: RecordProbe, partition: int, wm: Watermarks, offset: int, ts: int) -> bool:
    """True when the record at `offset` is the first with timestamp >= ts."""
    if offset < wm.high:
        at = probe.first_at_or_after(partition, offset)
        if at is None or at[1] < ts:
            return False
    if offset > wm.low:
        before = _last_before(probe, partition, wm, offset)
        if before is not None and before[1] >= ts:
            return False
    return True


def _last_before(probe: RecordProbe, partition: int, wm: Watermarks, offset: int) -> tuple[int, int] | None:
    """The last record before `offset` (walks back over gaps, bounded)."""
    step = 1
    while offset - step >= wm.low:
        found = probe.first_at_or_after(partition, offset - step)
        if found is not None and found[0] < offset:
            return found
        step *= 2
    found = probe.first_at_or_after(partition, wm.low)
    return found if found is not None and found[0] < offset else None


def _binary_search(probe: RecordProbe, partition: int, wm: Watermarks, ts: int) -> int:
    """Smallest offset o in [low, high] such that every record before o has timestamp < ts."""
    lo, hi = wm.low, wm.high
    while lo < hi:
        mid = (lo + hi) // 2
        found = probe.first_at_or_after(partition, mid)
        if found is None:
            hi = mid
        elif found[1] >= ts:
            hi = mid
        else:
            lo = found[0] + 1
    return lo
