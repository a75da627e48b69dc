"""Open the state store a manifest uses, its connection resolved.

Kept out of the package's __init__: the control-topic store lives with the replication code,
which itself imports `state.base`.
"""

from __future__ import annotations

from dpone_dagster.connections import resolve_postgres
from dpone_dagster.engine.clients import RunClients
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.state import open_state_store
from dpone_dagster.state.base import StateStore


def open_manifest_state_store(manifest: Manifest, clients: RunClients | None = None) -> StateStore:
    """The store of `manifest.state`: local or postgres (`open_state_store`), or the replication's
    control topic (`kafka_control_topic`, reached with `clients`' Kafka settings for the sink)."""
    state = manifest.state
    if state.type == "kafka_control_topic":
        from dpone_dagster.replication.control_topic import ControlTopicStore, commit_group_of

        replication = manifest.sink.options.replication
        return ControlTopicStore(
            (clients or RunClients()).kafka(manifest.sink),
            replication.control_topic,
            commit_group_of(manifest),
            replication.transaction_timeout_ms,
        )
    connect_kwargs = resolve_postgres(state).connect_kwargs() if state.type == "postgres" else None
    return open_state_store(state, manifest.name, connect_kwargs)
