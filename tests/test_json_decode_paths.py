"""The two JSON decoders agree: batches decoded in the read tasks (pyarrow) and batches left to
the JVM (`from_json`) give the same rows, on the embedded broker and the shared Spark session."""

from __future__ import annotations

import json
from typing import Any

from conftest import create_topic, produce_json, unique_topic
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dpone_dagster import columns as C
from dpone_dagster.kafka.boundary import ReadTask
from dpone_dagster.sources.kafka_reader import JSON_OK, ReaderSettings, raw_records, read_ranges, read_records
from dpone_dagster.spark.decode import decode_json, decoded_in_tasks
from dpone_dagster.spark.keep import keep_batch, release_batch

SCHEMA = StructType(
    [
        StructField("order_id", LongType()),
        StructField("amount", DoubleType()),
        StructField("status", StringType()),
        StructField("tags", ArrayType(StringType())),
        StructField("customer", StructType([StructField("city", StringType())])),
    ]
)
CLEAN = [{"order_id": i, "amount": i / 4, "status": "paid", "tags": ["a", "b"], "customer": {"city": "Oslo"}} for i in range(40)]
# Values Spark decodes by its own rules (or reports): the read task must leave their batch alone.
ODD = [
    {"order_id": 100, "status": 5},  # number into a string field: Spark keeps "5"
    b'{\n  "order_id": 101,\n  "amount": 2\n}',  # formatted over several lines
    b'{"order_id": 102, "amount": "x"}',  # corrupt for Spark
    b"null",
    None,  # tombstone
    {"order_id": 103, "late": True},  # drift past the schema
    b'{"order_id": 104, "status": "\\u00e9"}',
]


def clean_and_odd(bs: str, spark: Any, schema: StructType, clean: list[Any], odd: list[Any]) -> tuple[Any, Any]:
    """`clean` records in partition 0, `odd` ones in partition 1, read over two tasks: (the read
    with the decoder of the read tasks, which must decode only the clean partition; the raw read)."""
    topic = unique_topic("paths")
    create_topic(bs, topic, 2)
    produce_json(bs, topic, clean, partition=0)
    produce_json(bs, topic, odd, partition=1)
    tasks = [ReadTask(0, topic, 0, 0, len(clean)), ReadTask(1, topic, 1, 0, len(odd))]
    settings = ReaderSettings({"bootstrap.servers": bs}, f"g-{topic}")
    prepared = read_ranges(spark, tasks, settings, schema)
    flags = sorted({(r["partition"], r[JSON_OK]) for r in prepared.select("partition", JSON_OK).collect()})
    assert flags == [(0, True), (1, False)]  # the clean partition was decoded in its read task
    return prepared, read_ranges(spark, tasks, settings)


def same_rows_on_both_decoders(prepared: Any, raw: Any, schema: StructType, comparable: Any = None) -> Any:
    """Decode the read of the read tasks and the raw read with `schema`: both give the same rows
    (`comparable`: a projection of the decoded frame, for types Python cannot hold); the JVM's
    frame is returned."""
    keep = [*schema.fieldNames(), C.OP, C.SOURCE_PARTITION, C.SOURCE_OFFSET, C.CORRUPT]

    def rows_of(df) -> list[str]:
        frame = comparable(df.select(*keep)) if comparable is not None else df.select(*keep)
        return sorted(json.dumps(r.asDict(recursive=True), sort_keys=True, default=str) for r in frame.collect())

    jvm = decode_json(raw, schema, "flat", detect_unknown=False)
    assert rows_of(decode_json(prepared, schema, "flat", detect_unknown=False)) == rows_of(jvm)
    return jvm


def rows(df):
    keep = [*SCHEMA.fieldNames(), C.OP, C.SOURCE_PARTITION, C.SOURCE_OFFSET, C.CORRUPT, C.UNKNOWN_KEYS]
    return sorted(json.dumps(r.asDict(recursive=True), sort_keys=True, default=str) for r in df.select(*keep).collect())


def test_fast_and_jvm_decoders_give_the_same_rows(broker, spark):
    prepared, raw = clean_and_odd(broker.bootstrap_servers, spark, SCHEMA, CLEAN, CLEAN[:5] + ODD)
    fast = decode_json(prepared, SCHEMA, "flat", detect_unknown=True)
    jvm = decode_json(raw, SCHEMA, "flat", detect_unknown=True)
    assert rows(fast) == rows(jvm)

    by_offset = {(r[C.SOURCE_PARTITION], r[C.SOURCE_OFFSET]): r for r in fast.collect()}
    assert by_offset[(1, 5)]["status"] == "5"
    assert by_offset[(1, 6)]["amount"] == 2.0 and by_offset[(1, 6)][C.CORRUPT] is None
    assert by_offset[(1, 7)][C.CORRUPT] is not None
    assert by_offset[(1, 9)][C.OP] == C.DELETE
    assert by_offset[(1, 10)][C.UNKNOWN_KEYS] == ["late"]
    assert by_offset[(1, 11)]["status"] == "é"
    clean = by_offset[(0, 3)]
    assert (clean["order_id"], clean["amount"], clean["customer"]["city"], clean["tags"]) == (3, 0.75, "Oslo", ["a", "b"])


