"""The message size bound (spark/json_size.py) against what Spark's to_json really writes, on the
shared Spark session: the bound may be loose, never short."""

from __future__ import annotations

import datetime as dt
import decimal

from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dpone_dagster.sinks.kafka_messages import JSON_WRITE_OPTIONS
from dpone_dagster.spark.json_size import length_bound, name_bound

INNER = StructType([StructField("n", LongType()), StructField("s", StringType())])
SCHEMA = StructType(
    [
        StructField("long", LongType()),
        StructField("int", IntegerType()),
        StructField("double", DoubleType()),
        StructField("float", FloatType()),
        StructField("bool", BooleanType()),
        StructField("text", StringType()),
        StructField("bytes", BinaryType()),
        StructField("money", DecimalType(38, 18)),
        StructField("day", DateType()),
        StructField("at", TimestampType()),
        StructField("tags", ArrayType(StringType())),
        StructField("scores", ArrayType(DoubleType())),
        StructField("inner", INNER),
        StructField("inners", ArrayType(INNER)),
        StructField("attrs", MapType(StringType(), StringType())),
        StructField('we"ird\nname', StringType()),
    ]
)

ROWS = [
    # Longest numbers, escapes in every string, a non-BMP character, a control character.
    (
        -(2**63),
        -(2**31),
        -1.2345678901234567e-308,
        float("-inf"),
        False,
        'quote " backslash \\ tab \t nul \x00 bell \x07 é 😀',
        bytes(range(256)),
        decimal.Decimal("-12345678901234567890.123456789012345678"),
        dt.date(9999, 12, 31),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        ["\x01" * 10, None, ""],
        [float("nan"), None, 1e300],
        (2**63 - 1, "\x1f" * 5),
        [(1, None), None, (2, "\\\\")],
        {"k\x02": "v\x03", "empty": None},
        "\x00",
    ),
    # Nulls everywhere.
    (None,) * 16,
    # Empty containers and strings.
    (0, 0, 0.0, 0.0, True, "", b"", decimal.Decimal(0), dt.date(1970, 1, 1), dt.datetime(1970, 1, 1), [], [], (None, None), [], {}, ""),
]


def test_bound_is_never_below_the_encoded_length(spark) -> None:
    df = spark.createDataFrame(ROWS, SCHEMA)
    value = F.struct(*[F.col(f"`{f.name}`") for f in SCHEMA.fields])
    bound = length_bound(value, SCHEMA)
    assert bound is not None
    rows = df.select(F.octet_length(F.to_json(value, JSON_WRITE_OPTIONS)).alias("actual"), bound.alias("bound")).collect()
    assert len(rows) == len(ROWS)
    for row in rows:
        assert row["bound"] >= row["actual"], row
    # Loose, not absurd: the all-null row is bounded by the names and fixed widths.
    assert rows[1]["bound"] < 1000


def test_each_field_alone_is_bounded(spark) -> None:
    df = spark.createDataFrame(ROWS, SCHEMA)
    for f in SCHEMA.fields:
        value = F.struct(F.col(f"`{f.name}`"))
        bound = length_bound(value, StructType([f]))
        assert bound is not None, f.name
        for row in df.select(F.octet_length(F.to_json(value, JSON_WRITE_OPTIONS)).alias("a"), bound.alias("b")).collect():
            assert row["b"] >= row["a"], (f.name, row)


def test_fixed_width_structs_fold_into_one_constant(spark) -> None:
    schema = StructType([StructField("id", LongType()), StructField("ok", BooleanType()), StructField("none", StructType([]))])
    df = spark.createDataFrame([(-(2**63), False, None), (None, None, None)], schema)
    value = F.struct("id", "ok", "none")
    bound = length_bound(value, schema)
    assert bound is not None
    rows = df.select(F.octet_length(F.to_json(value, JSON_WRITE_OPTIONS)).alias("a"), bound.alias("b")).collect()
    assert all(r["b"] >= r["a"] for r in rows) and len({r["b"] for r in rows}) == 1


def test_types_without_a_bound_give_none() -> None:
    assert length_bound(F.col("x"), StructType([StructField("x", DayTimeIntervalType())])) is None
    assert length_bound(F.col("x"), MapType(LongType(), StringType())) is None
    assert length_bound(F.col("x"), ArrayType(MapType(IntegerType(), StringType()))) is None


def test_field_names_count_their_escapes() -> None:
    assert name_bound("order_id") == len('"order_id"')
    assert name_bound('a"b') == len('"a\\"b"')
    assert name_bound("a\nb") >= len('"a\\nb"')
    assert name_bound("é") == 4
