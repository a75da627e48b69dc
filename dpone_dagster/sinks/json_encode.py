"""Encode decoded Arrow columns as JSON text, byte for byte as Spark's `to_json` writes them with
the sink's options (`kafka_messages.JSON_WRITE_OPTIONS`: null fields kept), inside Python tasks.

The direct path (dpone_dagster/direct/) shapes messages here instead of in the JVM, so the bytes
must not depend on the path a run took. Spark writes through Jackson: strings escape `"`, `\\` and
control characters (`\\b \\t \\n \\f \\r`, otherwise `\\u00XX` in upper case); doubles are Java's
`Double.toString`, floats `Float.toString`. Java 17 prints the shortest round-trip digits for
1e-307 <= |d| < 1e16 and 1e-37 <= |f| < 1e7 (checked against Spark on millions of values,
tests/test_json_encode.py) but not always outside, nor for a power of two below 1e-3: such a
value is printed by Spark itself on the driver (`spark_numbers`: the direct path collects them in
a scan and scans again with their texts); without its text it is `Unencodable`. NaN and the
infinities are Java's `NaN`, `Infinity` and `-Infinity`, which Jackson writes as JSON strings.

Every step is a vectorised Arrow kernel; values that need a rare rule (an escape, a double outside
[1e-3, 1e7)) are formatted in Python one by one. The types a SQL source or a registry source adds
are written as Spark writes them with the session time zone UTC (spark/session.py): decimals as
Java's `BigDecimal.toString` (Arrow's cast writes the same, `0E-10` included), timestamps as
`yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX` (`Z`), dates as `yyyy-MM-dd`, binary as base64.

`PYTHON` is the other flavour: what `json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
allow_nan=False)` writes (the JSON Schema sink's values, schema/json_schema.encode_json): control
characters as lower-case `\\u00xx`, doubles as Python's `repr`.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Unencodable(Exception):
    """The batch holds a value (or a type) this encoder cannot write exactly as Spark does."""


_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_NEEDS_ESCAPE = '["\\\\\\x00-\\x1f]'  # a regex class: quote, backslash, control characters
# Java 17's Double.toString prints the shortest repr between these magnitudes (not for some
# subnormals: 4.9E-324 for 5e-324).
_EXACT_DOUBLES = (1e-307, 1e16)
# Java 17's Float.toString prints the shortest float digits between these (more digits from 1e7:
# 1.72729037E9 for 1.7272904E9), checked against Spark on random float bit patterns.
_EXACT_FLOATS = (1e-37, 1e7)


def json_string(text: str) -> str:
    """`text` as a JSON string literal, escaped as Jackson escapes it."""
    return _quoted(text, "X")


def python_string(text: str) -> str:
    """`text` as `json.dumps(text, ensure_ascii=False)` writes it."""
    return _quoted(text, "x")


def _quoted(text: str, hex_case: str) -> str:
    out = []
    for ch in text:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch < " ":
            out.append(f"\\u{ord(ch):04{hex_case}}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def java_double(value: float) -> str:
    """Java's `Double.toString(value)` for 0 and 1e-307 <= |value| < 1e16: the shortest digits that read
    back as `value`, plain between 1e-3 and 1e7, otherwise `d.dddE<exponent>`."""
    return _java_form(value, repr(abs(value)))


def java_float(value: float) -> str:
    """Java's `Float.toString(value)` for 0 and 1e-37 <= |value| < 1e7: the shortest digits that read
    back as the same float32, in `java_double`'s form."""
    return _java_form(value, np.format_float_scientific(np.float32(abs(value)), unique=True))


