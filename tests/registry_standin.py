"""A stand-in for a Confluent Schema Registry, for tests: a real HTTP server (stdlib `http.server`
in a thread) answering the part of the REST API this project and confluent-kafka's
SchemaRegistryClient use.

Why a stand-in: no Schema Registry server can be installed on this machine, and confluent-kafka's
in-memory `mock://` client hides two things the real server does, both of which matter to this
project:

- protobuf schemas are served as `.proto` text unless a read asks for `format=serialized` (then as
  base64 FileDescriptorProto, which is what the project decodes with);
- registering a version that breaks the subject's compatibility level (BACKWARD unless configured)
  answers 409 Conflict.

Avro compatibility is decided by the Apache `avro` package (`ReaderWriterCompatibilityChecker`),
independently of the project's own rules. Limits, on purpose: other schema types are registered
without a compatibility check; protobuf must be registered serialized (this file renders `.proto`
text but cannot parse it); Avro schemas with references are refused; nothing is ever deleted. A
`format` a schema type has no such form for (e.g. `serialized` for Avro) is an error here, as on
registry versions that refuse it, so the project must not ask for it.

Usage: the `registry_standin` fixture starts a server, points connection `kafka_cluster` at it
(`KAFKA_CLUSTER_SCHEMA_REGISTRY_URL`) and yields it; `exchanges` records every request answered.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from google.protobuf import descriptor_pb2

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_LEVELS = {
    "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE",
}


class RegistryError(Exception):
    """An error answer: HTTP status and the registry's error body."""

    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Stored:
    """One schema (one id): its type, the text it is served with, its references."""

    schema_id: int
    schema_type: str
    text: str  # AVRO / JSON: as registered; PROTOBUF: base64 FileDescriptorProto
    references: tuple[tuple[str, str, int], ...]  # (name, subject, version)
    key: str  # identity of the schema: same key, same id


@dataclass(frozen=True)
class Exchange:
    method: str
    path: str
    query: dict[str, str]
    status: int


