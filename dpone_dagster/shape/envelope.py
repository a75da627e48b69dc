"""The dpone envelope around a row's JSON (pure): `{"op", "data", "metadata": {"strategy",
"run_id"}, "source", "schema_version"}`, byte for byte as the Spark SQL path's `to_json` writes it
(fields in that order, a null `source` when the source has no fields to name)."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from dpone_dagster.sinks.json_encode import json_string

SCHEMA_VERSION = 1


def envelope_parts(op: str, strategy: str, run_id: str, source_fields: Mapping[str, str]) -> tuple[str, str]:
    """The text before and after the row's JSON object (pure)."""
    source = "{" + ",".join(f"{json_string(k)}:{json_string(v)}" for k, v in source_fields.items()) + "}" if source_fields else "null"
    head = f'{{"op":{json_string(op)},"data":'
    tail = f',"metadata":{{"strategy":{json_string(strategy)},"run_id":{json_string(run_id)}}},"source":{source},"schema_version":{SCHEMA_VERSION}}}'
    return head, tail


def wrap(data: pa.Array, parts: tuple[str, str]) -> pa.Array:
    """Each row's JSON object (`data`, text or binary) inside the envelope `parts`."""
    head, tail = parts
    text = data.cast(pa.string()) if pa.types.is_binary(data.type) else data
    return pc.binary_join_element_wise(head, text, tail, "")
