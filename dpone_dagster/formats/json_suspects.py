"""Which JSON values Arrow's reader (spark/arrow_json.py) would likely refuse on their own: a
guide for finding a batch's bad records, never a verdict.

The task decoder reads a batch whole or not at all. A batch it does not read is searched for the
records it refuses, and halving the batch costs one decode per range tried (~0.45 ms, most of
it the reader's start): about seven per bad record, 38 s for 12,500 bad records in 100,000
(measured). This look is one `json.loads` per value (~5 µs): a value that does not parse, is no
object, holds a field the schema lacks, or holds a field of a JSON kind its read type never takes
is a suspect. The caller (direct/task._undecodable, where more than one record is bad) sets
suspects aside unchecked and has the decoder read the others whole, halving only what that still
refuses. A suspect the decoder would have read is then decoded by Spark on the driver
(engine/direct_bad_records.py), which reads every record the task decoder reads alike: a wrong
guess costs time, never a different message. Where Python's limits are not the reader's (integer
digits, UTF-8, nesting), a value is no suspect.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# JSON numbers as json.loads returns them; bool is an int subclass and is left out by type().
_NUMBERS = (int, float)


def suspects(values: pa.Array, schema: pa.Schema) -> np.ndarray:
    """One flag per value of `values` (JSON bytes, null for a tombstone: never a suspect), for a
    flat payload of `schema` (arrow_json.arrow_schema: dates and timestamps are read from text)."""
    fields = {f.name: f.type for f in schema}
    return _flags(values, lambda record: _fits_struct(record, fields))


def envelope_suspects(values: pa.Array, schema: pa.Schema, delete_ops: tuple[str, ...], auto: bool) -> np.ndarray:
    """`suspects` of dpone envelopes `{"op", "data", ...}` whose data is of `schema`: an op that is
    no text, data that does not fit, an envelope without its op, or without its data unless the op
    deletes (under `auto`, every value without data: Spark decides what it is)."""
    fields = {f.name: f.type for f in schema}

    def fits(envelope: dict[str, Any]) -> bool:
        op, data = envelope.get("op"), envelope.get("data")
        if type(op) is not str:
            return False
        if data is None:
            return op in delete_ops and not auto
        return isinstance(data, dict) and _fits_struct(data, fields)

    return _flags(values, fits)


# Values looked at a time, and their bytes: a batch is never copied into Python objects whole.
CHUNK = 4_096
CHUNK_BYTES = 8 << 20


def _any_int(text: str) -> int:
    """Every integer read as 0: only its kind matters here, and json.loads's own int() refuses one
    past 4,300 digits, which Arrow reads in a double field (no suspect)."""
    return 0


def _flags(values: pa.Array, fits: Callable[[dict[str, Any]], bool]) -> np.ndarray:
    out = np.zeros(len(values), bool)
    for low, chunk in _chunks(values):
        for i, value in enumerate(chunk, low):
            if value is not None:
                out[i] = _suspect(value, fits)
    return out


def _chunks(values: pa.Array) -> Iterator[tuple[int, list[bytes | None]]]:
    """The values as Python bytes, at most CHUNK of them and CHUNK_BYTES (or one value) at a time."""
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    low = 0
    while low < len(values):
        sizes = np.cumsum(lengths[low : low + CHUNK])
        n = max(1, int(np.searchsorted(sizes, CHUNK_BYTES, side="right")))
        yield low, values.slice(low, n).to_pylist()
        low += n


def _suspect(value: bytes, fits: Callable[[dict[str, Any]], bool]) -> bool:
    """Only JSON that does not parse, or parses into what the reader never takes. Bytes that are
    not UTF-8 are no reason (Spark's decoder reads them as U+FFFD); a value nested past Python's
    recursion limit is no suspect either: the halving judges it."""
    try:
        record = json.loads(value.decode("utf-8", "surrogateescape"), parse_int=_any_int)
    except json.JSONDecodeError:
        return True
    except (RecursionError, ValueError):
        return False
    try:
        return not isinstance(record, dict) or not fits(record)
    except RecursionError:
        return False


def _fits_struct(record: dict[str, Any], fields: dict[str, pa.DataType]) -> bool:
    return all(name in fields and _fits(value, fields[name]) for name, value in record.items())


def _fits(value: Any, kind: pa.DataType) -> bool:
    """Whether `value` (as json.loads read it) is of a JSON kind Arrow reads as `kind`; out-of-range
    integers and number forms are left to the decoder."""
    if value is None:
        return True
    if pa.types.is_integer(kind):
        return type(value) is int
    if pa.types.is_floating(kind):
        return type(value) in _NUMBERS
    if pa.types.is_decimal(kind):  # a quoted number too is read by Spark's decoder (arrow_json._decimals_confirmed)
        return type(value) in _NUMBERS
    if pa.types.is_string(kind) or pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        return type(value) is str
    if pa.types.is_boolean(kind):
        return type(value) is bool
    if pa.types.is_struct(kind):
        return isinstance(value, dict) and _fits_struct(value, {f.name: f.type for f in kind})
    if pa.types.is_list(kind):
        return isinstance(value, list) and all(_fits(v, kind.value_type) for v in value)
    return True
