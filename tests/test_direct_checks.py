"""Row-level quality checks on the direct path (quality/arrow_checks.py): measured in the tasks,
judged on the driver before anything is produced, with the results the Spark SQL path gives on
the same batch (counts, descriptions, sample rows), de-duplicated records taken out of the rows
as published."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import spark_sql_golden
from conftest import consume_raw, create_topic, produce_json, unique_topic
from spark_sql_golden import any_sample, on_both_paths
from test_direct_path import manifest_text

from dpone_dagster.engine.run import RunRequest, run_pipeline
from dpone_dagster.errors import DataRefused
from dpone_dagster.manifest import parse_manifest
from dpone_dagster.manifest.models import (
    AcceptedValuesCheck,
    FreshnessCheck,
    GreatExpectationsCheck,
    NotNullCheck,
    UniqueCheck,
)
from dpone_dagster.quality import arrow_checks
from dpone_dagster.quality.arrow_checks import Tally
from dpone_dagster.state.local import LocalStateStore

SCHEMA = pa.schema([("id", pa.int64()), ("status", pa.string()), ("seen", pa.string())])


def batch(rows: list[dict[str, Any]]) -> list[pa.Array]:
    table = pa.Table.from_pylist(rows, SCHEMA)
    return [table.column(i).combine_chunks() for i in range(table.num_columns)]


def measure(checks: tuple, tally: Tally, rows: list[dict[str, Any]], partition: int, first_offset: int, deletes: list[bool] | None = None, skip: bool = False) -> None:
    n = len(rows)
    is_delete = pa.array(deletes or [False] * n)
    arrow_checks.measure(
        checks, tally, batch(rows), SCHEMA.names, is_delete, is_delete if skip else None, partition,
        pa.array(range(first_offset, first_offset + n), pa.int64()), pa.array([1_000 * (first_offset + i) for i in range(n)], pa.int64()),
    )


def test_counts_samples_and_losers_taken_out_of_the_published_rows():
    checks = arrow_checks.row_checks(
        [NotNullCheck(type="not_null", columns=["status", "seen"]), AcceptedValuesCheck(type="accepted_values", column="status", values=["new", "paid", None])],
        SCHEMA,
        ("id",),
    )
    assert [c.index for c in checks] == [0, 1]
    tally = Tally()
    measure(checks, tally, [{"id": 1, "status": None, "seen": "x"}, {"id": 2, "status": "lost", "seen": None}, {"id": 3, "status": "new", "seen": "y"}], 0, 10)
    other = Tally()
    measure(checks, other, [{"id": 4, "status": None, "seen": "z"}, {"id": 5, "status": None, "seen": "z"}], 1, 0, deletes=[False, True])
    tally.add(other)
    extracted = arrow_checks.measured(checks, tally, "extracted", {})
    assert extracted.counts == {}  # both checks judge the published rows
    published = arrow_checks.measured(checks, tally, "published", {})
    # The delete in partition 1 carries no payload: not counted.
    assert published.counts == {("null", 0, "status"): 2, ("null", 0, "seen"): 1, ("outside", 1): 1}
    assert [r["id"] for r in published.samples[0]] == [1, 2, 4]
    # Partition 0 offset 10 and partition 1 offset 0 were left out by de-duplication.
    # Their sample rows are read again where they are: the tasks kept only their first few.
    deduped = arrow_checks.measured(checks, tally, "published", {0: np.array([10]), 1: np.array([0])}, lambda at: [{"at": a} for a in at])
    assert deduped.counts == {("null", 0, "status"): 0, ("null", 0, "seen"): 1, ("outside", 1): 1}
    assert deduped.samples[0] == ({"at": (0, 11)},) and deduped.samples[1] == ({"at": (0, 11)},)


def test_freshness_takes_the_newest_value_left_and_says_when_it_cannot():
    checks = arrow_checks.row_checks(
        [FreshnessCheck(type="freshness", max_age_seconds=60), FreshnessCheck(type="freshness", column="seen", max_age_seconds=60, stage="extracted")], SCHEMA, ("id",)
    )
    tally = Tally()
    rows = [{"id": i, "status": "new", "seen": f"2024-01-0{1 + i % 9}T00:00:00"} for i in range(200)]
    measure(checks, tally, rows, 0, 0)
    assert arrow_checks.measured(checks, tally, "published", {}).newest[0] == 199 * 1_000_000
    assert arrow_checks.measured(checks, tally, "extracted", {}).newest[1] == 1_704_758_400_000_000  # 2024-01-09: i % 9 == 8
    # The newest left out: the next one is among the kept values.
    assert arrow_checks.measured(checks, tally, "published", {0: np.array([199])}).newest[0] == 198 * 1_000_000
    # Every kept value left out: the newest left cannot be told from what was kept; the check is
    # left to Spark SQL on the decoded rows.
    every = {0: np.arange(200 - arrow_checks.NEWEST_KEPT, 200)}
    assert arrow_checks.measured(checks, tally, "published", every).checks == set()


def test_freshness_texts_are_read_as_spark_casts_them_or_left_unsettled():
    """With a zone, its instant; without one (a time or a date), a wall time in UTC; both kinds in
    one column, each its own way. A text Arrow does not read is not guessed at."""
    texts = pa.array(["2024-01-15T10:00:00", "2024-02-15T10:00:00+02:00", None, "2024-03-15T10:00:00Z", "2024-03-15 10:00:00.5-0130", "2024-04-01"])
    micros = arrow_checks._micros(texts).to_pylist()
    assert micros == [1_705_312_800_000_000, 1_707_984_000_000_000, None, 1_710_496_800_000_000, 1_710_502_200_500_000, 1_711_929_600_000_000]
    with pytest.raises(arrow_checks.Unsettled):
        arrow_checks._micros(pa.array(["2024-01-15T10:00:00", "not a time", "2024-01-15T10:00:00Z"]))


def test_skipped_deletes_count_for_an_extracted_freshness_only():
    checks = arrow_checks.row_checks(
        [FreshnessCheck(type="freshness", max_age_seconds=60), FreshnessCheck(type="freshness", max_age_seconds=60, stage="extracted")], SCHEMA
    )
    tally = Tally()
    measure(checks, tally, [{"id": 1}, {"id": 2}], 0, 0, deletes=[False, True], skip=True)
    assert arrow_checks.measured(checks, tally, "published", {}).newest[0] == 0
    assert arrow_checks.measured(checks, tally, "extracted", {}).newest[1] == 1_000_000


def test_too_many_offending_rows_with_repeated_keys_are_unsettled(monkeypatch):
    monkeypatch.setattr(arrow_checks, "POSITIONS_KEPT", 3)
    checks = arrow_checks.row_checks([NotNullCheck(type="not_null", columns=["status"])], SCHEMA, ("id",))
    tally = Tally()
    measure(checks, tally, [{"id": i} for i in range(5)], 0, 0)
    assert arrow_checks.measured(checks, tally, "published", {}).counts == {("null", 0, "status"): 5}
    # Offending rows a task did not keep may be among those de-duplication leaves out.
    assert arrow_checks.measured(checks, tally, "published", {0: np.array([4])}).checks == set()


def test_what_the_tasks_cannot_measure_as_spark_sql_would_is_left_to_spark():
    def measured(check: Any, schema: pa.Schema = SCHEMA, key: tuple[str, ...] = ()) -> bool:
        return bool(arrow_checks.row_checks([check], schema, key))

    # unique: only on the columns each message's key is made of (every key is published once).
    assert not measured(UniqueCheck(type="unique", columns=["id"]))
    assert measured(UniqueCheck(type="unique", columns=["id"]), key=("id",))
    assert not measured(UniqueCheck(type="unique", columns=["id"], stage="extracted"), key=("id",))
    assert not measured(UniqueCheck(type="unique", columns=["status"]), key=("id",))
    assert not measured(NotNullCheck(type="not_null", columns=["nope"]))
    assert not measured(AcceptedValuesCheck(type="accepted_values", column="id", values=["1"]))
    assert not measured(AcceptedValuesCheck(type="accepted_values", column="id", values=[True]))
    assert measured(AcceptedValuesCheck(type="accepted_values", column="id", values=[1, None]))
    assert not measured(FreshnessCheck(type="freshness", column="id", max_age_seconds=1))
    assert not measured(AcceptedValuesCheck(type="accepted_values", column="id", values=[2**63]))
    assert not measured(GreatExpectationsCheck(type="great_expectations", expectation_type="expect_table_row_count_to_equal", kwargs={"value": 1}))
    floats = pa.schema([("x", pa.float64()), ("id", pa.int64())])
    assert not measured(AcceptedValuesCheck(type="accepted_values", column="x", values=[2**53 + 1]), floats)
    # Every NaN is one value to Spark, not to Arrow's is_in (bit for bit): an accepted NaN is Spark's.
    assert measured(AcceptedValuesCheck(type="accepted_values", column="x", values=[1.5]), floats)
    assert not measured(AcceptedValuesCheck(type="accepted_values", column="x", values=[1.5, float("nan")]), floats)
    # Spark groups 0.0 and -0.0 as one value, while their keys differ: no shortcut on a double key.
    assert not measured(UniqueCheck(type="unique", columns=["id", "x"]), floats, ("id", "x"))
    # Text and dates are read in the session's zone and calendar: Spark's, unless ISO-8601 in UTC.
    times = pa.schema([("seen", pa.string()), ("day", pa.date32()), ("at", pa.timestamp("us", "UTC"))])
    for column in ("seen", "day", "at"):
        check = FreshnessCheck(type="freshness", column=column, max_age_seconds=60)
        assert bool(arrow_checks.row_checks([check], times, (), iso_times=True))
        assert bool(arrow_checks.row_checks([check], times, (), iso_times=False)) == (column == "at"), column


def test_accepted_values_and_not_null_compare_as_spark_does():
    schema = pa.schema([("x", pa.float64())])
    checks = arrow_checks.row_checks(
        [AcceptedValuesCheck(type="accepted_values", column="x", values=[0.0, 1.5]), NotNullCheck(type="not_null", columns=["x", "x"])], schema
    )
    tally = Tally()
    arrow_checks.measure(
        checks, tally, [pa.array([-0.0, 0.0, 1.5, 2.0, None])], ["x"], pa.array([False] * 5), None, 0, pa.array(range(5), pa.int64()), pa.array([0] * 5, pa.int64())
    )
    # -0.0 is accepted as 0.0; a column named twice counts its nulls once.
    assert arrow_checks.measured(checks, tally, "published", {}).counts == {("outside", 0): 1, ("null", 1, "x"): 1}


# --------------------------------------------------------------------------- both paths, one batch


def comparable(gate: dict[str, Any]) -> dict[str, Any]:
    """A gate without what depends on the moment it ran (a freshness age) or on the order Spark's
    tasks ran in (which failing rows make the sample)."""
    gate = any_sample(gate)
    if gate["check_type"] != "freshness":
        return gate
    return {**gate, "observed": None, "description": gate["description"].split(", ")[0]}


def run_on_both(
    bs: str, spark: Any, src: str, tmp_path: Path, monkeypatch: Any, strategy: str, quality: str, sink_options: str = "", source_options: str = ""
) -> tuple[Any, Any]:
    def run(path: str, dst: str) -> Any:
        create_topic(bs, dst, 2)
        text = manifest_text(src, dst, tmp_path / path, strategy, sink_options, quality=f"quality:\n{quality}")
        if source_options:
            text = text.replace("options: {group_id:", f"options: {{{source_options}, group_id:")
        return run_pipeline(parse_manifest(text), spark, RunRequest(run_id=spark_sql_golden.run_id()) if path == "spark_sql" else RunRequest())

    both = on_both_paths(monkeypatch, tmp_path, run, {"dst": "c"}, src=src)
    return both["direct"], both["spark_sql"]


WARN_CHECKS = """  mode: warn
  checks:
    - {type: not_null, columns: [status, amount]}
    - {type: not_null, columns: [status], stage: extracted}
    - {type: accepted_values, column: status, values: [new, paid]}
    - {type: accepted_values, column: amount, values: [1.5, 2, null]}
    - {type: freshness, max_age_seconds: 60}
    - {type: freshness, column: seen, max_age_seconds: 60, stage: extracted}
    - {type: min_rows, threshold: 10}
    - {type: unique, columns: [order_id]}
