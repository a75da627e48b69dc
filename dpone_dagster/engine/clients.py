"""Where a run's client settings come from: one place for every client it creates.

From Dagster, the resources decide (the Kafka resource's `extra_config` on top of the connection,
the Schema Registry resource's `url` override); from the CLI, the connections alone. Consumers in
Spark tasks, producers (records, dead letters, control-topic offsets), admin clients, the
control-topic state store and every registry client read them here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpone_dagster.connections import resolve_kafka
from dpone_dagster.errors import ConfigError


def _connection_kafka(block: Any) -> dict[str, Any]:
    return resolve_kafka(block).client_config()


def _connection_registry(block: Any) -> dict[str, Any] | None:
    return resolve_kafka(block).schema_registry_config()


@dataclass(frozen=True)
class RunClients:
    kafka_config: Callable[[Any], dict[str, Any]] = _connection_kafka
    registry_settings: Callable[[Any], dict[str, Any] | None] = _connection_registry

    def kafka(self, block: Any) -> dict[str, Any]:
        return self.kafka_config(block)

    def registry(self, block: Any) -> dict[str, Any]:
        config = self.registry_settings(block)
        if not config or not config.get("url"):
            raise ConfigError(
                f"connection {block.connection_id}: message_format {block.options.message_format} needs "
                f"schema_registry_url ({block.connection_id.upper()}_SCHEMA_REGISTRY_URL)"
            )
        return config
