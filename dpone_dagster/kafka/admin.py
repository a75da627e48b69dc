"""Sink topic preflight: the topic must exist, or be created when the manifest asks for it."""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from dpone_dagster.errors import ConfigError
from dpone_dagster.kafka.config import driver_client_config
from dpone_dagster.kafka.errors import client_failure
from dpone_dagster.manifest.models import TopicCreation


def existing_topics(admin: AdminClient, timeout_s: float = 10.0) -> dict[str, int]:
    """Topic -> partition count. Lists all topics: asking for one may auto-create it on some brokers."""
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception as exc:
        raise ConfigError(client_failure("cannot reach the Kafka cluster to list topics", admin, exc)) from exc
    return {name: len(info.partitions) for name, info in metadata.topics.items() if info.error is None}


def ensure_sink_topic(client_config: dict[str, Any], topic: str, creation: TopicCreation) -> int:
    """Return the partition count of the sink topic, creating it first when allowed."""
    admin = AdminClient(driver_client_config(client_config))
    topics = existing_topics(admin)
    if topic in topics:
        return topics[topic]
    if not creation.enabled:
        raise ConfigError(
            f"sink topic '{topic}' does not exist; create it, or set sink.options.create_topic.enabled: true "
            "(with partitions, replication_factor and configs) to let the run create it"
        )
    new = NewTopic(
        topic,
        num_partitions=creation.partitions,
        replication_factor=creation.replication_factor,
        config=dict(creation.configs),
    )
    try:
        admin.create_topics([new])[topic].result(timeout=30)
    except Exception as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise ConfigError(f"could not create sink topic '{topic}': {exc}") from exc
    return creation.partitions
