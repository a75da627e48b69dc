"""Credential resolution for manifest connection blocks, and redaction of the secrets they hold.

A block names a connection (`connection_id`) and where its credentials live (`connection_type`):

- env: `DPONE_CONN_<ID>_<FIELD>` or `<ID>_<FIELD>` (the DPONE_CONN_ form wins for a field set twice);
- params: the block's inline `params:` mapping;
- airflow: `AIRFLOW_CONN_<ID>`, an Airflow connection URI or Airflow's JSON form;
- vault: a HashiCorp Vault KV secret at `<DPONE_VAULT_PATH_PREFIX>/<connection_id>` read with hvac.

`resolve_fields` returns the raw fields; `resolve_kafka`, `resolve_postgres` and `resolve_jdbc` map them
onto frozen models whose repr, str and describe() never show a secret. Every secret a model holds is
added to the process-wide registry of `dpone_dagster.redact` (re-exported here), so that every output
passing through `redact_text` is scrubbed. Error messages name where a value was looked up, never
the value.

Vault tokens: every read looks the token up first and renews a renewable one once less than half its
TTL is left; a token accepted earlier in the process and refused now is reported as expired or revoked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from dpone_dagster.errors import ConfigError
from dpone_dagster.redact import (
    MASK,
    SECRETS,
    SecretRedactor,
    redact,
    redact_text,
)
from dpone_dagster.redact import is_secret_key as _is_secret_key
from dpone_dagster.redact import url_passwords as _url_passwords

__all__ = [
    "MASK",
    "ConnectionRefLike",
    "JdbcConnection",
    "KafkaConnection",
    "PostgresConnection",
    "SECRETS",
    "SecretRedactor",
    "airflow_var_names",
    "env_key",
    "env_var_names",
    "redact",
    "redact_text",
    "resolve_fields",
    "resolve_jdbc",
    "resolve_kafka",
    "resolve_postgres",
]

CONNECTION_TYPES = ("env", "params", "airflow", "vault")
_DPONE_ENV_PREFIX = "DPONE_CONN_"
_LIBRDKAFKA_PREFIX = "librdkafka__"
_PROPERTIES_PREFIX = "properties__"


class ConnectionRefLike(Protocol):
    """What the resolvers read from a manifest block (KafkaSource, KafkaSink, SqlSource, StateConfig)."""

    connection_id: str | None
    connection_type: str
    params: Mapping[str, Any] | None


# --------------------------------------------------------------------------- raw fields


def env_key(connection_id: str) -> str:
    """`kafka-cluster.prod` -> `KAFKA_CLUSTER_PROD`: the form an environment variable name can hold."""
    return re.sub(r"[^0-9A-Za-z]", "_", connection_id).upper()


def env_var_names(connection_id: str, field: str) -> tuple[str, str]:
    """The two variables a field is read from, the winning one first."""
    key, name = env_key(connection_id), field.upper()
    return f"{_DPONE_ENV_PREFIX}{key}_{name}", f"{key}_{name}"


def airflow_var_names(connection_id: str) -> tuple[str, ...]:
    # Airflow upper-cases the id as it is; the normalised form is the one a shell can export.
    return tuple(
        dict.fromkeys((f"AIRFLOW_CONN_{connection_id.upper()}", f"AIRFLOW_CONN_{env_key(connection_id)}"))
    )


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
    context = _context("", connection_id, connection_type)
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
        fields = _env_fields(connection_id, environ)
    elif connection_type == "params":
        fields = _params_fields(connection_id, params)
    elif connection_type == "airflow":
        fields = _airflow_fields(connection_id, environ)
    else:
        fields = _vault_fields(connection_id, environ)
    fields = {str(key).lower(): value for key, value in fields.items()}
    SECRETS.add(*(str(value) for key, value in fields.items() if _is_secret_key(key) and value is not None))
    return fields


def _context(kind: str, connection_id: str, connection_type: str) -> str:
    label = f"{kind} connection" if kind else "connection"
    return f"{label} '{connection_id}' (connection_type: {connection_type})"


def _env_fields(connection_id: str, environ: Mapping[str, str]) -> dict[str, Any]:
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
            f"{_context('', connection_id, 'env')}: no environment variable named {dpone_prefix}<FIELD> "
            f"or {plain_prefix}<FIELD> is set. Fix: export the connection's fields, e.g. "
            f"{dpone_prefix}BOOTSTRAP_SERVERS for Kafka or {dpone_prefix}HOST / {dpone_prefix}USER / "
            f"{dpone_prefix}PASSWORD for a database, or change connection_type."
        )
    return {**plain, **dpone}


def _params_fields(connection_id: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    if not params:
        raise ConfigError(
            f"{_context('', connection_id, 'params')}: the block has no params mapping. "
            "Fix: add params: with the connection's fields (e.g. bootstrap_servers) to the block, "
            "or change connection_type."
        )
    return dict(params)


# --------------------------------------------------------------------------- airflow


class _Malformed(ValueError):
    """Why an Airflow connection did not parse; never quotes the value (it may hold a password)."""


_AIRFLOW_JSON_KEYS = {"conn_type", "description", "host", "login", "password", "schema", "port", "extra"}
# Generic field -> the Airflow connection part it comes from (for error messages).
_AIRFLOW_PARTS = {
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


def _airflow_fields(connection_id: str, environ: Mapping[str, str]) -> dict[str, Any]:
    names = airflow_var_names(connection_id)
    context = _context("", connection_id, "airflow")
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


# --------------------------------------------------------------------------- vault


class _VaultSettings(NamedTuple):
    addr: str
    token: str
    namespace: str | None
    mount: str
    path: str
    kv_version: int
    verify: str | None

    @property
    def where(self) -> str:
        namespace = f", namespace {self.namespace}" if self.namespace else ""
        return f"{self.mount}/{self.path} (KV v{self.kv_version}{namespace}) at {self.addr}"


def _vault_path(connection_id: str, environ: Mapping[str, str]) -> tuple[str, str]:
    mount = (environ.get("DPONE_VAULT_MOUNT") or "secret").strip("/")
    prefix = (environ.get("DPONE_VAULT_PATH_PREFIX") or "dpone/connections").strip("/")
    return mount, f"{prefix}/{connection_id}" if prefix else connection_id


def _vault_settings(connection_id: str, environ: Mapping[str, str]) -> _VaultSettings:
    context = _context("", connection_id, "vault")
    addr, token = environ.get("VAULT_ADDR"), environ.get("VAULT_TOKEN")
    if not addr:
        raise ConfigError(
            f"{context}: VAULT_ADDR is not set. Fix: export VAULT_ADDR (e.g. https://vault.example:8200) and VAULT_TOKEN."
        )
    if not token:
        raise ConfigError(
            f"{context}: VAULT_TOKEN is not set. Fix: export VAULT_TOKEN with a token that may read the secret."
        )
    SECRETS.add(token)
    version_text = environ.get("DPONE_VAULT_KV_VERSION") or "2"
    if version_text not in ("1", "2"):
        raise ConfigError(
            f"{context}: DPONE_VAULT_KV_VERSION must be 1 or 2. Fix: set it to the KV engine version of the mount."
        )
    mount, path = _vault_path(connection_id, environ)
    return _VaultSettings(
        addr=addr,
        token=token,
        namespace=environ.get("VAULT_NAMESPACE") or None,
        mount=mount,
        path=path,
        kv_version=int(version_text),
        verify=environ.get("VAULT_CACERT") or environ.get("VAULT_CAPATH") or None,
    )


def _vault_fields(connection_id: str, environ: Mapping[str, str]) -> dict[str, Any]:
    import hvac
    import requests
    from hvac import exceptions as vault_errors

    settings = _vault_settings(connection_id, environ)
    context = _context("", connection_id, "vault")
    client = hvac.Client(
        url=settings.addr, token=settings.token, namespace=settings.namespace, verify=settings.verify
    )
    _keep_token_fresh(client, settings, context)
    try:
        if settings.kv_version == 2:
            response = client.secrets.kv.v2.read_secret_version(
                path=settings.path, mount_point=settings.mount, raise_on_deleted_version=True
            )
            data = response["data"]["data"]
        else:
            data = client.secrets.kv.v1.read_secret(path=settings.path, mount_point=settings.mount)["data"]
    except vault_errors.InvalidPath:
        raise ConfigError(
            f"{context}: Vault secret {settings.where} does not exist. Fix: write it (e.g. `vault kv put "
            f"-mount={settings.mount} {settings.path} bootstrap_servers=...`), or point DPONE_VAULT_MOUNT, "
            "DPONE_VAULT_PATH_PREFIX and DPONE_VAULT_KV_VERSION at where it is."
        ) from None
    except (vault_errors.Forbidden, vault_errors.Unauthorized):
        policy_path = (
            f"{settings.mount}/data/{settings.path}"
            if settings.kv_version == 2
            else f"{settings.mount}/{settings.path}"
        )
        raise ConfigError(
            f"{context}: Vault denied reading {settings.where} with VAULT_TOKEN. Fix: use a valid token whose "
            f'policy grants read on "{policy_path}".'
        ) from None
    except (vault_errors.VaultError, requests.RequestException) as exc:
        detail = redact(f"{type(exc).__name__}: {exc}", [settings.token])
        raise ConfigError(
            f"{context}: cannot read Vault secret {settings.where}: {detail}. Fix: check that VAULT_ADDR is "
            "reachable and unsealed (and VAULT_NAMESPACE / VAULT_CACERT when used)."
        ) from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(
            f"{context}: Vault secret {settings.where} has no keys. Fix: store the connection's fields as its keys."
        )
    return dict(data)


# Tokens accepted earlier in this process (by digest, never the token), with when their TTL ran out
# as last seen (None: no expiry): tells an expired token from a wrong one.
_ACCEPTED_TOKENS: dict[str, float | None] = {}
_ACCEPTED_LOCK = threading.Lock()
# A renewable token is renewed when less than this share of its TTL is left.
VAULT_RENEW_BELOW = 0.5


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _keep_token_fresh(client: Any, settings: _VaultSettings, context: str) -> None:
    """Renew a renewable VAULT_TOKEN once less than half its TTL is left (every Vault read checks),
    and say clearly when a token that worked earlier in this process has expired since."""
    from hvac import exceptions as vault_errors

    digest = _token_digest(settings.token)
    try:
        info = client.auth.token.lookup_self()["data"]
    except (vault_errors.Forbidden, vault_errors.Unauthorized):
        with _ACCEPTED_LOCK:
            seen, expiry = digest in _ACCEPTED_TOKENS, _ACCEPTED_TOKENS.get(digest)
        if seen:
            until = (
                f" (its TTL ran out at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(expiry))})"
                if expiry
                else ""
            )
            raise ConfigError(
                f"{context}: VAULT_TOKEN was accepted earlier in this process but Vault now refuses it: it "
                f"expired{until} or was revoked during the run. Fix: use a renewable token (it is renewed "
                "whenever less than half its TTL is left) or one whose TTL outlasts the run, e.g. a periodic "
                "token (`vault token create -period=1h -policy=<policy>`), then rerun."
            ) from None
        return  # never valid here: the secret read reports the denial with its fix
    except Exception:  # noqa: BLE001 - lookup-self not permitted or not answered: the read decides
        return
    ttl, creation_ttl = int(info.get("ttl") or 0), int(info.get("creation_ttl") or 0)
    if info.get("renewable") and creation_ttl and ttl < creation_ttl * VAULT_RENEW_BELOW:
        try:
            ttl = int(client.auth.token.renew_self()["auth"].get("lease_duration") or ttl)
        except Exception:  # noqa: BLE001 - a token past its max TTL cannot be renewed; it still works until then
            pass
    with _ACCEPTED_LOCK:
        _ACCEPTED_TOKENS[digest] = time.time() + ttl if ttl else None


# --------------------------------------------------------------------------- typed models


def _reveal(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def _setting(value: Any) -> str:
    """A pass-through setting as the string librdkafka / JDBC expect (YAML true -> "true")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _Connection(BaseModel):
    # hide_input_in_errors: a ValidationError raised by direct construction must not quote a secret.
    model_config = ConfigDict(
        extra="forbid", frozen=True, coerce_numbers_to_str=True, hide_input_in_errors=True
    )
    # Fields holding a URI / DSN that may embed a password: shown with only that password masked.
    _url_fields: ClassVar[tuple[str, ...]] = ()
    _kind: ClassVar[str] = ""

    def model_post_init(self, context: Any, /) -> None:
        # Registered on construction, so every secret this process ever held can be scrubbed from logs.
        SECRETS.add(*self._secret_values())

    def _secret_values(self) -> list[str]:
        values: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            raw = value.get_secret_value() if isinstance(value, SecretStr) else value
            if name in self._url_fields and isinstance(raw, str):
                values += _url_passwords(raw)
            elif isinstance(value, SecretStr):
                values.append(raw)
            elif isinstance(value, dict):
                values += [_setting(v) for k, v in value.items() if _is_secret_key(k)]
        return [v for v in values if v]

    def describe(self) -> dict[str, Any]:
        """Every field, with secrets masked: safe for plans, metadata and logs."""
        secrets = self._secret_values()
        summary: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                raw = value.get_secret_value()
                summary[name] = redact(raw, secrets) if name in self._url_fields else (MASK if raw else None)
            elif isinstance(value, dict):
                summary[name] = {
                    k: MASK if _is_secret_key(k) else redact(_setting(v), secrets) for k, v in value.items()
                }
            elif isinstance(value, str):
                summary[name] = redact(value, secrets)
            else:
                summary[name] = value
        return summary

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # pydantic builds both repr() and str() from this.
        return list(self.describe().items())


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]

