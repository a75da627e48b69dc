"""The direct path's JSON encoder against Spark's own `to_json` on the same values: byte for byte,
or refused (`Unencodable`), never different."""

from __future__ import annotations

import random
import struct
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dpone_dagster.sinks.json_encode import (
    PYTHON,
    Unencodable,
    encode,
    encode_object,
    java_double,
    java_float,
    json_string,
    number_key,
    spark_numbers,
)
from dpone_dagster.sinks.kafka_messages import JSON_WRITE_OPTIONS
from dpone_dagster.spark.arrow_json import arrow_schema

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("name", StringType()),
        StructField("amount", DoubleType()),
        StructField("ok", BooleanType()),
        StructField("tags", ArrayType(StringType())),
        StructField("scores", ArrayType(DoubleType())),
        StructField(
            "address",
            StructType(
                [
                    StructField("street", StringType()),
                    StructField("lines", ArrayType(StructType([StructField("n", LongType()), StructField("t", StringType())]))),
                ]
            ),
        ),
        StructField('we"ird\nname', LongType()),
        StructField("code", StringType()),  # never null: its quotes join the literal text
    ]
)

_ALPHABET = "abc xyz\"\\/\n\t\r\b\f\x00\x01\x1f\x7f é€😀\u2028"


def _text(rng: random.Random) -> str | None:
    if rng.random() < 0.1:
        return None
    return "".join(rng.choice(_ALPHABET) if rng.random() < 0.3 else rng.choice("abcdefgh") for _ in range(rng.randint(0, 12)))


def _double(rng: random.Random) -> float | None:
    pick = rng.random()
    if pick < 0.1:
        return None
    if pick < 0.4:
        return round(rng.uniform(-1e4, 1e4), rng.randint(0, 6))
    if pick < 0.7:
        value = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        while value != value or not 1e-307 <= abs(value) < 1e16:
            value = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        return value
    return rng.choice([0.0, -0.0, 1e-3, 9.999e-4, 1e7, 9999999.5, 1e15, -1e-300, 1e-307, 123.0])


def _row(rng: random.Random) -> dict:
    maybe = lambda v: None if rng.random() < 0.1 else v  # noqa: E731
    return {
        "id": maybe(rng.randint(-(2**63), 2**63 - 1)),
        "name": _text(rng),
        "amount": _double(rng),
        "ok": maybe(rng.random() < 0.5),
        "tags": maybe([_text(rng) for _ in range(rng.randint(0, 3))]),
        "scores": maybe([_double(rng) for _ in range(rng.randint(0, 3))]),
        "address": maybe(
            {
                "street": _text(rng),
                "lines": maybe([maybe({"n": maybe(rng.randint(0, 99)), "t": _text(rng)}) for _ in range(rng.randint(0, 2))]),
            }
        ),
        'we"ird\nname': maybe(rng.randint(0, 9)),
        "code": _text(rng) or "",
    }


