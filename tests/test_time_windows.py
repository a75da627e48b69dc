"""Time windows → offsets: the timestamp rule on an in-memory log (both search paths), the
window mapping that covers every offset exactly once, and end-to-end runs through Dagster with
late and clock-skewed records."""

from __future__ import annotations

import bisect
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import consume_all, consume_raw, create_topic, produce_json, unique_topic
from dagster import DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource

from dpone_dagster.assets.factory import build_manifest_asset
from dpone_dagster.kafka.boundary import Watermarks
from dpone_dagster.kafka.timestamps import boundary_offset
from dpone_dagster.kafka.windows import Window, last_recorded_ends, plan_windows, record_of
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.manifest.loader import ManifestError
from dpone_dagster.resources import KafkaResource, SchemaRegistryResource
from dpone_dagster.state.local import LocalStateStore

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR


class MemoryLog:
    """One partition's records as (offset, timestamp_ms); offsets may have gaps."""

    def __init__(self, records: list[tuple[int, int]]):
        self.records = sorted(records)
        self.offsets = [o for o, _ in self.records]
        self.reads = 0

    @classmethod
    def of(cls, timestamps: list[int]) -> MemoryLog:
        return cls(list(enumerate(timestamps)))

    @property
    def wm(self) -> Watermarks:
        return Watermarks(self.offsets[0] if self.offsets else 0, self.offsets[-1] + 1 if self.offsets else 0)

    def first_at_or_after(self, partition: int, offset: int) -> tuple[int, int] | None:
        self.reads += 1
        i = bisect.bisect_left(self.offsets, offset)
        return self.records[i] if i < len(self.records) else None

    def index_answer(self, ts: int) -> int:
        """What a Kafka broker's timestamp index answers: the first record whose timestamp >= ts."""
        return next((o for o, t in self.records if t >= ts), self.wm.high)


def both_paths(log: MemoryLog, ts: int) -> tuple[int, int]:
    return boundary_offset(log, 0, log.wm, ts, log.index_answer(ts)), boundary_offset(log, 0, log.wm, ts, None)


def minutes(*values: float) -> list[int]:
    return [int(v * MINUTE) for v in values]


def test_ordered_records_follow_the_kafka_index_rule():
    log = MemoryLog.of(minutes(0, 10, 20, 59.99, 60, 70, 130))
    for ts, expected in [(0, 0), (60 * MINUTE, 4), (61 * MINUTE, 5), (120 * MINUTE, 6), (180 * MINUTE, 7)]:
        assert both_paths(log, ts) == (expected, expected) == (log.index_answer(ts), log.index_answer(ts))


def test_a_record_far_ahead_moves_no_boundary():
    """A record stamped a day ahead sits among hour-0 records: the hour-1 boundary stays where the
    records without it put it; the skewed record belongs to the window its offset falls in."""
    plain = MemoryLog.of(minutes(10, 20, 40, 50, 70, 80))
    skewed = MemoryLog.of([*minutes(10, 20), 20 * MINUTE + DAY, *minutes(40, 50, 70, 80)])
    assert both_paths(plain, HOUR) == (4, 4)
    assert both_paths(skewed, HOUR) == (5, 5)  # one offset later: the skewed record stays in hour 0
    assert both_paths(skewed, 2 * HOUR) == (7, 7)
    # Kafka's own index would have ended hour 0 at the skewed record.
    assert skewed.index_answer(HOUR) == 2


def test_a_record_far_behind_moves_no_boundary():
    """Written late, stamped a day back: right after the first hour-1 record, or later."""
    for late_at in (3, 4):
        stamps = minutes(10, 50, 70, 80, 90)
        stamps.insert(late_at, 5 * MINUTE - DAY)
        assert both_paths(MemoryLog.of(stamps), HOUR) == (2, 2)


def test_records_next_to_an_outlier_keep_their_timestamps():
    """Low traffic (20 minutes between records): the records beside a skewed one are not judged by it."""
    log = MemoryLog.of([*minutes(0, 20, 40), 50 * MINUTE + DAY, *minutes(60, 80)])
    assert both_paths(log, HOUR) == (4, 4)
    assert both_paths(log, 40 * MINUTE) == (2, 2)


