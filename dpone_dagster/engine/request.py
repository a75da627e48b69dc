"""What a caller can vary about one run of a manifest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpone_dagster.engine.clients import RunClients
from dpone_dagster.sources.kafka import TimeWindow


@dataclass
class RunRequest:
    """What a caller can vary about one run of a manifest."""

    run_id: str | None = None
    # time_window: contiguous windows in order (one per Dagster partition key of the run).
    windows: list[TimeWindow] | None = None
    # Offsets recorded by the last successful Dagster materialization, used when the state
    # store has nothing (e.g. a fresh state database).
    fallback_offsets: dict[int, int] | None = None
    log: Callable[[str], None] = field(default=lambda message: None)
    # Resolves a manifest block's connection to librdkafka settings (the Dagster Kafka resource
    # passes its own); defaults to the connections module.
    kafka_config: Callable[[Any], dict[str, Any]] | None = None
    # Resolves a block's Schema Registry settings (the Dagster Schema Registry resource passes its
    # own); defaults to the connections module.
    registry_config: Callable[[Any], dict[str, Any] | None] | None = None
    # The quality checks to evaluate, by name (None: every check); the others are not evaluated.
    checks: frozenset[str] | None = None
    # False: judge the batch a run would publish now with the selected pre-publish checks and stop
    # there; nothing is produced (dead letters neither) and no offsets or watermarks move.
    publish: bool = True

    def clients(self) -> RunClients:
        return RunClients(self.kafka_config, self.registry_config)
