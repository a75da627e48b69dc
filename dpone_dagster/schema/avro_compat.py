"""Avro schema resolution between two registered schemas: can a reader schema read what a writer
schema wrote? (pure; JSON schemas in, reasons out)

This is the check a Confluent-compatible registry makes before it accepts a new version (it answers
409 otherwise). `schema.evolution` plans changes on Spark types, which cannot see what only Avro
holds (record names, enums, fixed sizes); this module checks the Avro schema that is about to be
registered, so that such a change fails the run with its reason before anything is produced, instead
of as a bare 409 from the registry.

Rules (Avro specification, "Schema Resolution", as the registry applies them): records and enums
and fixed match by unqualified name (or a reader alias); reader fields missing from the writer need
a default; writer enum symbols must all be reader symbols unless the reader enum has a default;
fixed sizes must be equal; int -> long/float/double, long -> float/double, float -> double and
string <-> bytes are promotions; a writer union is readable when each branch is, a reader union reads
a writer type one of its branches reads. Logical types are not compared (the registry does not).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_NAMED = ("record", "error", "enum", "fixed")


def compatibility_issues(new: Mapping[str, Any] | str, registered: Sequence[Mapping[str, Any] | str], mode: str) -> list[str]:
    """Why registering `new` after `registered` (oldest first) breaks `mode` ("path: reason").

    BACKWARD / FORWARD / FULL check against the latest version, *_TRANSITIVE against all; NONE never
    breaks."""
    base = mode.upper().removesuffix("_TRANSITIVE")
    if base == "NONE" or not registered:
        return []
    olds = list(registered) if mode.upper().endswith("_TRANSITIVE") else [registered[-1]]
    issues: list[str] = []
    for old in olds:
        if base in ("BACKWARD", "FULL"):
            issues += [f"{i} (new schema reading old records)" for i in read_issues(new, old)]
        if base in ("FORWARD", "FULL"):
            issues += [f"{i} (old schema reading new records)" for i in read_issues(old, new)]
    return list(dict.fromkeys(issues))


def read_issues(reader: Mapping[str, Any] | str, writer: Mapping[str, Any] | str) -> list[str]:
    """Why records written with `writer` cannot be read with `reader` (empty when they can)."""
    reader_node, writer_node = _load(reader), _load(writer)
    check = _Check(_Names(reader_node), _Names(writer_node))
    check.inner(reader_node, writer_node, reader_node.get("namespace"), writer_node.get("namespace"), "")
    return check.issues


def _load(schema: Mapping[str, Any] | str) -> Any:
    return json.loads(schema) if isinstance(schema, str) else schema


def _fullname(node: Mapping[str, Any], namespace: str | None) -> tuple[str, str | None]:
    name = str(node["name"])
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    ns = node.get("namespace", namespace)
    return (f"{ns}.{name}" if ns else name), ns


class _Names:
    """Named type definitions of one schema, by full name (to resolve references)."""

    def __init__(self, root: Any):
        self.defined: dict[str, tuple[Mapping[str, Any], str | None]] = {}
        self._collect(root, root.get("namespace") if isinstance(root, Mapping) else None)

    def _collect(self, node: Any, namespace: str | None) -> None:
        if isinstance(node, list):
            for branch in node:
                self._collect(branch, namespace)
        elif isinstance(node, Mapping):
            kind = node.get("type")
            if kind in _NAMED and "name" in node:
                fullname, namespace = _fullname(node, namespace)
                self.defined[fullname] = (node, namespace)
            for field in node.get("fields", []) if kind in ("record", "error") else []:
                self._collect(field["type"], namespace)
            if kind == "array":
                self._collect(node["items"], namespace)
            elif kind == "map":
                self._collect(node["values"], namespace)
            elif isinstance(kind, (Mapping, list)):
                self._collect(kind, namespace)

    def resolve(self, node: Any, namespace: str | None) -> tuple[Any, str | None]:
        """The node itself, its definition (for a named reference), or the type of {"type": ...}."""
        if isinstance(node, str) and node not in _PRIMITIVES:
            for candidate in ([node] if "." in node else ([f"{namespace}.{node}"] if namespace else []) + [node]):
                if candidate in self.defined:
                    return self.defined[candidate]
            raise ValueError(f"unknown Avro type {node!r}")
        if isinstance(node, Mapping) and isinstance(node.get("type"), (Mapping, list)):
            return self.resolve(node["type"], namespace)
        if isinstance(node, Mapping) and node.get("type") in _PRIMITIVES:
            return node["type"], namespace  # {"type": "long", "logicalType": ...}: logical types are not compared
        return node, namespace


def _kind(node: Any) -> str:
    if isinstance(node, list):
        return "union"
    if isinstance(node, str):
        return node
    return str(node.get("type"))


class _Check:
    def __init__(self, reader: _Names, writer: _Names):
        self.reader, self.writer = reader, writer
        self.issues: list[str] = []
        self.seen: set[tuple[int, int]] = set()  # record pairs under comparison (recursive types)

    def _label(self, node: Any, ns: str | None, writer: bool = False) -> str:
        resolved, _ = (self.writer if writer else self.reader).resolve(node, ns)
        kind = _kind(resolved)
        if kind == "union":
            return "union [" + ", ".join(self._label(branch, ns, writer) for branch in resolved) + "]"
        return f"{kind} {resolved.get('name')}" if kind in _NAMED else kind

    def reads(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> bool:
        """True when `reader` reads `writer`; issues found inside records/enums are added on the way."""
        reader, r_ns = self.reader.resolve(reader, r_ns)
        writer, w_ns = self.writer.resolve(writer, w_ns)
        r_kind, w_kind = _kind(reader), _kind(writer)
        if w_kind == "union":
            return all(self.inner(reader, branch, r_ns, w_ns, path) for branch in writer)
        if r_kind == "union":
            return any(self._reads_quietly(branch, writer, r_ns, w_ns, path) for branch in reader) or (
                self._best_branch_report(reader, writer, r_ns, w_ns, path)
            )
        if r_kind in _PRIMITIVES or w_kind in _PRIMITIVES:
            return r_kind == w_kind or r_kind in _PROMOTIONS.get(w_kind, set())
        if r_kind != w_kind and not ({r_kind, w_kind} <= {"record", "error"}):
            return False
        named_ok = r_kind not in _NAMED or self._same_name(reader, writer)
        if not named_ok:  # reported, and the rest still compared: one run names every problem
            self.issues.append(
                f"{path or '/'}: reader {r_kind} {reader['name']} does not match writer {w_kind} {writer['name']} (names differ)"
            )
        return self._same_kind(reader, writer, r_kind, r_ns, w_ns, path) and named_ok

    def _same_kind(self, reader: Any, writer: Any, r_kind: str, r_ns: str | None, w_ns: str | None, path: str) -> bool:
        if r_kind == "array":
            return self.inner(reader["items"], writer["items"], r_ns, w_ns, f"{path}[]")
        if r_kind == "map":
            return self.inner(reader["values"], writer["values"], r_ns, w_ns, f"{path}{{}}")
        if r_kind == "fixed":
            if reader.get("size") != writer.get("size"):
                self.issues.append(
                    f"{path or '/'}: fixed {reader['name']} of size {reader.get('size')} cannot read size {writer.get('size')}"
                )
                return False
            return True
        if r_kind == "enum":
            missing = [s for s in writer.get("symbols", []) if s not in reader.get("symbols", [])]
            if missing and "default" not in reader:
                self.issues.append(f"{path or '/'}: enum {reader['name']} lacks writer symbol(s) {missing} and has no default")
                return False
            return True
        return self._record(reader, writer, r_ns, w_ns, path)

    def _same_name(self, reader: Mapping[str, Any], writer: Mapping[str, Any]) -> bool:
        writer_name = str(writer["name"]).rsplit(".", 1)[-1]
        aliases = {str(a).rsplit(".", 1)[-1] for a in reader.get("aliases", [])}
        return str(reader["name"]).rsplit(".", 1)[-1] == writer_name or writer_name in aliases

    def _record(self, reader: Mapping[str, Any], writer: Mapping[str, Any], r_ns: str | None, w_ns: str | None, path: str) -> bool:
        pair = (id(reader), id(writer))
        if pair in self.seen:
            return True
        self.seen.add(pair)
        _, r_ns = _fullname(reader, r_ns)
        _, w_ns = _fullname(writer, w_ns)
        written = {str(f["name"]): f for f in writer.get("fields", [])}
        ok = True
        for field in reader.get("fields", []):
            name = str(field["name"])
            child = f"{path}.{name}" if path else name
            source = written.get(name) or next((written[a] for a in field.get("aliases", []) if a in written), None)
            if source is None:
                if "default" not in field:
                    self.issues.append(f"{child}: reader field has no default and the writer does not write it")
                    ok = False
                continue
            ok = self.inner(field["type"], source["type"], r_ns, w_ns, child) and ok
        return ok

    def inner(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> bool:
        """`reads`, reporting a plain type mismatch when nothing more precise was reported."""
        before = len(self.issues)
        if self.reads(reader, writer, r_ns, w_ns, path):
            return True
        if len(self.issues) == before:
            self.issues.append(
                f"{path or '/'}: reader type {self._label(reader, r_ns)} cannot read writer type "
                f"{self._label(writer, w_ns, True)}"
            )
        return False

    def _reads_quietly(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> bool:
        """A trial of one reader union branch: leaves no issues and no record pairs behind."""
        before, seen = len(self.issues), set(self.seen)
        ok = self.reads(reader, writer, r_ns, w_ns, path)
        del self.issues[before:]
        self.seen = seen
        return ok

    def _best_branch_report(self, reader: list[Any], writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> bool:
        # No branch reads the writer: report the branch of the writer's kind (its detail), if any.
        for branch in reader:
            resolved, _ = self.reader.resolve(branch, r_ns)
            if _kind(resolved) == _kind(writer) and _kind(resolved) != "null":
                return self.reads(branch, writer, r_ns, w_ns, path)
        return False
