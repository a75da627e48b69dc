"""Schema evolution planning (pure: StructType in, plan out; no Spark session)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from dpone_dagster import columns as C
from dpone_dagster.errors import ConfigError
from dpone_dagster.schema.evolution import (
    NC_PREFIX,
    EvolutionPlan,
    compatibility_issues,
    fits,
    plan_evolution,
    promotes,
)
from dpone_dagster.schema.values import DEFAULT_KEY


def struct(*fields: tuple) -> StructType:
    return StructType([StructField(name, dtype, *rest) for name, dtype, *rest in fields])


def kinds(plan: EvolutionPlan) -> list[tuple[str, str]]:
    return [(a.kind, a.path) for a in plan.actions]


BASE = struct(("id", LongType(), False), ("name", StringType()))


def assert_consistent(plan: EvolutionPlan, target: StructType, mode: str) -> None:
    """A non-breaking plan's result passes the pairwise compatibility check against the target."""
    assert not plan.breaking
    assert compatibility_issues(plan.result_schema, target, mode) == []


def test_new_subject_registers_the_source_as_is():
    source = struct(("id", LongType(), False), ("name", StringType()), (C.OP, StringType()), (C.CORRUPT, StringType()))
    plan = plan_evolution(source, None)
    assert plan.actions == () and not plan.breaking and plan.changed
    assert plan.result_schema == BASE  # metadata columns never reach the registered schema


def test_identical_schema_needs_no_change():
    plan = plan_evolution(BASE, BASE)
    assert plan.actions == () and not plan.changed and not plan.breaking


def test_add_nullable_field():
    source = struct(("id", LongType(), False), ("name", StringType()), ("email", StringType()))
    plan = plan_evolution(source, BASE, "BACKWARD")
    assert kinds(plan) == [("add", "email")]
    assert plan.result_schema["email"].nullable
    assert plan.changed
    assert_consistent(plan, BASE, "BACKWARD")


@pytest.mark.parametrize("mode", ["BACKWARD", "BACKWARD_TRANSITIVE", "FULL"])
def test_add_non_nullable_field_is_breaking_when_new_readers_read_old_records(mode):
    source = struct(("id", LongType(), False), ("name", StringType()), ("tier", IntegerType(), False))
    plan = plan_evolution(source, BASE, mode)
    assert plan.breaking
    assert kinds(plan) == [("breaking", "tier")]
    with pytest.raises(ConfigError, match="breaking schema change for subject 'orders-value'.*tier"):
        plan.raise_if_breaking("orders-value")


@pytest.mark.parametrize("mode", ["FORWARD", "NONE"])
def test_add_non_nullable_field_is_allowed_when_only_old_readers_matter(mode):
    source = struct(("id", LongType(), False), ("name", StringType()), ("tier", IntegerType(), False))
    plan = plan_evolution(source, BASE, mode)
    assert kinds(plan) == [("add", "tier")]
    assert not plan.result_schema["tier"].nullable
    assert_consistent(plan, BASE, mode)


@pytest.mark.parametrize(
    ("old", "new"),
    [(IntegerType(), LongType()), (FloatType(), DoubleType()), (DecimalType(10, 2), DecimalType(18, 2)), (IntegerType(), DoubleType())],
)
def test_safe_widening_under_backward(old, new):
    target = struct(("id", LongType(), False), ("v", old))
    source = struct(("id", LongType(), False), ("v", new))
    plan = plan_evolution(source, target, "BACKWARD")
    assert kinds(plan) == [("widen", "v")]
    assert plan.result_schema["v"].dataType == new
    assert_consistent(plan, target, "BACKWARD")


@pytest.mark.parametrize("mode", ["FORWARD", "FULL"])
def test_widening_breaks_old_readers(mode):
    target = struct(("v", IntegerType()))
    plan = plan_evolution(struct(("v", LongType())), target, mode)
    assert kinds(plan) == [("breaking", "v")]
    assert "widening int -> bigint" in plan.actions[0].detail


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (LongType(), IntegerType()),  # values fit: written into the wider target, no change
        (DoubleType(), FloatType()),
        (DecimalType(18, 2), DecimalType(10, 2)),
        (DecimalType(18, 4), DecimalType(10, 2)),
    ],
)
def test_narrower_source_fits_the_target_without_change(old, new):
    target = struct(("v", old))
    plan = plan_evolution(struct(("v", new)), target, "FULL")
    assert plan.actions == () and plan.result_schema == target and not plan.changed


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (LongType(), DoubleType()),  # precision loss above 2^53: treated as breaking
        (DecimalType(10, 2), DecimalType(10, 4)),  # scale change
        (IntegerType(), StringType()),
        (StringType(), LongType()),
    ],
)
def test_incompatible_changes_are_breaking(old, new):
    target = struct(("v", old))
    plan = plan_evolution(struct(("v", new)), target, "BACKWARD")
    assert plan.breaking and kinds(plan) == [("breaking", "v")]
    assert plan.result_schema["v"].dataType == old


