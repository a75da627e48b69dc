"""Resolution of a manifest block's connection: the raw fields from its source, then a typed model.

Error messages name where a value was looked up, never the value.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from dpone_dagster.connections.airflow import AIRFLOW_PARTS, airflow_fields, airflow_var_names
from dpone_dagster.connections.base import ConnectionModel, as_setting
from dpone_dagster.connections.database import JdbcConnection, PostgresConnection
from dpone_dagster.connections.env import env_fields, env_var_names
from dpone_dagster.connections.kafka import KAFKA_TYPED_KEYS, KafkaConnection
from dpone_dagster.connections.params import params_fields
from dpone_dagster.connections.ref import ConnectionRefLike, connection_label
from dpone_dagster.connections.vault import vault_fields, vault_path
from dpone_dagster.errors import ConfigError
from dpone_dagster.redact import SECRETS, is_secret_key

CONNECTION_TYPES = ("env", "params", "airflow", "vault")
_LIBRDKAFKA_PREFIX = "librdkafka__"
_PROPERTIES_PREFIX = "properties__"


def resolve_fields(
    connection_id: str,
    connection_type: str,
    params: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The raw fields of a connection, keyed by lower-case field name.

    Airflow connections map to the generic fields host, port, user, password and database plus their
    extras; the typed resolvers map those onto their own fields.
    """
    environ = os.environ if environ is None else environ
    context = connection_label("", connection_id, connection_type)
    if connection_type not in CONNECTION_TYPES:
        raise ConfigError(
            f"{context}: unknown connection_type. Fix: use one of {', '.join(CONNECTION_TYPES)}."
        )
    if params and connection_type != "params":
        raise ConfigError(
            f"{context}: the block has a params mapping, which is only read with connection_type: params. "
            "Fix: remove params, or set connection_type: params."
        )
    if connection_type == "env":
        fields = env_fields(connection_id, environ)
    elif connection_type == "params":
        fields = params_fields(connection_id, params)
    elif connection_type == "airflow":
        fields = airflow_fields(connection_id, environ)
    else:
        fields = vault_fields(connection_id, environ)
    fields = {str(key).lower(): value for key, value in fields.items()}
    SECRETS.add(*(str(value) for key, value in fields.items() if is_secret_key(key) and value is not None))
    return fields


def resolve_kafka(ref: ConnectionRefLike, *, environ: Mapping[str, str] | None = None) -> KafkaConnection:
    """The Kafka connection of a KafkaSource / KafkaSink block."""
    connection_id, connection_type, environ = _ref(ref, environ)
    fields = _kafka_fields(resolve_fields(connection_id, connection_type, ref.params, environ))
    librdkafka = _take_prefixed(fields, _LIBRDKAFKA_PREFIX, _librdkafka_name)
    fields["librdkafka"] = {**_mapping(fields.get("librdkafka", {}), "librdkafka", ref), **librdkafka}
    _require(
        KafkaConnection,
        fields,
        ("bootstrap_servers",),
        ref,
        environ,
        "(an Airflow or Vault host[:port] also works)",
    )
    _reject_unknown(
        KafkaConnection,
        fields,
        ref,
        environ,
        f"Raw librdkafka settings go in {_LIBRDKAFKA_PREFIX}<name> fields (e.g. "
        f"{env_var_names(connection_id, _LIBRDKAFKA_PREFIX + 'socket_timeout_ms')[1]}=5000 for socket.timeout.ms) "
        "or a librdkafka: mapping.",
    )
    return _build(KafkaConnection, fields, ref, environ)


def resolve_postgres(
    ref: ConnectionRefLike, *, environ: Mapping[str, str] | None = None
) -> PostgresConnection:
    """The Postgres connection of a StateConfig (type: postgres) or any other block."""
    connection_id, connection_type, environ = _ref(ref, environ)
    fields = resolve_fields(connection_id, connection_type, ref.params, environ)
    _reject_unknown(PostgresConnection, fields, ref, environ)
    return _build(PostgresConnection, fields, ref, environ)


def resolve_jdbc(ref: ConnectionRefLike, *, environ: Mapping[str, str] | None = None) -> JdbcConnection:
    """The JDBC connection of a SqlSource block."""
    connection_id, connection_type, environ = _ref(ref, environ)
    fields = resolve_fields(connection_id, connection_type, ref.params, environ)
    properties = _take_prefixed(fields, _PROPERTIES_PREFIX, lambda name: name)
    fields["properties"] = {**_mapping(fields.get("properties", {}), "properties", ref), **properties}
    _require(JdbcConnection, fields, ("host", "jdbc_url"), ref, environ, "")
    _reject_unknown(
        JdbcConnection,
        fields,
        ref,
        environ,
        f"JDBC driver properties go in {_PROPERTIES_PREFIX}<name> fields or a properties: mapping.",
    )
    return _build(JdbcConnection, fields, ref, environ)


def _ref(ref: ConnectionRefLike, environ: Mapping[str, str] | None) -> tuple[str, str, Mapping[str, str]]:
    connection_id = getattr(ref, "connection_id", None)
    if not connection_id:
        raise ConfigError(
            f"the {type(ref).__name__} block has no connection_id. Fix: set connection_id (and "
            "connection_type: env|params|airflow|vault) on the block."
        )
    return (
        connection_id,
        getattr(ref, "connection_type", None) or "env",
        os.environ if environ is None else environ,
    )


