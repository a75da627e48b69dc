"""Schema Registry helpers: subject names, the client (mock:// sharing, TLS), schema registration
and look-ups by id, and `registry_errors` for transport failures. The wire format is in
`schema.wire_format`, the value contract shared by every registry format in `schema.values`.

Only the driver calls the client functions here. Executors never contact the registry: the driver
collects the schema ids of a batch (`spark.registry_codec.distinct_schema_ids`), fetches them with
`schemas_by_id` and ships the strings inside the task closure. A `mock://` registry is in-memory and
private to one client object, so a second process (a Spark Python worker) would not see it anyway.

Protobuf schemas travel as base64 FileDescriptorProto (what confluent's serializers register and
what executors rebuild message classes from). A registry answers with `.proto` text unless a
read asks for `format=serialized`, so every read of a protobuf schema here asks for it; a registry
that still answers with text is a clear error on the driver, never a batch of corrupt records.
"""

from __future__ import annotations

import base64
import binascii
import ssl
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dpone_dagster.errors import ConfigError
from dpone_dagster.redact import redact_text

# Re-exported (used in six modules, read as `registry.DEFAULT_KEY` by tests); defined with the value contract.
from dpone_dagster.schema.values import DEFAULT_KEY as DEFAULT_KEY

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import (
        RegisteredSchema,
        Schema,
        SchemaReference,
        SchemaRegistryClient,
    )
    from confluent_kafka.schema_registry.error import SchemaRegistryError

# Manifest message_format -> registry schema type.
SCHEMA_TYPES = {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}
_NOT_FOUND_CODES = {40400, 40401, 40402, 40403}
# The `format` a registry read asks for to get a protobuf schema as base64 FileDescriptorProto.
SERIALIZED = "serialized"


# --------------------------------------------------------------------------- subjects


def subject_name(strategy: str, topic: str, record_fullname: str | None, is_key: bool = False) -> str:
    """Subject for a topic's key or value schema (Confluent's TopicNameStrategy & co)."""
    if strategy == "topic":
        return f"{topic}-{'key' if is_key else 'value'}"
    if not record_fullname:
        raise ConfigError(
            f"schema_registry.subject_name_strategy: {strategy} needs a record name; set "
            "schema_registry.record_name (and record_namespace) or use subject_name_strategy: topic"
        )
    if strategy == "record":
        return record_fullname
    if strategy == "topic_record":
        return f"{topic}-{record_fullname}"
    raise ConfigError(f"unknown subject_name_strategy {strategy!r}; use topic, record or topic_record")


def schema_type_of(fmt_or_type: str) -> str:
    """AVRO | JSON | PROTOBUF from either a manifest format name or a registry schema type."""
    upper = fmt_or_type.upper()
    if upper in SCHEMA_TYPES.values():
        return upper
    if fmt_or_type in SCHEMA_TYPES:
        return SCHEMA_TYPES[fmt_or_type]
    raise ConfigError(f"{fmt_or_type!r} is not a Schema Registry format; use avro, json_schema or protobuf")


# --------------------------------------------------------------------------- client (driver only)

def client_module() -> ModuleType:
    """confluent-kafka's registry client, loaded on first use: with httpx and authlib it takes
    ~0.2 s to import, which a run without a registry does not pay."""
    import confluent_kafka.schema_registry

    return confluent_kafka.schema_registry


