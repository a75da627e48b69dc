"""Run state: Kafka offsets, SQL watermarks and run history, committed only with a run's success.

`open_state_store` opens the store a `state:` block describes; `state.open.open_manifest_state_store`
opens the one a manifest uses (also the replication's control topic), its connection resolved.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import psycopg2
import psycopg2.extensions

from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import StateConfig
from dpone_dagster.state.base import PartitionOffset, RunRecord, StateConflict, StateStore
from dpone_dagster.state.local import LocalStateStore
from dpone_dagster.state.postgres import PostgresStateStore, connection_summary

__all__ = [
    "LocalStateStore",
    "PartitionOffset",
    "PostgresStateStore",
    "RunRecord",
    "StateConflict",
    "StateStore",
    "open_state_store",
]

WATERMARKS_TABLE = "etl_watermarks"


def open_state_store(
    config: StateConfig, pipeline: str, connect_kwargs: dict[str, Any] | None = None
) -> StateStore:
    """Open the store a manifest's `state:` block describes.

    For postgres the caller resolves `connect_kwargs` (psycopg2.connect keyword arguments) from
    the state connection; tables are created on first use.
    """
    if config.type == "local":
        return LocalStateStore(config.path)
    if connect_kwargs is None:
        raise ConfigError(
            f"state.connection_id {config.connection_id}: no PostgreSQL connection settings were "
            f"resolved for pipeline {pipeline}; define the connection (e.g. POSTGRES_STATE_HOST/... "
            "or POSTGRES_STATE_DSN) or use state.type: local"
        )
    try:
        return PostgresStateStore(
            connect_kwargs,
            runs_table=(config.table.schema_, config.table.name),
            offsets_table=(config.offsets_table.schema_, config.offsets_table.name),
            # No manifest field for it: keep it next to the run table.
            watermarks_table=(config.table.schema_, WATERMARKS_TABLE),
        )
    except psycopg2.Error as exc:
        if exc.pgcode is None:  # raised by the client: no server answered (or it refused the login)
            raise ConfigError(_unreachable_message(config, pipeline, connect_kwargs, exc)) from None
        raise ConfigError(
            f"state.connection_id {config.connection_id}: cannot create the state tables "
            f"{config.table.qualified}/{config.offsets_table.qualified} for pipeline {pipeline} "
            f"({_redact(_first_line(exc), connect_kwargs)}): grant the state user CREATE on the "
            "schema or create the tables beforehand"
        ) from None


def _unreachable_message(
    config: StateConfig, pipeline: str, connect_kwargs: dict[str, Any], exc: Exception
) -> str:
    where = connection_summary(connect_kwargs)
    reason = _redact(_first_line(exc), connect_kwargs)
    return (
        f"state.connection_id {config.connection_id}: cannot connect to PostgreSQL at "
        f"{where['host']}:{where['port']} for pipeline {pipeline} ({reason}): "
        f"start it or fix {_settings_hint(config)}"
    )


def _settings_hint(config: StateConfig) -> str:
    conn_id = config.connection_id or "<connection_id>"
    if config.connection_type == "env":
        prefix = conn_id.upper()
        return f"{prefix}_HOST/{prefix}_PORT/... (or {prefix}_DSN)"
    if config.connection_type == "params":
        return "state.params (host, port)"
    return f"the {config.connection_type} connection {conn_id}"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _redact(text: str, connect_kwargs: dict[str, Any]) -> str:
    """Drop any password the driver might echo back."""
    dsn = connect_kwargs.get("dsn")
    if dsn and text.lower().startswith("invalid dsn"):
        # The driver quotes fragments of a DSN it cannot parse; any of them may be the password.
        return "invalid DSN; not shown because it may contain a password"
    secrets = [str(connect_kwargs.get("password") or "")]
    if dsn:
        with suppress(psycopg2.ProgrammingError):
            secrets.append(psycopg2.extensions.parse_dsn(dsn).get("password") or "")
    for secret in filter(None, secrets):
        text = text.replace(secret, "***")
    return text
