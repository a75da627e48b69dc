"""formats/json_suspects.py: no broker, no Spark. A suspect is set aside without being decoded,
so every suspect must be a value the task decoder refuses alone; and a batch's bad records are
found without halving when every one of them is a suspect."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from dpone_dagster.columns import DELETE_OPS
from dpone_dagster.direct import task
from dpone_dagster.direct.task import DirectSettings, failing
from dpone_dagster.formats.json_suspects import envelope_suspects, suspects
from dpone_dagster.sources.kafka_reader import ReaderSettings
from dpone_dagster.spark.arrow_json import decode_values

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("small", pa.int8()),
        ("amount", pa.float64()),
        ("ratio", pa.float32()),
        ("price", pa.decimal128(10, 2)),
        ("name", pa.string()),
        ("flag", pa.bool_()),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("tags", pa.list_(pa.string())),
        ("point", pa.struct([("x", pa.int64()), ("labels", pa.list_(pa.int32()))])),
    ]
)

GOOD = {
    "id": [0, -7, 2**62, None],
    "small": [0, 127, -128, None],
    "amount": [1.5, 3, -0.25, 1e300, None],
    "ratio": [0.5, 2, None],
    "price": [1.25, 3, None],
    "name": ["a", "", "ü\n", None],
    "flag": [True, False, None],
    "day": ["2024-02-29", None],
    "at": ["2024-02-29T10:00:00Z", "2024-02-29T10:00:00.123456+02:00", None],
    "tags": [[], ["a", None], None],
    "point": [{}, {"x": 1, "labels": [1, 2]}, {"labels": None}, None],
}
# Values of a JSON kind the field's read type never takes.
WRONG = {
    "id": ["1", 1.5, True, [1], {"a": 1}],
    "small": ["x", 0.5, False],
    "amount": ["1.5", True, [], {}],
    "ratio": ["x", False],
    "price": ["4.10", True, [1], {"a": 1}],
    "name": [1, 1.5, True, ["a"], {"a": "b"}],
    "flag": [1, 0, "true", 1.0],
    "day": [20240229, True, ["2024-02-29"]],
    "at": [1709200800, 1.5, {}],
    "tags": ["a", [1], [True], {"a": 1}],
    "point": ["p", [1], {"x": "1"}, {"labels": [1.5]}, {"y": 1}],
}
NOT_RECORDS = [b"{not json", b"[1, 2]", b'"text"', b"42", b"null", b"\xff\xfe{}", b'{"id": 1', b"{}{}"]


def record(rng: random.Random, wrong: bool) -> bytes:
    fields = {name: rng.choice(GOOD[name]) for name in SCHEMA.names if rng.random() < 0.8}
    if wrong:
        kind = rng.random()
        if kind < 0.1:
            return rng.choice(NOT_RECORDS)
        if kind < 0.2:
            fields["unknown"] = 1
        else:
            name = rng.choice(SCHEMA.names)
            fields[name] = rng.choice(WRONG[name])
    return json.dumps(fields).encode()


def test_every_suspect_is_a_value_the_decoder_refuses_alone():
    rng = random.Random(7)
    values = pa.array([record(rng, wrong=rng.random() < 0.3) for _ in range(3_000)] + [None], pa.binary())
    flagged = suspects(values, SCHEMA)
    assert 600 < flagged.sum() < 1_200 and not flagged[-1]  # a tombstone is never a suspect
    for i in np.flatnonzero(flagged):
        assert decode_values(values.slice(int(i), 1), SCHEMA) is None, values[int(i)]
    # ... and every value not suspected is one it reads: here, the rest of the batch whole.
    assert decode_values(values.filter(pa.array(~flagged)), SCHEMA) is not None


def test_a_batch_whose_bad_records_are_all_suspects_needs_one_decode_to_confirm_the_rest():
    rng = random.Random(11)
    truth = [rng.random() < 0.125 for _ in range(20_000)]
    values = pa.array([record(rng, wrong=bad) for bad in truth], pa.binary())
    flagged = suspects(values, SCHEMA)
    assert (flagged == np.array(truth)).all()
    rest = values.filter(pa.array(~flagged))
    calls = []

    def fails(low: int, n: int) -> bool:
        calls.append(n)
        return decode_values(rest.slice(low, n), SCHEMA) is None

    assert not failing(len(rest), fails, 10**6).any() and calls == [len(rest)]


def test_values_the_look_cannot_judge_are_left_to_the_decoder():
    """Integers past their type, number forms and texts the decoder refuses are not suspects:
    the halving that follows finds them."""
    quiet = [
        {"small": 128},
        {"id": 2**63},
        {"day": "2024-1-5"},
        {"at": "yesterday"},
        {"price": 1.234},
    ]
    values = pa.array([json.dumps(v).encode() for v in quiet], pa.binary())
    assert not suspects(values, SCHEMA).any()
    assert all(decode_values(values.slice(i, 1), SCHEMA) is None for i in range(len(quiet)))


def reads(values: pa.Array, envelope: str, auto: bool = False) -> bool:
    """Whether the scan task's decoder reads `values` whole (direct/task.decoded)."""
    settings = DirectSettings(
        reader=ReaderSettings(client_config={}, group_id="g"), schema=SCHEMA, key_columns=None, hashed=False,
        max_message_bytes=1_000_000, run_id="r", source_envelope=envelope, envelope_auto=auto,
    )
    try:
        task.decoded(settings, pa.RecordBatch.from_arrays([values], ["value"]))
    except task.Undecodable:
        return False
    return True


