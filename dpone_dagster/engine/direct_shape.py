"""What both direct paths (Kafka and SQL sources) take from the sink's settings to shape their
messages, one rule each (pure)."""

from __future__ import annotations

from dpone_dagster.manifest.models import KafkaSink


def delete_mode(sink: KafkaSink) -> str:
    """What a delete becomes: a tombstone, an envelope delete event, or (deletes disabled) what
    when_disabled says: skip | fail."""
    deletes = sink.options.deletes
    if not deletes.enabled:
        return deletes.when_disabled
    return "tombstone" if deletes.tombstone else "event"
