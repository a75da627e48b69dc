"""Stage 1, plan: fix what this run reads (offset ranges, or a SQL boundary) before reading, and
how the state advances once the sink succeeded. A retry reads the same boundary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from dpone_dagster.engine import time_windows
from dpone_dagster.engine.clients import RunClients
from dpone_dagster.engine.offsets import OffsetStorage
from dpone_dagster.engine.request import RunRequest
from dpone_dagster.engine.results import RunResult
from dpone_dagster.engine.stages.commit import StateMove
from dpone_dagster.kafka.windows import record_of
from dpone_dagster.manifest.models import KafkaSource, Manifest
from dpone_dagster.sources.kafka import KafkaBatchSource
from dpone_dagster.state.base import RunRecord, StateStore


@dataclass
class PlannedRead:
    """A source's fixed boundary and how to advance the state once the sink succeeded."""

    source: Any  # KafkaBatchSource | SqlBatchSource (sources/base.py)
    boundary: Any  # Boundary | SqlBoundary
    name: str  # what is read, for progress messages
    label: str  # the source, for error messages
    incremental: bool  # an empty batch means "no new data" (not a short batch)
    state: StateMove  # how the state advances once the sink succeeded (engine/stages/commit.py)
    # Stores the offsets of partitions delivered so far while the run goes on (Kafka offsets read
    # by a cursor); None where the state moves only with the whole batch.
    checkpoint: Callable[[dict[int, int]], None] | None = None


def plan_read(
    manifest: Manifest,
    spark: SparkSession,
    request: RunRequest,
    store: StateStore,
    record: RunRecord,
    result: RunResult,
    clients: RunClients,
) -> PlannedRead:
    planned = (
        _plan_kafka(manifest, request, store, record, result, clients)
        if isinstance(manifest.source, KafkaSource)
        else _plan_sql(manifest, spark, store)
    )
    result.boundary = planned.boundary.as_dict()
    result.notes.extend(planned.boundary.notes)
    return planned


def _plan_kafka(
    manifest: Manifest,
    request: RunRequest,
    store: StateStore,
    record: RunRecord,
    result: RunResult,
    clients: RunClients,
) -> PlannedRead:
    source_registry = (
        clients.registry(manifest.source) if manifest.source.options.message_format != "json" else None
    )
    source = KafkaBatchSource(manifest, clients.kafka(manifest.source), source_registry)
    offsets = OffsetStorage(manifest, store, source.client_config, source.group_id)
    stored = offsets.load(request.fallback_offsets, manifest.name, record.run_id)
    # Windows materialized before read the offsets they recorded then (kafka/windows.py).
    boundary = source.plan(stored, request.windows, time_windows.load_recorded(manifest, store))
    result.lag_before = boundary.lag_before
    # A time window or a replaced slice is addressed by its bounds, not by a cursor.
    advance = boundary.method != "time_window" and manifest.sink.strategy.mode != "replace"
    screen = (
        time_windows.LateRecordScreen(source, result, clients.kafka(manifest.sink))
        if boundary.method == "time_window"
        else None
    )

    def store_offsets(success: RunRecord) -> dict[int, int]:
        windows = record_of(boundary.windows, success.run_id) if screen is not None else None
        offsets.commit(success, boundary.end_offsets if advance else None, windows)
        result.lag_after = boundary.lag_before - boundary.total if advance else None
        return boundary.end_offsets if advance else {}

    incremental = boundary.method in ("offsets", "max_records") and manifest.sink.strategy.mode not in (
        "full_refresh",
        "replace",
    )
    summary = f"{boundary.total} offsets in {len(boundary.ranges)} partition(s) of '{boundary.topic}'"
    # Offsets stored as slices are delivered bound a rerun's duplicates; a full_refresh rerun reads
    # the whole topic again whatever is stored, so it stores them once, at the commit.
    checkpoint = (
        (lambda delivered: offsets.advance(record, delivered))
        if advance and screen is None and manifest.sink.strategy.mode != "full_refresh"
        else None
    )
    state = StateMove(store_offsets, screen.send_dead_letters if screen is not None else None, incremental)
    return PlannedRead(screen or source, boundary, summary, f"'{boundary.topic}'", incremental, state, checkpoint)


def _plan_sql(manifest: Manifest, spark: SparkSession, store: StateStore) -> PlannedRead:
    from dpone_dagster.connections import resolve_jdbc
    from dpone_dagster.sources.sql import SqlBatchSource

    source = SqlBatchSource(manifest, resolve_jdbc(manifest.source))
    boundary = source.plan(spark, store.load_watermark(manifest.name))

    def store_watermark(success: RunRecord) -> dict[int, int]:
        # The watermark moves in the same commit that marks the run successful.
        store.finish_run_success(success, None, None, None, watermark=boundary.new_watermark)
        return {}

    summary = f"{boundary.method} read of {boundary.table} ({boundary.total if boundary.total is not None else '?'} rows)"
    incremental = boundary.method in ("incremental", "cdc")
    return PlannedRead(source, boundary, summary, boundary.table, incremental, StateMove(store_watermark, None, incremental))