# librdkafka property -> KafkaConnection field, in client_config() order. "sasl.mechanism" is
# librdkafka's alias of "sasl.mechanisms"; both are accepted in input, only the canonical is emitted.
_KAFKA_CLIENT_KEYS = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
}
# Typed since TLS client certificates and OAUTHBEARER joined; the same names may still come as raw
# librdkafka settings when the typed field is unset.
_KAFKA_TLS_OAUTH_KEYS = {
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.key.password": "ssl_key_password",
    "ssl.endpoint.identification.algorithm": "ssl_endpoint_identification_algorithm",
    "sasl.oauthbearer.method": "sasl_oauthbearer_method",
    "sasl.oauthbearer.client.id": "sasl_oauthbearer_client_id",
    "sasl.oauthbearer.client.secret": "sasl_oauthbearer_client_secret",
    "sasl.oauthbearer.token.endpoint.url": "sasl_oauthbearer_token_endpoint_url",
    "sasl.oauthbearer.scope": "sasl_oauthbearer_scope",
    "sasl.oauthbearer.extensions": "sasl_oauthbearer_extensions",
    "sasl.oauthbearer.config": "sasl_oauthbearer_config",
}
_KAFKA_TYPED_KEYS = {**_KAFKA_CLIENT_KEYS, "sasl.mechanism": "sasl_mechanism", **_KAFKA_TLS_OAUTH_KEYS}
_OIDC_FIELDS = ("sasl_oauthbearer_client_id", "sasl_oauthbearer_client_secret", "sasl_oauthbearer_token_endpoint_url")
_REGISTRY_OAUTH_FIELDS = (
    "schema_registry_oauth_client_id",
    "schema_registry_oauth_client_secret",
    "schema_registry_oauth_token_endpoint_url",
)
# Schema Registry client settings (confluent_kafka.schema_registry) -> KafkaConnection field.
# ssl.key.password is not a setting of that client: schema.registry.registry_client applies it.
_REGISTRY_TLS_KEYS = {
    "ssl.ca.location": "schema_registry_ssl_ca_location",
    "ssl.certificate.location": "schema_registry_ssl_certificate_location",
    "ssl.key.location": "schema_registry_ssl_key_location",
    "ssl.key.password": "schema_registry_ssl_key_password",
}