def _java_form(value: float, shortest: str) -> str:
    """`value` in Java's form, from the shortest digits of its magnitude (`shortest`: Python's
    `1.5e-05`, `0.1` or numpy's `1.e-01`)."""
    if value == 0:
        return "-0.0" if np.signbit(value) else "0.0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    mantissa, _, exp_text = shortest.partition("e")
    digits_text = mantissa.replace(".", "")
    point = (mantissa.index(".") if "." in mantissa else len(mantissa)) + (int(exp_text) if exp_text else 0)
    stripped = digits_text.lstrip("0")
    point -= len(digits_text) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    if 1e-3 <= magnitude < 1e7:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{sign}{digits}{'0' * (point - len(digits))}.0"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"


# A number Java 17 may print otherwise than the shortest digits: ("double" | "float", its bits).
NumberKey = tuple[str, int]


@dataclass
class SparkNumbers:
    """Numbers as Spark printed them (`texts`); `unknown`: the numbers met without a text, when
    they are collected (None: such a number is Unencodable)."""

    texts: Mapping[NumberKey, str]
    unknown: set[NumberKey] | None = None


# Distinct such numbers one scan task collects; past them the batch goes to the Spark SQL path.
MAX_UNPRINTED = 100_000
TOO_MANY_UNPRINTED = f"more than {MAX_UNPRINTED:,} distinct numbers Java 17 may print otherwise than the shortest digits, in a task"

_SPARK_NUMBERS: ContextVar[SparkNumbers | None] = ContextVar("spark_numbers", default=None)


@contextlib.contextmanager
def spark_numbers(texts: Mapping[NumberKey, str], collect: bool = False) -> Iterator[SparkNumbers]:
    """Within the block, the numbers of `texts` are written with Spark's text. `collect`: one
    without its text is added to `unknown` and written as 0.0 meanwhile (what is encoded so is
    made again once Spark has printed it). An enclosing collecting block stays in force."""
    current = _SPARK_NUMBERS.get()
    if current is not None and current.unknown is not None:
        yield current
        return
    numbers = SparkNumbers(texts, set() if collect else None)
    token = _SPARK_NUMBERS.set(numbers)
    try:
        yield numbers
    finally:
        _SPARK_NUMBERS.reset(token)


def number_key(kind: str, value: float) -> NumberKey:
    """The key of a double or float `value` in SparkNumbers.texts."""
    if kind == "float":
        return kind, int(np.float32(value).view(np.int32))
    return kind, int(np.float64(value).view(np.int64))


def number_of(key: NumberKey) -> float:
    kind, bits = key
    return float(np.int32(bits).view(np.float32)) if kind == "float" else float(np.int64(bits).view(np.float64))


@dataclass(frozen=True)
class Flavor:
    """How a JSON writer quotes strings and prints doubles."""

    string: Callable[[str], str]  # a string literal, quotes included
    doubles: Callable[[pa.Array], pa.Array]
    floats: Callable[[pa.Array], pa.Array]


def encode(array: pa.Array, flavor: Flavor | None = None) -> pa.Array:
    """Each value of `array` as JSON text (a string array; null values stay null). Raises
    `Unencodable` for a type or value the flavour's writer would write differently."""
    flavor = flavor or SPARK
    kind = array.type
    if pa.types.is_integer(kind) and pa.types.is_signed_integer(kind):
        return pc.cast(array, pa.string())
    if pa.types.is_boolean(kind):
        return pc.if_else(array, "true", "false")
    if pa.types.is_float64(kind):
        return flavor.doubles(array)
    if pa.types.is_float32(kind):
        return flavor.floats(array)
    if pa.types.is_string(kind):
        return pc.binary_join_element_wise('"', _escaped(array, flavor), '"', "")
    if pa.types.is_map(kind):
        return _maps(array, flavor)
    if pa.types.is_list(kind):
        return _lists(array, flavor)
    if pa.types.is_struct(kind):
        names = [kind.field(i).name for i in range(kind.num_fields)]
        return _object(array.flatten(), names, array.is_valid() if array.null_count else None, flavor)
    if flavor is SPARK:
        typed = _spark_typed(array)
        if typed is not None:
            return typed
    raise Unencodable(f"no JSON encoding for Arrow type {kind}")


