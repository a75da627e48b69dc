"""Kafka resource: resolves a manifest block's connection into librdkafka settings and clients."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from dagster import ConfigurableResource
from pydantic import Field

from dpone_dagster.connections import ConnectionRefLike, resolve_kafka
from dpone_dagster.kafka.config import driver_client_config


class KafkaResource(ConfigurableResource):
    """Kafka clients for a manifest block's connection (connection_id → librdkafka settings)."""

    extra_config: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "librdkafka settings merged into every client of every run (e.g. socket.timeout.ms for a "
            "slow network); settings that would weaken the manifest's delivery mode are refused at run start"
        ),
    )

    def client_config(self, ref: ConnectionRefLike) -> dict[str, Any]:
        return {**resolve_kafka(ref).client_config(), **self.extra_config}

    def admin(self, ref: ConnectionRefLike) -> AdminClient:
        return AdminClient(driver_client_config(self.client_config(ref)))

    def consumer(self, ref: ConnectionRefLike, group_id: str) -> Consumer:
        return Consumer(
            driver_client_config({
                **self.client_config(ref),
                "group.id": group_id,
                "enable.auto.commit": False,
                "allow.auto.create.topics": False,
                "enable.partition.eof": True,
            })
        )