def test_a_cluster_of_skewed_records_is_not_outvoted():
    log = MemoryLog.of([*minutes(10, 20), DAY, DAY, *minutes(30, 40, 70)])
    assert both_paths(log, HOUR) == (2, 2)  # documented: two outliers in a row count


def test_gaps_and_an_empty_or_exhausted_log():
    log = MemoryLog([(3, 10 * MINUTE), (7, 50 * MINUTE), (8, 70 * MINUTE), (15, 80 * MINUTE)])
    assert both_paths(log, HOUR) == (8, 8)
    assert both_paths(log, 2 * HOUR) == (16, 16)
    empty = MemoryLog([])
    assert boundary_offset(empty, 0, Watermarks(5, 5), HOUR, 5) == 5


def test_an_index_answer_the_records_do_not_confirm_is_ignored():
    """The embedded broker answers from its write times (or 0 for 'none'): the search decides."""
    log = MemoryLog.of(minutes(10, 20, 70, 80))
    assert boundary_offset(log, 0, log.wm, HOUR, 0) == 2
    assert boundary_offset(log, 0, log.wm, HOUR, 3) == 2


@pytest.mark.parametrize("seed", range(40))
def test_index_path_and_search_agree_on_ordered_logs_with_isolated_outliers(seed):
    rng = random.Random(seed)
    timestamps, t = [], 0
    for _ in range(rng.randint(1, 400)):
        t += rng.randint(0, 3 * MINUTE)
        timestamps.append(t)
    # Isolated outliers (never two within two records): far ahead, far behind; and jitter below
    # the tolerance.
    for i in range(1, len(timestamps) - 1, rng.randint(3, 9)):
        timestamps[i] += rng.choice([DAY, -DAY, 3 * DAY, -2 * HOUR, 30_000, -30_000])
    gaps = sorted(rng.sample(range(len(timestamps) * 2), len(timestamps)))  # compaction-like gaps
    log = MemoryLog(list(zip(gaps, timestamps, strict=True)))
    previous = log.wm.low
    for ts in range(0, t + 2 * HOUR, 7 * MINUTE):
        index_path, search = both_paths(log, ts)
        assert index_path == search, (seed, ts)
        assert index_path >= previous  # boundaries never move backwards in time
        previous = index_path


# --------------------------------------------------------------------------- window mapping


def hour(n: int, key: bool = True) -> Window:
    start = datetime(2024, 3, 1, tzinfo=UTC) + timedelta(hours=n)
    return Window(start, start + timedelta(hours=1), start.strftime("%Y-%m-%d-%H:%M") if key else None)


def lookup_in(log: MemoryLog):
    return lambda ms: {0: boundary_offset(log, 0, log.wm, ms, log.index_answer(ms))}


def planned_ranges(planned) -> list[tuple[int, int]]:
    return [(w.ranges[0].start, w.ranges[0].end) for w in planned]


def materialize_windows(log: MemoryLog, windows: list[Window], recorded: dict, run: str) -> dict:
    planned = plan_windows([0], windows, recorded, lookup_in(log))
    new = record_of(tuple(w.as_dict() for w in planned), run)
    for key, entry in new.items():
        recorded.setdefault(key, entry)
    return recorded


def test_a_window_run_before_its_end_edge_existed_leaves_no_gap():
    """Hour 0 is materialized while nothing newer exists (end = the log end then). A late hour-0
    record and hour-1 records follow: hour 1 starts where hour 0 ended and holds the late one."""
    base = datetime(2024, 3, 1, tzinfo=UTC).timestamp() * 1000
    log = MemoryLog.of([int(base + m * MINUTE) for m in (10, 20, 50)])
    recorded = materialize_windows(log, [hour(0)], {}, "r0")
    assert recorded[hour(0).key]["partitions"] == {"0": [0, 3]}
    log = MemoryLog.of([int(base + m * MINUTE) for m in (10, 20, 50, 45, 70, 80)])  # 45: late
    planned = plan_windows([0], [hour(1)], recorded, lookup_in(log))
    assert planned_ranges(planned) == [(3, 6)]
    # Kafka's index would have started hour 1 at offset 4, past the late record.
    assert log.index_answer(int(base + HOUR)) == 4
    # A rerun of hour 0 reads what it read first; the frozen flag says so.
    again = plan_windows([0], [hour(0)], recorded, lookup_in(log))
    assert planned_ranges(again) == [(0, 3)] and again[0].as_dict()["frozen"]


