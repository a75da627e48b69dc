"""Schema Registry resource: a Confluent-compatible client for a manifest block's connection.

`mock://<scope>` URLs give confluent-kafka's in-memory registry (local runs and tests).
"""

from __future__ import annotations

import warnings
from typing import Any

with warnings.catch_warnings():
    # confluent-kafka's registry client imports authlib's deprecated httpx integration.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")
    from confluent_kafka.schema_registry import SchemaRegistryClient
from dagster import ConfigurableResource
from pydantic import Field

from dpone_dagster.connections import ConnectionRefLike, resolve_kafka
from dpone_dagster.errors import ConfigError
from dpone_dagster.schema.registry import registry_client


class SchemaRegistryResource(ConfigurableResource):
    """A Confluent-compatible Schema Registry client for a manifest block's connection."""

    url: str | None = Field(
        default=None,
        description="Registry URL for every run, instead of the connection's schema_registry_url (e.g. mock://local)",
    )

    def config(self, ref: ConnectionRefLike) -> dict[str, Any] | None:
        """The registry settings runs use for `ref`: the connection's, with this resource's url."""
        config = resolve_kafka(ref).schema_registry_config() or {}
        if self.url:
            config = {**config, "url": self.url}
        return config or None

    def client(self, ref: ConnectionRefLike) -> SchemaRegistryClient:
        config = self.config(ref) or {}
        if not config.get("url"):
            raise ConfigError(
                f"connection {ref.connection_id}: no schema_registry_url; set "
                f"{ref.connection_id.upper()}_SCHEMA_REGISTRY_URL or the resource's url"
            )
        return registry_client(config)
