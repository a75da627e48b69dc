"""Executor side of the ordered produce (engine/direct_load.produce_ordered): the messages of keys
that repeat where every record is published (an append, duplicate_policy: allow), as the
producer sends them, with their source order, so that Spark can hand each key's messages to one
producing task in that order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dpone_dagster.direct import task
from dpone_dagster.direct.keys import in_sorted
from dpone_dagster.direct.outgoing import outgoing
from dpone_dagster.direct.progress import Slice
from dpone_dagster.shape import headers as message_headers
from dpone_dagster.shape.headers import HEADERS_TYPE

# What a task hands over: the message as sent (headers empty and partition -1 when there are
# none: the producer's plain case), then the source order (timestamp, partition, offset).
ORDERED_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADERS_TYPE),
        ("partition", pa.int32()),
        ("timestamp", pa.int64()),
        ("source_partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)
ORDERED_DDL = (
    "key binary, value binary, headers array<struct<key:string,value:binary>>, partition int, "
    "timestamp long, source_partition int, offset long"
)
SOURCE_ORDER = ("timestamp", "source_partition", "offset")


def ordered_messages(settings: task.DirectSettings, slices: list[Slice], ordered: dict[int, np.ndarray], set_aside: dict[int, np.ndarray]) -> pa.Table:
    """The messages of `slices` at the source offsets `ordered` (per partition, sorted) as the
    producer sends them, with their source order. `set_aside`: the source offsets the scan set
    aside, per partition (never among `ordered`)."""
    found = []
    for piece in slices:
        _, partition, start, end = piece
        wanted = ordered.get(partition)
        if wanted is None or not np.any((wanted >= start) & (wanted < end)):
            continue  # no record of this slice is produced first: it is not read
        for batch in task.slice_messages(settings, piece, set_aside.get(partition)):
            chosen = in_sorted(batch.column("offset").to_numpy(), wanted)
            if not chosen.any():
                continue
            picked = batch.filter(pa.array(chosen))
            listed = None
            if settings.headers is not None:
                source = picked.column(task.SOURCE_HEADERS) if task.SOURCE_HEADERS in picked.schema.names else None
                listed = message_headers.headers(settings.headers, partition, picked.column("offset"), source)
            sent = outgoing(picked, settings.value_prefix, listed, settings.key_prefix)
            n = picked.num_rows
            headers = sent.column("headers") if "headers" in sent.schema.names else pa.array([[]] * n, HEADERS_TYPE)
            found.append(
                pa.RecordBatch.from_arrays(
                    [
                        sent.column("key"),
                        sent.column("value"),
                        headers,
                        pa.array(np.full(n, -1, np.int32)),
                        picked.column("timestamp"),
                        pa.array(np.full(n, partition, np.int32)),
                        picked.column("offset"),
                    ],
                    schema=ORDERED_SCHEMA,
                )
            )
    return pa.Table.from_batches(found, ORDERED_SCHEMA)
