"""Fields of a connection with connection_type airflow: `AIRFLOW_CONN_<ID>`, an Airflow connection
URI or Airflow's JSON form, mapped to the generic fields host, port, user, password and database plus
the connection's extras."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from dpone_dagster.connections.env import env_key
from dpone_dagster.connections.ref import connection_label
from dpone_dagster.errors import ConfigError


def airflow_var_names(connection_id: str) -> tuple[str, ...]:
    # Airflow upper-cases the id as it is; the normalised form is the one a shell can export.
    return tuple(
        dict.fromkeys((f"AIRFLOW_CONN_{connection_id.upper()}", f"AIRFLOW_CONN_{env_key(connection_id)}"))
    )


class _Malformed(ValueError):
    """Why an Airflow connection did not parse; never quotes the value (it may hold a password)."""


_AIRFLOW_JSON_KEYS = {"conn_type", "description", "host", "login", "password", "schema", "port", "extra"}
# Generic field -> the Airflow connection part it comes from (for error messages).
AIRFLOW_PARTS = {
    "host": "host",
    "port": "port",
    "user": "login",
    "password": "password",
    "database": "schema",
}
_AIRFLOW_FIX = (
    "Fix: use an Airflow connection URI, scheme://login:password@host:port/schema?extra=value, with "
    "special characters in login and password percent-encoded (@ -> %40, : -> %3A, / -> %2F), or "
    'Airflow\'s JSON form {"conn_type": ..., "host": ..., "port": ..., "login": ..., "password": ..., '
    '"schema": ..., "extra": {...}}.'
)


def airflow_fields(connection_id: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The generic fields and extras of the AIRFLOW_CONN_ variable set for this connection."""
    names = airflow_var_names(connection_id)
    context = connection_label("", connection_id, "airflow")
    name = next((n for n in names if environ.get(n)), None)
    if name is None:
        raise ConfigError(f"{context}: {' / '.join(names)} is not set. {_AIRFLOW_FIX}")
    raw = environ[name].strip()
    try:
        return _parse_airflow_json(raw) if raw.startswith("{") else _parse_airflow_uri(raw)
    except _Malformed as exc:
        raise ConfigError(
            f"{context}: {name} is not a valid Airflow connection: {exc}. {_AIRFLOW_FIX}"
        ) from None


def _parse_airflow_uri(raw: str) -> dict[str, Any]:
    try:
        parts = urlsplit(raw)
    except ValueError:
        raise _Malformed("it is not a URI") from None
    if "://" not in raw or not parts.scheme:
        raise _Malformed("it has no scheme:// prefix")
    userinfo, _, hostport = parts.netloc.rpartition("@")
    login, _, password = userinfo.partition(":")
    host, port = _split_host_port(hostport)
    extra: dict[str, Any] = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "__extra__" in extra:  # Airflow's way of carrying a JSON extra inside a URI
        extra = {**_json_object(extra.pop("__extra__"), "the __extra__ query parameter"), **extra}
    return _airflow_generic(
        host=unquote(host),
        port=port,
        login=unquote(login),
        password=unquote(password),
        schema=unquote(parts.path.lstrip("/")),
        extra=extra,
    )


def _split_host_port(hostport: str) -> tuple[str, int | None]:
    if "," in hostport:  # a broker list carries its own ports
        return hostport, None
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport.partition("]")
        host, port_text = host + "]", rest.removeprefix(":")
    else:
        host, _, port_text = hostport.partition(":")
    if port_text and not port_text.isdigit():
        raise _Malformed("the port is not a number (is a '/' or '#' in the password not percent-encoded?)")
    return host, int(port_text) if port_text else None


def _parse_airflow_json(raw: str) -> dict[str, Any]:
    data = _json_object(raw, "the JSON form")
    unknown = sorted(set(data) - _AIRFLOW_JSON_KEYS)
    if unknown:
        raise _Malformed(
            f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(_AIRFLOW_JSON_KEYS))})"
        )
    extra = data.get("extra") or {}
    if isinstance(extra, str):  # Airflow stores extra as a JSON string; accept both
        extra = _json_object(extra, "extra")
    if not isinstance(extra, dict):
        raise _Malformed("extra is not a JSON object")
    port = data.get("port")
    if port not in (None, ""):
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise _Malformed("the port is not a number") from None
    return _airflow_generic(
        host=data.get("host"),
        port=port,
        login=data.get("login"),
        password=data.get("password"),
        schema=data.get("schema"),
        extra=extra,
    )


def _json_object(raw: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _Malformed(
            f"{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise _Malformed(f"{what} is not a JSON object")
    return data


def _airflow_generic(
    *, host: Any, port: Any, login: Any, password: Any, schema: Any, extra: dict[str, Any]
) -> dict[str, Any]:
    standard = {"host": host, "port": port, "user": login, "password": password, "database": schema}
    # The connection's own parts win over an extra of the same name.
    return {**extra, **{key: value for key, value in standard.items() if value not in (None, "")}}
