"""The store of the Spark SQL path's outcomes (tests/spark_sql_golden.py) reads back what it
wrote, renamed to the names of the run reading it. No broker, no Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import spark_sql_golden
from spark_sql_golden import decode, encode, renamed

from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import DataRefused


def test_an_outcome_reads_back_equal():
    result = RunResult(run_id="r", pipeline="p", committed_offsets={0: 4, 1: 7}, gates=[{"name": "min_rows", "observed": 3.5}])
    outcome = (
        result,
        [{"key": b"\x00\x00\x00\x00\x02k\xff", "value": None, "headers": [("trace", b"t1")], "partition": 1}],
        Counter({(1, b"k", b"v"): 2, (None, None, b"w"): 1}),
        {b"k": [b"a", b"b"]},
    )
    assert decode(json.loads(json.dumps(encode(outcome)))) == outcome


def test_names_of_the_recording_run_become_the_names_of_this_run():
    recorded = {"topic": "d_spark_sql_0123456789", "notes": ["read d_src_aaaaaaaaaa"], "value": b"\x14d_src_aaaaaaaaaa"}
    renames = [("d_src_aaaaaaaaaa", "d_src_bbbbbbbbbb"), ("d_spark_sql_0123456789", "d_spark_sql_9876543210")]
    assert renamed(recorded, renames) == {"topic": "d_spark_sql_9876543210", "notes": ["read d_src_bbbbbbbbbb"], "value": b"\x14d_src_bbbbbbbbbb"}


def test_a_failed_run_is_raised_again_with_its_result(tmp_path, monkeypatch):
    """A Spark SQL run that failed is stored as its error and raised again on reading, with the
    RunResult a dpone error carries; a test that asks for more runs than stored fails."""
    monkeypatch.setattr(spark_sql_golden, "GOLDEN", tmp_path)

    def refused() -> None:
        exc = DataRefused("quality gate min_rows failed on dst_0123456789")
        exc.result = RunResult(run_id="r", pipeline="p", rows_extracted=3)
        raise exc

    monkeypatch.setattr(spark_sql_golden, "WRITE", True)
    with pytest.raises(DataRefused):
        spark_sql_golden.spark_sql_outcome({"dst": "dst_0123456789"}, refused)
    spark_sql_golden._calls.clear()
    monkeypatch.setattr(spark_sql_golden, "WRITE", False)
    with pytest.raises(DataRefused, match="min_rows failed on dst_9876543210") as again:
        spark_sql_golden.spark_sql_outcome({"dst": "dst_9876543210"}, refused)
    assert again.value.result.rows_extracted == 3
    with pytest.raises(AssertionError, match="holds 1 Spark SQL run"):
        spark_sql_golden.spark_sql_outcome({"dst": "dst_9876543210"}, refused)


def test_every_stored_outcome_belongs_to_a_test():
    """A stored file whose test was renamed or removed is left over: the store holds only what the
    tests read (collected without running them)."""
    stored = {path: spark_sql_golden.read_store(path)["test"] for path in spark_sql_golden.GOLDEN.rglob("*.json.gz")}
    modules = sorted({test.partition("::")[0] for test in stored.values()})
    root = Path(__file__).parent.parent
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *modules],
        cwd=root, capture_output=True, text=True, timeout=300, check=True,
    ).stdout.splitlines()
    left_over = sorted(str(path.relative_to(root)) for path, test in stored.items() if test not in collected or spark_sql_golden.golden_file(test) != path)
    assert stored and not left_over, left_over