def test_encoder_writes_what_spark_writes(spark):
    rng = random.Random(20261125)
    rows = [_row(rng) for _ in range(20_000)]
    expected = [
        r[0]
        for r in spark.createDataFrame([tuple(r.values()) for r in rows], SCHEMA)
        .select(F.to_json(F.struct(*[F.col(f"`{n}`") for n in SCHEMA.names]), JSON_WRITE_OPTIONS))
        .collect()
    ]
    table = pa.Table.from_pylist(rows, schema=arrow_schema(SCHEMA, True))
    # In batches, some sliced (the read tasks hand over slices of larger arrays).
    got: list[str] = []
    for start in range(0, len(rows), 3_000):
        batch = table.slice(start, 3_000)
        got.extend(encode_object([batch.column(i).combine_chunks() for i in range(batch.num_columns)], SCHEMA.names).to_pylist())
    mismatches = [(i, g, e) for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    assert not mismatches[:5]


def test_doubles_match_java_between_1e_307_and_1e16(spark):
    rng = random.Random(7)
    low, high = (struct.unpack("Q", struct.pack("d", v))[0] for v in (1e-307, 1e16))
    values = [struct.unpack("d", struct.pack("Q", rng.randint(low, high - 1)))[0] * rng.choice([1, -1]) for _ in range(100_000)]
    frame = spark.createDataFrame([(v,) for v in values], "x double")
    java = [r[0] for r in frame.select(F.col("x").cast("string")).collect()]
    assert [java_double(v) for v in values] == java
    assert encode(pa.array(values)).to_pylist() == [java_double(v) for v in values]


def test_floats_match_java_between_1e_37_and_1e7(spark):
    """Floats (a SQL real, an Avro or protobuf float) from random bit patterns of both signs, as
    Spark's to_json writes them (Java's Float.toString): shortest float digits in that range."""
    import numpy as np

    rng = np.random.default_rng(37)
    low, high = (int(np.array([v], np.float32).view(np.uint32)[0]) for v in (1e-37, 1e7))
    bits = rng.integers(low + 1, high, 100_000, dtype=np.uint32) | (rng.integers(0, 2, 100_000, dtype=np.uint32) << 31)
    values = pa.array(np.concatenate([bits.view(np.float32), np.array([0.0, -0.0, 1.0, 0.1, 1e-3, 9999999.0, 16777216.0 / 4], np.float32)]))
    frame = spark.createDataFrame(pa.table({"x": values}).to_pandas(), "x float")
    java = [r[0][5:-1] for r in frame.select(F.to_json(F.struct("x"))).collect()]
    assert [java_float(v) for v in values.to_pylist()] == java
    assert encode(values).to_pylist() == java
    assert encode(values, PYTHON).to_pylist()[-7:] == ["0.0", "-0.0", "1.0", "0.10000000149011612", "0.0010000000474974513", "9999999.0", "4194304.0"]


MAPS = StructType(
    [
        StructField("attrs", MapType(StringType(), StringType(), True)),
        StructField("counts", MapType(StringType(), LongType(), False)),
        StructField("by_id", MapType(IntegerType(), ArrayType(DoubleType()), True)),
        StructField("nested", ArrayType(MapType(StringType(), MapType(StringType(), BooleanType())))),
    ]
)


def _map_row(rng: random.Random) -> tuple:
    maybe = lambda v: None if rng.random() < 0.15 else v  # noqa: E731
    text = lambda: rng.choice(["", "a", 'q"\\', "\n\u2028é", "k" * rng.randint(1, 4)])  # noqa: E731
    return (
        maybe({text() + str(i): maybe(text()) for i in range(rng.randint(0, 4))}),
        maybe({f"c{i}": rng.randint(-(2**40), 2**40) for i in range(rng.randint(0, 3))}),
        maybe({rng.randint(-5, 5): maybe([rng.choice([0.5, -1.0, 1e-5])]) for _ in range(rng.randint(0, 3))}),
        maybe([maybe({"m": maybe({"t": rng.random() < 0.5})}) for _ in range(rng.randint(0, 2))]),
    )


def test_maps_are_written_as_spark_writes_them(spark):
    """Maps (an Avro or protobuf map from a registry source) from the Arrow batches Spark hands to
    Python, in slices: an object of the entries in their order, null values written, an integer
    key as its text; against Spark's to_json on the same rows, and the JSON Schema sink's encoder for the
    Python flavour."""
    from dpone_dagster.schema.json_schema import encode_json, to_json_value

    rng = random.Random(20261128)
    frame = spark.createDataFrame([_map_row(rng) for _ in range(5_000)], MAPS).cache()
    expected = [r[0] for r in frame.select(F.to_json(F.struct(*MAPS.names), JSON_WRITE_OPTIONS)).collect()]
    table = frame.toArrow()
    got: list[str] = []
    for start in range(0, table.num_rows, 700):
        batch = table.slice(start, 700)
        got.extend(encode_object([batch.column(i).combine_chunks() for i in range(batch.num_columns)], MAPS.names).to_pylist())
    assert [(g, e) for g, e in zip(got, expected, strict=True) if g != e][:5] == []
    # The JSON Schema sink's values on the Spark SQL path: the Arrow rows, maps in their order.
    python = encode_object([table.column(i).combine_chunks() for i in range(table.num_columns)], MAPS.names, PYTHON).to_pylist()
    assert python == [encode_json(to_json_value(r, MAPS)).decode() for r in table.to_pylist()]
    frame.unpersist()
    with pytest.raises(Unencodable, match="a map keyed by double"):
        encode(pa.array([[(1.5, 1)]], pa.map_(pa.float64(), pa.int64())))


@pytest.mark.parametrize(("kind", "powers"), [("double", range(-1020, 54)), ("float", range(-122, 24))])
def test_powers_of_two_are_written_as_java_writes_them_or_refused(spark, kind, powers):
    """Java 17 narrows its rounding interval for a power of two and then prints more digits than
    the shortest below 1e-3 (5.9604644775390625E-8 for 2^-24): each power of two in range is
    written as Spark writes it, or refused (only below 1e-3)."""
    import numpy as np

    values = np.array([2.0**k for k in powers], np.float64 if kind == "double" else np.float32)
    frame = spark.createDataFrame(pa.table({"x": values}).to_pandas(), f"x {kind}")
    java = [r[0][5:-1] for r in frame.select(F.to_json(F.struct("x"))).collect()]
    refused = []
    for value, wanted in zip(values, java, strict=True):
        try:
            assert encode(pa.array([value])).to_pylist() == [wanted]
        except Unencodable:
            refused.append(float(value))
    assert refused and max(refused) < 1e-3


def test_numbers_only_spark_prints_alike_are_written_with_its_text(spark):
    """Doubles and floats outside the magnitudes where Java 17 prints the shortest digits, and
    powers of two below 1e-3: printed by Spark on the driver (spark/printed_numbers.py), then
    written with that text, byte for byte what `to_json` writes; random bit patterns of every
    magnitude."""
    import numpy as np

    from dpone_dagster.spark.jobs import BoundedJobs
    from dpone_dagster.spark.printed_numbers import printed_by_spark

    rng = random.Random(20261128)
    doubles = [2e23, 1e23, 1e16, 5e-324, -1e-310, 2.0**-30, *(struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(3_000))]
    floats = [1.7272904e9, 1e-38, 2.0**-27, *(struct.unpack("f", struct.pack("I", rng.getrandbits(32)))[0] for _ in range(3_000))]
    cases = [
        ("double", np.array([d for d in doubles if np.isfinite(d)], np.float64)),
        ("float", np.array([f for f in floats if np.isfinite(f)], np.float32)),
    ]
    for kind, values in cases:
        array = pa.array(values)
        with spark_numbers({}, collect=True) as found:  # the scan collects them
            encode(array)
        assert found.unknown and all(k == kind for k, _ in found.unknown)
        texts = printed_by_spark(spark, BoundedJobs(spark, "numbers"), found.unknown, 120)
        frame = spark.createDataFrame(pa.table({"x": values}).to_pandas(), f"x {kind}")
        expected = [r[0][5:-1] for r in frame.select(F.to_json(F.struct("x"))).collect()]
        with spark_numbers(texts):
            assert encode(array).to_pylist() == expected
        with pytest.raises(Unencodable, match="not printed by Spark"):  # nor without them
            encode(array)


def test_a_number_without_spark_text_is_collected_or_refused():
    key = number_key("double", 2e23)
    with spark_numbers({}, collect=True) as found:
        assert encode(pa.array([1.5, 2e23, None])).to_pylist() == ["1.5", "0.0", None]  # made again with the text
        with spark_numbers({}):  # an enclosing collecting block stays in force
            encode(pa.array([2e23]))
    assert found.unknown == {key}
    with spark_numbers({key: "1.9999999999999998E23"}):
        assert encode(pa.array([2e23, 3.0])).to_pylist() == ["1.9999999999999998E23", "3.0"]
        with pytest.raises(Unencodable, match="not printed by Spark"):
            encode(pa.array([1e23]))
        assert encode(pa.array([float("nan")])).to_pylist() == ['"NaN"']  # Jackson writes it as a string


def test_zeros_and_lists_behind_a_null_struct_are_written():
    import numpy as np

    assert encode(pa.array([0.0, None, -0.0], pa.float32())).to_pylist() == ["0.0", None, "-0.0"]
    assert encode(pa.array([None, 0.0])).to_pylist() == [None, "0.0"]
    # A null struct whose list still spans values (StructArray.flatten leaves them there).
    held = pa.StructArray.from_arrays([pa.array([[("a", 1)], [("b", 2)]], pa.map_(pa.string(), pa.int64()))], ["m"], mask=pa.array([True, False]))
    assert encode(held).to_pylist() == [None, '{"m":{"b":2}}']
    assert encode(pa.array([np.float32(1.5)] * 2)).to_pylist() == ["1.5", "1.5"]


def test_large_floats_are_refused_not_guessed():
    import numpy as np

    with pytest.raises(Unencodable, match="a float Java 17 may print otherwise than the shortest digits"):
        encode(pa.array(np.array([1.5, 1.7272904e9], np.float32)))  # Java 17 prints 1.72729037E9
    with pytest.raises(Unencodable):
        encode(pa.array(np.array([1e-38], np.float32)))
    assert encode(pa.array(np.array([np.nan, 2.5], np.float32))).to_pylist() == ['"NaN"', "2.5"]


def test_large_doubles_are_refused_not_guessed():
    with pytest.raises(Unencodable):
        encode(pa.array([1.5, 6.960309306789904e18]))  # Java 17 prints -6.9603093067899044E18
    with pytest.raises(Unencodable):
        encode(pa.array([1e16]))
    with pytest.raises(Unencodable):
        encode(pa.array([0.0, 5e-324]))  # Java 17 prints 4.9E-324
    assert encode(pa.array([None, 9.999999999999998e15], pa.float64())).to_pylist() == [None, "9.999999999999998E15"]


def test_escapes_as_jackson():
    assert json_string('a"b\\c\n\x0b\u2028é') == '"a\\"b\\\\c\\n\\u000B\u2028é"'
    assert encode(pa.array(["plain", None, "tab\there"])).to_pylist() == ['"plain"', None, '"tab\\there"']


def test_the_python_flavour_writes_what_json_dumps_writes():
    """The JSON Schema sink's values: json.dumps(row, separators=(",", ":"), ensure_ascii=False),
    on doubles of every magnitude, control characters and nested values (pure, no Spark)."""
    import json as _json
    import random

    from dpone_dagster.sinks.json_encode import PYTHON, encode_object

    rng = random.Random(5)
    rows = []
    for i in range(2000):
        rows.append(
            {
                "d": rng.choice([None, 0.0, -0.0, 1e-5, 1e16, 123456789012345.0, 3.0, rng.random() * 10 ** rng.randint(-30, 30)]),
                "s": rng.choice([None, "", "plain", "é€😀", "\x01\x1f\x7f", 'q"b\\', "\n\t\r\b\f"]) ,
                "n": rng.choice([None, 0, -(2**63), 2**63 - 1, i]),
                "l": rng.choice([None, [], [1.5, None, 2.0], [0.1]]),
                "o": rng.choice([None, {"a": None, "b": "x\u2028"}, {"a": 1e-7, "b": ""}]),
            }
        )
    table = pa.Table.from_pylist(rows)
    columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
    got = encode_object(columns, table.column_names, PYTHON).to_pylist()
    assert got == [_json.dumps(r, separators=(",", ":"), ensure_ascii=False, allow_nan=False) for r in rows]


SQL_TYPES = StructType(
    [
        StructField("small", ShortType()),
        StructField("tiny", ByteType()),
        StructField("whole", IntegerType()),
        StructField("money", DecimalType(12, 2)),
        StructField("fine", DecimalType(20, 10)),  # BigDecimal.toString: 0E-10, 1.000E-7
        StructField("at", TimestampType()),
        StructField("on", DateType()),
        StructField("blob", BinaryType()),
        StructField("ratio", FloatType()),  # a real: Float.toString
    ]
)


def _sql_row(rng: random.Random) -> tuple:
    maybe = lambda v: None if rng.random() < 0.1 else v  # noqa: E731
    seconds = rng.choice([0, rng.randint(-62_135_596_800, 253_402_300_799), rng.randint(1_600_000_000, 1_900_000_000)])
    fine = rng.choice([0, 1, 1000, -1234, rng.randint(-(10**19) + 1, 10**19 - 1), rng.randint(-(10**6), 10**6)])
    return (
        maybe(rng.randint(-(2**15), 2**15 - 1)),
        maybe(rng.randint(-128, 127)),
        maybe(rng.randint(-(2**31), 2**31 - 1)),
        maybe(Decimal(rng.randint(-(10**12) + 1, 10**12 - 1)).scaleb(-2)),
        maybe(Decimal(fine).scaleb(-10)),
        maybe(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds, microseconds=rng.choice([0, 500_000, rng.randint(0, 999_999)]))),
        maybe(date(1, 1, 1) + timedelta(days=rng.randint(0, 3_652_058))),
        maybe(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 7)))),
        maybe(rng.choice([0.0, -0.0, 0.1, rng.uniform(-9e6, 9e6), rng.uniform(-1e-3, 1e-3), rng.uniform(1e-30, 1e-20)])),
    )


