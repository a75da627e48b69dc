"""Where a Kafka source's offsets live: the manifest's state store (offset_storage: dpone) or the
consumer group on the source cluster (offset_storage: kafka). Both are read back as the start of
the next run and both are written only after the sink succeeded.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, TopicPartition

from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.config import driver_client_config
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.state.base import RunRecord, StateStore


class OffsetStorage:
    def __init__(self, manifest: Manifest, store: StateStore, client_config: dict[str, Any], group_id: str):
        assert isinstance(manifest.source, KafkaSource)
        self.topic = manifest.source.topic
        self.mode = manifest.source.options.offset_storage
        self.store = store
        self.client_config = client_config
        self.group_id = group_id

    def load(self, fallback: dict[int, int] | None = None, pipeline: str | None = None, run_id: str | None = None) -> dict[int, int]:
        """Stored offsets. `fallback` (offsets of the last Dagster materialization) is used only when
        the store has never recorded another run of `pipeline`: a lost or new state database. A
        store that has runs but no offsets was reset on purpose (`dpone state reset`)."""
        stored = self._committed_in_group() if self.mode == "kafka" else self.store.load_offsets(self.topic, self.group_id)
        if stored or not fallback or pipeline is None:
            return stored
        earlier = [r for r in self.store.list_runs(pipeline, limit=2) if r.run_id != run_id]
        return stored if earlier else dict(fallback)

    def commit(self, record: RunRecord, end_offsets: dict[int, int] | None, windows: dict[str, dict[str, Any]] | None = None) -> None:
        """Advance offsets (None: leave them), record the time windows' offset ranges (they live in
        the state store in both modes) and mark the run successful."""
        recorded = {"windows": windows} if windows else {}  # only time-window runs pass them
        if self.mode == "kafka":
            if end_offsets:
                self._commit_group(end_offsets)
            self.store.finish_run_success(record, self.topic if windows else None, self.group_id if windows else None, None, **recorded)
        else:
            self.store.finish_run_success(record, self.topic, self.group_id, end_offsets, **recorded)

    def advance(self, record: RunRecord, offsets: dict[int, int]) -> None:
        """Store the offsets of partitions whose slices a running run has delivered (the run goes on)."""
        if self.mode == "kafka":
            self._commit_group(offsets)
        else:
            self.store.advance_offsets(record, self.topic, self.group_id, offsets)

    def _consumer(self) -> Consumer:
        return Consumer(
            driver_client_config(
                {**self.client_config, "group.id": self.group_id, "enable.auto.commit": False, "allow.auto.create.topics": False}
            )
        )

    def _committed_in_group(self) -> dict[int, int]:
        consumer = self._consumer()
        try:
            metadata = consumer.list_topics(timeout=10).topics.get(self.topic)
            partitions = sorted(metadata.partitions) if metadata else []
            committed = consumer.committed([TopicPartition(self.topic, p) for p in partitions], timeout=10)
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}

    def _commit_group(self, end_offsets: dict[int, int]) -> None:
        consumer = self._consumer()
        try:
            result = consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(end_offsets.items())], asynchronous=False
            )
        except Exception as exc:
            raise RunFailed(f"committing offsets of group '{self.group_id}' failed: {exc}") from exc
        finally:
            consumer.close()
        failed = [tp for tp in result or [] if tp.error is not None]
        if failed:
            raise RunFailed(f"committing offsets of group '{self.group_id}' failed: {failed}")
