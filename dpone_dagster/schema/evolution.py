"""Plan how a sink's registered value schema evolves to take a batch (pure; StructType only).

`plan_evolution(source, target, compatibility, on_type_change)` compares the batch's payload schema
(`source`) with the latest registered schema (`target`, None when the subject is new) and returns
the schema to register/write (`result_schema`) plus one action per difference:

- add: a source field the target lacks; appended, nullable with default null. A non-nullable new
  field is added as required, which old records cannot satisfy: breaking under BACKWARD and FULL.
- widen: the target type is promoted in place to the source type. Safe promotions (no value
  changes, readable by Avro schema resolution): int -> long, int -> double, float -> double and
  decimal(p,s) -> decimal(P,s) with P > p (same scale: the bytes hold the same unscaled value).
  long -> double is *not* a widening (doubles hold 53 bits: large ids would silently change), nor
  is any scale change, narrowing, or int -> float.
- route_new_column (on_type_change: new_column, top-level columns only): an incompatible (or,
  under FORWARD/FULL, a widening) change keeps the target column and its type; the batch's values go
  to a new nullable column `__dpone__nc__<column>` of the source type, and the original column is
  written as null (so it must be nullable). See `routes`.
- keep_target_field: a target field the source lacks stays in the schema and is written as null
  (or its default); a required field without a default cannot be written: breaking.
- retype: only under NONE, an incompatible type replaces the target type in place.
- breaking: the change violates the compatibility mode; nothing may be registered or produced.
A source type that fits the target type without loss (int into long, decimal(10,2) into
decimal(18,4), float into double, ...) needs no action: values are converted on encode.
Nullability of existing fields follows the target: a null in a required field fails at encode.
A rename is seen as a drop (keep_target_field) plus an add.

Compatibility modes (our own rules, on Spark types; for Avro sinks `schema.avro_compat` then checks
the evolved Avro schema the way the registry will, which also sees names, enums and fixed sizes):
- BACKWARD: readers of the new schema read old records: adds need a default (nullable), widening
  is allowed, removed target fields are kept.
- FORWARD: readers of the old schema read new records: any add is fine (old readers skip it),
  widening is breaking (an old int reader cannot read a long), kept fields need a default.
- FULL: both: nullable adds only, no widening.
- *_TRANSITIVE: the same against every earlier version (pass them as `history`).
- NONE: everything is allowed (incompatible types are retyped; required fields may be added).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pyspark.sql import types as T

from dpone_dagster import columns as C
from dpone_dagster.errors import ConfigError
from dpone_dagster.schema.values import DEFAULT_KEY, nullable_schema

NC_PREFIX = "__dpone__nc__"
MODES = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE")
ActionKind = Literal["add", "widen", "route_new_column", "keep_target_field", "retype", "breaking"]
_INT_RANK = {T.ByteType: 1, T.ShortType: 2, T.IntegerType: 3, T.LongType: 4}
_INT_DIGITS = {T.ByteType: 3, T.ShortType: 5, T.IntegerType: 10, T.LongType: 19}


@dataclass(frozen=True)
class EvolutionAction:
    kind: ActionKind
    path: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "detail": self.detail}


@dataclass(frozen=True)
class EvolutionPlan:
    actions: tuple[EvolutionAction, ...]
    result_schema: T.StructType
    breaking: bool
    compatibility: str = "BACKWARD"
    on_type_change: str = "fail"
    target_schema: T.StructType | None = field(default=None, compare=False)

    @property
    def changed(self) -> bool:
        """True when `result_schema` must be registered (differs from the target)."""
        return self.target_schema is None or self.result_schema != self.target_schema

    @property
    def routes(self) -> tuple[tuple[str, str], ...]:
        """(source column, variant column) for every route_new_column action."""
        return tuple((a.path, NC_PREFIX + a.path) for a in self.actions if a.kind == "route_new_column")

    def as_dict(self) -> dict[str, Any]:
        return {
            "compatibility": self.compatibility,
            "on_type_change": self.on_type_change,
            "breaking": self.breaking,
            "changed": self.changed,
            "actions": [a.as_dict() for a in self.actions],
            "result_schema": [
                {"name": f.name, "type": f.dataType.simpleString(), "nullable": f.nullable} for f in self.result_schema.fields
            ],
        }

    def with_breaking(self, issues: Sequence[tuple[str, str]]) -> EvolutionPlan:
        """This plan with (path, why) problems found elsewhere (the Avro-level check) as breaking actions."""
        if not issues:
            return self
        extra = tuple(EvolutionAction("breaking", path, why) for path, why in issues)
        return replace(self, actions=self.actions + extra, breaking=True)

    def raise_if_breaking(self, subject: str) -> None:
        problems = [f"{a.path}: {a.detail}" for a in self.actions if a.kind == "breaking"]
        if problems:
            raise ConfigError(
                f"breaking schema change for subject {subject!r} under {self.compatibility} compatibility: "
                + "; ".join(problems)
                + ". Fix the source types, set sink.options.on_type_change: new_column for type changes, "
                "or change the subject's compatibility deliberately"
            )


@dataclass(frozen=True)
class _Rules:
    backward: bool  # new schema reads old records
    forward: bool  # old schema reads new records

    @classmethod
    def of(cls, mode: str) -> _Rules:
        if mode not in MODES:
            raise ConfigError(f"unknown compatibility {mode!r}; use one of {', '.join(MODES)}")
        base = mode.removesuffix("_TRANSITIVE")
        return cls(backward=base in ("BACKWARD", "FULL"), forward=base in ("FORWARD", "FULL"))

    @property
    def none(self) -> bool:
        return not (self.backward or self.forward)


def plan_evolution(
    source: T.StructType,
    target: T.StructType | None,
    compatibility: str = "BACKWARD",
    on_type_change: str = "fail",
    history: Sequence[T.StructType] = (),
) -> EvolutionPlan:
    """Plan the target schema change for `source` (metadata columns are ignored). `history` holds
    earlier registered versions, checked too under *_TRANSITIVE modes."""
    if on_type_change not in ("fail", "new_column"):
        raise ConfigError(f"unknown on_type_change {on_type_change!r}; use fail or new_column")
    rules = _Rules.of(compatibility)
    payload = T.StructType([f for f in source.fields if f.name not in C.METADATA])
    if target is None:
        return EvolutionPlan((), payload, False, compatibility, on_type_change, None)
    merger = _Merger(rules, on_type_change == "new_column")
    result = merger.merge_struct("", payload, target, top_level=True)
    actions = list(merger.actions)
    if compatibility.endswith("_TRANSITIVE"):
        for version, old in enumerate(history, start=1):
            for issue in compatibility_issues(result, old, compatibility):
                actions.append(EvolutionAction("breaking", issue.split(":", 1)[0], f"history version {version}: {issue}"))
    breaking = any(a.kind == "breaking" for a in actions)
    return EvolutionPlan(tuple(actions), result, breaking, compatibility, on_type_change, target)


def _or(value: T.DataType | None, fallback: T.DataType) -> T.DataType:
    return fallback if value is None else value  # not `or`: an empty StructType is falsy


def _has_default(f: T.StructField) -> bool:
    return f.nullable or f.metadata.get(DEFAULT_KEY) is not None


class _Merger:
    def __init__(self, rules: _Rules, route: bool):
        self.rules = rules
        self.route = route
        self.actions: list[EvolutionAction] = []

    def act(self, kind: ActionKind, path: str, detail: str) -> None:
        self.actions.append(EvolutionAction(kind, path, detail))

    def merge_struct(self, prefix: str, source: T.StructType, target: T.StructType, top_level: bool = False) -> T.StructType:
        src = {f.name: f for f in source.fields}
        target_names = {f.name for f in target.fields}
        out: list[T.StructField] = []
        variants: list[T.StructField] = []
        for tgt in target.fields:
            path = f"{prefix}{tgt.name}"
            if tgt.name not in src:
                out.append(self._missing(path, tgt))
                continue
            merged = self._merge_type(path, src[tgt.name].dataType, tgt.dataType, tgt if top_level else None)
            if merged is None:  # routed: the column keeps its type, values go to the variant column
                out.append(tgt)
                variants.append(T.StructField(NC_PREFIX + tgt.name, src[tgt.name].dataType, True))
            else:
                out.append(T.StructField(tgt.name, merged, tgt.nullable, tgt.metadata))
        out += [self._added(f"{prefix}{f.name}", f) for f in source.fields if f.name not in target_names]
        routed = {f"{prefix}{v.name}" for v in variants}  # written with routed values, not "kept as null"
        self.actions = [a for a in self.actions if not (a.kind == "keep_target_field" and a.path in routed)]
        for variant in variants:
            index = next((i for i, f in enumerate(out) if f.name == variant.name), None)
            if index is None:
                out.append(variant)
                continue
            existing = out[index]  # the variant column exists already: the values must fit it
            merged = self._merge_type(variant.name, variant.dataType, existing.dataType, None)
            out[index] = T.StructField(existing.name, _or(merged, existing.dataType), existing.nullable, existing.metadata)
        return T.StructType(out)

    def _missing(self, path: str, tgt: T.StructField) -> T.StructField:
        if _has_default(tgt):
            self.act("keep_target_field", path, "not in the source: written as null" + (" (default)" if not tgt.nullable else ""))
            return tgt
        if self.rules.none:
            self.act("keep_target_field", path, "not in the source: made nullable and written as null (compatibility NONE)")
            return T.StructField(tgt.name, tgt.dataType, True, tgt.metadata)
        self.act("breaking", path, "required field (no default) is missing from the source and cannot be written")
        return tgt

    def _added(self, path: str, f: T.StructField) -> T.StructField:
        kind = f.dataType.simpleString()
        if f.nullable:
            self.act("add", path, f"new nullable field {kind} (default null)")
            return f
        if self.rules.backward:
            self.act("breaking", path, f"new required field {kind} has no default: records written before cannot be read with it")
        else:
            self.act("add", path, f"new required field {kind}")
        return f

    def _merge_type(self, path: str, src: T.DataType, tgt: T.DataType, column: T.StructField | None) -> T.DataType | None:
        """The result type; None means "route to the variant column" (only for a top-level `column`)."""
        if _same(src, tgt) or fits(src, tgt):
            return tgt
        if isinstance(src, T.StructType) and isinstance(tgt, T.StructType):
            return self.merge_struct(f"{path}.", src, tgt)
        if isinstance(src, T.ArrayType) and isinstance(tgt, T.ArrayType):
            element = self._merge_type(f"{path}[]", src.elementType, tgt.elementType, None)
            return T.ArrayType(_or(element, tgt.elementType), tgt.containsNull)
        if isinstance(src, T.MapType) and isinstance(tgt, T.MapType) and _same(src.keyType, tgt.keyType):
            values = self._merge_type(f"{path}{{}}", src.valueType, tgt.valueType, None)
            return T.MapType(tgt.keyType, _or(values, tgt.valueType), tgt.valueContainsNull)
        change = f"{tgt.simpleString()} -> {src.simpleString()}"
        if promotes(tgt, src):
            if not self.rules.forward:
                self.act("widen", path, f"widen {change}")
                return src
            return self._disallowed(path, src, tgt, column, f"widening {change} breaks readers of the old schema")
        if self.rules.none and not (self.route and column is not None):
            self.act("retype", path, f"change {change} (compatibility NONE)")
            return src
        return self._disallowed(path, src, tgt, column, f"incompatible type change {change}")

    def _disallowed(self, path: str, src: T.DataType, tgt: T.DataType, column: T.StructField | None, why: str) -> T.DataType | None:
        if not self.route:
            self.act("breaking", path, why)
        elif column is None:
            self.act("breaking", path, f"{why} (routing to {NC_PREFIX} columns applies to top-level columns only)")
        elif not column.nullable:
            self.act("breaking", path, f"{why}; cannot route to {NC_PREFIX}{column.name}: the column is required "
                     "and would be written as null")
        else:
            self.act("route_new_column", path, f"{why}: values go to {NC_PREFIX}{column.name} ({src.simpleString()})")
            return None
        return tgt


# --------------------------------------------------------------------------- type relations


def _same(a: T.DataType, b: T.DataType) -> bool:
    """Equal types, ignoring nullability and field metadata."""
    return nullable_schema(a) == nullable_schema(b)


def promotes(narrow: T.DataType, wide: T.DataType) -> bool:
    """Safe in-place promotion narrow -> wide (see the module docstring)."""
    if type(narrow) in _INT_RANK:
        if type(wide) in _INT_RANK:
            return _INT_RANK[type(wide)] > _INT_RANK[type(narrow)]
        return isinstance(wide, T.DoubleType) and not isinstance(narrow, T.LongType)
    if isinstance(narrow, T.FloatType):
        return isinstance(wide, T.DoubleType)
    if isinstance(narrow, T.DecimalType) and isinstance(wide, T.DecimalType):
        return wide.scale == narrow.scale and wide.precision > narrow.precision
    return False


def fits(value_type: T.DataType, column_type: T.DataType) -> bool:
    """Every value of `value_type` converts exactly into `column_type` (no schema change needed)."""
    if isinstance(value_type, T.NullType) or _same(value_type, column_type):
        return True
    v, c = type(value_type), type(column_type)
    if v in _INT_RANK and c in _INT_RANK:
        return _INT_RANK[v] <= _INT_RANK[c]
    if v in _INT_RANK and c is T.DoubleType:
        return v is not T.LongType
    if v in (T.ByteType, T.ShortType) and c is T.FloatType:
        return True
    if v is T.FloatType and c is T.DoubleType:
        return True
    if isinstance(column_type, T.DecimalType):
        if isinstance(value_type, T.DecimalType):
            return (
                column_type.scale >= value_type.scale
                and column_type.precision - column_type.scale >= value_type.precision - value_type.scale
            )
        if v in _INT_DIGITS:
            return column_type.precision - column_type.scale >= _INT_DIGITS[v]
    return False


# --------------------------------------------------------------------------- pairwise check


def compatibility_issues(new: T.StructType, old: T.StructType, compatibility: str) -> list[str]:
    """Why `new` is not `compatibility`-compatible with `old` ("path: reason"; empty when it is)."""
    rules = _Rules.of(compatibility)
    issues: list[str] = []
    if rules.backward:
        issues += _read_issues(new, old, "", "new schema cannot read old records")
    if rules.forward:
        issues += _read_issues(old, new, "", "old schema cannot read new records")
    return issues


def _read_issues(reader: T.DataType, writer: T.DataType, path: str, why: str) -> list[str]:
    if isinstance(writer, T.NullType):
        return []
    if isinstance(reader, T.StructType) and isinstance(writer, T.StructType):
        written = {f.name: f for f in writer.fields}
        issues: list[str] = []
        for f in reader.fields:
            child = f"{path}.{f.name}" if path else f.name
            w = written.get(f.name)
            if w is None:
                if not _has_default(f):
                    issues.append(f"{child}: {why} (required field without default)")
                continue
            if w.nullable and not f.nullable:
                issues.append(f"{child}: {why} (nullable written, required read)")
            issues += _read_issues(f.dataType, w.dataType, child, why)
        return issues
    if isinstance(reader, T.ArrayType) and isinstance(writer, T.ArrayType):
        return _read_issues(reader.elementType, writer.elementType, f"{path}[]", why)
    if isinstance(reader, T.MapType) and isinstance(writer, T.MapType) and _same(reader.keyType, writer.keyType):
        return _read_issues(reader.valueType, writer.valueType, f"{path}{{}}", why)
    if _same(reader, writer) or promotes(writer, reader):
        return []
    return [f"{path}: {why} ({writer.simpleString()} read as {reader.simpleString()})"]
