"""The read tasks' JSON fast path (spark/arrow_json.py): pure pyarrow, no Spark or broker.

A batch is decoded there only when every value decodes exactly as Spark's from_json would;
every other batch must come back as None (the JVM decoder takes it), never as a crash or a
silently different value.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
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
    TimestampNTZType,
    TimestampType,
)

from dpone_dagster.spark import arrow_json
from dpone_dagster.spark.arrow_json import arrow_schema, decode_values


def struct(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(name, dtype, True) for name, dtype in fields])


SCHEMA = struct(
    ("id", LongType()),
    ("amount", DoubleType()),
    ("status", StringType()),
    ("paid", BooleanType()),
    ("customer", struct(("city", StringType()))),
    ("items", ArrayType(LongType())),
)
ARROW = arrow_schema(SCHEMA, True)


def decode(*values: bytes | None) -> list[dict] | None:
    columns = decode_values(pa.array(list(values), pa.binary()), ARROW)
    if columns is None:
        return None
    return pa.Table.from_arrays(columns, schema=ARROW).to_pylist()


def test_values_decode_in_place_and_tombstones_stay_null_rows():
    rows = decode(
        b'{"id": 1, "amount": 2, "status": "paid", "paid": true, "customer": {"city": "Oslo"}, "items": [1, 2]}',
        None,
        b'{"id": 3}',
    )
    assert rows[0] == {"id": 1, "amount": 2.0, "status": "paid", "paid": True, "customer": {"city": "Oslo"}, "items": [1, 2]}
    assert rows[1] == dict.fromkeys(ARROW.names)
    assert rows[2] == {"id": 3, "amount": None, "status": None, "paid": None, "customer": None, "items": None}


def test_a_slice_of_a_batch_decodes_only_its_own_values():
    values = pa.array([b'{"id": 1}', b'{"id": 2}', None, b'{"id": 4}'], pa.binary())
    columns = decode_values(values.slice(1, 2), ARROW)
    assert columns is not None and columns[0].to_pylist() == [2, None]


def test_a_batch_of_tombstones_only():
    assert decode(None, None) == [dict.fromkeys(ARROW.names)] * 2


@pytest.mark.parametrize(
    "value",
    [
        b"null",  # pyarrow 26 crashes on a first row `null`: must never reach it as one
        b'{"id": 1}null',  # a second JSON text in one value
        b'{"id": 1}{"id": 2}',
        b'{"id": 1}\n{"id": 2}',
        b'{\n"id": 1}',  # formatted over lines: the JVM takes it
        b'{"id": 1}\r',
        b' {"id": 1}',
        b"5",
        b'"text"',
        b"[1]",
        b"",
        b"{not json",
        b'{"id": "12"}',  # Spark's rules for type mismatches apply (corrupt record)
        b'{"id": 1.0}',
        b'{"status": 5}',  # Spark turns a number into its text for a string field
        b'{"paid": 1}',
        b'{"customer": "x"}',
        b'{"items": [1.5]}',
        b'{"id": 1, "id": 2}',
        b'{"late": 1}',  # drift: reported and widened by the JVM path
        b'{"customer": {"city": "Oslo", "zip": "0150"}}',
        b'{"status": "a\tb"}',
        b'{"status": "\xff"}',
        # Number tokens past Jackson's 1,000 characters: corrupt records for Spark (measured),
        # read by Arrow; a long digit string goes to the JVM too (which reads it).
        b'{"amount": 1' + b"0" * 1200 + b"}",
        b'{"amount": 0.' + b"0" * 1200 + b"1}",
        b'{"items": [1' + b"0" * 1000 + b"]}",
        b'{"status": "' + b"7" * 1000 + b'"}',
    ],
)
def test_anything_pyarrow_might_read_differently_goes_to_the_jvm(value):
    assert decode(b'{"id": 1}', value) is None


INTEGERS = arrow_schema(struct(("i", IntegerType()), ("s", ShortType()), ("b", ByteType())), True)


@pytest.mark.parametrize(
    "value, decoded",
    [
        (b'{"i": 2147483647, "s": -32768, "b": 127}', {"i": 2147483647, "s": -32768, "b": 127}),
        (b'{"i": -0, "s": null}', {"i": 0, "s": None, "b": None}),
        (b'{"i": 2147483648}', None),  # past the type: corrupt for Spark, so the JVM decides
        (b'{"s": 32768}', None),
        (b'{"b": -129}', None),
        (b'{"b": 200}', None),  # Spark wraps it to -56: its decoder reads that batch
        (b'{"i": 1.0}', None),
        (b'{"i": 1e2}', None),
        (b'{"i": "1"}', None),
        (b'{"b": true}', None),
    ],
)
def test_declared_integers_are_decoded_here_only_within_their_type(value, decoded):
    columns = decode_values(pa.array([b'{"i": 1}', value], pa.binary()), INTEGERS)
    if decoded is None:
        assert columns is None
    else:
        assert pa.Table.from_arrays(columns, schema=INTEGERS).to_pylist()[1] == decoded


FLOATS = arrow_schema(struct(("f", FloatType()), ("fs", ArrayType(FloatType())), ("in", struct(("f", FloatType())))), True)


@pytest.mark.parametrize(
    "number, bits",
    [
        (b"0.1", 0x3DCCCCCD),
        (b"33554435", 0x4C000001),  # an integer token: to the nearest float, as Float.parseFloat
        (b"3.4028235e38", 0x7F7FFFFF),
        (b"NaN", 0x7FC00000),
        (b"1e-45", 0x00000001),
        (b"-0.0", 0x80000000),
        # Halfway between 1.0 and the next float, plus 1e-25: as a double exactly halfway, which
        # narrowing rounds to 1.0 (ties to even) where Java rounds the text once, up.
        (b"1.0000000596046447753906251", None),
        (b"1.000000059604644775390625", None),  # exactly halfway: left to the JVM too
        (b"16777217", None),  # an integer exactly halfway (Java rounds it as narrowing does; not told apart)
        (b"3.5e38", None),  # a finite double past the largest float: Java's infinity, left to the JVM
        (b"3.4028235677973366e38", None),
    ],
)
def test_declared_floats_are_read_as_doubles_and_narrowed_only_where_that_rounds_once(number, bits):
    """A float is read as a double and narrowed; a double halfway between two floats may have
    been rounded from a text Java rounds the other way (Spark's Float.parseFloat rounds once), so
    such a batch is the JVM's, wherever the float sits (a list, a record)."""
    import struct as packing

    for value in (b'{"f": %s}' % number, b'{"fs": [1.5, %s]}' % number, b'{"in": {"f": %s}}' % number):
        columns = decode_values(pa.array([b'{"f": 1}', value], pa.binary()), FLOATS)
        if bits is None:
            assert columns is None, value
            continue
        row = pa.Table.from_arrays(columns, schema=FLOATS).to_pylist()[1]
        read = row["f"] if b'"f"' in value[:5] else row["fs"][1] if row["fs"] else row["in"]["f"]
        assert packing.unpack(">I", packing.pack(">f", read))[0] == bits, value


@pytest.mark.parametrize(
    "value, read",
    [
        (b'{"amount": -0}', None),  # Jackson reads the integer 0: Spark's double is 0.0, Arrow's -0.0
        (b'{"amount": -0.0}', -0.0),
        (b'{"amount": -0e3}', -0.0),
        (b'{"amount": 0}', 0.0),
        (b'{"status": "x:-0", "amount": -0.0}', None),  # text like the token: the JVM reads the batch
    ],
)
def test_a_negative_zero_is_decoded_here_only_from_a_fraction_or_an_exponent(value, read):
    import math

    rows = decode(value)
    if read is None:
        assert rows is None
    else:
        assert rows[0]["amount"] == 0 and math.copysign(1, rows[0]["amount"]) == math.copysign(1, read)


DECIMALS = arrow_schema(struct(("d", DecimalType(10, 2)), ("ds", ArrayType(DecimalType(38, 18)))), True)


@pytest.mark.parametrize(
    "value, decoded",
    [
        (b'{"d": 12345678.99, "ds": [1e-18]}', {"d": "12345678.99", "ds": ["1E-18"]}),
        (b'{"d": 1e2}', {"d": "100.00", "ds": None}),
        (b'{"d": -0.00}', {"d": "0.00", "ds": None}),
        (b'{"ds": [12345678901234567890.123456789012345678]}', {"d": "None", "ds": ["12345678901234567890.123456789012345678"]}),
        (b'{"d": "1.5"}', None),  # a quoted number: Spark's decoder reads it (as Java's BigDecimal)
        (b'{"d": "1e+-1"}', None),  # pyarrow takes this exponent; Java refuses it (corrupt)
        (b'{"ds": [4e20]}', None),  # pyarrow wraps past 128 bits scaling it to 18 places; corrupt for Spark
        (b'{"d": -0}', None),
        (b'{"d": 1.005}', None),  # Spark rounds half up to the scale: the JVM reads it
        (b'{"d": 123456789.99}', None),  # past the precision: corrupt for Spark
        (b'{"d": "1,000.5"}', None),  # grouping commas: Spark reads them, pyarrow does not
        (b'{"d": " 1.5"}', None),
        (b'{"d": true}', None),
    ],
)
def test_declared_decimals_are_decoded_here_only_where_their_digits_fit_and_read_as_doubles_alike(value, decoded):
    columns = decode_values(pa.array([b'{"d": 1}', value], pa.binary()), DECIMALS)
    if decoded is None:
        assert columns is None
        return
    row = pa.Table.from_arrays(columns, schema=DECIMALS).to_pylist()[1]
    assert {"d": str(row["d"]), "ds": [str(v) for v in row["ds"]] if row["ds"] is not None else None} == decoded


TEMPORAL = arrow_schema(struct(("day", DateType()), ("at", TimestampType()), ("log", ArrayType(struct(("at", TimestampType()))))), True)
AT_2024_01_05_10H = 1_704_448_800_000_000  # microseconds


@pytest.mark.parametrize(
    "value, decoded",
    [
        (b'{"day": "2024-02-29", "at": "2024-01-05T10:00:00Z"}', {"day": 19782, "at": AT_2024_01_05_10H}),
        (b'{"at": "2024-01-05 10:00:00"}', {"at": AT_2024_01_05_10H}),  # zone-less: the session's zone, UTC
        (b'{"at": "2024-01-05T11:30:00.5+01:30"}', {"at": AT_2024_01_05_10H + 500_000}),
        (b'{"at": "2024-01-05T04:59:59.000001-05:00"}', {"at": AT_2024_01_05_10H - 999_999}),
        (b'{"day": "0001-01-01", "at": "9999-12-31T23:59:59.999999Z"}', {"day": -719_162, "at": 253_402_300_799_999_999}),
        (b'{"log": [{"at": "2024-01-05T10:00:00Z"}, null, {"at": null}]}', {"log": [{"at": AT_2024_01_05_10H}, None, {"at": None}]}),
        (b'{"day": "2023-02-29"}', None),  # not a date: corrupt for Spark
        (b'{"at": "2024-01-05T24:00:00Z"}', None),
        (b'{"day": "2024-1-5"}', None),  # forms Spark reads by its own rules: the JVM reads them
        (b'{"day": "2024-01-05T10:00:00Z"}', None),
        (b'{"at": "2024-01-05"}', None),
        (b'{"at": " 2024-01-05T10:00:00Z"}', None),
        (b'{"at": "2024-01-05T10:00:00.1234567Z"}', None),
        (b'{"at": "2024-01-05T10:00:00+18:00"}', None),
        (b'{"at": "0001-01-01T00:00:00+01:00"}', None),  # before the year 1 in UTC
        (b'{"at": 1704448800}', None),  # epoch seconds
    ],
)
def test_declared_dates_and_timestamps_are_decoded_here_only_in_their_full_iso_form(value, decoded):
    columns = decode_values(pa.array([b'{"day": "2024-01-01"}', value], pa.binary()), TEMPORAL)
    if decoded is None:
        assert columns is None
        return
    row = pa.Table.from_arrays(columns, schema=TEMPORAL).cast(pa.schema([("day", pa.int32()), ("at", pa.int64()), ("log", pa.list_(pa.struct([("at", pa.int64())])))])).to_pylist()[1]
    assert row == {"day": None, "at": None, "log": None, **decoded}


def test_only_types_with_identical_semantics_are_decoded_here():
    assert arrow_schema(struct(("day", DateType())), False) is None  # a session of another zone or calendar: Spark reads them
    assert arrow_schema(struct(("at", TimestampType()), ("day", DateType())), True) == pa.schema([("at", pa.timestamp("us", tz="UTC")), ("day", pa.date32())])
    assert arrow_schema(struct(("ratio", FloatType()), ("price", DecimalType(12, 2))), True) == pa.schema([("ratio", pa.float32()), ("price", pa.decimal128(12, 2))])
    assert INTEGERS == pa.schema([("i", pa.int32()), ("s", pa.int16()), ("b", pa.int8())])
    assert arrow_schema(struct(("tags", ArrayType(struct(("at", TimestampNTZType()))))), True) is None
    assert arrow_schema(SCHEMA, True) == pa.schema(
        [
            ("id", pa.int64()),
            ("amount", pa.float64()),
            ("status", pa.string()),
            ("paid", pa.bool_()),
            ("customer", pa.struct([("city", pa.string())])),
            ("items", pa.list_(pa.int64())),
        ]
    )


def test_escapes_decode_like_json_and_lone_surrogates_go_to_the_jvm():
    assert decode(b'{"status": "\\u00e9\\ud83d\\ude00 \\"q\\" \\/"}')[0]["status"] == 'é😀 "q" /'
    assert decode(b'{"status": "\\ud800"}') is None


def test_a_value_nested_too_deep_for_arrows_reader_is_left_to_spark():
    """Arrow's reader recurses into the nesting of a field beyond the schema: 9,000 levels crash
    the process. Run in a child process, so that a crash fails this test and not the suite."""
    import subprocess
    import sys

    script = (
        "import pyarrow as pa\n"
        "from dpone_dagster.spark import arrow_json\n"
        "deep = b'{\"a\": 1, \"z\": ' + b'[' * 20000 + b']' * 20000 + b'}'\n"
        "shallow = b'{\"a\": 2, \"z\": ' + b'[' * 100 + b']' * 100 + b'}'\n"
        "schema = pa.schema([pa.field('a', pa.int64())])\n"
        "print(arrow_json.decode_values(pa.array([b'{\"a\": 0}', deep], pa.binary()), schema))\n"
        "print(arrow_json.decode_values(pa.array([shallow], pa.binary()), schema) is None)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "True"]  # the shallow drift is refused as drift, without a crash


def test_numbers_shorter_than_jacksons_limit_are_read_here():
    assert decode(b'{"amount": 1' + b"0" * 980 + b"}") == [{**dict.fromkeys(ARROW.names), "amount": float("inf")}]
    assert decode(b'{"status": "' + b"7" * 980 + b'"}')[0]["status"] == "7" * 980


def test_fields_beyond_the_schema_nested_past_pythons_recursion_limit_are_left_to_spark():
    """Arrow reads them (under MAX_OPENINGS); the checks after the read walk the inferred types."""
    deep = b'{"id": 1, "z": ' + b"[" * 1500 + b"]" * 1500 + b"}"
    assert decode(deep) is None
    envelope = b'{"op": "d", "metadata": ' + b'{"a":' * 1500 + b"1" + b"}" * 1501
    assert arrow_json.decode_envelopes(pa.array([envelope], pa.binary()), ARROW) is None


def test_an_envelope_field_read_past_named_by_bytes_that_are_not_utf8_is_left_to_spark():
    """Spark's decoder reads the name as U+FFFD; the checks after Arrow's read cannot name it."""
    with_decimal = pa.schema([("price", pa.decimal128(10, 2))])
    envelope = b'{"op": "d", "metadata": {"m\xe9ta": 1.5}}'
    assert arrow_json.decode_envelopes(pa.array([envelope], pa.binary()), with_decimal) is None


def test_values_joined_past_what_one_arrow_buffer_holds_are_left_to_spark(monkeypatch):
    """Values whose joined lines would pass 2 GiB (a batch of huge records) are left to Spark's
    decoder, not a failed task. Joining 2 GiB here would take the machine's memory: the join is
    made to raise as Arrow does then."""

    def too_large(_values: pa.Array) -> pa.Buffer:
        raise pa.ArrowCapacityError("array cannot contain more than 2147483646 bytes")

    monkeypatch.setattr(arrow_json, "_lines", too_large)
    assert arrow_json.decode_values(pa.array([b'{"a": 1}'], pa.binary()), pa.schema([("a", pa.int64())])) is None