def _spark_typed(array: pa.Array) -> pa.Array | None:
    """Decimals, UTC timestamps, dates and binary as Spark's `to_json` writes them (None: another
    type)."""
    kind = array.type
    if pa.types.is_decimal128(kind):
        return pc.cast(array, pa.string())  # BigDecimal.toString: plain, or 1.000E-7 / 0E-10
    if pa.types.is_timestamp(kind):
        return pc.binary_join_element_wise('"', timestamp_text(array, "T"), 'Z"', "")
    if pa.types.is_date32(kind):
        return pc.binary_join_element_wise('"', date_text(array), '"', "")
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        text = [None if v is None else '"' + base64.b64encode(v).decode("ascii") + '"' for v in array.to_pylist()]
        return pa.array(text, pa.string())
    return None


# Time zones whose offset is always zero: Spark reads zone-less timestamp text and writes
# timestamp text in them as in UTC (a session's zone, or an Arrow timestamp's).
OFFSET_FREE_ZONES = ("UTC", "Etc/UTC", "GMT", "Etc/GMT", "Z", "+00:00")


def timestamp_text(array: pa.Array, separator: str) -> pa.Array:
    """A UTC timestamp column as `yyyy-MM-dd<separator>HH:mm:ss.SSSSSS` (no zone); years 1 to
    9999 only, whose text is the same in Arrow and Java."""
    kind = array.type
    if kind.unit != "us" or kind.tz not in OFFSET_FREE_ZONES:
        raise Unencodable(f"a timestamp of type {kind} (Spark writes UTC microseconds)")
    wall = array.cast(pa.timestamp("us"))  # the UTC wall clock: Arrow prints it ~10x faster than a zoned one
    _check_range(wall.cast(pa.int64()), _MICROS_OF_YEARS)
    text = pc.cast(wall, pa.string())
    return text if separator == " " else pc.replace_substring(text, " ", separator, max_replacements=1)


def date_text(array: pa.Array) -> pa.Array:
    """A date column as `yyyy-MM-dd` (years 1 to 9999)."""
    _check_range(array.cast(pa.int32()), _DAYS_OF_YEARS)
    return pc.cast(array, pa.string())


# Years 1 to 9999 (proleptic Gregorian, as Arrow and Spark count them) in epoch days and microseconds.
_DAYS_OF_YEARS = (-719_162, 2_932_896)
_MICROS_OF_YEARS = (_DAYS_OF_YEARS[0] * 86_400_000_000, (_DAYS_OF_YEARS[1] + 1) * 86_400_000_000 - 1)


def _check_range(values: pa.Array, bounds: tuple[int, int]) -> None:
    if values.null_count == len(values):
        return
    extremes = pc.min_max(values).as_py()
    if extremes["min"] < bounds[0] or extremes["max"] > bounds[1]:
        raise Unencodable("a date or timestamp outside the years 1 to 9999")


def unencodable_type(schema: pa.Schema) -> str | None:
    """Why a column of `schema` has a type this encoder never writes (None: every type it may
    write, values permitting)."""
    for field in schema:
        try:
            encode(pa.array([], field.type))
        except Unencodable as exc:
            return f"column {field.name}: {exc}"
    return None


def encode_object(columns: list[pa.Array], names: list[str], flavor: Flavor | None = None) -> pa.Array:
    """One JSON object per row of `columns` (the fields `names`, in order, nulls written)."""
    return _object(columns, names, None, flavor or SPARK)


