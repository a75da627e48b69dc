"""Declarative automation on a manifest asset (`dagster.automation`), evaluated by the daemon's
automation sensor.

- Unpartitioned (offsets): `on_cron` materializes the asset once per cron tick unless a run of it
  is in progress. A failed run is not re-requested before the next tick (run retries still apply).
- Time windows: a tick requests only windows that are closed (their allowed lateness has passed),
  not materialized and not in progress (any launcher: UI, CLI, backfill, sensor, schedule, whose
  planned materializations Dagster tracks per partition), within `sensor.catch_up_windows` windows
  back. A materialized window is never re-produced by automation; a failed one is asked for again
  at the next tick.

Closed windows come from Dagster's own condition: a window that ends at least the lateness before
the end of the latest complete window has ended at least the lateness before now (the latest
complete window ends at or before now). A window closing between two window ends waits for the
next one: late by at most one window, never early.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from dagster import AutomationCondition, TimeWindowPartitionsDefinition

from dpone_dagster.assets.partitions import partition_settings, partitions_def_for
from dpone_dagster.manifest.models import Manifest


def automation_condition(manifest: Manifest) -> AutomationCondition | None:
    options = manifest.dagster.automation
    if options is None:
        return None
    tick = AutomationCondition.cron_tick_passed(options.on_cron, options.timezone).since_last_handled()
    label = f"on_cron({options.on_cron}, {options.timezone})"
    settings, partitions_def = partition_settings(manifest), partitions_def_for(manifest)
    if settings is None or partitions_def is None:
        return (tick & ~AutomationCondition.in_progress()).with_label(label)
    # Dagster takes the look-back in wall-clock time of the partitions' zone: across a daylight
    # saving change it is an hour short, so zones that change keep an hour more.
    lateness = timedelta(seconds=settings.allowed_lateness_seconds) + (timedelta(hours=1) if changes_offset(settings.timezone) else timedelta(0))
    length = window_length(partitions_def)
    catch_up = manifest.dagster.sensor.catch_up_windows
    # Dagster's `in_latest_time_window(d)`: the windows that start at or after (end of the latest
    # complete window − d). A window that starts before (that end − lateness − its length) ended
    # at least the lateness before that end, which is at or before now: it is closed.
    # Without lateness the latest complete window is closed too.
    closed = AutomationCondition.in_latest_time_window(lateness + length * (catch_up + (1 if lateness else 0)))
    if lateness:
        closed = closed & ~AutomationCondition.in_latest_time_window(lateness + length)
    return (
        closed.with_label(f"closed (lateness {settings.allowed_lateness_seconds}s), at most {catch_up} windows back")
        & AutomationCondition.missing()
        & ~AutomationCondition.in_progress()
        & tick
    ).with_label(f"{label}: closed windows not materialized")


def window_length(partitions_def: TimeWindowPartitionsDefinition, sample: int = 14) -> timedelta:
    """The longest of the first `sample` windows (a cron of weekdays or months has windows of
    several lengths; the longest keeps the closed-window rule on the safe side)."""
    start = partitions_def.start
    longest = timedelta(0)
    for _ in range(sample):
        window = partitions_def.time_window_for_partition_key(start.strftime(partitions_def.fmt))
        longest = max(longest, window.end - window.start)
        start = window.end
    return longest


def changes_offset(timezone: str) -> bool:
    """Whether the zone's UTC offset changes during the year (daylight saving)."""
    zone = ZoneInfo(timezone)
    year = datetime.now(UTC).year
    return len({datetime(year, month, 1, tzinfo=zone).utcoffset() for month in range(1, 13)}) > 1
