"""Rows Spark decoded, spliced into a task's decoded batch (direct/spark_rows.py): pure Arrow, no
broker and no Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dpone_dagster.direct.spark_rows import IS_DELETE, OFFSET, PARTITION, SparkRows

SCHEMA = pa.schema([("order_id", pa.int64()), ("note", pa.string())])


def raw(partition: int, offsets: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"partition": pa.array([partition] * len(offsets), pa.int32()), "offset": pa.array(offsets, pa.int64())})


def rows(spec: list[tuple[int, int, bool, int, str]]) -> SparkRows:
    """(partition, offset, is_delete, order_id, note) per row, in any order; Spark's types."""
    positions = pa.table({PARTITION: [s[0] for s in spec], OFFSET: [s[1] for s in spec], IS_DELETE: [s[2] for s in spec]})
    payload = pa.table({"note": pa.array([s[4] for s in spec], pa.large_string()), "order_id": [s[3] for s in spec]})
    return SparkRows.of(positions, payload, SCHEMA)


def test_rows_are_put_in_at_their_records_in_source_order():
    held = rows([(0, 7, True, 70, "seven"), (1, 5, False, 0, "other partition"), (0, 3, False, 30, "three")])
    assert held.payload_schema == SCHEMA
    batch = raw(0, [2, 3, 4, 5, 6, 7])
    found = held.found(batch)
    assert found is not None and found.tolist() == [False, True, False, False, False, True]
    decoded = [pa.array([20, 40, 50, 60]), pa.array(["two", "four", "five", "six"])]
    columns, deletes = held.splice(batch, found, decoded, pa.array([False, False, True, False]))
    assert columns[0].to_pylist() == [20, 30, 40, 50, 60, 70]
    assert columns[1].to_pylist() == ["two", "three", "four", "five", "six", "seven"]
    assert deletes.to_pylist() == [False, False, False, True, False, True]


def test_a_batch_of_only_such_records_and_batches_without_any():
    held = rows([(1, 5, False, 1, "a"), (1, 6, False, 2, "b")])
    assert held.found(raw(0, [5, 6])) is None  # another partition
    assert held.found(raw(1, [7, 8, 9])) is None  # past them
    assert held.found(raw(1, [])) is None
    batch = raw(1, [5, 6])
    found = held.found(batch)
    assert found is not None
    empty = [pa.array([], pa.int64()), pa.array([], pa.string())]
    columns, deletes = held.splice(batch, found, empty, pa.array([], pa.bool_()))
    assert [c.to_pylist() for c in columns] == [[1, 2], ["a", "b"]] and deletes.to_pylist() == [False, False]


def test_rows_of_later_scans_join_the_earlier_and_a_flood_is_refused(monkeypatch):
    from dpone_dagster.direct import spark_rows

    first, second = rows([(0, 1, False, 1, "a")]), rows([(0, 9, False, 9, "z")])
    joined = second.joined(first)
    assert joined.table.column(OFFSET).to_pylist() == [1, 9] and joined.too_many() is None
    assert np.array_equal(joined.found(raw(0, [1, 2, 9])), [True, False, True])
    monkeypatch.setattr(spark_rows, "MAX_ROWS", 1)
    assert "only Spark's decoder reads" in (joined.too_many() or "")
