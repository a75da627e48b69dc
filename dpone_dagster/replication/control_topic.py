"""The replication offset store: a compacted control topic on the TARGET cluster.

Why there: Kafka transactions span one cluster, so the replicated records and the source offset
they advance can only be committed atomically when both live on the target (the source cluster
is never written to). A reader with isolation.level=read_committed therefore sees an offset only
once the records it covers are committed.

Record format (one record per commit of a source partition range):

- key: compact JSON array, UTF-8 — ``["<commit_group>","<source_topic>",<source_partition>]``
  (e.g. ``["orders_dr","orders",3]``); byte-identical for the same triple, so compaction keeps
  exactly the latest record per source partition and commit group.
- value: compact JSON object — ``{"committed_at":"2024-05-01T12:00:00.123456+00:00","offset":1200,
  "pipeline":"orders_dr","run_id":"...","target_topic":"dr.orders","v":1}``; ``offset`` is the next
  source offset to read (everything below it is replicated). A null value (tombstone) forgets the
  partition: the next run starts from `start_from`.
- partition: crc32(key) mod the control topic's partition count, chosen by the writer, so the
  history of one key stays ordered in one partition whatever client wrote it.

Several pipelines may share one control topic: each reads only its own commit group's keys.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.kafka.config import driver_client_config
from dpone_dagster.kafka.errors import client_failure
from dpone_dagster.kafka.inspect import TopicMissing, make_consumer, topic_partitions
from dpone_dagster.manifest.models import ControlTopicOptions, Manifest
from dpone_dagster.state.base import RunRecord

FORMAT_VERSION = 1
PartitionKey = tuple[str, int]  # (source topic, source partition)
Log = Callable[[str], None]

# A reader waits at most this long beyond the transaction timeout for open transactions to finish.
READ_MARGIN_S = 30.0


def commit_group_of(manifest: Manifest) -> str:
    """The commit group isolating this pipeline's keys in a shared control topic."""
    return manifest.sink.options.replication.control_topic.commit_group or manifest.name


# --------------------------------------------------------------------------- record format (pure)


def encode_key(commit_group: str, source_topic: str, source_partition: int) -> bytes:
    return json.dumps([commit_group, source_topic, int(source_partition)], separators=(",", ":"), ensure_ascii=False).encode()


def decode_key(raw: bytes | None) -> tuple[str, str, int] | None:
    """(commit_group, topic, partition), or None for a record that is not ours (left alone)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if (
        isinstance(data, list)
        and len(data) == 3
        and isinstance(data[0], str)
        and isinstance(data[1], str)
        and isinstance(data[2], int)
        and not isinstance(data[2], bool)
    ):
        return data[0], data[1], data[2]
    return None


def control_partition(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % max(1, partitions)


def offset_record(
    commit_group: str,
    source_topic: str,
    source_partition: int,
    next_offset: int,
    pipeline: str,
    run_id: str,
    target_topic: str | None = None,
    committed_at: datetime | None = None,
) -> tuple[bytes, bytes]:
    """(key, value) of the control record that marks [.., next_offset) of a partition replicated."""
    if next_offset < 0:
        raise ValueError(f"offset must be >= 0, got {next_offset}")
    value = {
        "v": FORMAT_VERSION,
        "offset": int(next_offset),
        "pipeline": pipeline,
        "run_id": run_id,
        "target_topic": target_topic,
        "committed_at": (committed_at or datetime.now(UTC)).isoformat(),
    }
    return (
        encode_key(commit_group, source_topic, source_partition),
        json.dumps(value, separators=(",", ":"), sort_keys=True).encode(),
    )


def decode_value(raw: bytes | None) -> dict[str, Any] | None:
    """The value as a dict (None for a tombstone); a value without an int offset is an error."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunFailed(f"control topic record is not JSON: {exc}") from None
    offset = data.get("offset") if isinstance(data, dict) else None
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise RunFailed(f"control topic record has no valid 'offset': {raw[:200]!r}")
    return data


@dataclass(frozen=True)
class ControlEntry:
    """The latest committed control record of one source partition."""

    offset: int
    value: dict[str, Any]
    partition: int  # of the control topic
    position: int  # offset in the control topic
    timestamp_ms: int

    def newer_than(self, other: ControlEntry) -> bool:
        # Same control partition: log order decides. Across partitions (only after the control
        # topic gained partitions) the record timestamp is the best evidence left.
        if self.partition == other.partition:
            return self.position > other.position
        return self.timestamp_ms >= other.timestamp_ms