def test_a_never_materialized_window_fits_between_recorded_neighbours():
    base = datetime(2024, 3, 1, tzinfo=UTC).timestamp() * 1000
    log = MemoryLog.of([int(base + m * MINUTE) for m in (10, 70, 75, 130, 190, 200)])
    recorded = materialize_windows(log, [hour(0)], {}, "r0")
    recorded = materialize_windows(log, [hour(2)], recorded, "r2")
    assert planned_ranges(plan_windows([0], [hour(1)], recorded, lambda ms: pytest.fail("no lookup needed"))) == [(1, 3)]
    # Planned together with recorded windows, a range shares their edges.
    together = plan_windows([0], [hour(0), hour(1), hour(2), hour(3)], recorded, lookup_in(log))
    assert planned_ranges(together) == [(0, 1), (1, 3), (3, 4), (4, 6)]
    assert last_recorded_ends(recorded) == {0: 4}


def test_windows_without_partition_keys_are_looked_up_and_not_recorded():
    base = datetime(2024, 3, 1, tzinfo=UTC).timestamp() * 1000
    log = MemoryLog.of([int(base + m * MINUTE) for m in (10, 70)])
    planned = plan_windows([0], [hour(0, key=False)], {}, lookup_in(log))
    assert record_of(tuple(w.as_dict() for w in planned), "cli") == {}


@pytest.mark.parametrize("seed", range(30))
def test_every_offset_belongs_to_exactly_one_window_whatever_the_order_of_runs(seed):
    """Records arrive over time (late and skewed ones among them); windows are materialized in a
    random order at random moments, some twice. Once all are materialized, the recorded ranges
    tile the log from the first window's start: no offset is read twice or never."""
    rng = random.Random(seed)
    base = int(datetime(2024, 3, 1, tzinfo=UTC).timestamp() * 1000)
    timestamps: list[int] = []
    recorded: dict = {}
    hours = list(range(8))
    pending = set(hours)
    now = 0
    while pending:
        for _ in range(rng.randint(0, 30)):
            now += rng.randint(0, 4 * MINUTE)
            stamp = now + rng.choice([0] * 8 + [-rng.randint(1, 3) * HOUR, DAY])  # late or skewed
            timestamps.append(base + max(0, stamp))
        log = MemoryLog.of(timestamps)
        closed = [h for h in hours if (h + 1) * HOUR <= now]
        if closed:
            first = rng.choice(closed)
            span = [h for h in range(first, first + rng.randint(1, 3)) if h in closed]
            recorded = materialize_windows(log, [hour(h) for h in span], recorded, f"run{len(recorded)}")
            pending -= set(span)
        if now > 20 * HOUR:
            for h in sorted(pending):
                recorded = materialize_windows(log, [hour(h)], recorded, "last")
            pending = set()
    ranges = [tuple(recorded[hour(h).key]["partitions"]["0"]) for h in hours]
    for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert end == start, (seed, ranges)
    assert all(start <= end for start, end in ranges)


# --------------------------------------------------------------------------- end to end


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def manifest_text(src: str, dst: str, state: Path, late: str = "", options: str = "") -> str:
    return f"""
name: windows_{src}
source:
  type: kafka
  connection_id: kafka_cluster
  topic: {src}
  options:
    read_mode: time_window
    partitions: {{granularity: hourly, start: "2024-03-01T00:00:00"{late}}}
{options}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: {dst}
state: {{type: local, path: {state}}}
"""