"""


def test_the_checks_judge_what_the_spark_sql_path_judges(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Keys repeat across partitions, and the records keep_last leaves out hold nulls and values
    outside the accepted ones: the published rows' results must not count them."""
    bs = broker.bootstrap_servers
    src = unique_topic("csrc")
    create_topic(bs, src, 2)
    for p in range(2):
        rows = [
            {
                "order_id": i % 40,
                "status": [None, "new", "paid", "lost"][i % 4] if i < 40 or p == 1 else "new",
                "amount": [1.5, 2.0, None, 3.25][(i + p) % 4],
                "seen": f"2024-0{1 + i % 9}-15T10:00:00",
                "nested": {"a": i, "tags": [f"t{i}"]},
            }
            for i in range(60)
        ]
        produce_json(bs, src, rows, partition=p, timestamps=[1_700_000_000_000 + 1_000 * i + p for i in range(60)])
    direct, sql = run_on_both(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", WARN_CHECKS)
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql"
    assert direct.duplicates_removed == sql.duplicates_removed == 80
    for d, s in zip(direct.gates, sql.gates, strict=True):
        assert comparable(d) == comparable(s), (d, s)
    by_name = {g["name"]: g for g in direct.gates}
    # 25 null statuses were read; the 40 records kept (the last of each key, all in partition 1) hold 10.
    assert by_name["not_null_status_extracted"]["observed"] == 25
    published = by_name["not_null_status_amount"]
    assert published["description"].startswith("null values (status: 10, ") and len(published["failing_sample"]) == 5


def test_a_failing_check_stops_the_direct_path_before_anything_is_produced(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("csrc"), unique_topic("cdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": i, "status": "new" if i != 7 else "lost"} for i in range(20)], partition=0)
    quality = "  mode: fail\n  checks: [{type: accepted_values, column: status, values: [new]}]"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, "{mode: incremental_append, unique_key: order_id}", quality=f"quality:\n{quality}"))
    with pytest.raises(DataRefused, match="1 row"):
        run_pipeline(manifest, spark)
    assert consume_raw(bs, dst) == []
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{dst}") == {}