class KafkaConnection(_Connection):
    """A Kafka cluster (and optionally its schema registry)."""

    _url_fields: ClassVar[tuple[str, ...]] = ("bootstrap_servers", "schema_registry_url")
    _kind: ClassVar[str] = "Kafka"

    bootstrap_servers: str = Field(min_length=1)
    security_protocol: SecurityProtocol | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    ssl_endpoint_identification_algorithm: str | None = None
    sasl_oauthbearer_method: str | None = None
    sasl_oauthbearer_client_id: str | None = None
    sasl_oauthbearer_client_secret: SecretStr | None = None
    sasl_oauthbearer_token_endpoint_url: str | None = None
    sasl_oauthbearer_scope: str | None = None
    sasl_oauthbearer_extensions: SecretStr | None = None
    sasl_oauthbearer_config: SecretStr | None = None
    client_id: str = "dpone"
    schema_registry_url: str | None = None
    schema_registry_username: str | None = None
    schema_registry_password: SecretStr | None = None
    schema_registry_ssl_ca_location: str | None = None
    schema_registry_ssl_certificate_location: str | None = None
    schema_registry_ssl_key_location: str | None = None
    schema_registry_ssl_key_password: SecretStr | None = None
    schema_registry_bearer_token: SecretStr | None = None
    schema_registry_oauth_client_id: str | None = None
    schema_registry_oauth_client_secret: SecretStr | None = None
    schema_registry_oauth_scope: str | None = None
    schema_registry_oauth_token_endpoint_url: str | None = None
    schema_registry_logical_cluster: str | None = None
    schema_registry_identity_pool_id: str | None = None
    # Raw librdkafka settings passed through unchanged.
    librdkafka: dict[str, str] = Field(default_factory=dict)

    @field_validator("security_protocol", mode="before")
    @classmethod
    def _upper_protocol(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("librdkafka", mode="before")
    @classmethod
    def _settings_as_strings(cls, value: Any) -> Any:
        return {str(k): _setting(v) for k, v in value.items()} if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConnection:
        protocol = self.security_protocol or ""
        if (self.sasl_username is None) != (self.sasl_password is None):
            raise ValueError("sasl_username and sasl_password must be set together")
        if self.sasl_username is not None and not protocol.startswith("SASL_"):
            # librdkafka would ignore the credentials and connect without authenticating.
            raise ValueError(
                "SASL credentials are set but security_protocol is not SASL_SSL or SASL_PLAINTEXT"
            )
        oauth = [name for name in _KAFKA_TLS_OAUTH_KEYS.values() if "oauthbearer" in name and getattr(self, name)]
        if oauth and (self.sasl_mechanism or "").upper() != "OAUTHBEARER":
            raise ValueError(f"{', '.join(oauth)} set but sasl_mechanism is not OAUTHBEARER")
        if (self.sasl_oauthbearer_method or "").lower() == "oidc":
            missing = [name for name in _OIDC_FIELDS if not getattr(self, name)]
            if missing:
                raise ValueError(f"sasl_oauthbearer_method oidc needs {', '.join(missing)}")
        if (self.sasl_mechanism or "").upper() == "OAUTHBEARER" and not protocol.startswith("SASL_"):
            raise ValueError("sasl_mechanism OAUTHBEARER needs security_protocol SASL_SSL or SASL_PLAINTEXT")
        client_tls = [
            name for name in ("ssl_certificate_location", "ssl_key_location", "ssl_key_password") if getattr(self, name)
        ]
        if client_tls and not protocol.endswith("SSL"):
            # librdkafka would connect in plain text and never present the certificate.
            raise ValueError(f"{', '.join(client_tls)} set but security_protocol is not SSL or SASL_SSL")
        raw_duplicates = {key for key, field in _KAFKA_TLS_OAUTH_KEYS.items() if getattr(self, field) is not None}
        duplicated = sorted(set(self.librdkafka) & ((set(_KAFKA_TYPED_KEYS) - set(_KAFKA_TLS_OAUTH_KEYS)) | raw_duplicates))
        if duplicated:
            fields = ", ".join(_KAFKA_TYPED_KEYS[key] for key in duplicated)
            raise ValueError(
                f"librdkafka setting(s) {', '.join(duplicated)} duplicate typed fields: set {fields} instead"
            )
        self._check_registry()
        return self

    def _check_registry(self) -> None:
        if (self.schema_registry_username is None) != (self.schema_registry_password is None):
            raise ValueError("schema_registry_username and schema_registry_password must be set together")
        oauth = [name for name in _REGISTRY_OAUTH_FIELDS if getattr(self, name)]
        if oauth and len(oauth) != len(_REGISTRY_OAUTH_FIELDS):
            missing = [name for name in _REGISTRY_OAUTH_FIELDS if name not in oauth]
            raise ValueError(f"{', '.join(oauth)} set without {', '.join(missing)}")
        schemes = [
            label
            for label, present in (
                ("schema_registry_username/password (basic)", self.schema_registry_username is not None),
                ("schema_registry_bearer_token", self.schema_registry_bearer_token is not None),
                ("schema_registry_oauth_* (OAuth client credentials)", bool(oauth)),
            )
            if present
        ]
        if len(schemes) > 1:
            # The registry client sends one Authorization header; the others would be dropped silently.
            raise ValueError(f"choose one Schema Registry authentication: {' or '.join(schemes)}")
        if self.schema_registry_ssl_key_location and not self.schema_registry_ssl_certificate_location:
            raise ValueError("schema_registry_ssl_key_location needs schema_registry_ssl_certificate_location")
        if self.schema_registry_ssl_key_password is not None and not self.schema_registry_ssl_certificate_location:
            raise ValueError("schema_registry_ssl_key_password needs schema_registry_ssl_certificate_location")
        tls = [name for name in _REGISTRY_TLS_KEYS.values() if getattr(self, name)]
        url = (self.schema_registry_url or "").lower()
        if (tls or schemes) and not url:
            raise ValueError(f"{', '.join(tls + schemes)} set without schema_registry_url")
        if tls and url.startswith("http://"):
            raise ValueError(f"{', '.join(tls)} set but schema_registry_url is http://, not https://")

    def client_config(self) -> dict[str, str]:
        """The librdkafka configuration (confluent_kafka Producer/Consumer/AdminClient conf)."""
        config: dict[str, str] = {}
        for key, field in {**_KAFKA_CLIENT_KEYS, **_KAFKA_TLS_OAUTH_KEYS}.items():
            value = getattr(self, field)
            if value is not None:
                config[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        return {**config, **self.librdkafka}

    def schema_registry_config(self) -> dict[str, str] | None:
        """Settings for `schema.registry.registry_client` (confluent_kafka's SchemaRegistryClient conf,
        plus ssl.key.password), or None without a registry URL."""
        if not self.schema_registry_url:
            return None
        config = {"url": self.schema_registry_url}
        if self.schema_registry_username is not None:
            config["basic.auth.user.info"] = (
                f"{self.schema_registry_username}:{_reveal(self.schema_registry_password)}"
            )
        for key, field in _REGISTRY_TLS_KEYS.items():
            value = getattr(self, field)
            if value is not None:
                config[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        if self.schema_registry_bearer_token is not None:
            config["bearer.auth.credentials.source"] = "STATIC_TOKEN"
            config["bearer.auth.token"] = self.schema_registry_bearer_token.get_secret_value()
        elif self.schema_registry_oauth_client_id:
            config["bearer.auth.credentials.source"] = "OAUTHBEARER"
            config["bearer.auth.client.id"] = self.schema_registry_oauth_client_id
            config["bearer.auth.client.secret"] = _reveal(self.schema_registry_oauth_client_secret) or ""
            config["bearer.auth.scope"] = self.schema_registry_oauth_scope or ""
            config["bearer.auth.issuer.endpoint.url"] = self.schema_registry_oauth_token_endpoint_url or ""
        if "bearer.auth.credentials.source" in config:
            # Confluent Cloud routing headers; the client requires both keys, other registries ignore them.
            config["bearer.auth.logical.cluster"] = self.schema_registry_logical_cluster or ""
            config["bearer.auth.identity.pool.id"] = self.schema_registry_identity_pool_id or ""
        return config


class PostgresConnection(_Connection):
    """A PostgreSQL database (the state store): discrete fields or a libpq `dsn`."""

    _url_fields: ClassVar[tuple[str, ...]] = ("dsn",)
    _kind: ClassVar[str] = "Postgres"

    host: str = "127.0.0.1"
    port: int = Field(default=5432, gt=0, lt=65536)
    user: str | None = None
    password: SecretStr | None = None
    database: str | None = None
    dsn: SecretStr | None = None

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for psycopg2.connect."""
        pairs = (
            ("host", "host"),
            ("port", "port"),
            ("user", "user"),
            ("password", "password"),
            ("dbname", "database"),
        )
        if self.dsn is None:
            chosen = pairs
        else:
            # psycopg2 lets keywords override the DSN: pass only fields set explicitly, never defaults.
            chosen = tuple(pair for pair in pairs if pair[1] in self.model_fields_set)
        kwargs: dict[str, Any] = {} if self.dsn is None else {"dsn": self.dsn.get_secret_value()}
        for keyword, field in chosen:
            value = getattr(self, field)
            if value is not None:
                kwargs[keyword] = value.get_secret_value() if isinstance(value, SecretStr) else value
        return kwargs


class JdbcConnection(_Connection):
    """A SQL source reached over JDBC (mssql, postgres, mysql)."""

    _url_fields: ClassVar[tuple[str, ...]] = ("jdbc_url",)
    _kind: ClassVar[str] = "JDBC"

    host: str | None = None
    port: int | None = Field(default=None, gt=0, lt=65536)
    user: str | None = None
    password: SecretStr | None = None
    database: str | None = None
    jdbc_url: str | None = None
    driver: str | None = None
    # JDBC driver properties (encrypt, trustServerCertificate, ...).
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("properties", mode="before")
    @classmethod
    def _properties_as_strings(cls, value: Any) -> Any:
        return {str(k): _setting(v) for k, v in value.items()} if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _reachable(self) -> JdbcConnection:
        if not self.host and not self.jdbc_url:
            raise ValueError("either host or jdbc_url must be set")
        return self


# --------------------------------------------------------------------------- typed resolvers


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
    for key in [key for key in fields if key in _KAFKA_TYPED_KEYS]:  # Airflow's Kafka provider uses these
        value = fields.pop(key)
        fields.setdefault(_KAFKA_TYPED_KEYS[key], value)
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
        taken[rename(key[len(prefix) :])] = _setting(fields.pop(key))
    return taken


def _mapping(value: Any, name: str, ref: ConnectionRefLike) -> dict[str, Any]:
    if isinstance(value, str):  # a Vault key or Airflow extra may hold the mapping as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{_context('', str(ref.connection_id), ref.connection_type)}: {name} must be a mapping of setting "
            f"name to value. Fix: give {name} as a mapping (or JSON object), or use {name}__<setting> fields."
        )
    return dict(value)


_M = TypeVar("_M", bound=_Connection)


def _lookup(ref: ConnectionRefLike, field: str, environ: Mapping[str, str]) -> str:
    """Where `field` of this connection is read from, for error messages."""
    connection_id, connection_type = str(ref.connection_id), ref.connection_type
    if connection_type == "env":
        return " or ".join(env_var_names(connection_id, field))
    if connection_type == "params":
        return f"params.{field} in the manifest block"
    if connection_type == "airflow":
        name = airflow_var_names(connection_id)[0]
        part = _AIRFLOW_PARTS.get(field)
        return f"the {part} of {name}" if part else f"extra '{field}' of {name}"
    mount, path = _vault_path(connection_id, environ)
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
        f"{_context(model._kind, str(ref.connection_id), ref.connection_type)}: missing required field {wanted}. "
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
        f"{_context(model._kind, str(ref.connection_id), ref.connection_type)}: unknown field(s) {names} "
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
            f"{_context(model._kind, str(ref.connection_id), ref.connection_type)} is invalid: "
            f"{'; '.join(problems)}. Fix: correct the field(s) named."
        ) from None