def resources():
    return {
        "pyspark": LazyPySparkResource(spark_config={"spark.master": "local[2]"}),
        "kafka": KafkaResource(),
        "schema_registry": SchemaRegistryResource(),
    }


def run_window(instance, asset, key: str, raise_on_error: bool = True):
    result = materialize([asset], instance=instance, resources=resources(), partition_key=key, raise_on_error=raise_on_error)
    if not result.success:
        return result, None
    event = instance.get_latest_materialization_event(asset.key)
    assert event.dagster_event.partition == key
    return result, event.asset_materialization.metadata


def ids_in(bs: str, topic: str) -> list[str]:
    return sorted(r["value"]["id"] for r in consume_all(bs, topic))


H0, H1 = "2024-03-01-00:00", "2024-03-01-01:00"


@pytest.mark.parametrize("skewed", [False, True], ids=["late", "late_and_skewed"])
def test_late_and_skewed_records_are_delivered_exactly_once(broker, spark, kafka_env, tmp_path, skewed):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("wsrc"), unique_topic("wdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    asset = build_manifest_asset(parse_manifest(manifest_text(src, dst, tmp_path)))
    instance = DagsterInstance.ephemeral()
    produce_json(bs, src, [{"id": i} for i in ("a", "b", "c")], partition=0,
                 timestamps=[ms("2024-03-01T00:10:00"), ms("2024-03-01T00:20:00"), ms("2024-03-01T00:50:00")])
    _, first = run_window(instance, asset, H0)
    assert first["offset_ranges_by_partition"].value[H0] == [{"partition": 0, "start": 0, "end": 3}]
    assert first["late_records"].value == 0

    # After hour 0 was materialized: a record stamped inside it, then hour-1 records (and, in the
    # second case, one stamped a day ahead among them, which must not move hour 1's edges).
    later = [("late", "2024-03-01T00:45:00"), ("d", "2024-03-01T01:10:00")]
    if skewed:
        later.append(("skewed", "2024-03-02T01:15:00"))
    later += [("e", "2024-03-01T01:20:00"), ("f", "2024-03-01T01:50:00"), ("g", "2024-03-01T02:05:00")]
    produce_json(bs, src, [{"id": i} for i, _ in later], partition=0, timestamps=[ms(t) for _, t in later])
    _, second = run_window(instance, asset, H1)
    end = 8 if skewed else 7
    assert second["offset_ranges_by_partition"].value[H1] == [{"partition": 0, "start": 3, "end": end}]
    assert second["late_records"].value == 1
    expected = ["a", "b", "c", "d", "e", "f", "late"] + (["skewed"] if skewed else [])
    assert ids_in(bs, dst) == sorted(expected)  # every record once; g waits for hour 2

    # A backfill of hour 0 after hour 1 reads the identical ranges (and so the same records).
    _, again = run_window(instance, asset, H0)
    assert again["offset_ranges_by_partition"].value == first["offset_ranges_by_partition"].value
    assert again["frozen_partition_keys"].value == [H0]
    assert ids_in(bs, dst) == sorted([*expected, "a", "b", "c"])
    # The state store holds the same frozen ranges.
    windows = LocalStateStore(str(tmp_path)).load_windows(src, f"dpone.windows_{src}")
    assert windows["2024-03-01T00:00:00+00:00"]["partitions"] == {"0": [0, 3]}
    assert windows["2024-03-01T01:00:00+00:00"]["partitions"] == {"0": [3, end]}


def test_late_records_fail_policy_stops_the_run_before_publishing(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("wsrc"), unique_topic("wdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    asset = build_manifest_asset(parse_manifest(manifest_text(src, dst, tmp_path, ", late_records: fail")))
    instance = DagsterInstance.ephemeral()
    produce_json(bs, src, [{"id": "a"}], partition=0, timestamps=[ms("2024-03-01T00:10:00")])
    run_window(instance, asset, H0)
    produce_json(bs, src, [{"id": "late"}, {"id": "d"}], partition=0,
                 timestamps=[ms("2024-03-01T00:45:00"), ms("2024-03-01T01:10:00")])
    result, _ = run_window(instance, asset, H1, raise_on_error=False)
    assert not result.success
    failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "1 late record(s)" in failure.event_specific_data.error.message
    assert ids_in(bs, dst) == ["a"]  # nothing of hour 1 was produced
    windows = LocalStateStore(str(tmp_path)).load_windows(src, f"dpone.windows_{src}")
    assert list(windows) == ["2024-03-01T00:00:00+00:00"]  # hour 1 recorded nothing


def test_dead_letter_for_late_records_needs_a_dead_letter_topic(tmp_path):
    with pytest.raises(ManifestError, match="late_records: dead_letter needs source.options.dead_letter"):
        parse_manifest(manifest_text("s", "d", tmp_path, ", late_records: dead_letter"))


def test_late_records_dead_letter_policy_sends_them_with_the_run_output(broker, spark, kafka_env, tmp_path):
    """Late records leave the sink batch and reach the dead-letter topic once, with a reason; a run
    stopped by a pre-publish gate sends none of them."""
    bs = broker.bootstrap_servers
    src, dst, dlq = unique_topic("wsrc"), unique_topic("wdst"), unique_topic("wdlq")
    for topic in (src, dst, dlq):
        create_topic(bs, topic, 1)
    text = manifest_text(src, dst, tmp_path, ", late_records: dead_letter", f"    dead_letter: {{topic: {dlq}}}")
    manifest = parse_manifest(text)
    gated = parse_manifest(text + "quality:\n  mode: fail\n  checks:\n    - {type: min_rows, threshold: 1000}\n")
    instance = DagsterInstance.ephemeral()
    produce_json(bs, src, [{"id": "a"}], partition=0, timestamps=[ms("2024-03-01T00:10:00")])
    run_window(instance, build_manifest_asset(manifest), H0)
    produce_json(bs, src, [{"id": "late"}, {"id": "d"}], partition=0,
                 timestamps=[ms("2024-03-01T00:45:00"), ms("2024-03-01T01:10:00")])

    failed, _ = run_window(instance, build_manifest_asset(gated), H1, raise_on_error=False)
    assert not failed.success
    assert consume_all(bs, dlq) == [] and ids_in(bs, dst) == ["a"]  # the gate stopped everything

    _, metadata = run_window(instance, build_manifest_asset(manifest), H1)
    assert metadata["late_records"].value == 1
    assert ids_in(bs, dst) == ["a", "d"]
    [letter] = consume_raw(bs, dlq)
    assert json.loads(letter["value"]) == {"id": "late"}
    headers = dict(letter["headers"])
    assert headers["dpone.error.source.offset"] == b"1"
    assert headers["dpone.error.reason"].startswith(b"late record: timestamp 2024-03-01T00:45:00")


def test_default_allowed_lateness_is_five_minutes(tmp_path):
    settings = parse_manifest(manifest_text("s", "d", tmp_path)).source.options.partitions
    assert settings.allowed_lateness_seconds == 300 and settings.late_records == "next_window"


def test_lag_of_a_time_window_source_counts_from_the_last_materialized_window(broker, spark, kafka_env, tmp_path):
    from dpone_dagster.engine.lag import source_lag

    bs = broker.bootstrap_servers
    src, dst = unique_topic("wsrc"), unique_topic("wdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    manifest = parse_manifest(manifest_text(src, dst, tmp_path))
    produce_json(bs, src, [{"id": i} for i in "abcd"], partition=0,
                 timestamps=[ms("2024-03-01T00:10:00"), ms("2024-03-01T00:20:00"), ms("2024-03-01T01:10:00"), ms("2024-03-01T02:10:00")])
    assert source_lag(manifest, {"bootstrap.servers": bs}).new_messages == 4
    run_window(DagsterInstance.ephemeral(), build_manifest_asset(manifest), H0)
    lag = source_lag(manifest, {"bootstrap.servers": bs})
    assert lag.stored == {0: 2} and lag.new_messages == 2
    assert json.loads(json.dumps(lag.as_dict()))["stored_offsets"] == {"0": 2}