def test_records_without_their_key_count_before_de_duplication_only(broker, spark, kafka_env, tmp_path, monkeypatch):
    """Upserts without their unique key are bad records: the extracted checks see them, the
    published ones do not, on both paths."""
    bs = broker.bootstrap_servers
    src = unique_topic("csrc")
    create_topic(bs, src, 1)
    produce_json(bs, src, [{"order_id": i if i % 10 else None, "status": None if i % 5 == 0 else "new"} for i in range(60)], partition=0)
    quality = """  mode: warn
  checks:
    - {type: not_null, columns: [status]}
    - {type: not_null, columns: [status], stage: extracted}
"""
    direct, sql = run_on_both(
        bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}", quality,
        source_options="on_error: skip",
    )
    assert direct.execution_path == "direct" and direct.rows_skipped == sql.rows_skipped == 6
    assert [comparable(g) for g in direct.gates] == [comparable(g) for g in sql.gates]
    assert [g["observed"] for g in direct.gates] == [12, 6]  # extracted: every fifth; published: not the keyless


SPARK_CHECKS = """  mode: warn
  checks:
    - {type: unique, columns: [status]}
    - {type: unique, columns: [order_id], stage: extracted}
    - {type: accepted_values, column: amount, values: ["1.5"]}
    - {type: not_null, columns: [status]}
    - {type: great_expectations, expectation_type: expect_column_values_to_be_between, kwargs: {column: amount, min_value: 0, max_value: 3}}
    - {type: great_expectations, expectation_type: expect_table_row_count_to_equal, kwargs: {value: 120}, stage: extracted}
    - {type: great_expectations, expectation_type: expect_column_values_to_be_unique, kwargs: {column: order_id}}
    - {type: great_expectations, expectation_type: expect_table_column_count_to_equal, kwargs: {value: 13}}
"""