def test_sql_types_are_written_as_spark_writes_them(spark):
    """What a SQL source (or a registry source) adds to the JSON rows — short ints, decimals of
    either notation, UTC timestamps and dates of every year, binary — encoded from the Arrow
    batches Spark itself hands to Python, against Spark's `to_json` and `cast(... as string)`
    (the key of one column) on the same rows."""
    from dpone_dagster.shape.keys import as_text

    rng = random.Random(20261126)
    frame = spark.createDataFrame([_sql_row(rng) for _ in range(20_000)], SQL_TYPES).cache()
    columns = [f"`{n}`" for n in SQL_TYPES.names]
    expected = frame.select(
        F.to_json(F.struct(*[F.col(c) for c in columns]), JSON_WRITE_OPTIONS).alias("json"),
        *[F.col(c).cast("string").cast("binary") if c == "`blob`" else F.col(c).cast("string") for c in columns],  # a key's bytes
    ).collect()
    table = frame.toArrow()
    got = encode_object([table.column(i).combine_chunks() for i in range(table.num_columns)], SQL_TYPES.names).to_pylist()
    mismatches = [(g, e["json"]) for g, e in zip(got, expected, strict=True) if g != e["json"]]
    assert not mismatches[:5]
    for i, name in enumerate(SQL_TYPES.names):
        column = table.column(i).combine_chunks()
        text = as_text(column).to_pylist()
        wanted = [None if e[i + 1] is None else (bytes(e[i + 1]) if name == "blob" else e[i + 1]) for e in expected]
        assert [(t, w) for t, w in zip(text, wanted, strict=True) if t != w][:5] == [], name
    frame.unpersist()


