"""Repeated message keys across a batch, found from 64-bit hashes of the keys (pure numpy).

Each task hashes the keys it shaped; its distinct hashes and those that repeat within it are split
into buckets, and each bucket (a Spark task after a shuffle, or the driver on Spark Connect) adds up
what every task sent it. A hash seen more than once is a *candidate*: the key may repeat, or two
keys may share a hash. Candidates are then settled on the keys themselves, so a
collision never drops or reorders a record (engine: dedupe and per-key order).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_LENGTH_SALT = np.uint64(0xC2B2AE3D27D4EB4F)


def key_hashes(keys: pa.Array) -> np.ndarray:
    """A 64-bit hash of each key's bytes (a binary array without nulls), vectorised: a polynomial
    over the bytes, mixed with the length and a splitmix64 finaliser."""
    if keys.null_count:
        raise ValueError("key_hashes: null keys")
    n = len(keys)
    offsets = np.frombuffer(keys.buffers()[1], np.int32)[keys.offset : keys.offset + n + 1].astype(np.int64)
    data_buffer = keys.buffers()[2]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    data = data[offsets[0] : offsets[-1]].astype(np.uint64)
    starts = offsets[:-1] - offsets[0]
    lengths = np.diff(offsets)
    position = np.arange(len(data), dtype=np.int64) - np.repeat(starts, lengths)
    with np.errstate(over="ignore"):
        weights = _powers(int(lengths.max()) if n else 0)[position]
        sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(data * weights, dtype=np.uint64)])
        h = (sums[starts + lengths] - sums[starts]) ^ (lengths.astype(np.uint64) * _LENGTH_SALT)
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


def _powers(length: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        powers = np.full(max(length, 1), _MULTIPLIER, np.uint64)
        powers[0] = np.uint64(1)
        return np.cumprod(powers, dtype=np.uint64)


@dataclass(frozen=True)
class TaskHashes:
    """One task's key hashes: distinct (sorted), those it saw more than once, and how often."""

    distinct: np.ndarray
    repeated: np.ndarray
    repeated_counts: np.ndarray

    @staticmethod
    def of(hashes: Iterable[np.ndarray]) -> TaskHashes:
        arrays = [h for h in hashes if len(h)]
        if not arrays:
            empty = np.zeros(0, np.uint64)
            return TaskHashes(empty, empty, np.zeros(0, np.int64))
        distinct, counts = np.unique(np.concatenate(arrays), return_counts=True)
        return TaskHashes(distinct, distinct[counts > 1], counts[counts > 1])

    def rows_of(self, found: np.ndarray) -> int:
        """How many of the task's rows have a hash among `found` (sorted)."""
        rows = int(in_sorted(self.distinct, found).sum())
        return rows + int((self.repeated_counts[in_sorted(self.repeated, found)] - 1).sum())

    def split(self, buckets: int) -> list[TaskHashes]:
        """The hashes by bucket (hash modulo `buckets`): equal hashes of any two tasks meet in one
        bucket, so each bucket finds its candidates on its own."""
        return [
            TaskHashes(
                self.distinct[self.distinct % buckets == b],
                self.repeated[self.repeated % buckets == b],
                self.repeated_counts[self.repeated % buckets == b],
            )
            for b in range(buckets)
        ]


def candidates(tasks: Iterable[TaskHashes]) -> np.ndarray:
    """Hashes seen more than once in the whole batch (sorted): within a task, or in two tasks."""
    tasks = list(tasks)
    distinct = [t.distinct for t in tasks if len(t.distinct)]
    repeated = [t.repeated for t in tasks if len(t.repeated)]
    across = np.zeros(0, np.uint64)
    if len(distinct) > 1:
        values, counts = np.unique(np.concatenate(distinct), return_counts=True)
        across = values[counts > 1]
    return np.unique(np.concatenate([across, *repeated])) if repeated else across


def repeated_keys(records: pa.Table) -> pa.Array:
    """The keys (the `key` column) found more than once among `records`, sorted: a candidate hash
    shared by different keys only gives none."""
    counted = records.select(["key"]).group_by("key").aggregate([("key", "count")])
    return counted.filter(pc.field("key_count") > 1).sort_by("key").column("key").combine_chunks()


def left_out_by_policy(records: pa.Table, order: list[str], policy: str) -> pa.Table:
    """keep_last / keep_first among `records` (a `key` column, then the source order's columns
    `order`, most significant first): every record but one per key, as the Spark SQL path's
    window ranks them (kafka_messages.dedupe: a null orders before any value, NaN after every
    number). Pure Arrow."""
    ranked = in_source_order(records, order, descending=policy == "keep_last")
    keys = ranked.column("key").combine_chunks()
    first = np.ones(len(keys), bool)
    if len(keys) > 1:
        first[1:] = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(zero_copy_only=False)
    return ranked.filter(pa.array(~first))


def in_source_order(records: pa.Table, order: list[str], descending: bool = False) -> pa.Table:
    """`records` by key, then by the source order's columns `order` (most significant first), as
    Spark sorts them: a null before any value, NaN after every number. Pure Arrow."""
    direction = "descending" if descending else "ascending"
    nulls = "at_end" if descending else "at_start"  # a null is the smallest value
    columns, sort_keys = {"key": records.column("key")}, [("key", "ascending", nulls)]
    for name in order:
        column = records.column(name)
        if pa.types.is_floating(column.type):  # NaN ranks above every number, as in Spark
            nan = pc.is_nan(column)
            columns[f"{name}.nan"] = nan
            column = pc.if_else(nan, pa.scalar(0.0, column.type), column)
            sort_keys.append((f"{name}.nan", direction, nulls))
        columns[name] = column
        sort_keys.append((name, direction, nulls))
    return records.take(pc.sort_indices(pa.table(columns), options=pc.SortOptions(sort_keys=sort_keys)))


def keyed_hashes(keys: pa.Array) -> np.ndarray:
    """The hashes of the keys that are not null: a message without a key is never settled (the
    Spark SQL path publishes every one of them)."""
    return key_hashes(keys.filter(keys.is_valid()) if keys.null_count else keys)


def is_candidate(keys: pa.Array, candidates: np.ndarray) -> np.ndarray:
    """Which keys' hashes are among `candidates` (sorted); a null key never is."""
    if not keys.null_count:
        return in_sorted(key_hashes(keys), candidates)
    valid = keys.is_valid().to_numpy(zero_copy_only=False)
    chosen = np.zeros(len(keys), bool)
    chosen[valid] = in_sorted(keyed_hashes(keys), candidates)
    return chosen


def in_sorted(values: np.ndarray, sorted_values: np.ndarray) -> np.ndarray:
    """Which of `values` are in `sorted_values` (ascending): a binary search, where np.isin would
    sort `sorted_values` again on every call."""
    if not len(sorted_values):
        return np.zeros(len(values), bool)
    at = np.searchsorted(sorted_values, values)
    return sorted_values[np.minimum(at, len(sorted_values) - 1)] == values