def fold_records(
    records: Iterable[tuple[bytes | None, bytes | None, int, int, int]],
    commit_group: str,
    topics: Iterable[str] | None = None,
) -> dict[PartitionKey, ControlEntry]:
    """Latest entry per (topic, partition) of `commit_group` from (key, value, partition, offset,
    timestamp_ms) tuples. Compaction may not have run yet, so every version can still be there."""
    wanted = set(topics) if topics is not None else None
    latest: dict[PartitionKey, ControlEntry] = {}
    for key, value, partition, position, timestamp_ms in records:
        decoded = decode_key(key)
        if decoded is None or decoded[0] != commit_group:
            continue
        pk = (decoded[1], decoded[2])
        if wanted is not None and pk[0] not in wanted:
            continue
        data = decode_value(value)
        # A tombstone (offset -1 here) forgets the partition unless a newer record follows.
        entry = ControlEntry(data["offset"] if data else -1, data or {}, partition, position, timestamp_ms)
        if pk not in latest or entry.newer_than(latest[pk]):
            latest[pk] = entry
    return {pk: entry for pk, entry in latest.items() if entry.offset >= 0}


def target_conflict(topic: str, partition: int, entry: ControlEntry, target_topic: str, commit_group: str) -> str | None:
    """Why `entry` cannot be the start of a copy into `target_topic`, or None (pure).

    An offset counts only for the target it was committed with: after a change of the topic
    mapping it says nothing of the new target, which would otherwise stay empty while the run
    reports success. Starting the new target from the beginning under the same key would in turn
    copy into the old one a second time if the mapping were changed back, so the run refuses;
    records written before targets were recorded (no `target_topic`) count for any target."""
    committed_for = entry.value.get("target_topic")
    if committed_for in (None, target_topic):
        return None
    return (
        f"{topic}[{partition}]: the control topic holds offset {entry.offset} of commit group '{commit_group}' "
        f"for target topic '{committed_for}', but the topic mapping now sends it to '{target_topic}'. To copy "
        f"into '{target_topic}' from the start, give it a commit group of its own "
        "(sink.options.replication.control_topic.commit_group); to continue the old copy, restore the mapping"
    )


# --------------------------------------------------------------------------- IO


def ensure_control_topic(client_config: dict[str, Any], options: ControlTopicOptions, log: Log | None = None) -> int:
    """Partition count of the control topic, creating it (compacted) when `options.create` allows."""
    admin = AdminClient(driver_client_config(client_config))
    try:
        metadata = admin.list_topics(timeout=10)
    except Exception as exc:
        raise ConfigError(client_failure("cannot reach the target Kafka cluster to check the control topic", admin, exc)) from exc
    info = metadata.topics.get(options.name)
    if info is not None and info.error is None:
        _warn_unless_compacted(admin, options.name, log)
        return len(info.partitions)
    if not options.create:
        raise ConfigError(
            f"replication control topic '{options.name}' does not exist on the target cluster; create it "
            f"(cleanup.policy=compact) or set sink.options.replication.control_topic.create: true"
        )
    new = NewTopic(
        options.name,
        num_partitions=options.partitions,
        replication_factor=options.replication_factor,
        config={"cleanup.policy": "compact"},
    )
    try:
        admin.create_topics([new])[options.name].result(timeout=30)
    except Exception as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):  # a concurrent run created it first
            raise ConfigError(f"could not create the replication control topic '{options.name}': {exc}") from exc
    if log:
        log(f"control topic '{options.name}' created ({options.partitions} partition(s), compacted)")
    return options.partitions


def _warn_unless_compacted(admin: AdminClient, name: str, log: Log | None) -> None:
    """A non-compacted control topic works but grows forever (or loses offsets to retention)."""
    if log is None:
        return
    try:
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        configs = admin.describe_configs([resource])[resource].result(timeout=10)
        policy = configs.get("cleanup.policy")
    except Exception:  # describe is advisory; the topic itself is usable
        return
    if policy is not None and "compact" not in str(policy.value):
        log(
            f"control topic '{name}' has cleanup.policy={policy.value}: retention may delete committed "
            "offsets; set cleanup.policy=compact"
        )


