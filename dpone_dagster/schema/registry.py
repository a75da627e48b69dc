"""Schema Registry helpers: subject names, registration, schema look-ups by id, the Confluent wire
format, and the value contract shared by every registry format (avro, json_schema, protobuf).

Only the driver calls the client functions here. Executors never contact the registry: the driver
collects the schema ids of a batch (`spark.registry_codec.distinct_schema_ids`), fetches them with
`schemas_by_id` and ships the strings inside the task closure. A `mock://` registry is in-memory and
private to one client object, so a second process (a Spark Python worker) would not see it anyway.

Wire format (Confluent): magic byte 0, schema id as a 4-byte big-endian integer, then, for protobuf
only, the message indexes (zigzag varints: a count then the indexes; the common path [0] is the
single byte 0), then the serialized payload.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any
from uuid import UUID

import httpx
from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from dpone_dagster.errors import ConfigError
from dpone_dagster.redact import redact_text

MAGIC_BYTE = 0
HEADER_SIZE = 5
# Manifest message_format -> registry schema type.
SCHEMA_TYPES = {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}
# StructField metadata key carrying a non-null field default read from a registered schema.
DEFAULT_KEY = "dpone.default"
_NOT_FOUND_CODES = {40400, 40401, 40402, 40403}


class WireFormatError(ValueError):
    """A value that is not a Confluent-framed record; `reason` goes to `__dpone__corrupt`."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


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


# --------------------------------------------------------------------------- wire format