def _object(columns: list[pa.Array], names: list[str], valid: pa.Array | None, flavor: Flavor) -> pa.Array:
    """The fields joined in one pass. A string field without nulls puts its quotes into the
    literal text around it instead of quoting each value (~0.05 µs per value saved)."""
    if not columns:
        raise Unencodable("an object without fields")
    parts: list[pa.Array | str] = []
    literal = ""
    for i, (column, name) in enumerate(zip(columns, names, strict=True)):
        literal += ("{" if i == 0 else ",") + flavor.string(name) + ":"
        if pa.types.is_string(column.type) and not column.null_count:
            parts += [literal + '"', _escaped(column, flavor)]
            literal = '"'
        else:
            parts += [literal, _or_null(encode(column, flavor))]
            literal = ""
    joined = pc.binary_join_element_wise(*parts, literal + "}", "")
    return joined if valid is None else pc.if_else(valid, joined, pa.scalar(None, pa.string()))


def _or_null(encoded: pa.Array) -> pa.Array:
    return pc.fill_null(encoded, "null") if encoded.null_count else encoded


def _escaped(array: pa.Array, flavor: Flavor) -> pa.Array:
    """String values with what JSON escapes escaped (without the quotes). Most batches hold no
    such character: one byte scan of the values finds that out (~100x faster than a regex)."""
    offsets, data = array.buffers()[1], array.buffers()[2]
    if data is None or not len(array):
        return array
    bounds = np.frombuffer(offsets, np.int32)[array.offset : array.offset + len(array) + 1]
    octets = np.frombuffer(data, np.uint8)[bounds[0] : bounds[-1]]
    if not ((octets < 0x20) | (octets == 0x22) | (octets == 0x5C)).any():
        return array
    special = pc.fill_null(pc.match_substring_regex(array, _NEEDS_ESCAPE), False)
    rare = pc.filter(array, special).to_pylist()
    return pc.replace_with_mask(array, special, pa.array([flavor.string(t)[1:-1] for t in rare], pa.string()))


def _doubles(array: pa.Array) -> pa.Array:
    return _java_numbers(array, _EXACT_DOUBLES, "double", java_double, quoted=True)


def _floats(array: pa.Array) -> pa.Array:
    return _java_numbers(array, _EXACT_FLOATS, "float", java_float, quoted=True)


def double_texts(array: pa.Array) -> pa.Array:
    """Each double as Spark's `cast(x as string)` writes it: its JSON text, but NaN and the
    infinities without quotes."""
    return _java_numbers(array, _EXACT_DOUBLES, "double", java_double, quoted=False)


def float_texts(array: pa.Array) -> pa.Array:
    """Each float as Spark's `cast(x as string)` writes it (Float.toString, as in JSON)."""
    return _java_numbers(array, _EXACT_FLOATS, "float", java_float, quoted=False)


def _java_numbers(array: pa.Array, exact: tuple[float, float], kind: str, java: Callable[[float], str], quoted: bool) -> pa.Array:
    """Each value as Java's `toString` of its type (`java`) writes it; Unencodable past the
    magnitudes where that is the shortest digits (`exact`), and for a power of two below 1e-3,
    where Java 17 narrows its rounding interval and prints more digits (7.4505806E-9 for the
    float 2^-27). NaN and the infinities in quotes when `quoted` (Jackson writes them as strings)."""
    magnitude = pc.abs(array)
    text = pc.cast(array, pa.string())
    # Arrow writes the same shortest digits; in the plain range only ".0" for whole numbers differs.
    plain = pc.or_(
        pc.and_(pc.greater_equal(magnitude, 1e-3), pc.less(magnitude, 1e7)), pc.equal(magnitude, 0.0)
    )
    plain = pc.and_(plain, pc.invert(pc.match_substring(text, "e")))
    fraction = pc.match_substring(text, ".")
    text = pc.if_else(fraction, text, pc.binary_join_element_wise(text, ".0", ""))
    rare = pc.and_(pc.invert(plain), array.is_valid())
    if not pc.any(rare).as_py():
        return text
    values = pc.filter(array, rare).to_numpy(zero_copy_only=False)
    smallest, largest = exact
    magnitudes = np.abs(values)
    finite = np.isfinite(values)
    # Where Java 17 may print more digits than the shortest: Spark's own text (SparkNumbers).
    by_spark = finite & ((magnitudes < smallest) | (magnitudes >= largest))
    small = magnitudes < 1e-3  # False for NaN
    by_spark[small] |= np.abs(np.frexp(values[small])[0]) == 0.5
    texts = [
        (_spark_text(kind, float(v)) if spark else java(float(v))) if ok else _not_finite(float(v), quoted)
        for v, ok, spark in zip(values, finite, by_spark, strict=True)
    ]
    return pc.replace_with_mask(text, rare, pa.array(texts, pa.string()))


