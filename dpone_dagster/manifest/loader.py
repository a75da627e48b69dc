"""Load manifests from YAML and turn validation failures into messages a person can act on.

A message names the manifest file, the field path (e.g. `sink.strategy.mode`) and the fix.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.manifest.rules import Problem, check_rules
from dpone_dagster.redact import redact_text


class ManifestError(ConfigError):
    """A manifest that cannot be used, with every problem found in it."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        # A problem may quote an input value (a literal field, say): masked like every other output.
        lines = "\n".join(f"  - {redact_text(str(p))}" for p in problems)
        super().__init__(f"{source}: invalid manifest ({len(problems)} problem(s)):\n{lines}")


def load_manifest(path: str | Path) -> Manifest:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(str(path), [Problem("<file>", f"cannot read the file: {exc.strerror}")]) from exc
    except UnicodeDecodeError as exc:
        problem = Problem("<file>", f"not UTF-8 text: {exc.reason} at byte {exc.start}")
        raise ManifestError(str(path), [problem]) from exc
    return parse_manifest(text, source=str(path))


def parse_manifest(text: str, source: str = "<manifest>") -> Manifest:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # `from None`: str(exc) and the parser's marks quote the offending source line, which may
        # hold an inline password.
        raise ManifestError(source, [Problem("<yaml>", yaml_problem(exc))]) from None
    return manifest_from_dict(data, source=source)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where the YAML is broken and the parser's problem, never the source text around it."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [exc.context, exc.problem]
        context_mark = exc.context_mark
        if exc.context and context_mark is not None and context_mark is not mark:
            parts[0] = f"{exc.context} (line {context_mark.line + 1}, column {context_mark.column + 1})"
        # "; " not ": ": "while scanning for the next token: found ..." would read as a token's value.
        detail = "; ".join(part for part in parts if part) or type(exc).__name__
    elif isinstance(exc, yaml.reader.ReaderError):
        detail = f"unacceptable character #x{exc.character:04x}" if isinstance(exc.character, int) else exc.reason
        at = f" at byte {exc.position}"
    else:
        detail = type(exc).__name__
    return redact_text(f"not valid YAML{at}: {detail}. Fix: correct the YAML syntax there")


def manifest_from_dict(data: Any, source: str = "<manifest>") -> Manifest:
    if not isinstance(data, dict):
        raise ManifestError(source, [Problem("<root>", "a manifest is a YAML mapping with name, source, sink")])
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(source, [_problem_from_error(err, data) for err in exc.errors()]) from None
    problems = check_rules(manifest)
    if problems:
        raise ManifestError(source, problems)
    return manifest


def discover_manifests(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    return sorted(p for p in directory.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))


# --------------------------------------------------------------------------- error translation


def _problem_from_error(err: dict[str, Any], data: dict[str, Any]) -> Problem:
    loc = _loc_in_input(err["loc"], data)
    path = ".".join(str(part) for part in loc) or "<root>"
    kind = err["type"]
    if kind == "extra_forbidden":
        field = str(loc[-1])
        allowed = _allowed_fields(loc[:-1], data)
        hint = ""
        if allowed:
            close = difflib.get_close_matches(field, allowed, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; allowed fields: {', '.join(sorted(allowed))}"
        return Problem(path, f"unknown field '{field}'{hint} (remove it or fix the spelling)")
    if kind == "missing":
        return Problem(path, f"required field is missing; add `{loc[-1]}: ...`")
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return Problem(
            f"{path}.{ctx.get('discriminator', 'type').strip(chr(39))}" if path != "<root>" else path,
            f"'{ctx.get('tag')}' is not supported; use one of {ctx.get('expected_tags')}",
        )
    if kind == "union_tag_not_found":
        tag = str(err.get("ctx", {}).get("discriminator", "type")).strip(chr(39))
        return Problem(path, f"missing `{tag}`; say which kind this is")
    message = err["msg"]
    if kind.startswith("literal_error"):
        message = f"{message} (got {err.get('input')!r})"
    return Problem(path, message)


def _loc_in_input(loc: Iterable[Any], data: Any) -> tuple[Any, ...]:
    """Drop the discriminator tags pydantic inserts into a location (e.g. source.kafka.topic)."""
    out: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part not in node and node.get("type") == part:
            continue  # the union tag, not a key of the input
        out.append(part)
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            node = None
    return tuple(out)


def _allowed_fields(loc: tuple[Any, ...], data: Any) -> list[str]:
    """Field names (aliases) of the model found at `loc`, following the input for union tags."""
    model: Any = Manifest
    node = data
    for part in loc:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
            model = _list_item(model)
        else:
            model = _field_model(model, part, node)
            node = node.get(part) if isinstance(node, dict) else None
        if model is None:
            return []
    model = _pick_union_member(model, node)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [f.alias or name for name, f in model.model_fields.items()]
    return []


def _field_model(model: Any, key: str, node: Any) -> Any:
    """The annotation of field `key` of `model`, where `node` is the input at the model."""
    model = _pick_union_member(model, node)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return _strip(field.annotation)
    return None


def _strip(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _strip(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members[0] if len(members) == 1 else tuple(_strip(a) for a in members)
    return annotation


def _list_item(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    return _strip(args[0]) if args else None


def _pick_union_member(model: Any, value: Any) -> Any:
    if isinstance(model, tuple):
        tag = value.get("type") if isinstance(value, dict) else None
        for member in model:
            if isinstance(member, type) and issubclass(member, BaseModel):
                tag_field = member.model_fields.get("type")
                if tag_field is not None and tag in typing.get_args(tag_field.annotation):
                    return member
        return None
    return model