@dataclass
class RegistryStandIn:
    """The registry's state and its answers (`handle`); `url` is set once the server listens."""

    url: str = ""
    compatibility: str = "BACKWARD"
    schemas: list[Stored] = field(default_factory=list)
    subjects: dict[str, list[int]] = field(default_factory=dict)  # subject -> ids, version i+1 at [i]
    subject_levels: dict[str, str] = field(default_factory=dict)
    exchanges: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ helpers for tests

    def answered(self, status: int, method: str | None = None) -> list[Exchange]:
        return [e for e in self.exchanges if e.status == status and (method is None or e.method == method)]

    def latest(self, subject: str) -> tuple[int, Stored]:
        ids = self.subjects[subject]
        return len(ids), self._by_id(ids[-1])

    # ------------------------------------------------------------------ dispatch

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        routes = [
            ("GET", r"/subjects", self._list_subjects),
            ("GET", r"/subjects/([^/]+)/versions", self._list_versions),
            ("GET", r"/subjects/([^/]+)/versions/([^/]+)", self._get_version),
            ("GET", r"/subjects/([^/]+)/versions/([^/]+)/schema", self._get_version_text),
            ("POST", r"/subjects/([^/]+)/versions", self._register),
            ("POST", r"/subjects/([^/]+)", self._lookup),
            ("GET", r"/schemas/types", lambda q, b: ["AVRO", "JSON", "PROTOBUF"]),
            ("GET", r"/schemas/ids/(\d+)", self._get_by_id),
            ("GET", r"/schemas/ids/(\d+)/versions", self._id_versions),
            ("GET", r"/schemas/ids/(\d+)/subjects", self._id_subjects),
            ("GET", r"/config", lambda q, b: {"compatibilityLevel": self.compatibility}),
            ("PUT", r"/config", self._set_global_level),
            ("GET", r"/config/([^/]+)", self._get_subject_level),
            ("PUT", r"/config/([^/]+)", self._set_subject_level),
            ("POST", r"/compatibility/subjects/([^/]+)/versions/([^/]+)", self._test_compatibility),
            ("POST", r"/compatibility/subjects/([^/]+)/versions", self._test_compatibility_all),
        ]
        try:
            for verb, pattern, action in routes:
                match = re.fullmatch(pattern, path.rstrip("/") or "/")
                if verb == method and match:
                    args = [unquote(g) for g in match.groups()]
                    with self.lock:
                        return 200, action(*args, query, body)
            raise RegistryError(404, 404, f"HTTP 404 Not Found: {method} {path}")
        except RegistryError as error:
            return error.status, {"error_code": error.code, "message": error.message}

    # ------------------------------------------------------------------ subjects and versions

    def _list_subjects(self, query: dict[str, str], body: Any) -> list[str]:
        return sorted(self.subjects)

    def _ids(self, subject: str) -> list[int]:
        if subject not in self.subjects:
            raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        return self.subjects[subject]

    def _list_versions(self, subject: str, query: dict[str, str], body: Any) -> list[int]:
        return list(range(1, len(self._ids(subject)) + 1))

    def _version(self, subject: str, version: str) -> tuple[int, Stored]:
        ids = self._ids(subject)
        number = len(ids) if version in ("latest", "-1") else int(version) if version.isdigit() else 0
        if not 1 <= number <= len(ids):
            raise RegistryError(404, 40402, f"Version {version} not found.")
        return number, self._by_id(ids[number - 1])

    def _get_version(self, subject: str, version: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        number, stored = self._version(subject, version)
        return {"subject": subject, "version": number, "id": stored.schema_id, **self._body(stored, query.get("format"))}

    def _get_version_text(self, subject: str, version: str, query: dict[str, str], body: Any) -> Any:
        _, stored = self._version(subject, version)
        return self._served(stored, query.get("format"))

    def _register(self, subject: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        stored = self._parse(body)
        ids = self.subjects.get(subject, [])
        for schema_id in ids:
            if self._by_id(schema_id).key == stored.key:
                return {"id": schema_id}  # registered already: same id, no new version
        if ids:
            problems = self._incompatibilities(subject, stored, self._level(subject))
            if problems:
                raise RegistryError(
                    409, 409,
                    f"Schema being registered is incompatible with an earlier schema for subject \"{subject}\", "
                    f"details: {problems}",
                )
        same = next((s for s in self.schemas if s.key == stored.key), None)
        if same is None:
            same = Stored(len(self.schemas) + 1, stored.schema_type, stored.text, stored.references, stored.key)
            self.schemas.append(same)
        self.subjects.setdefault(subject, []).append(same.schema_id)
        return {"id": same.schema_id}

    def _lookup(self, subject: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        stored = self._parse(body)
        for number, schema_id in enumerate(self._ids(subject), start=1):
            found = self._by_id(schema_id)
            if found.key == stored.key:
                return {"subject": subject, "version": number, "id": schema_id, **self._body(found, query.get("format"))}
        raise RegistryError(404, 40403, "Schema not found")

    # ------------------------------------------------------------------ schemas by id

    def _by_id(self, schema_id: int) -> Stored:
        if not 1 <= schema_id <= len(self.schemas):
            raise RegistryError(404, 40403, f"Schema {schema_id} not found")
        return self.schemas[schema_id - 1]

    def _get_by_id(self, schema_id: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        return self._body(self._by_id(int(schema_id)), query.get("format"))

    def _holders(self, schema_id: int) -> list[tuple[str, int]]:
        self._by_id(schema_id)
        return [(s, n) for s, ids in sorted(self.subjects.items()) for n, i in enumerate(ids, start=1) if i == schema_id]

    def _id_versions(self, schema_id: str, query: dict[str, str], body: Any) -> list[dict[str, Any]]:
        return [{"subject": s, "version": n} for s, n in self._holders(int(schema_id))]

    def _id_subjects(self, schema_id: str, query: dict[str, str], body: Any) -> list[str]:
        return sorted({s for s, _ in self._holders(int(schema_id))})

    # ------------------------------------------------------------------ compatibility

    def _level(self, subject: str) -> str:
        return self.subject_levels.get(subject, self.compatibility)

    def _set_global_level(self, query: dict[str, str], body: Any) -> dict[str, str]:
        self.compatibility = self._valid_level(body)
        return {"compatibility": self.compatibility}

    def _get_subject_level(self, subject: str, query: dict[str, str], body: Any) -> dict[str, str]:
        if subject in self.subject_levels:
            return {"compatibilityLevel": self.subject_levels[subject]}
        if query.get("defaultToGlobal") == "true":
            return {"compatibilityLevel": self.compatibility}
        raise RegistryError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")

    def _set_subject_level(self, subject: str, query: dict[str, str], body: Any) -> dict[str, str]:
        self.subject_levels[subject] = self._valid_level(body)
        return {"compatibility": self.subject_levels[subject]}

    def _valid_level(self, body: Any) -> str:
        level = str((body or {}).get("compatibility", "")).upper()
        if level not in _LEVELS:
            raise RegistryError(422, 42203, f"Invalid compatibility level {level!r}")
        return level

    def _test_compatibility(self, subject: str, version: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        stored = self._parse(body)
        if subject not in self.subjects:
            return {"is_compatible": True}
        _, old = self._version(subject, version)
        problems = self._pair_problems(stored, old, self._level(subject).removesuffix("_TRANSITIVE"))
        return {"is_compatible": not problems, **({"messages": problems} if query.get("verbose") == "true" else {})}

    def _test_compatibility_all(self, subject: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        stored = self._parse(body)
        problems = self._incompatibilities(subject, stored, self._level(subject)) if subject in self.subjects else []
        return {"is_compatible": not problems, **({"messages": problems} if query.get("verbose") == "true" else {})}

    def _incompatibilities(self, subject: str, new: Stored, level: str) -> list[str]:
        ids = self.subjects[subject]
        olds = [self._by_id(i) for i in (ids if level.endswith("_TRANSITIVE") else ids[-1:])]
        problems: list[str] = []
        for old in olds:
            problems += self._pair_problems(new, old, level.removesuffix("_TRANSITIVE"))
        return problems

    def _pair_problems(self, new: Stored, old: Stored, level: str) -> list[str]:
        if level == "NONE":
            return []
        if new.schema_type != old.schema_type:
            return [f"Incompatible because of different schema type ({old.schema_type} -> {new.schema_type})"]
        if new.schema_type != "AVRO":
            return []  # the stand-in decides Avro compatibility only
        problems = []
        if level in ("BACKWARD", "FULL"):
            problems += _avro_problems(reader=new.text, writer=old.text, what="new schema reading old data")
        if level in ("FORWARD", "FULL"):
            problems += _avro_problems(reader=old.text, writer=new.text, what="old schema reading new data")
        return problems

    # ------------------------------------------------------------------ schema bodies

    def _parse(self, body: Any) -> Stored:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise RegistryError(422, 42201, "Either the input schema or one its references is invalid")
        schema_type = str(body.get("schemaType") or "AVRO").upper()
        text = body["schema"]
        refs = tuple((r["name"], r["subject"], int(r["version"])) for r in body.get("references") or [])
        try:
            if schema_type == "AVRO":
                if refs:
                    raise ValueError("Avro references are not supported by this stand-in")
                avro.schema.parse(text)
                key = json.dumps(json.loads(text), sort_keys=True)
            elif schema_type == "PROTOBUF":
                proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
                text = base64.standard_b64encode(proto.SerializeToString(deterministic=True)).decode("ascii")
                key = text
            elif schema_type == "JSON":
                key = json.dumps(json.loads(text), sort_keys=True)
            else:
                raise ValueError(f"unknown schema type {schema_type}")
        except (ValueError, binascii.Error, avro.schema.SchemaParseException) as exc:
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None
        return Stored(0, schema_type, text, refs, f"{schema_type}:{key}:{refs}")

    def _served(self, stored: Stored, fmt: str | None) -> str:
        """The schema text for a read asking for `fmt` (None: the type's default form)."""
        if stored.schema_type == "PROTOBUF":
            if fmt in (None, "", "default", "ignore_extensions"):
                return render_proto(descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(stored.text)))
            if fmt == "serialized":
                return stored.text
        elif fmt in (None, "", "default", "resolved"):
            return stored.text
        raise RegistryError(500, 50001, f"Unsupported format {fmt} for schema type {stored.schema_type}")

    def _body(self, stored: Stored, fmt: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self._served(stored, fmt)}
        if stored.schema_type != "AVRO":
            out["schemaType"] = stored.schema_type
        if stored.references:
            out["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in stored.references]
        return out


def _avro_problems(reader: str, writer: str, what: str) -> list[str]:
    result = ReaderWriterCompatibilityChecker().get_compatibility(avro.schema.parse(reader), avro.schema.parse(writer))
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    return [f"{what}: {message} at {sorted(result.locations)}" for message in sorted(result.messages)]


# ---------------------------------------------------------------------- .proto text


_SCALAR_NAMES = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


def render_proto(file: descriptor_pb2.FileDescriptorProto) -> str:
    """`.proto` text of a file descriptor, as a registry serves a protobuf schema by default
    (messages, enums, maps, oneofs, optional fields, imports; options are left out)."""
    proto3 = file.syntax == "proto3"
    lines = [f'syntax = "{file.syntax or "proto2"}";']
    if file.package:
        lines.append(f"package {file.package};")
    for index, dependency in enumerate(file.dependency):
        lines.append(f'import {"public " if index in file.public_dependency else ""}"{dependency}";')
    for enum in file.enum_type:
        lines += _enum(enum, "")
    for message in file.message_type:
        lines += _message(message, "", proto3)
    return "\n".join(lines) + "\n"


def _enum(enum: descriptor_pb2.EnumDescriptorProto, indent: str) -> list[str]:
    return [f"{indent}enum {enum.name} {{", *(f"{indent}  {v.name} = {v.number};" for v in enum.value), f"{indent}}}"]


def _type_name(field: descriptor_pb2.FieldDescriptorProto) -> str:
    return field.type_name if field.type_name else _SCALAR_NAMES[field.type]


def _message(message: descriptor_pb2.DescriptorProto, indent: str, proto3: bool) -> list[str]:
    inner = indent + "  "
    entries = {n.name: n for n in message.nested_type if n.options.map_entry}
    lines = [f"{indent}message {message.name} {{"]
    for nested in message.nested_type:
        if not nested.options.map_entry:
            lines += _message(nested, inner, proto3)
    for enum in message.enum_type:
        lines += _enum(enum, inner)
    oneofs: dict[int, list[str]] = {}
    for f in message.field:
        parent, _, short = f.type_name.rpartition(".")
        entry = entries.get(short) if parent.rpartition(".")[2] == message.name else None  # a map's entry type
        if entry is not None and f.label == f.LABEL_REPEATED:
            key, value = entry.field[0], entry.field[1]
            line = f"map<{_type_name(key)}, {_type_name(value)}> {f.name} = {f.number};"
        else:
            label = ""
            if f.label == f.LABEL_REPEATED:
                label = "repeated "
            elif f.proto3_optional or (not proto3 and f.label == f.LABEL_OPTIONAL and not f.HasField("oneof_index")):
                label = "optional "
            elif f.label == f.LABEL_REQUIRED:
                label = "required "
            default = ""
            if f.HasField("default_value"):
                shown = json.dumps(f.default_value) if f.type == f.TYPE_STRING else f.default_value
                default = f" [default = {shown}]"
            line = f"{label}{_type_name(f)} {f.name} = {f.number}{default};"
        if f.HasField("oneof_index") and not f.proto3_optional:
            oneofs.setdefault(f.oneof_index, []).append(line)
        else:
            lines.append(f"{inner}{line}")
    for index, members in oneofs.items():
        lines += [f"{inner}oneof {message.oneof_decl[index].name} {{", *(f"{inner}  {m}" for m in members), f"{inner}}}"]
    lines.append(f"{indent}}}")
    return lines


# ---------------------------------------------------------------------- the server


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        pass  # keep test output quiet; `exchanges` records every request

    def _answer(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            status, payload = 400, {"error_code": 400, "message": "Unexpected character in the request body"}
        else:
            status, payload = self.server.registry.handle(self.command, parts.path, query, body)
        self.server.registry.exchanges.append(Exchange(self.command, parts.path, query, status))
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", _CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, registry: RegistryStandIn):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.registry = registry


@contextmanager
def running_standin() -> Iterator[RegistryStandIn]:
    """A stand-in listening on 127.0.0.1 (a free port) until the block ends."""
    registry = RegistryStandIn()
    server = _Server(registry)
    registry.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="registry-standin", daemon=True)
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def registry_standin(monkeypatch, kafka_env) -> Iterator[RegistryStandIn]:
    """A fresh stand-in registry, set as connection kafka_cluster's schema_registry_url."""
    with running_standin() as registry:
        monkeypatch.setenv("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", registry.url)
        yield registry