@dataclass(frozen=True)
class ControlSnapshot:
    entries: dict[PartitionKey, ControlEntry]
    # False: an open transaction kept the end of the topic unreadable within the wait, so an entry
    # committed behind it may be missing or older here.
    complete: bool
    behind: dict[int, tuple[int, int]]  # control partition -> (reached, end) when incomplete

    @property
    def offsets(self) -> dict[PartitionKey, int]:
        return {pk: entry.offset for pk, entry in self.entries.items()}


def snapshot_control_topic(
    client_config: dict[str, Any],
    control_topic: str,
    commit_group: str,
    topics: Iterable[str] | None = None,
    wait_s: float = 90.0,
    missing_ok: bool = False,
) -> ControlSnapshot:
    """Read the whole control topic read_committed up to its end; latest entry per key.

    The end of each partition is the high watermark of the first fetch response, and the read is
    complete only when the consumer position reaches it: the last stable offset stays behind an
    open transaction, so reaching the end proves that every transaction that wrote before this call
    has committed or aborted (a task that committed and then died is never read as "not committed
    yet").
    """
    consumer = make_consumer(
        client_config,
        f"dpone-control-reader-{commit_group}",
        {
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",  # compaction/retention may move the log start meanwhile
            "max.partition.fetch.bytes": 10_485_760,
            # At the end of a partition the broker holds a fetch this long; every task reads here
            # before its first transaction, so the default 500 ms would be paid per task.
            "fetch.wait.max.ms": 50,
        },
    )
    try:
        try:
            partitions = topic_partitions(consumer, control_topic)
        except TopicMissing:
            if missing_ok:
                return ControlSnapshot({}, True, {})
            raise
        records, behind = _read_to_end(consumer, control_topic, partitions, wait_s)
    finally:
        consumer.close()
    return ControlSnapshot(fold_records(records, commit_group, topics), not behind, behind)


def read_control_topic(
    client_config: dict[str, Any],
    control_topic: str,
    commit_group: str,
    topics: Iterable[str] | None = None,
    timeout_s: float = 90.0,
    missing_ok: bool = False,
) -> dict[PartitionKey, ControlEntry]:
    """`snapshot_control_topic` that must be complete (raises RunFailed after `timeout_s`)."""
    snapshot = snapshot_control_topic(client_config, control_topic, commit_group, topics, timeout_s, missing_ok)
    if not snapshot.complete:
        raise RunFailed(
            f"control topic '{control_topic}' could not be read up to its end within {timeout_s:.0f}s "
            f"(partition: (reached, end) {snapshot.behind}): an open transaction holds the last stable offset "
            "(a running replication of another partition, or a crashed one that the broker aborts after "
            "transaction.timeout.ms); retry later"
        )
    return snapshot.entries


ControlRecord = tuple[bytes | None, bytes | None, int, int, int]  # key, value, partition, offset, timestamp


def _read_to_end(
    consumer: Any, topic: str, partitions: list[int], wait_s: float
) -> tuple[list[ControlRecord], dict[int, tuple[int, int]]]:
    """(records below the ends, {partition: (reached, end)} of partitions not read to the end).

    One pass from the log start. A partition's end is fixed from the first fetch response that
    reaches the client: a Fetch carries the true high watermark (ListOffsets may under-report it,
    as the embedded broker does), and that response is newer than this call.
    """
    if not partitions:
        return [], {}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    ends: dict[int, int] = {}
    reached = dict.fromkeys(partitions, -1)
    out: list[ControlRecord] = []
    deadline = time.monotonic() + wait_s
    while True:
        # A short timeout: consume() waits it out whenever the batch cannot be filled (at the end).
        for message in consumer.consume(num_messages=10_000, timeout=0.1):
            err = message.error()
            p = message.partition()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    # The EOF offset is the fetch position (the last stable offset read_committed).
                    reached[p] = max(reached[p], message.offset())
                    continue
                raise RunFailed(f"control topic '{topic}'[{p}]: fetch failed: {err}")
            reached[p] = max(reached[p], message.offset() + 1)
            out.append((message.key(), message.value(), p, message.offset(), message.timestamp()[1]))
        for p in partitions:
            if p not in ends:
                high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
                if high >= 0:
                    ends[p] = high
        # Commit markers and aborted batches move the position without delivering a record.
        for tp in consumer.position([TopicPartition(topic, p) for p in partitions]):
            if tp.offset >= 0:
                reached[tp.partition] = max(reached[tp.partition], tp.offset)
        behind = {p: (reached[p], ends.get(p, -1)) for p in partitions if p not in ends or reached[p] < ends[p]}
        if not behind:
            return [r for r in out if r[3] < ends[r[2]]], {}
        if time.monotonic() > deadline:
            return [r for r in out if r[3] < ends.get(r[2], 0)], behind


