"""Values of a batch encoded with a registered Avro schema, unframed (the Confluent frame with the
schema id is added when the id is known: engine/direct_registry.py). Column-wise where the batch's
types match the schema (formats/avro_arrow.py); otherwise row by row with the registry codec's
record encoder, which converts values the way the Spark SQL path does."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import pyarrow as pa

from dpone_dagster.formats.avro_arrow import Unsupported, encode_records
from dpone_dagster.schema.wire_format import HEADER_SIZE


class Unencodable(Exception):
    """A value the registered schema cannot take (an enum symbol it lacks, a null it forbids)."""


def encode_values(columns: list[pa.Array], names: list[str], schema_str: str) -> pa.Array:
    """Each row of `columns` (named `names`) as the unframed Avro bytes of `schema_str`."""
    rows = len(columns[0]) if columns else 0
    try:
        return encode_records(dict(zip(names, columns, strict=True)), _parsed(schema_str), rows)
    except Unsupported:
        pass
    encoder = _row_encoder(schema_str)
    table = pa.Table.from_arrays(columns, names=names)
    out = []
    for row in table.to_pylist():
        try:
            out.append(encoder.encode(row)[HEADER_SIZE:])
        except Exception as exc:  # noqa: BLE001 - the run's path decides what a bad value means
            raise Unencodable(f"a value the registered Avro schema cannot take: {exc}") from exc
    return pa.array(out, pa.binary())


@lru_cache(maxsize=8)
def _parsed(schema_str: str) -> dict[str, Any]:
    return json.loads(schema_str)


@lru_cache(maxsize=8)
def _row_encoder(schema_str: str) -> Any:
    from dpone_dagster.spark.registry_codec import RecordEncoder

    return RecordEncoder("avro", 0, schema_str)  # the id is in the frame, added later
