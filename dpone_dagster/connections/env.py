"""Fields of a connection with connection_type env: `DPONE_CONN_<ID>_<FIELD>` or `<ID>_<FIELD>`
(the DPONE_CONN_ form wins for a field set twice)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dpone_dagster.connections.ref import connection_label
from dpone_dagster.errors import ConfigError

_DPONE_ENV_PREFIX = "DPONE_CONN_"


def env_key(connection_id: str) -> str:
    """`kafka-cluster.prod` -> `KAFKA_CLUSTER_PROD`: the form an environment variable name can hold."""
    return re.sub(r"[^0-9A-Za-z]", "_", connection_id).upper()


def env_var_names(connection_id: str, field: str) -> tuple[str, str]:
    """The two variables a field is read from, the winning one first."""
    key, name = env_key(connection_id), field.upper()
    return f"{_DPONE_ENV_PREFIX}{key}_{name}", f"{key}_{name}"


def env_fields(connection_id: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The fields set in `environ` for this connection, the DPONE_CONN_ form winning."""
    key = env_key(connection_id)
    dpone_prefix, plain_prefix = f"{_DPONE_ENV_PREFIX}{key}_", f"{key}_"
    dpone: dict[str, str] = {}
    plain: dict[str, str] = {}
    for name, value in environ.items():
        if not value:  # a blank variable counts as unset (compose files often leave them empty)
            continue
        if name.startswith(dpone_prefix) and len(name) > len(dpone_prefix):
            dpone[name[len(dpone_prefix) :].lower()] = value
        elif name.startswith(plain_prefix) and len(name) > len(plain_prefix):
            plain[name[len(plain_prefix) :].lower()] = value
    if not dpone and not plain:
        raise ConfigError(
            f"{connection_label('', connection_id, 'env')}: no environment variable named {dpone_prefix}<FIELD> "
            f"or {plain_prefix}<FIELD> is set. Fix: export the connection's fields, e.g. "
            f"{dpone_prefix}BOOTSTRAP_SERVERS for Kafka or {dpone_prefix}HOST / {dpone_prefix}USER / "
            f"{dpone_prefix}PASSWORD for a database, or change connection_type."
        )
    return {**plain, **dpone}