def _zigzag_varint(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded & ~0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def _read_zigzag_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(data):
            raise WireFormatError("truncated protobuf message indexes")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise WireFormatError("malformed protobuf message index varint")


def encode_message_indexes(indexes: Sequence[int]) -> bytes:
    if not indexes:
        raise ValueError("protobuf message indexes must not be empty")
    if list(indexes) == [0]:
        return b"\x00"  # the first top-level message: Confluent's one-byte shorthand
    return _zigzag_varint(len(indexes)) + b"".join(_zigzag_varint(i) for i in indexes)


def decode_message_indexes(data: bytes, pos: int) -> tuple[list[int], int]:
    """(indexes, position after them); a count of 0 is the shorthand for [0]."""
    count, pos = _read_zigzag_varint(data, pos)
    if count == 0:
        return [0], pos
    if count < 0 or count > len(data) - pos:
        raise WireFormatError(f"bad protobuf message index count {count}")
    indexes = []
    for _ in range(count):
        index, pos = _read_zigzag_varint(data, pos)
        indexes.append(index)
    return indexes, pos


def frame(schema_id: int, payload: bytes, message_indexes: Sequence[int] | None = None) -> bytes:
    head = bytes([MAGIC_BYTE]) + schema_id.to_bytes(4, "big", signed=False)
    if message_indexes is not None:
        head += encode_message_indexes(message_indexes)
    return head + payload


def unframe(value: bytes, with_indexes: bool = False) -> tuple[int, list[int] | None, bytes]:
    """(schema_id, message indexes or None, payload); `with_indexes` for protobuf values."""
    if len(value) < HEADER_SIZE:
        if value and value[0] != MAGIC_BYTE:
            raise WireFormatError(f"wrong magic byte 0x{value[0]:02x}")
        raise WireFormatError(f"too short for the registry wire format ({len(value)} bytes)")
    if value[0] != MAGIC_BYTE:
        raise WireFormatError(f"wrong magic byte 0x{value[0]:02x}")
    schema_id = int.from_bytes(value[1:HEADER_SIZE], "big", signed=False)
    if not with_indexes:
        return schema_id, None, bytes(value[HEADER_SIZE:])
    indexes, pos = decode_message_indexes(bytes(value), HEADER_SIZE)
    return schema_id, indexes, bytes(value[pos:])


# --------------------------------------------------------------------------- client (driver only)

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
            _MOCK_CLIENTS[url] = SchemaRegistryClient.new_client(conf)
        return _MOCK_CLIENTS[url]
    client = SchemaRegistryClient(conf)
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


def fetch_latest(client: SchemaRegistryClient, subject: str) -> RegisteredSchema | None:
    """The latest version of `subject`, or None when the subject does not exist."""
    try:
        return client.get_latest_version(subject)
    except SchemaRegistryError as error:
        if _not_found(error):
            return None
        raise _registry_error("reading the latest version", subject, error) from error


def fetch_versions(client: SchemaRegistryClient, subject: str) -> list[RegisteredSchema]:
    """Every version of `subject`, oldest first (for *_TRANSITIVE compatibility checks)."""
    try:
        versions = sorted(client.get_versions(subject))
        return [client.get_version(subject, v) for v in versions]
    except SchemaRegistryError as error:
        if _not_found(error):
            return []
        raise _registry_error("listing versions", subject, error) from error


def ensure_registered(
    client: SchemaRegistryClient,
    subject: str,
    schema_str: str,
    schema_type: str,
    auto_register: bool,
    references: Sequence[SchemaReference] | None = None,
) -> int:
    """Schema id of `schema_str` under `subject`, registering it when `auto_register` is on.

    Compatibility is checked by `schema.evolution` before this is called: the mock registry has no
    compatibility endpoint, and a real one would only answer with a bare 409.
    """
    schema = Schema(schema_str, schema_type_of(schema_type), list(references or []))
    try:
        if auto_register:
            return int(client.register_schema(subject, schema))
        return int(client.lookup_schema(subject, schema).schema_id)
    except SchemaRegistryError as error:
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
        schema = Schema(file.schema_str, schema_type_of(schema_type), refs)
        try:
            if auto_register:
                client.register_schema(file.name, schema)
            registered = client.lookup_schema(file.name, schema)
        except SchemaRegistryError as error:
            raise ConfigError(
                f"schema registry: referenced schema {file.name!r} is not registered"
                + ("" if auto_register else " and auto_register_schemas is false; register it first")
                + f" ({error})"
            ) from error
        done[file.name] = SchemaReference(file.name, file.name, registered.version)
    return done


def schemas_by_id(client: SchemaRegistryClient, ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """id -> (schema_type, schema_str); ids the registry does not know are left out (their records
    are then marked corrupt with "unknown schema id")."""
    found: dict[int, tuple[str, str]] = {}
    for schema_id in sorted(set(ids)):
        try:
            schema = client.get_schema(schema_id)
        except SchemaRegistryError as error:
            if _not_found(error):
                continue
            raise _registry_error(f"reading schema id {schema_id}", "-", error) from error
        found[schema_id] = (schema.schema_type or "AVRO", schema.schema_str or "")
    return found


def references_by_id(client: SchemaRegistryClient, ids: Iterable[int]) -> dict[int, tuple[tuple[str, str], ...]]:
    """id -> referenced (file name, schema_str) pairs, dependencies first, for schemas with references
    (protobuf imports of non-well-known files). Executors need them to rebuild descriptors."""
    out: dict[int, tuple[tuple[str, str], ...]] = {}
    for schema_id in sorted(set(ids)):
        try:
            schema = client.get_schema(schema_id)
        except SchemaRegistryError:
            continue
        if schema.references:
            files: dict[str, str] = {}
            _collect_references(client, schema.references, files)
            out[schema_id] = tuple(files.items())
    return out


def _collect_references(client: SchemaRegistryClient, refs: Sequence[SchemaReference], files: dict[str, str]) -> None:
    for ref in refs:
        if ref.name in files:
            continue
        registered = client.get_version(ref.subject, ref.version)
        if registered.schema.references:
            _collect_references(client, registered.schema.references, files)
        files[ref.name] = registered.schema.schema_str


# --------------------------------------------------------------------------- value contract


def to_spark_value(value: Any, dtype: DataType, path: str = "", enforce_nullability: bool = False) -> Any:
    """Convert a decoded Python value into what Arrow expects for `dtype` (raises ValueError).

    Shared by all registry formats: structs project by field name (missing -> null, extra keys
    ignored), maps become (key, value) pairs, timestamps become UTC-aware datetimes, decimals are
    rounded half-up to the scale and must fit the precision. Lenient where the source format has no
    native type: ISO strings for dates/timestamps, base64 strings for binary, strings or numbers for
    decimals (JSON). With `enforce_nullability`, a null in a non-nullable place raises (encoding).
    """
    if value is None:
        return None
    if isinstance(dtype, StructType):
        if not isinstance(value, Mapping):
            raise ValueError(f"{path or 'value'}: expected an object, got {type(value).__name__}")
        out = {}
        for field in dtype.fields:
            child = f"{path}.{field.name}" if path else field.name
            converted = to_spark_value(value.get(field.name), field.dataType, child, enforce_nullability)
            if converted is None and enforce_nullability and not field.nullable and DEFAULT_KEY not in field.metadata:
                raise ValueError(f"{child}: null in a field the schema requires")
            out[field.name] = converted
        return out
    if isinstance(dtype, ArrayType):
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
            raise ValueError(f"{path}: expected an array, got {type(value).__name__}")
        items = [to_spark_value(v, dtype.elementType, f"{path}[]", enforce_nullability) for v in value]
        if enforce_nullability and not dtype.containsNull and any(v is None for v in items):
            raise ValueError(f"{path}: null element in an array that does not allow nulls")
        return items
    if isinstance(dtype, MapType):
        pairs = value.items() if isinstance(value, Mapping) else value
        out_pairs = []
        for pair in pairs:
            k, v = pair
            key = to_spark_value(k, dtype.keyType, f"{path}{{}}", enforce_nullability)
            if key is None:
                raise ValueError(f"{path}: null map key")
            item = to_spark_value(v, dtype.valueType, f"{path}{{{k}}}", enforce_nullability)
            if item is None and enforce_nullability and not dtype.valueContainsNull:
                raise ValueError(f"{path}{{{k}}}: null map value where the schema allows none")
            out_pairs.append((key, item))
        return out_pairs
    converter = _SCALARS.get(type(dtype))
    if converter is None:
        raise ValueError(f"{path}: Spark type {dtype.simpleString()} is not supported by registry formats")
    try:
        return converter(value, dtype)
    except (TypeError, ValueError, ArithmeticError, InvalidOperation) as exc:
        raise ValueError(f"{path or 'value'}: {exc}") from None


_DECIMAL_CONTEXT = Context(prec=80)
_INT_BITS = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}


def _integral(value: Any, dtype: DataType) -> int:
    if isinstance(value, bool):
        raise TypeError("expected an integer, got a boolean")
    if isinstance(value, float | Decimal):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"expected an integer, got {value}")
        value = int(value)
    if not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    bits = _INT_BITS[type(dtype)]
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise ValueError(f"{value} does not fit {dtype.simpleString()}")
    return value