def test_narrowing_of_the_target_is_breaking():
    # The target is long; a source that became a wider decimal does not fit and is no widening.
    target = struct(("v", LongType()))
    plan = plan_evolution(struct(("v", DecimalType(38, 0))), target, "BACKWARD")
    assert plan.breaking


def test_incompatible_type_routes_to_new_column():
    target = struct(("id", LongType(), False), ("amount", LongType()), ("name", StringType()))
    source = struct(("id", LongType(), False), ("amount", StringType()), ("name", StringType()))
    plan = plan_evolution(source, target, "BACKWARD", "new_column")
    assert kinds(plan) == [("route_new_column", "amount")]
    assert not plan.breaking
    assert plan.result_schema["amount"].dataType == LongType()  # the target keeps its type
    variant = plan.result_schema[f"{NC_PREFIX}amount"]
    assert variant.dataType == StringType() and variant.nullable
    assert plan.result_schema.names == ["id", "amount", "name", "__dpone__nc__amount"]
    assert plan.routes == (("amount", "__dpone__nc__amount"),)
    assert_consistent(plan, target, "BACKWARD")


def test_route_reuses_an_existing_variant_column():
    target = struct(("amount", LongType()), (f"{NC_PREFIX}amount", StringType()))
    source = struct(("amount", StringType()))
    plan = plan_evolution(source, target, "BACKWARD", "new_column")
    assert kinds(plan) == [("route_new_column", "amount")]
    assert plan.result_schema == target and not plan.changed


def test_route_needs_a_nullable_target_column():
    target = struct(("amount", LongType(), False))
    plan = plan_evolution(struct(("amount", StringType(), False)), target, "BACKWARD", "new_column")
    assert plan.breaking
    assert "required" in plan.actions[0].detail


def test_widening_routes_under_forward_with_new_column():
    target = struct(("v", IntegerType()))
    plan = plan_evolution(struct(("v", LongType())), target, "FORWARD", "new_column")
    assert kinds(plan) == [("route_new_column", "v")]
    assert plan.result_schema[f"{NC_PREFIX}v"].dataType == LongType()
    assert_consistent(plan, target, "FORWARD")


def test_dropped_nullable_field_is_kept_and_written_as_null():
    target = struct(("id", LongType(), False), ("legacy", StringType()))
    plan = plan_evolution(struct(("id", LongType(), False)), target, "FULL")
    assert kinds(plan) == [("keep_target_field", "legacy")]
    assert plan.result_schema == target
    assert_consistent(plan, target, "FULL")


def test_dropped_required_field_is_breaking_unless_it_has_a_default():
    target = struct(("id", LongType(), False), ("legacy", StringType(), False))
    plan = plan_evolution(struct(("id", LongType(), False)), target, "BACKWARD")
    assert kinds(plan) == [("breaking", "legacy")]

    with_default = struct(("id", LongType(), False), ("legacy", StringType(), False, {DEFAULT_KEY: "n/a"}))
    plan = plan_evolution(struct(("id", LongType(), False)), with_default, "BACKWARD")
    assert kinds(plan) == [("keep_target_field", "legacy")] and not plan.breaking


def test_rename_is_a_drop_plus_an_add():
    target = struct(("id", LongType(), False), ("name", StringType()))
    source = struct(("id", LongType(), False), ("full_name", StringType()))
    plan = plan_evolution(source, target, "BACKWARD")
    assert kinds(plan) == [("keep_target_field", "name"), ("add", "full_name")]
    assert plan.result_schema.names == ["id", "name", "full_name"]


def test_nested_struct_add_and_widen():
    address = struct(("city", StringType()), ("zip", IntegerType()))
    target = struct(("id", LongType(), False), ("address", address), ("lines", ArrayType(struct(("sku", StringType())))))
    source = struct(
        ("id", LongType(), False),
        ("address", struct(("city", StringType()), ("zip", LongType()), ("street", StringType()))),
        ("lines", ArrayType(struct(("sku", StringType()), ("qty", IntegerType())))),
    )
    plan = plan_evolution(source, target, "BACKWARD")
    assert kinds(plan) == [("widen", "address.zip"), ("add", "address.street"), ("add", "lines[].qty")]
    assert plan.result_schema["address"].dataType.names == ["city", "zip", "street"]
    assert_consistent(plan, target, "BACKWARD")


