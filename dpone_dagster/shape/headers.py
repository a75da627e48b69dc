"""Message headers (pure), in the Spark SQL path's order: the source record's own headers when
they are replicated, then the static ones, then lineage (`dpone.source.topic`, `.partition`,
`.offset`, as text). A sink that adds none gives no header list at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def _lineage(spec: HeaderSpec, partition: int, offset: int) -> list[tuple[str, bytes]]:
    if spec.lineage_topic is None:
        return []
    return [
        ("dpone.source.topic", spec.lineage_topic.encode()),
        ("dpone.source.partition", str(partition).encode()),
        ("dpone.source.offset", str(offset).encode()),
    ]


def headers(spec: HeaderSpec, partition: int, offsets: pa.Array, source: pa.Array | None) -> pa.Array:
    """The header list of each message of one slice (`offsets`: the source offsets; `source`: the
    source records' headers, when replicated)."""
    lists: list[Any] = []
    own = source.to_pylist() if spec.replicate and source is not None else None
    static = [{"key": k, "value": v} for k, v in spec.static]
    for i, offset in enumerate(offsets.to_pylist()):
        entries = list(own[i] or []) if own is not None else []
        entries += static
        entries += [{"key": k, "value": v} for k, v in _lineage(spec, partition, offset)]
        lists.append(entries)
    return pa.array(lists, HEADERS_TYPE)


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
