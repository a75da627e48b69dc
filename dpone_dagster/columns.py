"""Names of the metadata columns that travel beside the payload columns of a batch.

Every name starts with `__dpone__` and none of them is written into a message payload, except
`__dpone__nc__<column>` variant columns, which are payload (schema evolution routes values there).
"""

from __future__ import annotations

from typing import Any

OP = "__dpone__op"  # upsert | delete
SOURCE_TOPIC = "__dpone__source_topic"
SOURCE_PARTITION = "__dpone__source_partition"
SOURCE_OFFSET = "__dpone__source_offset"
SOURCE_TIMESTAMP = "__dpone__source_timestamp"
SOURCE_KEY = "__dpone__source_key"
SOURCE_HEADERS = "__dpone__source_headers"
CORRUPT = "__dpone__corrupt"
ORDER = "__dpone__order"  # source order, used by keep_last / keep_first and ordered produce
# JSON drift past the schema sample: a record's unknown top-level keys and its text (extract only).
UNKNOWN_KEYS = "__dpone__unknown_keys"
UNKNOWN_TEXT = "__dpone__unknown_text"
# Flat JSON, before the batch is kept: the read task decoded the record (sources/kafka_reader.py).
JSON_OK = "__dpone__json_ok"

METADATA = frozenset(
    {OP, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TIMESTAMP, SOURCE_KEY, SOURCE_HEADERS, CORRUPT, ORDER, UNKNOWN_KEYS, UNKNOWN_TEXT, JSON_OK}
)

UPSERT = "upsert"
DELETE = "delete"
# The ops of a source's dpone envelope that delete its key (both paths read them alike).
DELETE_OPS = ("delete", "d", "DELETE", "D")


def payload_columns(columns: list[str]) -> list[str]:
    return [c for c in columns if c not in METADATA]


def json_column(index: int) -> str:
    """Name of the read task's decoded payload field `index` (payload names may clash with raw ones)."""
    return f"__dpone__json_{index}"


def reads_decoded(df: Any) -> bool:
    """Whether the read tasks decoded this frame's values already (it has the JSON_OK column)."""
    return JSON_OK in df.columns