def _floating(value: Any, dtype: DataType) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _boolean(value: Any, dtype: DataType) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value


def _decimal(value: Any, dtype: DecimalType) -> Decimal:
    if isinstance(value, bool):
        raise TypeError("expected a decimal, got a boolean")
    if isinstance(value, float):
        value = repr(value)  # shortest repr: 0.1 stays 0.1, not its binary expansion
    if not isinstance(value, Decimal | int | str):
        raise TypeError(f"expected a decimal, got {type(value).__name__}")
    number = Decimal(value)
    if not number.is_finite():
        raise ValueError(f"{value} is not a finite decimal")
    # The default context keeps 28 digits; Spark decimals have up to 38.
    quantized = number.quantize(Decimal(1).scaleb(-dtype.scale), rounding=ROUND_HALF_UP, context=_DECIMAL_CONTEXT)
    if quantized.adjusted() >= dtype.precision - dtype.scale and quantized != 0:
        raise ValueError(f"{value} does not fit {dtype.simpleString()}")
    return quantized


def _string(value: Any, dtype: DataType) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping | list | tuple):
        # Values of types a string column stands in for (multi-branch unions, open objects).
        return json.dumps(value, default=str, separators=(",", ":"))
    if isinstance(value, date | datetime | time):
        return value.isoformat()
    if isinstance(value, int | float | Decimal | UUID):
        return str(value)
    raise TypeError(f"expected a string, got {type(value).__name__}")


def _binary(value: Any, dtype: DataType) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return base64.b64decode(value, validate=True)  # JSON carries bytes as base64
    raise TypeError(f"expected bytes, got {type(value).__name__}")


def _parse_datetime(text: str) -> datetime:
    return datetime.fromisoformat(text.strip())


def _timestamp(value: Any, dtype: DataType) -> datetime:
    if isinstance(value, str):
        value = _parse_datetime(value)
    if isinstance(value, datetime):
        # Naive values are taken as UTC, the session time zone the engine runs with.
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime.combine(value, time(), UTC)
    raise TypeError(f"expected a timestamp, got {type(value).__name__}")


def _timestamp_ntz(value: Any, dtype: DataType) -> datetime:
    if isinstance(value, str):
        value = _parse_datetime(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, date):
        return datetime.combine(value, time())
    raise TypeError(f"expected a local timestamp, got {type(value).__name__}")


def _date(value: Any, dtype: DataType) -> date:
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        return date.fromisoformat(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        return date(1970, 1, 1) + timedelta(days=value)  # Avro/epoch days
    raise TypeError(f"expected a date, got {type(value).__name__}")


_SCALARS: dict[type, Any] = {
    ByteType: _integral,
    ShortType: _integral,
    IntegerType: _integral,
    LongType: _integral,
    FloatType: _floating,
    DoubleType: _floating,
    BooleanType: _boolean,
    DecimalType: _decimal,
    StringType: _string,
    BinaryType: _binary,
    TimestampType: _timestamp,
    TimestampNTZType: _timestamp_ntz,
    DateType: _date,
    NullType: lambda value, dtype: None,
}


@contextmanager
def registry_errors(config: Mapping[str, Any]) -> Iterator[None]:
    """Turn transport failures (connection refused, DNS, TLS, timeouts) into a ConfigError that
    names the cause and the fix; registry answers (SchemaRegistryError) are classified too."""
    from dpone_dagster.kafka.errors import classify_registry

    url = str(config.get("url", ""))
    try:
        yield
    except SchemaRegistryError as error:
        classified = classify_registry(getattr(error, "http_status_code", None), str(error))
        if classified.kind == "retriable":
            raise ConfigError(redact_text(classified.message(f"{url}: {error}"))) from None
        raise
    except (httpx.HTTPError, OSError) as error:
        # The URL may carry user:password and the transport error may echo it.
        raise ConfigError(redact_text(classify_registry(None).message(f"{url}: {type(error).__name__}: {error}"))) from None
