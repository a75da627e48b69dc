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


@dataclass(frozen=True)
class RunClients:
    # Unset: the block's connection decides.
    kafka_config: Callable[[Any], dict[str, Any]] | None = None
    registry_config: Callable[[Any], dict[str, Any] | None] | None = None

    def kafka(self, block: Any) -> dict[str, Any]:
        if self.kafka_config is not None:
            return self.kafka_config(block)
        return resolve_kafka(block).client_config()

    def registry(self, block: Any) -> dict[str, Any]:
        if self.registry_config is not None:
            config = self.registry_config(block)
        else:
            config = resolve_kafka(block).schema_registry_config()
        if not config or not config.get("url"):
            raise ConfigError(
                f"connection {block.connection_id}: message_format {block.options.message_format} needs "
                f"schema_registry_url ({block.connection_id.upper()}_SCHEMA_REGISTRY_URL)"
            )
        return config
