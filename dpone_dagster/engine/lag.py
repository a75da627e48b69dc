"""How far a Kafka source's stored offsets are behind the topic (read-only). A time-window
source's position is the end of the newest materialized window (its recorded offsets)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpone_dagster.connections import resolve_kafka
from dpone_dagster.engine.offsets import OffsetStorage
from dpone_dagster.kafka import inspect
from dpone_dagster.kafka.windows import last_recorded_ends
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.sources.kafka import default_group_id


@dataclass(frozen=True)
class SourceLag:
    topic: str
    low: dict[int, int]
    high: dict[int, int]
    stored: dict[int, int]

    def start(self, partition: int) -> int:
        return self.stored.get(partition, self.low[partition])

    @property
    def new_messages(self) -> int:
        return sum(max(0, self.high[p] - self.start(p)) for p in self.high)

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "high_watermarks": {str(p): o for p, o in sorted(self.high.items())},
            "stored_offsets": {str(p): o for p, o in sorted(self.stored.items())},
            "lag_messages": self.new_messages,
        }


def source_lag(manifest: Manifest, client_config: dict[str, Any]) -> SourceLag:
    from dpone_dagster.engine.time_windows import is_time_window, load_recorded
    from dpone_dagster.state.open import open_manifest_state_store

    source = manifest.source
    assert isinstance(source, KafkaSource)
    group_id = default_group_id(manifest)
    consumer = inspect.make_consumer(client_config, group_id)
    try:
        partitions = inspect.topic_partitions(consumer, source.topic)
        watermarks = inspect.verified_watermarks(consumer, source.topic, partitions)
    finally:
        consumer.close()
    if manifest.sink.options.delivery.mode == "exactly_once":
        # Replication offsets live only in the control topic on the target cluster.
        from dpone_dagster.replication.control_topic import ControlTopicStore, commit_group_of

        replication = manifest.sink.options.replication
        control = ControlTopicStore(
            resolve_kafka(manifest.sink).client_config(),
            replication.control_topic,
            commit_group_of(manifest),
            replication.transaction_timeout_ms,
        )
        stored = control.load_offsets(source.topic)
    else:
        store = open_manifest_state_store(manifest)
        try:
            if is_time_window(manifest):
                stored = last_recorded_ends(load_recorded(manifest, store))
            else:
                stored = OffsetStorage(manifest, store, client_config, group_id).load()
        finally:
            store.close()
    return SourceLag(
        source.topic,
        {p: w.low for p, w in watermarks.items()},
        {p: w.high for p, w in watermarks.items()},
        stored,
    )