def test_a_batch_decoded_in_its_read_tasks_is_kept_as_they_handed_it_over(broker, spark):
    """The engine keeps the read output itself when no record needs the JVM decoder: renaming the
    decoded columns of the kept copy gives the rows the full decoder gives (tombstones included).
    That the kept copy is computed once is tests/test_keep.py's."""
    bs = broker.bootstrap_servers
    topic = unique_topic("kept")
    create_topic(bs, topic, 1)
    produce_json(bs, topic, [*CLEAN, None, {"order_id": 200, "tags": []}])
    tasks = [ReadTask(0, topic, 0, 0, len(CLEAN) + 2)]
    kept = keep_batch(read_records(spark, tasks, ReaderSettings({"bootstrap.servers": bs}, "g-kept"), SCHEMA))
    raw = raw_records(kept, tasks)
    try:
        renamed = decoded_in_tasks(raw, SCHEMA)
        assert renamed.where(~F.col(JSON_OK)).count() == 0
        assert rows(renamed.withColumn(C.UNKNOWN_KEYS, F.lit(None))) == rows(decode_json(raw, SCHEMA, "flat", detect_unknown=True))
        by_offset = {r[C.SOURCE_OFFSET]: r for r in renamed.collect()}
        assert by_offset[len(CLEAN)][C.OP] == C.DELETE and by_offset[len(CLEAN)]["order_id"] is None
        assert by_offset[len(CLEAN) + 1]["tags"] == [] and by_offset[3]["amount"] == 0.75
    finally:
        release_batch(kept)


def test_declared_integers_decode_in_the_read_tasks_as_the_jvm_decodes_them(broker, spark):
    """Columns declared int, smallint and tinyint: a batch whose values all fit is decoded in its
    read task, with the JVM's rows; a value past its type, or of another JSON type, leaves the
    batch to the JVM, which makes those records corrupt or reads them by its own rules."""
    schema = StructType(
        [StructField("order_id", IntegerType()), StructField("qty", ShortType()), StructField("flag", ByteType()), StructField("note", StringType())]
    )
    bounds = [(2**31 - 1, 2**15 - 1, 127), (-(2**31), -(2**15), -128), (0, None, 0)]
    clean = [{"order_id": i, "qty": q, "flag": f, "note": "n"} for i, q, f in bounds * 10]
    odd = [b'{"order_id": 2147483648}', b'{"qty": 32768}', b'{"flag": -129}', b'{"order_id": 1.0}', b'{"qty": "7"}', b'{"flag": true}', b'{"flag": 200}']
    prepared, raw = clean_and_odd(broker.bootstrap_servers, spark, schema, clean, clean[:3] + odd)
    jvm = same_rows_on_both_decoders(prepared, raw, schema)
    by_offset = {(r[C.SOURCE_PARTITION], r[C.SOURCE_OFFSET]): r for r in jvm.collect()}
    assert (by_offset[(0, 1)]["order_id"], by_offset[(0, 1)]["qty"], by_offset[(0, 1)]["flag"]) == (-(2**31), -(2**15), -128)
    corrupt = [by_offset[(1, 3 + i)][C.CORRUPT] is not None for i in range(len(odd))]
    assert corrupt == [True] * (len(odd) - 1) + [False], [by_offset[(1, 3 + i)] for i in range(len(odd))]
    assert by_offset[(1, 3 + len(odd) - 1)]["flag"] == -56  # Jackson's getByteValue wraps 128..255