def test_timestamps_out_of_java_years_and_other_zones_are_refused():
    with pytest.raises(Unencodable):
        encode(pa.array([0], pa.timestamp("us", tz="Europe/Berlin")))
    with pytest.raises(Unencodable):
        encode(pa.array([0], pa.timestamp("us")))  # TIMESTAMP_NTZ: Spark writes it without a zone
    with pytest.raises(Unencodable):
        encode(pa.array([-62_135_596_800_000_001], pa.timestamp("us", tz="UTC")))  # year 0


def test_a_key_of_three_columns_is_their_json_object_null_only_when_all_are_null():
    """A unique key of several columns, as the Spark SQL path's to_json writes the struct of them
    (ignoreNullFields false: nulls written); a row whose key columns are all null has no key."""
    import pyarrow as pa

    from dpone_dagster.shape.keys import unique_key

    columns = [pa.array(["a", None, None]), pa.array([1.5, None, None]), pa.array([1, 2, None])]
    assert unique_key(columns, ["c", "amount", "id"], (0, 1, 2)).to_pylist() == [b'{"c":"a","amount":1.5,"id":1}', b'{"c":null,"amount":null,"id":2}', None]


def test_nan_and_infinities_are_written_as_spark_writes_them(spark):
    """NaN (of either sign) and the infinities of doubles and floats: in JSON values, lists and
    objects the strings Jackson writes ("NaN", "Infinity", "-Infinity"); as key text, Spark's
    `cast(x as string)`, without quotes. Byte for byte what Spark writes."""
    import numpy as np

    from dpone_dagster.shape.keys import as_text

    nan, inf = float("nan"), float("inf")
    values = [nan, -nan, inf, -inf, 1.5, None, 0.0]
    for kind, numpy_type in (("double", np.float64), ("float", np.float32)):
        column = pa.array([None if v is None else numpy_type(v) for v in values], pa.float64() if kind == "double" else pa.float32())
        frame = spark.createDataFrame([(v,) for v in column.to_pylist()], f"x {kind}")  # None stays null, NaN stays NaN
        rows = frame.select(
            F.to_json(F.struct("x"), JSON_WRITE_OPTIONS), F.to_json(F.struct(F.array("x", "x").alias("l")), JSON_WRITE_OPTIONS), F.col("x").cast("string")
        ).collect()
        assert encode(column).to_pylist() == [None if r[0] == '{"x":null}' else r[0][5:-1] for r in rows], kind
        assert encode(pa.array([[v, v] for v in column.to_pylist()], pa.list_(column.type))).to_pylist() == [r[1][5:-1] for r in rows], kind
        assert as_text(column).to_pylist() == [r[2] for r in rows], kind
        assert '"NaN"' in encode(column).to_pylist() and "-Infinity" in as_text(column).to_pylist()
