"""Boundary correctness against the embedded broker: the end is verified, fixed before reading,
and a range that cannot be read to its end fails the run without storing anything."""

from __future__ import annotations

import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic

from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka import inspect
from dpone_dagster.kafka.boundary import (
    Boundary,
    PartitionRange,
    Watermarks,
    cap_total_records,
    plan_offset_ranges,
    split_into_tasks,
)
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.sources.kafka import KafkaBatchSource
from dpone_dagster.state.local import LocalStateStore


def _manifest(src: str, dst: str, state: str) -> str:
    return f"""
name: boundary
source: {{type: kafka, connection_id: kafka_cluster, topic: {src}, options: {{group_id: g_{src}, max_empty_polls: 2, poll_timeout_ms: 200}}}}
sink: {{type: kafka, connection_id: kafka_cluster, topic: {dst}}}
state: {{type: local, path: {state}}}
"""


class UnderReporting:
    """A consumer whose ListOffsets answer is the base offset of the last batch + 1, as the
    embedded broker answers for one batch; fetches (and the watermarks they carry) are real."""

    def __init__(self, consumer):
        self._consumer = consumer
        self.reported: list[tuple[int, int]] = []

    def get_watermark_offsets(self, partition, timeout=None, cached=False):
        if cached:
            return self._consumer.get_watermark_offsets(partition, cached=True)
        low, _ = self._consumer.get_watermark_offsets(partition, timeout=timeout)
        self.reported.append((low, 1))
        return low, 1

    def __getattr__(self, name):
        return getattr(self._consumer, name)


def test_under_reported_high_watermark_is_corrected_by_a_fetch(broker):
    """One producer batch of 3000 records; ListOffsets says 1 (on the embedded broker itself, or
    through a consumer that answers like it on brokers that report correctly)."""
    bs = broker.bootstrap_servers
    topic = unique_topic("wm")
    create_topic(bs, topic, 1)
    produce_json(bs, topic, [{"i": i} for i in range(3000)], partition=0, linger_ms=500)
    consumer = UnderReporting(inspect.make_consumer({"bootstrap.servers": bs}, "wm-check"))
    try:
        verified = inspect.verified_watermarks(consumer, topic, [0])
    finally:
        consumer.close()
    assert consumer.reported == [(0, 1)]  # the under-report was what verification started from
    assert verified == {0: Watermarks(0, 3000)}


def test_messages_produced_during_the_run_wait_for_the_next_run(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("src"), unique_topic("dst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"n": i} for i in range(10)], partition=0)

    def log(message: str) -> None:
        if message.startswith("plan: ") and "offsets" in message:  # boundary fixed; now more arrive
            produce_json(bs, src, [{"n": i} for i in range(10, 15)], partition=0)

    manifest = parse_manifest(_manifest(src, dst, str(tmp_path)))
    first = run_pipeline(manifest, spark, RunRequest(log=log))
    assert first.rows_extracted == 10 and first.committed_offsets == {0: 10}
    second = run_pipeline(manifest, spark)
    assert second.rows_extracted == 5 and second.committed_offsets == {0: 15}
    assert sorted(r["value"]["n"] for r in consume_all(bs, dst)) == list(range(15))


def test_a_range_not_read_to_its_planned_end_fails_and_stores_nothing(broker, spark, kafka_env, tmp_path, monkeypatch):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("src"), unique_topic("dst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"n": i} for i in range(10)], partition=0)
    planned = KafkaBatchSource.plan

    def plan_past_the_end(self, stored, window=None, recorded=None):
        boundary = planned(self, stored, window, recorded)
        return Boundary(boundary.topic, boundary.method, (PartitionRange(0, 0, 13),))  # 3 offsets do not exist

    monkeypatch.setattr(KafkaBatchSource, "plan", plan_past_the_end)
    manifest = parse_manifest(_manifest(src, dst, str(tmp_path)))
    with pytest.raises(RunFailed, match=r"stopped at offset 10, planned end 13"):
        run_pipeline(manifest, spark)
    assert consume_all(bs, dst) == []
    store = LocalStateStore(str(tmp_path))
    assert store.load_offsets(src, f"g_{src}") == {}
    assert store.list_runs("boundary")[0].status == "failed"


# --------------------------------------------------------------------------- pure planning


def test_plan_offset_ranges_from_stored_earliest_latest():
    wm = {0: Watermarks(0, 100), 1: Watermarks(20, 50)}
    assert plan_offset_ranges("t", wm, {0: 40}, "stored").ranges == (PartitionRange(0, 40, 100), PartitionRange(1, 20, 50))
    assert plan_offset_ranges("t", wm, {0: 40}, "earliest").ranges == (PartitionRange(0, 0, 100), PartitionRange(1, 20, 50))
    assert plan_offset_ranges("t", wm, {0: 40}, "latest").total == 0


def test_stored_offset_outside_the_log_is_refused_with_the_fix():
    with pytest.raises(RunFailed, match="below the log start offset 20 .*dpone state reset"):
        plan_offset_ranges("t", {0: Watermarks(20, 50)}, {0: 5}, "stored")
    with pytest.raises(RunFailed, match="beyond the high watermark 50"):
        plan_offset_ranges("t", {0: Watermarks(0, 50)}, {0: 60}, "stored")


def test_max_records_is_shared_fairly_and_deterministically():
    boundary = Boundary("t", "offsets", (PartitionRange(0, 0, 2), PartitionRange(1, 10, 100), PartitionRange(2, 5, 100)))
    capped = cap_total_records(boundary, 50)
    assert capped.ranges == (PartitionRange(0, 0, 2), PartitionRange(1, 10, 34), PartitionRange(2, 5, 29))
    assert capped.total == 50
    assert cap_total_records(boundary, 1000).ranges == boundary.ranges


def test_ranges_split_into_bounded_tasks():
    boundary = Boundary("t", "offsets", (PartitionRange(0, 0, 25), PartitionRange(1, 7, 7), PartitionRange(2, 3, 13)))
    tasks = split_into_tasks(boundary, 10)
    assert [(t.partition, t.start, t.end) for t in tasks] == [(0, 0, 10), (0, 10, 20), (0, 20, 25), (2, 3, 13)]
    assert [t.task_id for t in tasks] == [0, 1, 2, 3]