def _kafka_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Map generic fields (host/port/user/password, librdkafka names in Airflow extras) to Kafka's."""
    fields = dict(fields)
    host, port = fields.pop("host", None), fields.pop("port", None)
    user, password = fields.pop("user", None), fields.pop("password", None)
    for key in [key for key in fields if key in KAFKA_TYPED_KEYS]:  # Airflow's Kafka provider uses these
        value = fields.pop(key)
        fields.setdefault(KAFKA_TYPED_KEYS[key], value)
    if host and "bootstrap_servers" not in fields:
        fields["bootstrap_servers"] = _bootstrap_servers(str(host), port)
    if user is not None:
        fields.setdefault("sasl_username", user)
    if password is not None:
        fields.setdefault("sasl_password", password)
    return fields


def _bootstrap_servers(host: str, port: Any) -> str:
    servers = [server.strip() for server in host.split(",") if server.strip()]
    if port in (None, ""):
        return ",".join(servers)
    # "b1,b2" with port 9092 -> "b1:9092,b2:9092"; entries that carry a port keep it.
    return ",".join(s if re.search(r":\d+$", s) else f"{s}:{port}" for s in servers)


def _librdkafka_name(suffix: str) -> str:
    """`socket_timeout_ms` -> `socket.timeout.ms` (the Confluent images' convention: __ -> _, ___ -> -)."""
    return "-".join(
        part.replace("__", "\0").replace("_", ".").replace("\0", "_") for part in suffix.split("___")
    )


def _take_prefixed(fields: dict[str, Any], prefix: str, rename: Callable[[str], str]) -> dict[str, str]:
    taken = {}
    for key in [key for key in fields if key.startswith(prefix) and len(key) > len(prefix)]:
        taken[rename(key[len(prefix) :])] = as_setting(fields.pop(key))
    return taken


def _mapping(value: Any, name: str, ref: ConnectionRefLike) -> dict[str, Any]:
    if isinstance(value, str):  # a Vault key or Airflow extra may hold the mapping as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{connection_label('', str(ref.connection_id), ref.connection_type)}: {name} must be a mapping of setting "
            f"name to value. Fix: give {name} as a mapping (or JSON object), or use {name}__<setting> fields."
        )
    return dict(value)


_M = TypeVar("_M", bound=ConnectionModel)


def _lookup(ref: ConnectionRefLike, field: str, environ: Mapping[str, str]) -> str:
    """Where `field` of this connection is read from, for error messages."""
    connection_id, connection_type = str(ref.connection_id), ref.connection_type
    if connection_type == "env":
        return " or ".join(env_var_names(connection_id, field))
    if connection_type == "params":
        return f"params.{field} in the manifest block"
    if connection_type == "airflow":
        name = airflow_var_names(connection_id)[0]
        part = AIRFLOW_PARTS.get(field)
        return f"the {part} of {name}" if part else f"extra '{field}' of {name}"
    mount, path = vault_path(connection_id, environ)
    return f"key '{field}' of Vault secret {mount}/{path}"


def _require(
    model: type[_M],
    fields: dict[str, Any],
    any_of: tuple[str, ...],
    ref: ConnectionRefLike,
    environ: Mapping[str, str],
    note: str,
) -> None:
    if any(fields.get(name) not in (None, "") for name in any_of):
        return
    wanted = " or ".join(any_of)
    where = "; or ".join(_lookup(ref, name, environ) for name in any_of)
    raise ConfigError(
        f"{connection_label(model._kind, str(ref.connection_id), ref.connection_type)}: missing required field {wanted}. "
        f"Fix: set {where}{' ' + note if note else ''}."
    )


def _reject_unknown(
    model: type[_M],
    fields: dict[str, Any],
    ref: ConnectionRefLike,
    environ: Mapping[str, str],
    note: str = "",
) -> None:
    allowed = set(model.model_fields)
    unknown = sorted(set(fields) - allowed)
    if not unknown:
        return
    names = ", ".join(repr(name) for name in unknown)
    sources = "; ".join(_lookup(ref, name, environ) for name in unknown)
    raise ConfigError(
        f"{connection_label(model._kind, str(ref.connection_id), ref.connection_type)}: unknown field(s) {names} "
        f"(read from {sources}). Allowed fields: {', '.join(sorted(allowed))}. "
        f"Fix: rename or remove it.{' ' + note if note else ''}"
    )


def _build(model: type[_M], fields: dict[str, Any], ref: ConnectionRefLike, environ: Mapping[str, str]) -> _M:
    try:
        return model(**fields)
    except ValidationError as exc:
        problems = []
        # include_input=False: pydantic would otherwise quote the (possibly secret) offending value.
        for error in exc.errors(include_input=False, include_url=False):
            location = ".".join(str(part) for part in error["loc"])
            field = str(error["loc"][0]) if error["loc"] else ""
            source = f" (read from {_lookup(ref, field, environ)})" if field else ""
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{location}: {message}{source}" if location else message)
        # `from None`: the ValidationError's own text quotes input values.
        raise ConfigError(
            f"{connection_label(model._kind, str(ref.connection_id), ref.connection_type)} is invalid: "
            f"{'; '.join(problems)}. Fix: correct the field(s) named."
        ) from None
