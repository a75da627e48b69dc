"""Whether a run that automation requested (a sensor, a schedule, an automation condition) is still
wanted when it starts.

Requests are decided on what the instance knew at the tick; a run waits in the queue behind the
pool slot of its pipeline. When another run (a backfill, a UI run, the schedule beside the sensor)
materialized one of its windows in the meantime, producing it again would duplicate the window's
records in the sink: such a run produces nothing and says why; the next tick asks for what is
still missing. Runs a person launched (UI, CLI, a backfill) always run: re-materializing a window
is something a person may want.
"""

from __future__ import annotations

from dagster import AssetExecutionContext, AssetKey, AssetRecordsFilter

# Tags Dagster puts on the runs its sensors (the automation condition sensor too), schedules and
# asset daemon launch; a person's re-execution of such a run keeps them but has no retry number.
AUTOMATIC_TAGS = ("dagster/sensor_name", "dagster/schedule_name", "dagster/auto_materialize")
PARENT_RUN = "dagster/parent_run_id"
ROOT_RUN = "dagster/root_run_id"
RETRY_NUMBER = "dagster/retry_number"  # Dagster's own run retries
# When this project's sensor or schedule decided a request (epoch seconds); other runs: when created.
REQUESTED_AT = "dpone/requested_at"


def superseded(context: AssetExecutionContext, asset_key: AssetKey, keys: list[str]) -> str | None:
    """Why this automatic run of window(s) `keys` must not produce, or None."""
    tags = context.run.tags
    if not keys or not any(tag in tags for tag in AUTOMATIC_TAGS):
        return None
    if PARENT_RUN in tags and RETRY_NUMBER not in tags:
        return None  # re-executed by a person from the UI
    requested_at = _requested_at(context)
    if requested_at is None:
        return None
    found = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset_key, asset_partitions=keys, after_timestamp=requested_at), limit=100
    ).records
    by_run = {r.partition_key: r.run_id for r in found if r.run_id != context.run_id}
    if not by_run:
        return None
    done = ", ".join(f"{key} (run {run_id})" for key, run_id in sorted(by_run.items()))
    return (
        f"window(s) {done} were materialized by another run after this run was requested; nothing was produced "
        "(producing them again would duplicate their records); the next tick asks for any window still missing"
    )


def _requested_at(context: AssetExecutionContext) -> float | None:
    """When the request was decided: the tick's time tagged by this project's sensor and schedule
    (retries keep the tag), else when the first run of the request (a retry's root) was created."""
    tags = context.run.tags
    tagged = tags.get(REQUESTED_AT)
    if tagged is not None:
        try:
            return float(tagged)
        except ValueError:
            pass
    record = context.instance.get_run_record_by_id(tags.get(ROOT_RUN, context.run_id))
    return record.create_timestamp.timestamp() if record is not None else None
