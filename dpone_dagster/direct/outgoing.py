"""What the producer sends of kept messages (both direct paths): the key sent, framed with the key
subject's id when keys are registry-encoded, the value framed with its schema's, and the headers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Registry-encoded keys: the key sent (unframed), beside `key`, the text repeated keys are settled on.
SENT_KEY = "sent_key"


def sent_keys(messages: pa.RecordBatch) -> pa.Array:
    """The keys the producer sends of kept messages (unframed)."""
    return messages.column(SENT_KEY) if SENT_KEY in messages.schema.names else messages.column("key")


def sent_size(column: pa.Array, frame_bytes: int) -> pa.Array:
    """Bytes of each key or value as sent, with its registry frame (none for a null: a null key,
    a tombstone's value)."""
    return pc.fill_null(pc.add(pc.binary_length(column), frame_bytes), 0)


def outgoing(kept: pa.RecordBatch, value_prefix: bytes, headers: pa.Array | None, key_prefix: bytes = b"") -> pa.RecordBatch:
    """What the producer sends of kept messages: the key and the value behind their registered
    schemas' frames (a null key or a tombstone stays null), and the headers with no partition
    chosen, when there are any."""
    key, value = _framed(sent_keys(kept), key_prefix), _framed(kept.column("value"), value_prefix)
    if headers is None:
        return pa.RecordBatch.from_arrays([key, value], names=["key", "value"])
    unassigned = pa.array(np.full(kept.num_rows, -1, np.int32))
    return pa.RecordBatch.from_arrays([key, value, headers, unassigned], names=["key", "value", "headers", "partition"])


def _framed(column: pa.Array, prefix: bytes) -> pa.Array:
    if not prefix:
        return column
    return pc.binary_join_element_wise(pa.scalar(prefix, pa.binary()), column, pa.scalar(b"", pa.binary()))