def test_declared_floats_and_decimals_decode_in_the_read_tasks_as_the_jvm_decodes_them(broker, spark):
    """Columns declared float and decimal (top level and in a list): a batch of values a double
    narrows to the float Java parses, and of decimals within their scale and precision, is decoded
    in its read task with the JVM's rows; a number halfway between two floats, a decimal Spark
    rounds or overflows, a quoted number, a string with grouping commas leave the batch to the JVM."""
    schema = StructType(
        [
            StructField("ratio", FloatType()),
            StructField("price", DecimalType(12, 2)),
            StructField("fees", ArrayType(DecimalType(20, 10))),
            StructField("weights", ArrayType(FloatType())),
        ]
    )
    numbers = [b"0.1", b"1e7", b"-0.0", b"3.4028235e38", b"1.4e-45", b"123456.789", b"33554435", b"NaN"]
    clean = [
        b'{"ratio": %s, "price": %s, "fees": [%s, 1e-7], "weights": [%s]}' % (n, p, f, n)
        for n in numbers
        for p, f in ((b"1234567890.12", b"0.0000000001"), (b"-7.5", b"12"), (b"1e2", b"-0.0"))
    ]
    odd = [
        b'{"ratio": 1.0000000596046447753906251}',  # a double halfway between floats; Java rounds up
        b'{"weights": [16777217]}',
        b'{"ratio": "NaN"}',
        b'{"price": 1.005}',  # rounded half up by Spark
        b'{"price": 12345678901.5}',  # past the precision
        b'{"price": "1,000.5"}',
        b'{"fees": [1e-11]}',
        b'{"price": "-7.5", "fees": ["12"]}',  # quoted numbers
        b'{"price": 4e10, "fees": [-0]}',  # past the precision; the integer -0
    ]
    prepared, raw = clean_and_odd(broker.bootstrap_servers, spark, schema, clean, clean[:3] + odd)
    jvm = same_rows_on_both_decoders(prepared, raw, schema)
    by_offset = {(r[C.SOURCE_PARTITION], r[C.SOURCE_OFFSET]): r for r in jvm.collect()}
    assert by_offset[(1, 3)]["ratio"] == 1.0000001192092896 and by_offset[(1, 4)]["weights"] == [16777216.0]
    assert str(by_offset[(1, 6)]["price"]) == "1.01" and str(by_offset[(1, 8)]["price"]) == "1000.50"


def test_declared_dates_and_timestamps_decode_in_the_read_tasks_as_the_jvm_decodes_them(broker, spark):
    """Columns declared date and timestamp (top level and in a list of records), the session in
    UTC: full ISO-8601 texts (zone-less, Z, offsets, fractions to microseconds, leap days) are
    decoded in the read task with the JVM's rows; the forms Spark reads by its own rules (a short
    date, a date as a timestamp, epoch seconds) and texts that are no date leave the batch to it."""
    schema = StructType(
        [
            StructField("day", DateType()),
            StructField("at", TimestampType()),
            StructField("log", ArrayType(StructType([StructField("at", TimestampType())]))),
        ]
    )
    texts = [
        ("2024-02-29", "2024-01-05T10:00:00Z"),
        ("0001-01-01", "2024-01-05 10:00:00"),
        ("9999-12-31", "2024-01-05T11:30:00.5+01:30"),
        ("1582-10-10", "1969-12-31T23:59:59.999999-05:00"),
        ("1900-02-28", "9999-12-31T23:59:59.999999Z"),
    ]
    clean = [{"day": d, "at": t, "log": [{"at": t}, None, {"at": None}]} for d, t in texts * 6]
    odd = [
        b'{"day": "2024-1-5"}',
        b'{"day": "2024-01-05T10:00:00Z"}',
        b'{"at": "2024-01-05"}',
        b'{"at": 1704448800}',
        b'{"day": "2023-02-29"}',  # corrupt
        b'{"log": [{"at": "2024-01-05T24:00:00Z"}]}',  # corrupt
    ]
    prepared, raw = clean_and_odd(broker.bootstrap_servers, spark, schema, clean, clean[:3] + odd)

    def in_numbers(frame):  # days and microseconds: Python's datetime holds no year-1 offsets
        frame = frame.withColumn("day", F.unix_date("day")).withColumn("at", F.unix_micros("at"))
        return frame.withColumn("log", F.transform("log", lambda e: F.when(e.isNotNull(), F.unix_micros(e["at"]))))

    jvm = same_rows_on_both_decoders(prepared, raw, schema, in_numbers)
    by_offset = {(r[C.SOURCE_PARTITION], r[C.SOURCE_OFFSET]): r for r in jvm.select(F.col(C.SOURCE_PARTITION), F.col(C.SOURCE_OFFSET), F.unix_micros("at").alias("at"), F.unix_date("day").alias("day"), C.CORRUPT).collect()}
    assert by_offset[(0, 2)]["at"] == 1_704_448_800_500_000 and by_offset[(0, 0)]["day"] == 19_782
    assert by_offset[(1, 3)]["day"] == 19_727 and by_offset[(1, 6)]["at"] == 1_704_448_800_000_000
    assert by_offset[(1, 7)][C.CORRUPT] is not None
