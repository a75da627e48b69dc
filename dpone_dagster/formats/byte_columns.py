"""Reading one field of every value of a batch at once (pure numpy and Arrow): the cursor over a
batch of binary values, varints, runs of bytes and strings. Shared by the column readers of
registry-framed Avro (formats/avro_columns.py) and protobuf (formats/protobuf_columns.py) values.

Every read checks that it stays inside its value; a read that would not raises Inexact, and the
caller then leaves the batch to its record decoder."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PAD = 16  # zero bytes after the data: a varint or a double read at a value's end stays in range


class Inexact(Exception):
    """A value a column reader would not read exactly as the record decoder does."""


@dataclass
class Cursor:
    """The batch's bytes and, per value still read, where it is and where the value ends."""

    data: np.ndarray
    pos: np.ndarray
    end: np.ndarray

    def at(self, rows: np.ndarray) -> Cursor:
        return Cursor(self.data, self.pos[rows], self.end[rows])

    def advance(self, to: np.ndarray) -> None:
        if to.size and bool((to > self.end).any()):
            raise Inexact("a value runs past its record")
        self.pos = to

    def skip(self, lengths: np.ndarray) -> None:
        """Past `lengths` bytes at each position (read from the data: compared before adding)."""
        if lengths.size and bool(((lengths < 0) | (lengths > self.end - self.pos)).any()):
            raise Inexact("a length beyond its record")
        self.pos = self.pos + lengths


def batch_cursor(values: pa.Array, header: int) -> tuple[Cursor, np.ndarray, np.ndarray] | None:
    """A cursor past the first `header` bytes of each non-null value, the positions of those values
    in `values`, and their headers (one row of `header` bytes each); None when a value is shorter."""
    values = values.cast(pa.binary()) if values.type != pa.binary() else values
    live = np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))
    offsets = np.frombuffer(values.buffers()[1], np.int32)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(values.buffers()[2], np.uint8) if values.buffers()[2] is not None else np.empty(0, np.uint8)
    padded = np.concatenate([data[: offsets[-1]], np.zeros(PAD, np.uint8)])
    starts = offsets[live].astype(np.int64)
    cursor = Cursor(padded, starts + header, offsets[live + 1].astype(np.int64))
    if live.size and bool((cursor.pos > cursor.end).any()):
        return None
    return cursor, live, padded[starts[:, None] + np.arange(header)]


def schema_ids(headers: np.ndarray) -> np.ndarray:
    """The schema ids of registry frames (magic byte, then the id in 4 big-endian bytes)."""
    framed = headers[:, 1:5].astype(np.uint32)
    return (framed[:, 0] << 24) | (framed[:, 1] << 16) | (framed[:, 2] << 8) | framed[:, 3]


def raw_varints(cursor: Cursor) -> tuple[np.ndarray, np.ndarray]:
    """The varints at the cursor (uint64) and the positions after them (not advanced)."""
    data, pos = cursor.data, cursor.pos
    byte = data[pos]
    raw = (byte & 0x7F).astype(np.uint64)
    length = np.ones(pos.size, np.int64)
    more = np.flatnonzero(byte & 0x80)
    shift = 7
    while more.size:
        if bool((pos[more] + length[more] > cursor.end[more]).any()):
            raise Inexact("a varint runs past its record")
        byte = data[pos[more] + length[more]]
        bits = (byte & 0x7F).astype(np.uint64)
        if shift == 63 and bool((bits > 1).any()) or shift > 63:
            raise Inexact("a varint wider than 64 bits")
        raw[more] |= bits << np.uint64(shift)
        length[more] += 1
        more = more[(byte & 0x80) != 0]
        shift += 7
    return raw, pos + length


def zigzag(raw: np.ndarray) -> np.ndarray:
    """Zigzag-decoded int64 values of raw varints."""
    return (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)


def bytes_at(cursor: Cursor, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The `lengths` bytes at each position, joined, and where each starts; advances past them."""
    starts = cursor.pos
    cursor.skip(lengths)
    offsets = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return cursor.data[index], offsets


def gather(cursor: Cursor, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The `lengths` bytes at each position as one string or binary array, advancing past them."""
    data, offsets = bytes_at(cursor, lengths)
    if offsets[-1] >= 1 << 31:
        raise Inexact("more than 2 GiB of values in a batch")
    array = pa.Array.from_buffers(kind, lengths.size, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])
    try:
        array.validate(full=True)  # a string must be UTF-8, as the record decoders require
    except pa.ArrowInvalid as exc:
        raise Inexact(str(exc)) from None
    return array


def payload_columns(read: dict[str, pa.Array], schema: pa.Schema, live: np.ndarray, size: int) -> list[pa.Array]:
    """One array per payload field of `size` rows: the columns `read` by name for the `live` rows
    (nulls at the others: tombstones), nulls for a field nothing was read for."""
    rows = None if live.size == size else spread(live, size)
    return [
        (read[f.name] if rows is None else pc.take(read[f.name], rows)) if f.name in read else pa.nulls(size, f.type)
        for f in schema
    ]


def spread(rows: np.ndarray, size: int) -> pa.Array:
    """Take indices placing the values read for `rows` at those rows of `size`, nulls elsewhere."""
    index = np.full(size, -1, np.int64)
    index[rows] = np.arange(rows.size)
    return pa.array(index, mask=index < 0)