def test_nested_incompatible_change_cannot_be_routed():
    target = struct(("address", struct(("zip", LongType()))))
    source = struct(("address", struct(("zip", StringType()))))
    plan = plan_evolution(source, target, "BACKWARD", "new_column")
    assert kinds(plan) == [("breaking", "address.zip")]
    assert "top-level" in plan.actions[0].detail


def test_none_allows_everything():
    target = struct(("id", IntegerType(), False), ("amount", LongType()), ("legacy", StringType(), False))
    source = struct(("id", LongType(), False), ("amount", StringType()), ("tier", IntegerType(), False))
    plan = plan_evolution(source, target, "NONE")
    assert not plan.breaking
    assert kinds(plan) == [("widen", "id"), ("retype", "amount"), ("keep_target_field", "legacy"), ("add", "tier")]
    assert plan.result_schema["amount"].dataType == StringType()
    assert plan.result_schema["legacy"].nullable


def test_transitive_modes_check_every_earlier_version():
    v1 = struct(("id", LongType(), False), ("code", IntegerType()))
    v2 = struct(("id", LongType(), False))  # `code` was removed (BACKWARD allows dropping)
    source = struct(("id", LongType(), False), ("code", StringType()))  # re-added with another type
    assert not plan_evolution(source, v2, "BACKWARD").breaking
    plan = plan_evolution(source, v2, "BACKWARD_TRANSITIVE", history=[v1, v2])
    assert plan.breaking
    assert any("history version 1" in a.detail for a in plan.actions)


def test_plan_as_dict_is_reportable():
    source = struct(("id", LongType(), False), ("name", StringType()), ("email", StringType()))
    report = plan_evolution(source, BASE).as_dict()
    assert report["breaking"] is False and report["changed"] is True
    assert report["actions"] == [{"kind": "add", "path": "email", "detail": "new nullable field string (default null)"}]
    assert report["result_schema"][-1] == {"name": "email", "type": "string", "nullable": True}


def test_unknown_modes_are_config_errors():
    with pytest.raises(ConfigError, match="compatibility"):
        plan_evolution(BASE, BASE, "SIDEWAYS")
    with pytest.raises(ConfigError, match="on_type_change"):
        plan_evolution(BASE, BASE, "BACKWARD", "cast")


def test_type_relations():
    assert promotes(IntegerType(), LongType()) and promotes(FloatType(), DoubleType())
    assert promotes(DecimalType(10, 2), DecimalType(12, 2))
    assert not promotes(LongType(), DoubleType()) and not promotes(DecimalType(10, 2), DecimalType(12, 3))
    assert fits(IntegerType(), DecimalType(12, 2)) and not fits(LongType(), DecimalType(12, 2))


# --------------------------------------------------------------------------- Avro: evolve the registered schema

REGISTERED = {
    "type": "record",
    "name": "Order",
    "namespace": "com.acme",
    "doc": "as the shop registered it",
    "fields": [
        {"name": "id", "type": "long", "doc": "order number"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "qty", "type": ["null", "int"], "default": None},
        {"name": "channel", "type": "string", "default": "web"},
        {"name": "ship", "type": ["null", {"type": "record", "name": "Ship", "fields": [{"name": "city", "type": "string"}]}],
         "default": None},
        {"name": "bill", "type": ["null", "Ship"], "default": None},
    ],
}


def _evolve(source: StructType, compatibility: str = "BACKWARD") -> tuple[EvolutionPlan, dict]:
    from dpone_dagster.schema.avro import avro_to_spark
    from dpone_dagster.schema.avro_evolution import evolve_avro_schema

    plan = plan_evolution(source, avro_to_spark(REGISTERED), compatibility)
    return plan, evolve_avro_schema(REGISTERED, plan.result_schema)


def test_avro_evolution_keeps_the_registered_schema_and_appends_new_fields():
    from pyspark.sql.types import TimestampType

    source = struct(("id", LongType()), ("status", StringType()), ("created", TimestampType()), ("qty", LongType()),
                    ("ship", struct(("city", StringType()), ("zip", StringType()))), ("coupon", StringType()))
    plan, evolved = _evolve(source)
    assert ("widen", "qty") in kinds(plan) and ("add", "coupon") in kinds(plan)
    assert {k: evolved[k] for k in ("name", "namespace", "doc")} == {"name": "Order", "namespace": "com.acme", "doc": REGISTERED["doc"]}
    fields = {f["name"]: f for f in evolved["fields"]}
    assert [f["name"] for f in evolved["fields"]] == [f["name"] for f in REGISTERED["fields"]] + ["coupon"]
    for unchanged in ("id", "status", "created", "channel", "bill"):
        assert fields[unchanged] == next(f for f in REGISTERED["fields"] if f["name"] == unchanged)
    assert fields["qty"] == {"name": "qty", "type": ["null", "long"], "default": None}  # widened in place
    ship = fields["ship"]["type"][1]
    assert ship["name"] == "Ship" and ship["fields"][1] == {"name": "zip", "type": ["null", "string"], "default": None}
    assert fields["coupon"] == {"name": "coupon", "type": ["null", "string"], "default": None}


