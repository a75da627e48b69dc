"""Fields of a connection with connection_type params: the block's inline `params:` mapping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpone_dagster.connections.ref import connection_label
from dpone_dagster.errors import ConfigError


def params_fields(connection_id: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The block's inline params, which must be present."""
    if not params:
        raise ConfigError(
            f"{connection_label('', connection_id, 'params')}: the block has no params mapping. "
            "Fix: add params: with the connection's fields (e.g. bootstrap_servers) to the block, "
            "or change connection_type."
        )
    return dict(params)
