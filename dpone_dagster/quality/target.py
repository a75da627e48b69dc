"""What the sink topic holds, read from the target itself (never from the producer's own reports):
its partitions' end offsets before and after a run, and the records a range of offsets holds.

`source_target_count` compares these with what the run meant to produce. End offsets are
confirmed with a fetch (see `kafka.inspect`): some brokers under-report them in ListOffsets.
Reads use read_committed when the sink is written in transactions, so aborted records and
transaction markers are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.inspect import make_consumer, topic_partitions, verified_watermarks

READ_TIMEOUT_S = 60.0


def _consumer(client_config: dict[str, Any], transactional: bool, purpose: str) -> Any:
    isolation = "read_committed" if transactional else "read_uncommitted"
    return make_consumer(client_config, f"dpone-target-{purpose}", {"isolation.level": isolation})


def end_offsets(client_config: dict[str, Any], topic: str, transactional: bool = False) -> dict[int, int]:
    """The end offset (next offset to be written) of every partition of `topic`."""
    consumer = _consumer(client_config, transactional, "ends")
    try:
        partitions = topic_partitions(consumer, topic)
        return {p: wm.high for p, wm in verified_watermarks(consumer, topic, partitions).items()}
    finally:
        consumer.close()


def offset_advance(before: Mapping[Any, int], after: Mapping[Any, int]) -> dict[Any, int]:
    """Per partition, how many offsets the target advanced between two readings (pure)."""
    return {p: after[p] - before.get(p, 0) for p in sorted(after) if after[p] > before.get(p, 0)}


def count_records(
    client_config: dict[str, Any],
    topic: str,
    before: Mapping[int, int],
    after: Mapping[int, int],
    transactional: bool = False,
    timeout_s: float = READ_TIMEOUT_S,
) -> int:
    """Records (tombstones included, transaction markers not) held in [before, after) per partition."""
    ranges = {p: (before.get(p, 0), end) for p, end in after.items() if end > before.get(p, 0)}
    if not ranges:
        return 0
    consumer = _consumer(client_config, transactional, "count")
    count = 0
    try:
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in ranges.items()])
        pending = set(ranges)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                p = message.partition()
                err = message.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise RunFailed(f"{topic}[{p}]: reading the target to count the run's records failed: {err}")
                if err is None and message.offset() < ranges[p][1]:
                    count += 1
                # Done with a partition at its range end, or at the end of the log (read_committed
                # skips the markers, so the last offset of the range may never be delivered).
                if err is not None or message.offset() >= ranges[p][1] - 1:
                    pending.discard(p)
            for p in list(pending):
                position = consumer.position([TopicPartition(topic, p)])[0].offset
                if position >= ranges[p][1]:
                    pending.discard(p)
        if pending:
            raise RunFailed(
                f"{topic}: could not read partitions {sorted(pending)} of the target to their end within "
                f"{timeout_s}s to count the run's records; check broker health and retry"
            )
    finally:
        consumer.close()
    return count


class KafkaTargets:
    """The run's target topics as the post-publish checks read them (engine/stages/commit.py):
    partitions are named (topic, partition) across the topics."""

    def __init__(self, client_config: dict[str, Any], topics: Sequence[str], transactional: bool = False):
        self.client_config = client_config
        self.topics = tuple(sorted(set(topics)))
        self.transactional = transactional

    def ends(self) -> dict[Any, int]:
        return self.ends_of(self.topics)

    def ends_of(self, topics: Iterable[str]) -> dict[Any, int]:
        """End offsets of `topics` (a subset: a topic the run creates starts empty)."""
        return {
            (topic, p): end
            for topic in sorted(topics)
            for p, end in end_offsets(self.client_config, topic, self.transactional).items()
        }

    def held(self, before: Mapping[Any, int], after: Mapping[Any, int]) -> int:
        def of(topic: str, ends: Mapping[Any, int]) -> dict[int, int]:
            return {p: end for (t, p), end in ends.items() if t == topic}

        return sum(
            count_records(self.client_config, topic, of(topic, before), of(topic, after), self.transactional)
            for topic in self.topics
        )
