"""What the resolvers read from a manifest block, and how their messages name a connection."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class ConnectionRefLike(Protocol):
    """What the resolvers read from a manifest block (KafkaSource, KafkaSink, SqlSource, StateConfig)."""

    connection_id: str | None
    connection_type: str
    params: Mapping[str, Any] | None


def connection_label(kind: str, connection_id: str, connection_type: str) -> str:
    """`Kafka connection 'id' (connection_type: env)`: how every message names a connection."""
    label = f"{kind} connection" if kind else "connection"
    return f"{label} '{connection_id}' (connection_type: {connection_type})"