def registry_error() -> type[SchemaRegistryError]:
    """The error a registry answer raises (an `except` names it only once an error is raised)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    return SchemaRegistryError


def http_error() -> type[Exception]:
    import httpx

    return httpx.HTTPError


_MOCK_CLIENTS: dict[str, SchemaRegistryClient] = {}


# TLS settings `registry_client` applies itself: confluent-kafka's client has no key password, and a
# key it loads without one makes OpenSSL prompt on the terminal.
_TLS_KEYS = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password")


def registry_client(config: Mapping[str, Any]) -> SchemaRegistryClient:
    """A client for `config` (`KafkaConnection.schema_registry_config()`); `mock://` URLs share one
    in-memory registry per URL in this process.

    `SchemaRegistryClient(conf)` never returns the mock (only `SchemaRegistryClient.new_client`
    does), and each mock object has a private store, so code paths of one run must share it.
    TLS (CA, client certificate and key, key password) is applied through an `ssl.SSLContext`.
    """
    conf = dict(config)
    tls = {key: conf.pop(key) for key in _TLS_KEYS if conf.get(key) is not None}
    url = str(conf.get("url") or "")
    if url.startswith("mock://"):
        if url not in _MOCK_CLIENTS:
            _MOCK_CLIENTS[url] = client_module().SchemaRegistryClient.new_client(conf)
        return _MOCK_CLIENTS[url]
    client = client_module().SchemaRegistryClient(conf)
    if tls:
        _use_tls(client, registry_ssl_context(tls))
    return client


def registry_ssl_context(tls: Mapping[str, str]) -> ssl.SSLContext:
    """The client-side TLS context of a registry connection: server verification against
    ssl.ca.location (else the system's CAs) and the client certificate, if any."""
    cafile = tls.get("ssl.ca.location")
    try:
        context = ssl.create_default_context(cafile=cafile)
        if tls.get("ssl.certificate.location"):
            password = tls.get("ssl.key.password")
            context.load_cert_chain(
                tls["ssl.certificate.location"],
                tls.get("ssl.key.location"),
                # A callable: OpenSSL never prompts, and a key without a password ignores it.
                (lambda: password) if password is not None else (lambda: ""),
            )
    except (OSError, ssl.SSLError) as exc:
        # The reason only: never the key password.
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(
            f"schema registry TLS: cannot load the CA / client certificate / key ({reason}); check "
            "schema_registry_ssl_ca_location, schema_registry_ssl_certificate_location, "
            "schema_registry_ssl_key_location and schema_registry_ssl_key_password of the connection"
        ) from None
    return context


def _use_tls(client: SchemaRegistryClient, context: ssl.SSLContext) -> None:
    rest = getattr(client, "_rest_client", None)
    if rest is None or not hasattr(rest, "session"):
        raise ConfigError(
            "schema registry TLS: this confluent-kafka version's registry client cannot take a TLS "
            "context; install the confluent-kafka version pinned by the project"
        )
    rest.session.close()
    import httpx

    rest.session = httpx.Client(
        verify=context,
        auth=getattr(rest, "auth", None),
        proxy=getattr(rest, "proxy", None),
        timeout=getattr(rest, "timeout", None),
    )


def _not_found(error: SchemaRegistryError) -> bool:
    return error.http_status_code == 404 or error.error_code in _NOT_FOUND_CODES


def _registry_error(action: str, subject: str, error: SchemaRegistryError) -> ConfigError:
    return ConfigError(
        f"schema registry: {action} for subject {subject!r} failed: {error}; check schema_registry_url "
        "and credentials of the connection"
    )


def read_format(message_format: str | None) -> str | None:
    """The `format` to ask a registry read for: serialized for protobuf, the default otherwise
    (some registry versions refuse `serialized` for Avro and JSON Schema)."""
    return SERIALIZED if message_format == "protobuf" else None


def fetch_latest(client: SchemaRegistryClient, subject: str, message_format: str | None = None) -> RegisteredSchema | None:
    """The latest version of `subject`, or None when the subject does not exist. With
    message_format protobuf the schema comes serialized (see the module docstring)."""
    try:
        latest = client.get_latest_version(subject, fmt=read_format(message_format))
    except registry_error() as error:
        if _not_found(error):
            return None
        raise _registry_error("reading the latest version", subject, error) from error
    _require_serialized(latest.schema, f"the latest version of subject {subject!r}")
    return latest


def fetch_versions(client: SchemaRegistryClient, subject: str, message_format: str | None = None) -> list[RegisteredSchema]:
    """Every version of `subject`, oldest first (for *_TRANSITIVE compatibility checks)."""
    try:
        versions = sorted(client.get_versions(subject))
        found = [client.get_version(subject, v, fmt=read_format(message_format)) for v in versions]
    except registry_error() as error:
        if _not_found(error):
            return []
        raise _registry_error("listing versions", subject, error) from error
    for registered in found:
        _require_serialized(registered.schema, f"version {registered.version} of subject {subject!r}")
    return found


def is_serialized_descriptor(schema_str: str) -> bool:
    """True when a protobuf schema string is base64 (a serialized FileDescriptorProto), not .proto text."""
    try:
        base64.b64decode(schema_str, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _require_serialized(schema: Schema, what: str) -> None:
    if _is_text_protobuf(schema):
        raise ConfigError(
            f"schema registry: {what} came back as .proto text although format=serialized was asked; this "
            "project reads protobuf schemas as serialized FileDescriptorProto (the form confluent's "
            "serializers register). Point schema_registry_url at a Confluent-compatible registry that "
            "supports format=serialized (Confluent Schema Registry 5.5 or later)"
        )


def ensure_registered(
    client: SchemaRegistryClient,
    subject: str,
    schema_str: str,
    schema_type: str,
    auto_register: bool,
    references: Sequence[SchemaReference] | None = None,
) -> int:
    """Schema id of `schema_str` under `subject`, registering it when `auto_register` is on.

    Compatibility is checked before this is called (`schema.evolution`, and `schema.avro_compat` for
    Avro): the mock registry checks nothing, and a real one would only answer with a bare 409.
    """
    schema = client_module().Schema(schema_str, schema_type_of(schema_type), list(references or []))
    try:
        if auto_register:
            return int(client.register_schema(subject, schema))
        return int(client.lookup_schema(subject, schema).schema_id)
    except registry_error() as error:
        if auto_register or not _not_found(error):
            raise _registry_error("registering the schema" if auto_register else "looking up the schema", subject, error) from error
    latest = fetch_latest(client, subject)
    if latest is None:
        raise ConfigError(
            f"schema registry subject {subject!r} does not exist and auto_register_schemas is false; "
            f"register the schema under {subject!r} first or set schema_registry.auto_register_schemas: true"
        )
    raise ConfigError(
        f"the schema to write is not registered under {subject!r} (latest is version {latest.version}, "
        f"id {latest.schema_id}) and auto_register_schemas is false; register it (a compatible evolution "
        "of the latest version) or set schema_registry.auto_register_schemas: true"
    )


@dataclass(frozen=True)
class ReferencedFile:
    """A schema another one imports (protobuf files), registered under its own name as subject."""

    name: str
    schema_str: str
    imports: tuple[str, ...] = ()


def ensure_references(
    client: SchemaRegistryClient, files: Sequence[ReferencedFile], auto_register: bool, schema_type: str = "PROTOBUF"
) -> dict[str, SchemaReference]:
    """Register/look up referenced files (dependencies first) like confluent's ProtobufSerializer
    does: subject = file name. Returns name -> SchemaReference for the importing schema."""
    done: dict[str, SchemaReference] = {}
    for file in files:
        refs = [done[name] for name in file.imports if name in done]
        schema = client_module().Schema(file.schema_str, schema_type_of(schema_type), refs)
        try:
            if auto_register:
                client.register_schema(file.name, schema)
            registered = client.lookup_schema(file.name, schema)
        except registry_error() as error:
            raise ConfigError(
                f"schema registry: referenced schema {file.name!r} is not registered"
                + ("" if auto_register else " and auto_register_schemas is false; register it first")
                + f" ({error})"
            ) from error
        done[file.name] = client_module().SchemaReference(file.name, file.name, registered.version)
    return done


def schemas_by_id(
    client: SchemaRegistryClient, ids: Iterable[int], message_format: str | None = None
) -> dict[int, tuple[str, str]]:
    """id -> (schema_type, schema_str); ids the registry does not know are left out (their records
    are then marked corrupt with "unknown schema id").

    Protobuf schemas are returned serialized. With message_format protobuf every id is read with
    format=serialized; without it, an id that turns out to be PROTOBUF is read again that way.
    """
    found: dict[int, tuple[str, str]] = {}
    for schema_id in sorted(set(ids)):
        try:
            schema = client.get_schema(schema_id, fmt=read_format(message_format))
        except registry_error() as error:
            if _not_found(error):
                continue
            raise _registry_error(f"reading schema id {schema_id}", "-", error) from error
        if message_format != "protobuf" and _is_text_protobuf(schema):
            schema = _serialized_by_id(client, schema_id)
        _require_serialized(schema, f"schema id {schema_id}")
        found[schema_id] = ((schema.schema_type or "AVRO").upper(), schema.schema_str or "")
    return found


def _is_text_protobuf(schema: Schema) -> bool:
    return (schema.schema_type or "").upper() == "PROTOBUF" and not is_serialized_descriptor(schema.schema_str or "")


def _serialized_by_id(client: SchemaRegistryClient, schema_id: int) -> Schema:
    """Schema `schema_id` read again with format=serialized. The client caches schemas by id
    whatever format was asked, so the read goes through a subject version holding the id."""
    try:
        for holder in client.get_schema_versions(schema_id):
            return client.get_version(holder.subject, holder.version, fmt=SERIALIZED).schema
    except registry_error() as error:
        raise _registry_error(f"reading protobuf schema id {schema_id} serialized", "-", error) from error
    raise ConfigError(
        f"schema registry: protobuf schema id {schema_id} came back as .proto text and is registered under "
        "no subject version, so it cannot be read with format=serialized; register it again (or produce "
        "with a registered schema)"
    )


def references_by_id(client: SchemaRegistryClient, ids: Iterable[int]) -> dict[int, tuple[tuple[str, str], ...]]:
    """id -> referenced (file name, schema_str) pairs, dependencies first, for schemas with references
    (protobuf imports of non-well-known files, read serialized). Executors need them to rebuild
    descriptors."""
    out: dict[int, tuple[tuple[str, str], ...]] = {}
    for schema_id in sorted(set(ids)):
        try:
            schema = client.get_schema(schema_id)
        except registry_error():
            continue
        if schema.references:
            files: dict[str, str] = {}
            collect_references(client, schema.references, files, schema.schema_type or "AVRO")
            out[schema_id] = tuple(files.items())
    return out


def collect_references(
    client: SchemaRegistryClient, refs: Sequence[SchemaReference], files: dict[str, str], schema_type: str
) -> None:
    """Add the referenced schemas to `files` (name -> schema_str), dependencies first."""
    fmt = read_format("protobuf" if schema_type.upper() == "PROTOBUF" else None)
    for ref in refs:
        if ref.name in files:
            continue
        registered = client.get_version(ref.subject, ref.version, fmt=fmt)
        _require_serialized(registered.schema, f"referenced schema {ref.name!r} (subject {ref.subject!r})")
        if registered.schema.references:
            collect_references(client, registered.schema.references, files, schema_type)
        files[ref.name] = registered.schema.schema_str


@contextmanager
def registry_errors(config: Mapping[str, Any]) -> Iterator[None]:
    """Turn transport failures (connection refused, DNS, TLS, timeouts) into a ConfigError that
    names the cause and the fix; registry answers (SchemaRegistryError) are classified too."""
    from dpone_dagster.kafka.errors import classify_registry

    url = str(config.get("url", ""))
    try:
        yield
    except registry_error() as error:
        classified = classify_registry(getattr(error, "http_status_code", None), str(error))
        if classified.kind == "retriable":
            raise ConfigError(redact_text(classified.message(f"{url}: {error}"))) from None
        raise
    except (http_error(), OSError) as error:
        # The URL may carry user:password and the transport error may echo it.
        raise ConfigError(redact_text(classify_registry(None).message(f"{url}: {type(error).__name__}: {error}"))) from None
