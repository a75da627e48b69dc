"""Quality gates on real Spark DataFrames shaped like the engine's staged batch (payload columns plus
the `__dpone__` metadata columns of spark/decode.py), Great Expectations included."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from dpone_dagster import columns as C
from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import (
    AcceptedValuesCheck,
    FreshnessCheck,
    GreatExpectationsCheck,
    MinRowsCheck,
    NotNullCheck,
    SourceTargetCountCheck,
    UniqueCheck,
)
from dpone_dagster.quality.expectations import run_expectation, validate_expectation
from dpone_dagster.quality.gates import run_post_publish, run_pre_publish
from dpone_dagster.quality.results import CheckResult, check_name, check_names, failed_gates

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
SCHEMA = (
    "order_id long, status string, amount double, created_at timestamp, "
    f"{C.OP} string, {C.SOURCE_TOPIC} string, {C.SOURCE_PARTITION} int, {C.SOURCE_OFFSET} long, "
    f"{C.SOURCE_TIMESTAMP} timestamp, {C.SOURCE_KEY} binary, "
    f"{C.SOURCE_HEADERS} array<struct<key:string,value:binary>>, {C.CORRUPT} string, "
    f"{C.ORDER} struct<ts:long,p:int,o:long>"
)
PAYLOAD = ["order_id", "status", "amount", "created_at"]


def batch(spark, rows: list[dict]):
    """Staged-batch rows: each dict gives payload values (and optionally op / offset / ts / partition)."""
    data = []
    for i, row in enumerate(rows):
        ts = row.get("ts", NOW - timedelta(seconds=60))
        partition, offset = row.get("partition", 0), row.get("offset", i)
        data.append(
            (
                row.get("order_id"),
                row.get("status"),
                row.get("amount"),
                row.get("created_at"),
                row.get("op", C.UPSERT),
                "orders",
                partition,
                offset,
                ts,
                str(row.get("order_id")).encode(),
                [],
                None,
                (int(ts.timestamp() * 1000), partition, offset),
            )
        )
    return spark.createDataFrame(data, SCHEMA)


@pytest.fixture(scope="module")
def orders(spark):
    return batch(
        spark,
        [
            {"order_id": 1, "status": "new", "amount": 10.0, "created_at": NOW - timedelta(hours=2)},
            {"order_id": 2, "status": "paid", "amount": 20.0, "created_at": NOW - timedelta(hours=1)},
            {"order_id": 3, "status": "shipped", "amount": 30.0, "created_at": NOW - timedelta(minutes=30)},
        ],
    ).cache()


@pytest.fixture(scope="module")
def dirty(spark):
    """Nulls, a duplicate key, an unknown status, an out-of-range amount and a keyless delete."""
    return batch(
        spark,
        [
            {"order_id": 1, "status": "new", "amount": 10.0, "offset": 0},
            {"order_id": None, "status": "paid", "amount": 20.0, "offset": 1},
            {"order_id": 3, "status": "lost", "amount": 500.0, "offset": 2},
            {"order_id": 3, "status": None, "amount": 30.0, "offset": 3},
            {"order_id": None, "status": "weird", "amount": 40.0, "offset": 4},
            {"order_id": None, "status": None, "amount": None, "op": C.DELETE, "offset": 5},
            {"order_id": 7, "status": "new", "amount": None, "offset": 6},
        ],
    ).cache()


def pre(df, checks, mode="fail", rows=None, incremental_empty=False, now=NOW) -> list[CheckResult]:
    return run_pre_publish(df, checks, mode, df.count() if rows is None else rows, incremental_empty, now)


def only(results: list[CheckResult]) -> CheckResult:
    assert len(results) == 1, results
    return results[0]


# --------------------------------------------------------------------------- names


def test_default_check_names_are_stable_and_asset_check_safe():
    checks = [
        MinRowsCheck(type="min_rows", threshold=1),
        SourceTargetCountCheck(type="source_target_count"),
        NotNullCheck(type="not_null", columns=["order_id"]),
        NotNullCheck(type="not_null", columns=["order_id", "customer.id"]),
        UniqueCheck(type="unique", columns=["order_id"]),
        AcceptedValuesCheck(type="accepted_values", column="status", values=["new"]),
        FreshnessCheck(type="freshness", max_age_seconds=60),
        FreshnessCheck(type="freshness", column="created_at", max_age_seconds=60),
        GreatExpectationsCheck(
            type="great_expectations",
            expectation_type="expect_column_values_to_be_between",
            kwargs={"column": "amount", "min_value": 0},
        ),
        GreatExpectationsCheck(type="great_expectations", expectation_type="expect_table_row_count_to_equal"),
        UniqueCheck(type="unique", columns=[C.SOURCE_KEY]),
    ]
    assert [check_name(c, i) for i, c in enumerate(checks)] == [
        "min_rows",
        "source_target_count",
        "not_null_order_id",
        "not_null_order_id_customer_id",
        "unique_order_id",
        "accepted_values_status",
        "freshness",
        "freshness_created_at",
        "ge_expect_column_values_to_be_between_amount",
        "ge_expect_table_row_count_to_equal",
        "unique_dpone_source_key",
    ]
    assert check_name(NotNullCheck(type="not_null", columns=["x"], name="ids_present"), 0) == "ids_present"


def test_explicit_names_are_validated_and_defaults_made_unique():
    with pytest.raises(ConfigError, match=r"quality.checks\[2\].name: 'bad name'"):
        check_name(MinRowsCheck(type="min_rows", threshold=1, name="bad name"), 2)
    twice = [MinRowsCheck(type="min_rows", threshold=1), MinRowsCheck(type="min_rows", threshold=5)]
    assert check_names(twice) == ["min_rows", "min_rows_1"]
    clash = [
        MinRowsCheck(type="min_rows", threshold=1, name="x"),
        MinRowsCheck(type="min_rows", threshold=5, name="x"),
    ]
    with pytest.raises(ConfigError, match="used by another check"):
        check_names(clash)


def test_check_result_as_dict_is_json_safe():
    result = CheckResult(
        name="n",
        check_type="not_null",
        phase="pre_publish",
        passed=False,
        severity="fail",
        observed=1,
        threshold=0,
        description="d",
        failing_sample=(
            {"at": datetime(2025, 1, 1, tzinfo=UTC), "amount": Decimal("12.50"), "raw": b"\xff\x00"},
        ),
    )
    data = json.loads(json.dumps(result.as_dict()))
    assert data["failing_sample"] == [
        {"at": "2025-01-01T00:00:00+00:00", "amount": "12.50", "raw": "base64:/wA="}
    ]
    assert data["skipped"] is False and data["phase"] == "pre_publish"


# --------------------------------------------------------------------------- min_rows


def test_min_rows_passes_and_fails(orders):
    ok = only(pre(orders, [MinRowsCheck(type="min_rows", threshold=3)]))
    assert (ok.name, ok.passed, ok.observed, ok.threshold, ok.skipped) == ("min_rows", True, 3, 3, False)
    low = only(pre(orders, [MinRowsCheck(type="min_rows", threshold=4)]))
    assert (low.passed, low.observed, low.severity) == (False, 3, "fail")
    assert failed_gates([ok, low]) == [low]


def test_min_rows_on_empty_batches(spark):
    empty = batch(spark, [])
    check = MinRowsCheck(type="min_rows", threshold=1)
    incremental = only(run_pre_publish(empty, [check], "fail", 0, True, NOW))
    assert (incremental.passed, incremental.skipped, incremental.description) == (True, True, "no new data")
    assert failed_gates([incremental]) == []
    full = only(run_pre_publish(empty, [check], "fail", 0, False, NOW))
    assert (full.passed, full.skipped, full.observed) == (False, False, 0)
    assert failed_gates([full]) == [full]
    # Row-level checks have nothing to judge in an empty batch (missing columns do not matter then).
    others = run_pre_publish(
        empty,
        [
            NotNullCheck(type="not_null", columns=["not_a_column"]),
            FreshnessCheck(type="freshness", max_age_seconds=1),
            GreatExpectationsCheck(
                type="great_expectations",
                expectation_type="expect_column_values_to_not_be_null",
                kwargs={"column": "order_id"},
            ),
        ],
        "fail",
        0,
        True,
        NOW,
    )
    assert [(r.passed, r.skipped) for r in others] == [(True, True)] * 3


# --------------------------------------------------------------------------- not_null / unique / accepted_values


def test_not_null(orders, dirty):
    ok = only(pre(orders, [NotNullCheck(type="not_null", columns=["order_id", "status"])]))
    assert (ok.passed, ok.observed, ok.failing_sample) == (True, 0, ())
    bad = only(pre(dirty, [NotNullCheck(type="not_null", columns=["order_id", "status"])]))
    # order_id: offsets 1 and 4; status: offset 3. The delete at offset 5 is not judged.
    assert (bad.name, bad.passed, bad.observed) == ("not_null_order_id_status", False, 3)
    assert "order_id: 2" in bad.description and "status: 1" in bad.description
    assert [r["order_id"] for r in bad.failing_sample] == [None, 3, None]
    assert all(set(r) == set(PAYLOAD) for r in bad.failing_sample)


def test_unique(orders, dirty):
    ok = only(pre(orders, [UniqueCheck(type="unique", columns=["order_id"])]))
    assert (ok.passed, ok.observed) == (True, 0)
    bad = only(pre(dirty, [UniqueCheck(type="unique", columns=["order_id"])]))
    # order_id 3 twice; the three null order_ids (two upserts, one delete) are excluded.
    assert (bad.passed, bad.observed) == (False, 1)
    assert [(r["order_id"], r["status"]) for r in bad.failing_sample] == [(3, "lost"), (3, None)]
    composite = only(pre(dirty, [UniqueCheck(type="unique", columns=["order_id", "status"])]))
    assert (composite.passed, composite.observed) == (True, 0)


def test_accepted_values(orders, dirty):
    check = AcceptedValuesCheck(type="accepted_values", column="status", values=["new", "paid", "shipped"])
    ok = only(pre(orders, [check]))
    assert (ok.name, ok.passed, ok.observed) == ("accepted_values_status", True, 0)
    bad = only(pre(dirty, [check]))
    assert (bad.passed, bad.observed) == (False, 2)  # lost, weird; nulls not counted
    assert [r["status"] for r in bad.failing_sample] == ["lost", "weird"]
    numbers = only(
        pre(dirty, [AcceptedValuesCheck(type="accepted_values", column="order_id", values=[1, 3, 7])])
    )
    assert (numbers.passed, numbers.observed) == (True, 0)


def test_failing_sample_is_capped_at_five_rows(spark):
    df = batch(spark, [{"order_id": None, "status": "x"} for _ in range(12)])
    result = only(pre(df, [NotNullCheck(type="not_null", columns=["order_id"])]))
    assert result.observed == 12 and len(result.failing_sample) == 5


def test_missing_column_is_a_config_error(orders):
    with pytest.raises(ConfigError, match="not_null_nope .*nope not in the batch; payload columns: order_id"):
        pre(orders, [NotNullCheck(type="not_null", columns=["nope"])])


# --------------------------------------------------------------------------- freshness


def test_freshness_default_column_is_the_record_timestamp(spark):
    df = batch(
        spark,
        [
            {"order_id": 1, "ts": NOW - timedelta(seconds=900)},
            {"order_id": 2, "ts": NOW - timedelta(seconds=120, milliseconds=500)},
        ],
    )
    ok = only(pre(df, [FreshnessCheck(type="freshness", max_age_seconds=300)]))
    assert (ok.name, ok.passed, ok.observed, ok.threshold) == ("freshness", True, 120.5, 300)
    stale = only(pre(df, [FreshnessCheck(type="freshness", max_age_seconds=60)]))
    assert (stale.passed, stale.observed) == (False, 120.5)
    assert C.SOURCE_TIMESTAMP in stale.description
    # A naive `now` means UTC.
    naive = only(
        pre(df, [FreshnessCheck(type="freshness", max_age_seconds=300)], now=NOW.replace(tzinfo=None))
    )
    assert naive.observed == 120.5


def test_freshness_explicit_column(orders, spark):
    # created_at newest: NOW - 30 min, while the record timestamps are NOW - 60 s.
    check = FreshnessCheck(type="freshness", column="created_at", max_age_seconds=3600)
    ok = only(pre(orders, [check]))
    assert (ok.name, ok.passed, ok.observed) == ("freshness_created_at", True, 1800.0)
    stale = only(pre(orders, [FreshnessCheck(type="freshness", column="created_at", max_age_seconds=600)]))
    assert (stale.passed, stale.observed) == (False, 1800.0)
    all_null = batch(spark, [{"order_id": 1}])
    unknown = only(pre(all_null, [check]))
    assert (unknown.passed, unknown.observed, unknown.skipped) == (False, None, False)
    with pytest.raises(ConfigError, match="has type bigint"):
        pre(orders, [FreshnessCheck(type="freshness", column="order_id", max_age_seconds=1)])


# --------------------------------------------------------------------------- severity, ordering


def test_warn_mode_reports_but_does_not_gate(dirty):
    checks = [
        MinRowsCheck(type="min_rows", threshold=100),
        SourceTargetCountCheck(type="source_target_count"),  # post-publish only: not in these results
        NotNullCheck(type="not_null", columns=["order_id"], name="ids"),
        {"type": "unique", "columns": ["order_id"]},  # a plain dict is validated into its model
    ]
    results = pre(dirty, checks, mode="warn")
    assert [r.name for r in results] == ["min_rows", "ids", "unique_order_id"]
    assert all(r.severity == "warn" and not r.passed for r in results)
    assert failed_gates(results) == []
    assert [r.name for r in failed_gates(pre(dirty, checks, mode="fail"))] == [
        "min_rows",
        "ids",
        "unique_order_id",
    ]
    with pytest.raises(ConfigError, match="quality.mode"):
        pre(dirty, checks, mode="strict")


# --------------------------------------------------------------------------- great expectations


def test_great_expectations_between_passes_and_fails(orders, dirty):
    check = GreatExpectationsCheck(
        type="great_expectations",
        expectation_type="expect_column_values_to_be_between",
        kwargs={"column": "amount", "min_value": 0, "max_value": 100},
    )
    ok = only(pre(orders, [check]))
    assert (ok.name, ok.check_type, ok.passed, ok.observed) == (
        "ge_expect_column_values_to_be_between_amount",
        "great_expectations",
        True,
        0,
    )
    assert ok.threshold == "max_value=100, min_value=0"
    bad = only(pre(dirty, [check]))
    assert (bad.passed, bad.observed, bad.failing_sample) == (False, 1, ({"amount": 500.0},))
    assert "1 unexpected value(s) of 6 row(s)" in bad.description  # the delete row is not judged
    assert failed_gates([bad]) == [bad]


def test_great_expectations_other_shapes(orders, dirty):
    regex = GreatExpectationsCheck(
        type="great_expectations",
        expectation_type="expect_column_values_to_match_regex",
        kwargs={"column": "status", "regex": "^[a-z]+$"},
    )
    assert only(pre(orders, [regex])).passed
    not_null = GreatExpectationsCheck(
        type="great_expectations",
        expectation_type="expect_column_values_to_not_be_null",
        kwargs={"column": "order_id"},
    )
    result = only(pre(dirty, [not_null]))
    assert (result.passed, result.observed) == (False, 2)
    # An aggregate expectation reports GE's observed_value.
    maximum = run_expectation(
        dirty,
        "expect_column_max_to_be_between",
        {"column": "amount", "max_value": 100},
        name="max_amount",
        severity="warn",
    )
    assert (maximum.passed, maximum.observed, maximum.severity) == (False, 500.0, "warn")


def test_great_expectations_unknown_type_and_bad_kwargs(orders):
    unknown = GreatExpectationsCheck(
        type="great_expectations",
        expectation_type="expect_column_values_to_be_betwen",
        kwargs={"column": "amount"},
    )
    with pytest.raises(
        ConfigError, match="unknown expectation_type 'expect_column_values_to_be_betwen'.*Did you mean"
    ):
        pre(orders, [unknown])
    with pytest.raises(ConfigError, match="unknown expectation_type 'drop_table'"):
        validate_expectation("drop_table", {})
    with pytest.raises(ConfigError, match="expect_column_values_to_be_between: invalid kwargs"):
        validate_expectation("expect_column_values_to_be_between", {"min_value": 0})
    missing = GreatExpectationsCheck(
        type="great_expectations",
        expectation_type="expect_column_values_to_not_be_null",
        kwargs={"column": "nope"},
    )
    with pytest.raises(ConfigError, match="column 'nope'"):
        pre(orders, [missing])


# --------------------------------------------------------------------------- source_target_count


def test_source_target_count_within_and_outside_tolerance():
    exact = [SourceTargetCountCheck(type="source_target_count")]
    ok = only(run_post_publish(exact, "fail", 120, 100, 100, {0: 60, 1: 40}))
    assert (ok.name, ok.phase, ok.passed, ok.observed, ok.threshold) == (
        "source_target_count",
        "post_publish",
        True,
        0.0,
        0.0,
    )
    assert "120 row(s) extracted" in ok.description and "100 message(s) expected" in ok.description
    short = only(run_post_publish(exact, "fail", 120, 100, 98, {0: 98}))
    assert (short.passed, short.observed) == (False, 2.0)
    tolerant = [SourceTargetCountCheck(type="source_target_count", tolerance_pct=2.5)]
    assert only(run_post_publish(tolerant, "fail", 120, 100, 98, {0: 98})).passed
    assert not only(run_post_publish(tolerant, "fail", 120, 100, 97, {0: 97})).passed
    nothing = only(run_post_publish(exact, "fail", 0, 0, 0, {}))
    assert (nothing.passed, nothing.observed) == (True, 0.0)
    unexpected = only(run_post_publish(exact, "fail", 0, 0, 3, {0: 3}))
    assert (unexpected.passed, unexpected.observed) == (False, 100.0)
    # Only source_target_count is post-publish.
    assert run_post_publish([MinRowsCheck(type="min_rows", threshold=1)], "fail", 1, 1, 1, {0: 1}) == []


def test_source_target_count_offset_advance_rule():
    check = [SourceTargetCountCheck(type="source_target_count")]
    # Retries may leave extra offsets: advance > delivered passes.
    retried = only(run_post_publish(check, "fail", 10, 10, 10, {0: 7, 1: 5}))
    assert (
        retried.passed
        and "advanced by 12 across 2 partition(s), >= the 10 acknowledged" in retried.description
    )
    # Fewer offsets than acknowledged messages: the accounting is wrong, even with matching counts.
    short = only(run_post_publish(check, "fail", 10, 10, 10, {0: 6, 1: 3}))
    assert (short.passed, short.observed) == (False, 0.0)
    assert "FEWER THAN the 10 acknowledged" in short.description
    unmeasured = only(run_post_publish(check, "warn", 10, 10, 10, None))
    assert unmeasured.passed and "not measured" in unmeasured.description
    failing = only(run_post_publish(check, "warn", 10, 10, 10, {0: 1}))
    assert failing.severity == "warn" and failed_gates([failing]) == []


def test_great_expectations_leaves_nothing_persisted(spark):
    df = batch(spark, [{"order_id": i, "amount": float(i)} for i in range(20)])
    check = GreatExpectationsCheck(
        type="great_expectations",
        expectation_type="expect_column_values_to_be_between",
        kwargs={"column": "amount", "min_value": 0},
    )
    before = spark.sparkContext._jsc.getPersistentRDDs().size()
    assert only(pre(df, [check])).passed
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == before