def _not_finite(value: float, quoted: bool) -> str:
    """NaN (of any sign) or an infinity as Java prints it, in quotes in JSON."""
    text = "NaN" if np.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return f'"{text}"' if quoted else text


def _spark_text(kind: str, value: float) -> str:
    """`value` as Spark printed it (spark_numbers), or Unencodable."""
    numbers = _SPARK_NUMBERS.get()
    key = number_key(kind, value)
    text = numbers.texts.get(key) if numbers is not None else None
    if text is not None:
        return text
    if numbers is None or numbers.unknown is None:
        raise Unencodable(
            f"a {kind} Java 17 may print otherwise than the shortest digits (1e16 or more, below 1e-307, or a power of two below 1e-3), not printed by Spark"
        )
    numbers.unknown.add(key)
    return "0.0"


def _python_doubles(array: pa.Array) -> pa.Array:
    """Python's repr of each double (json.dumps writes floats with it); NaN and infinities are
    not JSON (allow_nan=False)."""
    if array.null_count != len(array) and not pc.all(pc.is_finite(array.drop_null())).as_py():
        raise Unencodable("a double that is not finite")
    return pa.array([None if v is None else repr(v) for v in array.to_pylist()], pa.string())


def _lists(array: pa.Array, flavor: Flavor) -> pa.Array:
    return _joined(array, lambda values: _or_null(encode(values, flavor)), "[", "]")


def _maps(array: pa.Array, flavor: Flavor) -> pa.Array:
    """A map as an object of its entries in their order, a null value written (Spark writes each
    key's text as the field name: a string's, or a signed integer's)."""
    kind = array.type
    if not (pa.types.is_string(kind.key_type) or pa.types.is_signed_integer(kind.key_type)):
        raise Unencodable(f"a map keyed by {kind.key_type}")

    def pairs(entries: pa.Array) -> pa.Array:
        keys, values = entries.flatten()
        names = keys if pa.types.is_string(keys.type) else pc.cast(keys, pa.string())
        return pc.binary_join_element_wise('"', _escaped(names, flavor), '":', _or_null(encode(values, flavor)), "")

    return _joined(array.cast(pa.list_(pa.struct([kind.key_field, kind.item_field]))), pairs, "{", "}")


def _joined(array: pa.Array, encoded: Callable[[pa.Array], pa.Array], opening: str, closing: str) -> pa.Array:
    """Each list of `array` as its items' texts (`encoded`) joined by commas between `opening`
    and `closing`; a null list stays null."""
    # The values the offsets span (flatten() would drop those behind a null slot, which a null
    # struct around the list may leave).
    offsets = array.offsets
    start = offsets[0].as_py()
    values = array.values.slice(start, offsets[-1].as_py() - start)
    if start:
        offsets = pc.subtract(offsets, start)
    lists = pa.ListArray.from_arrays(offsets, encoded(values))
    joined = pc.binary_join_element_wise(opening, pc.binary_join(lists, ","), closing, "")
    if not array.null_count:
        return joined
    return pc.if_else(array.is_valid(), joined, pa.scalar(None, pa.string()))


def _python_floats(array: pa.Array) -> pa.Array:
    """A float as Python holds it once a Spark row hands it over: widened to a double."""
    return _python_doubles(pc.cast(array, pa.float64()))


SPARK = Flavor(json_string, _doubles, _floats)
PYTHON = Flavor(python_string, _python_doubles, _python_floats)
