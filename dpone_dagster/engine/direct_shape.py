"""What both direct paths (Kafka and SQL sources) take from the sink's settings to shape their
messages, one rule each (pure)."""

from __future__ import annotations

from dpone_dagster.manifest.models import KafkaSink


def key_columns(sink: KafkaSink, names: list[str]) -> tuple[tuple[int, ...] | None, str | None]:
    """The positions in `names` of the unique key's columns (None: no unique_key columns, or
    key.mode is not unique_key), or why the batch cannot be keyed on the direct path."""
    if sink.options.key.mode != "unique_key" or not sink.strategy.unique_key_columns:
        return None, None
    missing = [c for c in sink.strategy.unique_key_columns if c not in names]
    if missing:
        return None, f"unique_key column(s) {missing} not in the batch"
    return tuple(names.index(c) for c in sink.strategy.unique_key_columns), None


def delete_mode(sink: KafkaSink) -> str:
    """What a delete becomes: a tombstone, an envelope delete event, or (deletes disabled) what
    when_disabled says: skip | fail."""
    deletes = sink.options.deletes
    if not deletes.enabled:
        return deletes.when_disabled
    return "tombstone" if deletes.tombstone else "event"