@pytest.mark.parametrize("rows", ["kept by the scan", "read again"])
def test_checks_spark_sql_judges_run_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch, rows):
    """Great Expectations, `unique` off the message key and a check the tasks do not measure are
    judged by Spark SQL on the decoded rows: the Spark SQL path's results, records keep_last and
    the bad-record policy leave out taken out of the rows as published, and the run still takes
    the direct path. The rows come from the files the scan kept them in — the checks' tasks are
    given a broker that does not answer, so a second read of the topic would find nothing and
    send the batch to the Spark SQL path — or, where a task finds no file, read again."""
    from dpone_dagster.engine import direct_checks

    if rows == "read again":
        monkeypatch.setattr(direct_checks, "keeps_rows", lambda *_: False)
    else:
        real = direct_checks.kafka_rows

        def without_the_broker(spark: Any, jobs: Any, settings: Any, *args: Any) -> Any:
            config = {**settings.reader.client_config, "bootstrap.servers": "127.0.0.1:9"}
            return real(spark, jobs, replace(settings, reader=replace(settings.reader, client_config=config)), *args)

        monkeypatch.setattr(direct_checks, "kafka_rows", without_the_broker)
    bs = broker.bootstrap_servers
    src = unique_topic("csrc")
    create_topic(bs, src, 2)
    for p in range(2):
        rows = [
            {"order_id": i % 40 if i % 13 else None, "status": ["new", "paid", None][i % 3], "amount": [1.5, 2.0, None, 3.25][(i + p) % 4]}
            for i in range(60)
        ]
        produce_json(bs, src, rows, partition=p, timestamps=[1_700_000_000_000 + 1_000 * i + p for i in range(60)])
    strategy = "{mode: incremental_merge, unique_key: order_id, duplicate_policy: keep_last}"
    direct, sql = run_on_both(bs, spark, src, tmp_path, monkeypatch, strategy, SPARK_CHECKS, source_options="on_error: skip")
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql", direct.notes
    assert direct.duplicates_removed == sql.duplicates_removed and direct.rows_skipped == sql.rows_skipped == 10
    assert [comparable(g) for g in direct.gates] == [comparable(g) for g in sql.gates]
    observed = {g["name"]: (g["passed"], g["observed"]) for g in direct.gates}
    # 120 records, 10 without their key (skipped), 38 keys kept once each (keep_last).
    assert observed == {
        "unique_order_id_extracted": (False, 38),
        "ge_expect_table_row_count_to_equal_extracted": (True, 120),
        "unique_status": (False, 2),
        "accepted_values_amount": (False, 19),  # a string value for a double column: Spark SQL compares
        "not_null_status": (False, 13),
        "ge_expect_column_values_to_be_between_amount": (False, 9),
        "ge_expect_column_values_to_be_unique_order_id": (True, 0),
        "ge_expect_table_column_count_to_equal": (False, 15),  # the Spark SQL path's decoded columns
    }