def read_committed_offsets(
    client_config: dict[str, Any],
    options: ControlTopicOptions,
    commit_group: str,
    topics: Iterable[str] | None = None,
    transaction_timeout_ms: int = 60_000,
    missing_ok: bool = False,
) -> dict[PartitionKey, int]:
    """(source topic, partition) -> next source offset to read, as committed by replication."""
    entries = read_control_topic(
        client_config,
        options.name,
        commit_group,
        topics,
        timeout_s=transaction_timeout_ms / 1000 + READ_MARGIN_S,
        missing_ok=missing_ok,
    )
    return {pk: entry.offset for pk, entry in entries.items()}


class ControlTopicStore:
    """State view of the control topic (`state.type: kafka_control_topic`) for `dpone state show`
    and the engine.

    Offsets move only inside replication transactions, so every offset write is refused; run
    records are not kept here (start/finish calls are accepted and dropped, list_runs is empty).
    """

    def __init__(self, client_config: dict[str, Any], options: ControlTopicOptions, commit_group: str,
                 transaction_timeout_ms: int = 60_000):
        self._client_config = client_config
        self._options = options
        self.commit_group = commit_group
        self._transaction_timeout_ms = transaction_timeout_ms

    def load_offsets(self, topic: str, group_id: str | None = None) -> dict[int, int]:
        """{partition: next offset} of `topic`; `group_id` is the commit group (default: the store's)."""
        offsets = read_committed_offsets(
            self._client_config,
            self._options,
            group_id or self.commit_group,
            [topic],
            self._transaction_timeout_ms,
            missing_ok=True,
        )
        return {partition: offset for (_, partition), offset in sorted(offsets.items())}

    def load_all(self) -> dict[PartitionKey, ControlEntry]:
        """Every committed entry of the commit group (all replicated topics)."""
        return read_control_topic(
            self._client_config,
            self._options.name,
            self.commit_group,
            timeout_s=self._transaction_timeout_ms / 1000 + READ_MARGIN_S,
            missing_ok=True,
        )

    def _read_only(self, what: str) -> ConfigError:
        return ConfigError(
            f"state.type kafka_control_topic is read-only ({what}): replication commits offsets in its "
            f"own transactions to '{self._options.name}'"
        )

    def start_run(self, record: RunRecord) -> None:
        return None  # run history lives elsewhere (artifacts, Dagster); see the class docstring

    def finish_run_success(self, record: RunRecord, topic: str | None, group_id: str | None,
                           offsets: dict[int, int] | None, watermark: dict[str, Any] | None = None,
                           windows: dict[str, dict[str, Any]] | None = None) -> None:
        if offsets or windows:
            raise self._read_only("finish_run_success with offsets or time windows")

    def advance_offsets(self, record: RunRecord, topic: str, group_id: str, offsets: dict[int, int]) -> None:
        raise self._read_only("advance_offsets")

    def finish_run_failed(self, record: RunRecord) -> None:
        return None

    def load_watermark(self, pipeline: str) -> dict[str, Any] | None:
        return None

    def load_windows(self, topic: str, group_id: str) -> dict[str, dict[str, Any]]:
        return {}  # replication reads offsets, never time windows

    def reset_offsets(self, topic: str, group_id: str, offsets: dict[int, int] | None) -> None:
        raise self._read_only("reset_offsets")

    def list_runs(self, pipeline: str, limit: int = 20) -> list[RunRecord]:
        return []  # run history is not kept in the control topic

    def try_lock(self, pipeline: str) -> bool:
        # Exclusivity per source partition comes from the transactional.id: a second writer fences the first.
        return True

    def unlock(self, pipeline: str) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"type": "kafka_control_topic", "topic": self._options.name, "commit_group": self.commit_group}

    def close(self) -> None:
        return None
