"""Message headers (pure), in the Spark SQL path's order: the source record's own headers when
they are replicated, then the static ones, then lineage (`dpone.source.topic`, `.partition`,
`.offset`, as text). A sink that adds none gives no header list at all."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@dataclass(frozen=True)
class HeaderSpec:
    static: tuple[tuple[str, bytes], ...]
    lineage_topic: str | None  # the source topic when lineage headers are on
    replicate: bool  # the source record's headers first

    @classmethod
    def of(cls, static: dict[str, str], lineage: bool, replicate: bool, topic: str) -> HeaderSpec | None:
        if not static and not lineage and not replicate:
            return None
        return cls(tuple((k, str(v).encode()) for k, v in static.items()), topic if lineage else None, replicate)


def headers(spec: HeaderSpec, partition: int, offsets: pa.Array, source: pa.Array | None) -> pa.Array:
    """The header list of each message of one slice (`offsets`: the source offsets; `source`: the
    source records' headers, when replicated), built column-wise: the fixed entries of every row
    (static, lineage) are taken from a small pool, then placed after the row's own headers."""
    n = len(offsets)
    if n == 0:
        return pa.array([], HEADERS_TYPE)
    fixed_keys = [k for k, _ in spec.static]
    fixed_values: list[bytes] = [v for _, v in spec.static]
    if spec.lineage_topic is not None:
        fixed_keys += ["dpone.source.topic", "dpone.source.partition", "dpone.source.offset"]
        fixed_values += [spec.lineage_topic.encode(), str(partition).encode()]
    per_row = len(fixed_keys)
    rows = np.arange(n)
    key_index = np.tile(np.arange(per_row), n)
    value_index = key_index.copy()
    value_pool = pa.array(fixed_values, pa.binary())
    if spec.lineage_topic is not None:  # the last entry is the row's own offset
        value_index[per_row - 1 :: per_row] = len(fixed_values) + rows
        value_pool = pa.concat_arrays([value_pool, pc.cast(pc.cast(offsets, pa.string()), pa.binary())])
    keys = pa.array(fixed_keys, pa.string()).take(pa.array(key_index))
    values = value_pool.take(pa.array(value_index))
    counts = np.full(n, per_row, np.int64)
    if spec.replicate and source is not None:
        own = source.fill_null([]) if source.null_count else source
        own_offsets = own.offsets.to_numpy().astype(np.int64)
        own_counts = np.diff(own_offsets)
        flat = own.values.slice(own_offsets[0], own_offsets[-1] - own_offsets[0])
        keys = pa.concat_arrays([flat.field("key"), keys])
        values = pa.concat_arrays([flat.field("value"), values])
        # Row i: its own headers, then its fixed entries (which follow every own header in the pool).
        total = own_counts + per_row
        starts = np.concatenate([[0], np.cumsum(total)[:-1]])
        local = np.arange(int(total.sum())) - np.repeat(starts, total)
        row_of = np.repeat(rows, total)
        own_start = own_offsets[:-1] - own_offsets[0]
        is_own = local < own_counts[row_of]
        index = np.where(is_own, own_start[row_of] + local, len(flat) + row_of * per_row + (local - own_counts[row_of]))
        keys, values, counts = keys.take(pa.array(index)), values.take(pa.array(index)), total
    entries = pa.StructArray.from_arrays([keys, values], names=["key", "value"])
    offsets_out = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets_out), entries).cast(HEADERS_TYPE)


def header_bytes(spec: HeaderSpec, partition: int, offsets: pa.Array, source: pa.Array | None) -> np.ndarray:
    """Bytes the headers of each message take (keys and values), as message.max.bytes counts them."""
    n = len(offsets)
    fixed = sum(len(k.encode()) + len(v) for k, v in spec.static)
    total = np.full(n, fixed, np.int64)
    if spec.lineage_topic is not None:
        names = len(b"dpone.source.topic") + len(b"dpone.source.partition") + len(b"dpone.source.offset")
        total += names + len(spec.lineage_topic.encode()) + len(str(partition))
        total += pc.utf8_length(pc.cast(offsets, pa.string())).to_numpy(zero_copy_only=False).astype(np.int64)
    if spec.replicate and source is not None and len(source):
        flat = pc.list_flatten(source)
        sizes = pc.add(pc.fill_null(pc.binary_length(flat.field("key")), 0), pc.fill_null(pc.binary_length(flat.field("value")), 0))
        per_row = pc.list_parent_indices(source)
        total += np.bincount(per_row.to_numpy(zero_copy_only=False), weights=sizes.to_numpy(zero_copy_only=False), minlength=n).astype(np.int64)
    return total
