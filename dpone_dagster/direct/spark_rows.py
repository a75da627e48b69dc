"""Records of a JSON source that Spark's decoder reads and the task decoder does not: `+INF` or a
quoted "NaN" in a double field (Spark's allowNonNumericNumbers), a number or an object where the
schema holds a string (Spark keeps its JSON text), an envelope of the other kind under
`envelope: auto`. The driver has Spark decode them (engine/direct_bad_records.py) and hands the
rows to the tasks, which splice them into their decoded batches in source order (pure: no IO).
So the batch stays on the direct path, and each such record carries the values the Spark SQL path
decodes for it; everything after the decode (checks, keys, shaping, sizes) is the one rule."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

# The position of each row and whether it is a delete (a delete op), before the payload fields
# (named as the engine's own columns, which no payload field may be: engine/direct._settings).
PARTITION, OFFSET, IS_DELETE = "__dpone__partition", "__dpone__offset", "__dpone__is_delete"
POSITION = pa.schema([(PARTITION, pa.int32()), (OFFSET, pa.int64()), (IS_DELETE, pa.bool_())])
# Rows the driver hands over (they travel to every task with its settings); a batch with more
# records only Spark's decoder reads goes to the Spark SQL path.
MAX_ROWS = 10_000
MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class SparkRows:
    """Rows Spark decoded: POSITION's fields, then the payload's in the task decoder's types."""

    table: pa.Table

    @staticmethod
    def of(positions: pa.Table, payload: pa.Table, schema: pa.Schema) -> SparkRows:
        """`payload` (Spark's Arrow form of the rows) cast to `schema`, the task decoder's: the same
        logical types (Spark's large strings become strings, its time zone the decoder's)."""
        columns = [*positions.cast(POSITION).columns, *payload.select(schema.names).cast(schema).columns]
        return SparkRows(pa.Table.from_arrays(columns, schema=pa.schema([*POSITION, *schema])))

    @property
    def payload_schema(self) -> pa.Schema:
        return pa.schema(list(self.table.schema)[len(POSITION) :])

    def joined(self, other: SparkRows | None) -> SparkRows:
        return self if other is None else SparkRows(pa.concat_tables([other.table, self.table]))

    @cached_property
    def _by_partition(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per source partition: the rows' offsets (sorted) and their row numbers in the table."""
        partitions = self.table.column(PARTITION).to_numpy()
        offsets = self.table.column(OFFSET).to_numpy()
        out = {}
        for partition in np.unique(partitions):
            rows = np.flatnonzero(partitions == partition)
            order = np.argsort(offsets[rows], kind="stable")
            out[int(partition)] = (offsets[rows][order], rows[order])
        return out

    def found(self, raw: pa.RecordBatch) -> np.ndarray | None:
        """Which records of `raw` (one partition's, in offset order) have a row here; None for none."""
        if not raw.num_rows:
            return None
        held = self._by_partition.get(int(raw.column("partition")[0].as_py()))
        if held is None:
            return None
        offsets = raw.column("offset").to_numpy()
        if held[0][-1] < offsets[0] or held[0][0] > offsets[-1]:
            return None
        found = np.isin(offsets, held[0])
        return found if found.any() else None

    def splice(self, raw: pa.RecordBatch, found: np.ndarray, columns: list[pa.Array], deletes: pa.Array) -> tuple[list[pa.Array], pa.Array]:
        """The decoded columns and deletes of `raw`: those of the records not `found` (`columns`,
        `deletes`, in their order) with this table's rows put in at the records `found`."""
        offsets, rows = self._by_partition[int(raw.column("partition")[0].as_py())]
        picked = self.table.take(pa.array(rows[np.searchsorted(offsets, raw.column("offset").to_numpy()[found])]))
        kept = len(found) - int(found.sum())
        order = np.empty(len(found), np.int64)
        order[~found] = np.arange(kept)
        order[found] = kept + np.arange(len(found) - kept)
        at = pa.array(order)
        first = len(POSITION)
        spliced = [pa.concat_arrays([c, picked.column(first + i).combine_chunks()]).take(at) for i, c in enumerate(columns)]
        return spliced, pa.concat_arrays([deletes, picked.column(IS_DELETE).combine_chunks()]).take(at)

    def too_many(self) -> str | None:
        """Why these rows cannot travel with the tasks' settings, or None."""
        if self.table.num_rows > MAX_ROWS or self.table.nbytes > MAX_BYTES:
            return f"more than {MAX_ROWS:,} records, or {MAX_BYTES >> 20} MB of them, only Spark's decoder reads"
        return None