def envelope(rng: random.Random, wrong: bool) -> bytes:
    data = json.loads(record(rng, wrong=False))
    shape = {"op": rng.choice(["upsert", "insert", "u"]), "data": data, "metadata": {"source": "db"}}
    if rng.random() < 0.1:
        shape = {"op": rng.choice(DELETE_OPS)}
    if wrong:
        kind = rng.random()
        if kind < 0.1:
            return rng.choice(NOT_RECORDS)
        if kind < 0.2:
            return json.dumps(data).encode()  # a flat record: no op
        if kind < 0.4:
            shape.pop("op")
        elif kind < 0.5:
            shape["op"] = rng.choice([1, None, True])
        elif kind < 0.6:
            shape = {"op": "upsert"}
        elif kind < 0.7:
            shape["data"] = rng.choice(["x", [1], 3])
        else:
            name = rng.choice(SCHEMA.names)
            shape["data"] = {**data, name: rng.choice(WRONG[name])}
    return json.dumps(shape).encode()


@pytest.mark.parametrize("auto", [False, True])
def test_every_suspect_envelope_is_one_the_decoder_refuses_alone(auto):
    rng = random.Random(5)
    values = pa.array([envelope(rng, wrong=rng.random() < 0.3) for _ in range(2_000)] + [None], pa.binary())
    flagged = envelope_suspects(values, SCHEMA, DELETE_OPS, auto)
    assert 400 < flagged.sum() < 1_000 and not flagged[-1]
    for i in np.flatnonzero(flagged):
        assert not reads(values.slice(int(i), 1), "dpone", auto), values[int(i)]
    assert reads(values.filter(pa.array(~flagged)), "dpone", auto)


def test_the_flat_suspects_are_judged_by_the_scan_tasks_decoder_alike():
    rng = random.Random(3)
    values = pa.array([record(rng, wrong=rng.random() < 0.3) for _ in range(500)], pa.binary())
    flagged = suspects(values, SCHEMA)
    assert all(not reads(values.slice(int(i), 1), "flat") for i in np.flatnonzero(flagged))
    assert reads(values.filter(pa.array(~flagged)), "flat")


def test_values_json_loads_alone_refuses_are_no_suspects():
    """Python's limits are not the reader's: an integer past 4,300 digits (Arrow reads it into a
    double), bytes that are not UTF-8 in a name the envelope's reader reads past (Spark's decoder
    reads them as U+FFFD), a value nested past the recursion limit (no crash: the halving judges it)."""
    huge = b'{"amount": 1' + b"0" * 5_000 + b"}"
    deep = b'{"tags": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"
    assert not suspects(pa.array([huge, deep], pa.binary()), SCHEMA).any()
    latin = b'{"op": "d", "metadata": {"m\xe9ta": "db"}}'
    assert not envelope_suspects(pa.array([latin], pa.binary()), SCHEMA, DELETE_OPS, False).any()
    assert not reads(pa.array([latin], pa.binary()), "dpone")  # no crash: Spark's decoder reads it


def test_one_bad_record_in_a_batch_is_found_by_halving_without_the_look(monkeypatch):
    """The look costs one json.loads a value; one bad record costs about one decode of the batch by
    halving. Where both halves fail, the look runs."""
    from dpone_dagster.formats import json_suspects

    looked = []
    real = json_suspects.suspects
    monkeypatch.setattr(json_suspects, "suspects", lambda values, schema: looked.append(len(values)) or real(values, schema))
    settings = DirectSettings(
        reader=ReaderSettings(client_config={}, group_id="g"), schema=SCHEMA, key_columns=None, hashed=False,
        max_message_bytes=1_000_000, run_id="r", screen_undecodable=True,
    )

    def batch(bad: set[int]) -> pa.RecordBatch:
        values = [b'{"id": "x"}' if i in bad else b'{"id": %d}' % i for i in range(1_000)]
        return pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], ["value"])

    assert np.flatnonzero(task._undecodable(settings, batch({700})).to_numpy(zero_copy_only=False)).tolist() == [700]
    assert looked == []
    assert np.flatnonzero(task._undecodable(settings, batch({3, 700})).to_numpy(zero_copy_only=False)).tolist() == [3, 700]
    assert looked == [1_000]
