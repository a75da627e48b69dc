"""Time-window partitions of a manifest with read_mode: time_window.

A partition key maps to a window [start, end); the engine maps a window to per-partition offsets
(kafka/windows.py): the ranges its first run recorded, else its neighbours' recorded edges, else
the timestamp lookup. Every offset belongs to exactly one window.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from dagster import (
    DailyPartitionsDefinition,
    HourlyPartitionsDefinition,
    TimeWindowPartitionsDefinition,
)

from dpone_dagster.manifest.models import KafkaSource, Manifest, TimeWindowPartitions
from dpone_dagster.sources.kafka import TimeWindow

KEY_FORMATS = {"hourly": "%Y-%m-%d-%H:%M", "daily": "%Y-%m-%d", "cron": "%Y-%m-%d-%H:%M"}


def partition_settings(manifest: Manifest) -> TimeWindowPartitions | None:
    source = manifest.source
    if not isinstance(source, KafkaSource) or source.options.read_mode != "time_window":
        return None
    return source.options.partitions or TimeWindowPartitions()


def partitions_def_for(manifest: Manifest) -> TimeWindowPartitionsDefinition | None:
    settings = partition_settings(manifest)
    if settings is None:
        return None
    start = datetime.fromisoformat(settings.start)  # any ISO 8601 text; the zone comes from `timezone`
    if settings.granularity == "hourly":
        return HourlyPartitionsDefinition(start_date=start, timezone=settings.timezone, fmt=KEY_FORMATS["hourly"])
    if settings.granularity == "daily":
        return DailyPartitionsDefinition(start_date=start, timezone=settings.timezone, fmt=KEY_FORMATS["daily"])
    assert settings.cron is not None
    return TimeWindowPartitionsDefinition(
        cron_schedule=settings.cron, start=start, timezone=settings.timezone, fmt=KEY_FORMATS["cron"]
    )


def window_for_key(partitions_def: TimeWindowPartitionsDefinition, key: str) -> TimeWindow:
    window = partitions_def.time_window_for_partition_key(key)
    return TimeWindow(window.start, window.end, key)


def is_closed(window: TimeWindow, settings: TimeWindowPartitions, now: datetime) -> bool:
    """A window runs once it has ended and the allowed lateness has passed."""
    return now >= window.end + timedelta(seconds=settings.allowed_lateness_seconds)