def test_avro_evolution_made_nullable_under_none_takes_a_null_default():
    source = struct(("id", LongType()), ("status", StringType()))
    plan, evolved = _evolve(source, "NONE")
    created = next(f for f in evolved["fields"] if f["name"] == "created")
    assert created == {"name": "created", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None}


# Pairs (reader, writer) the project's Avro check and the Apache `avro` package must judge alike.
_ENUM = {"type": "enum", "name": "S", "symbols": ["A", "B"]}
_FIXED = {"type": "fixed", "name": "F", "size": 4}
_PAIRS = [
    ("long", "int"), ("int", "long"), ("double", "float"), ("float", "long"), ("string", "bytes"), ("bytes", "string"),
    ("string", _ENUM), (_ENUM, "string"), (_ENUM, {**_ENUM, "symbols": ["A"]}), ({**_ENUM, "symbols": ["A"]}, _ENUM),
    ({**_ENUM, "symbols": ["A"], "default": "A"}, _ENUM), ({**_ENUM, "name": "T"}, _ENUM),
    (_FIXED, {**_FIXED, "size": 5}), ("bytes", _FIXED), (_FIXED, _FIXED),
    (["null", "long"], "int"), (["null", "int"], ["null", "long"]), (["null", "long", "string"], ["null", "int"]),
    ({"type": "array", "items": "long"}, {"type": "array", "items": "int"}), ({"type": "map", "values": "int"}, {"type": "map", "values": "long"}),
    ({"type": "long", "logicalType": "timestamp-micros"}, {"type": "long", "logicalType": "timestamp-millis"}),
]


@pytest.mark.parametrize(("reader", "writer"), _PAIRS, ids=[f"pair{i}" for i in range(len(_PAIRS))])
def test_avro_read_check_agrees_with_the_apache_avro_package(reader, writer):
    import json

    import avro.schema
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    from dpone_dagster.schema.avro_compat import read_issues

    def record(node, name="R"):
        return {"type": "record", "name": name, "fields": [{"name": "x", "type": node}]}

    apache = ReaderWriterCompatibilityChecker().get_compatibility(
        avro.schema.parse(json.dumps(record(reader))), avro.schema.parse(json.dumps(record(writer)))
    )
    ours = read_issues(record(reader), record(writer))
    assert (not ours) == (apache.compatibility is SchemaCompatibilityType.compatible), ours


def test_avro_compatibility_names_record_and_field_problems():
    from dpone_dagster.schema.avro_compat import compatibility_issues as avro_issues

    renamed = {**REGISTERED, "name": "orders", "namespace": "dpone"}
    assert any("names differ" in i for i in avro_issues(renamed, [REGISTERED], "BACKWARD"))
    required = {**REGISTERED, "fields": [*REGISTERED["fields"], {"name": "must", "type": "string"}]}
    assert avro_issues(required, [REGISTERED], "BACKWARD") == [
        "must: reader field has no default and the writer does not write it (new schema reading old records)"
    ]
    assert avro_issues(required, [REGISTERED], "FORWARD") == [] and avro_issues(renamed, [REGISTERED], "NONE") == []


def test_a_named_record_used_twice_takes_the_new_fields_of_every_use():
    """Address is defined at `billing` and referenced by `shipping` and `home`; each use brings a
    field of its own: the one definition takes both, nothing the batch holds is left out."""
    from dpone_dagster.schema.avro import avro_to_spark
    from dpone_dagster.schema.avro_evolution import evolve_avro_schema

    registered = {
        "type": "record", "name": "Order", "namespace": "com.acme",
        "fields": [
            {"name": "billing", "type": {"type": "record", "name": "Address", "fields": [{"name": "street", "type": "string"}]}},
            {"name": "shipping", "type": "Address"},
            {"name": "home", "type": "Address"},
        ],
    }

    def address(*extra: str) -> StructType:
        return StructType([StructField("street", StringType(), False), *(StructField(n, StringType(), True) for n in extra)])

    batch = struct(("billing", address(), False), ("shipping", address("zip"), False), ("home", address("x"), False))
    evolved = evolve_avro_schema(registered, batch)
    assert [f["name"] for f in evolved["fields"][0]["type"]["fields"]] == ["street", "zip", "x"]
    assert evolved["fields"][1]["type"] == "Address" and evolved["fields"][2]["type"] == "Address"
    home = next(f for f in avro_to_spark(evolved).fields if f.name == "home").dataType
    assert {"zip", "x"} <= set(home.fieldNames())