def test_a_failing_expectation_stops_the_direct_path_before_anything_is_produced(broker, spark, kafka_env, tmp_path):
    bs = broker.bootstrap_servers
    src, dst = unique_topic("csrc"), unique_topic("cdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": i, "amount": 10 * i} for i in range(20)], partition=0)
    quality = (
        "  mode: fail\n  checks: [{type: great_expectations, expectation_type: expect_column_values_to_be_between,"
        " kwargs: {column: amount, min_value: 0, max_value: 100}}]"
    )
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, "{mode: incremental_append, unique_key: order_id}", quality=f"quality:\n{quality}"))
    with pytest.raises(DataRefused, match="9 unexpected value"):
        run_pipeline(manifest, spark)
    assert consume_raw(bs, dst, timeout_s=5) == []
    assert LocalStateStore(str(tmp_path)).load_offsets(src, f"g_{dst}") == {}


def test_a_batch_that_reads_again_otherwise_goes_to_the_spark_sql_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """The rows read again for the checks must be those the scan read (a topic compacted in
    between holds fewer): when the count differs, the Spark SQL path judges and produces the
    batch from one read. The mismatch is simulated by expecting one record more (no broker here
    compacts a topic on demand)."""
    from dpone_dagster.engine import direct_checks

    real = direct_checks.kafka_rows
    monkeypatch.setattr(direct_checks, "kafka_rows", lambda *args: real(*args[:-1], args[-1] + 1))
    bs = broker.bootstrap_servers
    src, dst = unique_topic("csrc"), unique_topic("cdst")
    create_topic(bs, src, 1)
    create_topic(bs, dst, 1)
    produce_json(bs, src, [{"order_id": i, "amount": i} for i in range(20)], partition=0)
    quality = "  mode: fail\n  checks: [{type: unique, columns: [amount]}]"
    manifest = parse_manifest(manifest_text(src, dst, tmp_path, "{mode: incremental_append, unique_key: order_id}", quality=f"quality:\n{quality}"))
    result = run_pipeline(manifest, spark)
    assert result.execution_path == "spark_sql" and any("holds 20 record(s), not the 21" in n for n in result.notes), result.notes
    assert sorted(r["key"] for r in consume_raw(bs, dst)) == sorted(str(i).encode() for i in range(20))


def test_freshness_of_texts_with_and_without_a_zone_is_judged_on_the_direct_path(broker, spark, kafka_env, tmp_path, monkeypatch):
    """A text column of ISO-8601 times, some with a zone (Z, +02:00, -0130) and some without (a
    wall time in UTC, a date): the tasks read each as Spark casts it, and the newest is the one
    the Spark SQL path finds (here a zoned one that is newest only as an instant)."""
    bs = broker.bootstrap_servers
    src = unique_topic("czone")
    create_topic(bs, src, 1)
    seen = ["2024-01-15T10:00:00", "2024-03-15T23:30:00-0130", "2024-03-16T00:30:00+02:00", "2024-03-16", None, "2024-03-15T10:00:00Z"]
    produce_json(bs, src, [{"order_id": i, "seen": s} for i, s in enumerate(seen)], partition=0)
    quality = "  mode: warn\n  checks: [{type: freshness, column: seen, max_age_seconds: 60}]"
    direct, sql = run_on_both(bs, spark, src, tmp_path, monkeypatch, "{mode: incremental_append, unique_key: order_id}", quality)
    assert direct.execution_path == "direct" and sql.execution_path == "spark_sql", direct.notes
    assert [comparable(g) for g in direct.gates] == [comparable(g) for g in sql.gates]
    assert direct.gates[0]["description"].startswith("newest seen is 2024-03-16T01:00:00+00:00"), direct.gates
