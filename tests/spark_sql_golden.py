"""Stored outcomes of the Spark SQL path, the oracle the direct path is compared with.

A test that compares the two paths runs the direct path live and takes the Spark SQL path's
outcome (its RunResult, the target's messages, whatever the test reads from it) from a file under
tests/golden/spark_sql/, one per test, holding each of the test's Spark SQL runs in call order:

    DPONE_GOLDEN_WRITE=1 .venv/bin/python -m pytest tests/test_direct_path.py   # record them again

Recording runs the Spark SQL path live (the test then compares as before) and writes what it
returned. Replaying renames what differs between runs of a test: its topics, the registry URL and
its temporary directory (each recorded name is replaced by the one the test made now; a topic made
by `unique_topic` keeps its length, so names inside Avro strings stay well formed). A Spark SQL run
has a fixed run id, derived from the test and the call. A missing or short file fails the test.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib
import json
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

GOLDEN = Path(__file__).parent / "golden" / "spark_sql"
WRITE = os.environ.get("DPONE_GOLDEN_WRITE") == "1"
_calls: Counter = Counter()


def current_test() -> str:
    """The running test's node id (pytest sets it for the duration of each test)."""
    return os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]


def golden_file(test: str) -> Path:
    module, _, name = test.partition("::")
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:90].strip("_")
    digest = hashlib.sha1(test.encode()).hexdigest()[:8]
    return GOLDEN / Path(module).stem / f"{readable}-{digest}.json.gz"


def read_store(path: Path) -> dict[str, Any]:
    """A stored file: the test's node id and its runs."""
    return json.loads(gzip.decompress(path.read_bytes()))


def run_id() -> str:
    """A fixed run id for the running test's next Spark SQL run (32 hex digits, as a run's own)."""
    test = current_test()
    return hashlib.sha1(f"{test}#{_calls[test]}".encode()).hexdigest()[:32]


def spark_sql_outcome(names: dict[str, str], run: Callable[[], T]) -> T:
    """What `run` (a Spark SQL run of the running test and what the test reads of it) returns:
    run live and stored when recording, read back and renamed to `names` otherwise. `names` maps
    a role ("src", "dst", ...) to the name it has in this run of the test."""
    test = current_test()
    call = _calls[test]
    _calls[test] += 1
    path = golden_file(test)
    if WRITE:
        try:
            outcome, raised = run(), None
        except Exception as exc:  # a run that fails is an outcome too: its error is stored
            outcome, raised = None, exc
        stored = read_store(path) if call and path.exists() else {"test": test, "runs": []}
        del stored["runs"][call:]
        stored["runs"].append({"names": names, "outcome": encode(outcome), "raised": raised and error_of(raised)})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(json.dumps(stored, indent=1, sort_keys=True).encode(), mtime=0))
        if raised:
            raise raised
        return outcome
    if not path.exists():
        raise AssertionError(f"no stored Spark SQL outcome for {test} ({path}); record it with DPONE_GOLDEN_WRITE=1")
    runs = read_store(path)["runs"]
    if call >= len(runs):
        raise AssertionError(f"{path} holds {len(runs)} Spark SQL run(s) of {test}, the test asks for run {call + 1}; record it again")
    recorded = runs[call]
    renames = sorted(((old, names[role]) for role, old in recorded["names"].items() if role in names and old != names[role]), key=lambda r: -len(r[0]))
    if recorded.get("raised"):
        raise raised_again(recorded["raised"], renames)
    return renamed(decode(recorded["outcome"]), renames)


def error_of(exc: Exception) -> dict[str, Any]:
    """A run's error as stored: its class, its text, and the RunResult a dpone error carries."""
    kind = type(exc)
    result = getattr(exc, "result", None)
    return {"class": f"{kind.__module__}:{kind.__qualname__}", "text": str(exc), "result": encode(result)}


def raised_again(error: dict[str, Any], renames: list[tuple[str, str]]) -> Exception:
    module, _, name = error["class"].partition(":")
    kind = getattr(importlib.import_module(module), name)
    exc = kind.__new__(kind)
    exc.args = (renamed(error["text"], renames),)
    if error["result"] is not None:
        exc.result = renamed(decode(error["result"]), renames)
    return exc


def names(tmp_path: Path, **topics: str) -> dict[str, str]:
    """What differs between two runs of a test: its topics, its in-memory registry, its
    temporary directory."""
    url = os.environ.get("KAFKA_CLUSTER_SCHEMA_REGISTRY_URL", "")
    return {**topics, "tmp": str(tmp_path), **({"url": url} if url.startswith("mock://") else {})}


def any_sample(gate: dict[str, Any]) -> dict[str, Any]:
    """A gate as a stored run is compared with: a failed check's sample is any few failing rows,
    and which ones Spark returns first depends on the order its tasks run in, which differs from
    one session to the next; so the sample is compared by its size."""
    return {**gate, "failing_sample": len(gate.get("failing_sample") or ())}


def without_timestamp(record: dict[str, Any]) -> dict[str, Any]:
    """A target record as the tests compare it: the time it was produced at differs each run."""
    return {k: v for k, v in record.items() if k != "timestamp"}


def renamed(value: Any, renames: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for old, new in renames:
            value = value.replace(old, new)
        return value
    if isinstance(value, bytes):
        for old, new in renames:
            value = value.replace(old.encode(), new.encode())
        return value
    if isinstance(value, tuple):
        return tuple(renamed(v, renames) for v in value)
    if isinstance(value, list):
        return [renamed(v, renames) for v in value]
    if isinstance(value, Counter):
        return Counter({renamed(k, renames): n for k, n in value.items()})
    if isinstance(value, dict):
        return {renamed(k, renames): renamed(v, renames) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: renamed(getattr(value, f.name), renames) for f in dataclasses.fields(value)})
    return value


def encode(value: Any) -> Any:
    """JSON of a run's outcome that reads back to equal values: bytes, tuples, counters, dicts
    with other keys than text, and dataclasses are tagged."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return {"$bytes": value.decode("latin-1")}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, Counter):
        return {"$counter": [[encode(k), n] for k, n in value.items()]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = type(value)
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"$dataclass": f"{kind.__module__}:{kind.__qualname__}", "fields": fields}
    raise TypeError(f"cannot store a {type(value).__name__} of a Spark SQL outcome")


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$bytes" in value:
        return value["$bytes"].encode("latin-1")
    if "$tuple" in value:
        return tuple(decode(v) for v in value["$tuple"])
    if "$counter" in value:
        return Counter({_hashable(decode(k)): n for k, n in value["$counter"]})
    if "$dict" in value:
        return {_hashable(decode(k)): decode(v) for k, v in value["$dict"]}
    if "$dataclass" in value:
        module, _, name = value["$dataclass"].partition(":")
        kind = getattr(importlib.import_module(module), name)
        return kind(**{k: decode(v) for k, v in value["fields"].items()})
    return {k: decode(v) for k, v in value.items()}


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def on_both_paths(monkeypatch: Any, tmp_path: Path, run: Callable[..., T], topics: dict[str, str], **fixed: str) -> dict[str, T]:
    """`run(path, **names)` on the direct path, live, then on the Spark SQL path, stored: each
    path has its own topics (`topics` maps a role to its prefix), `fixed` names the ones both share
    (the source topic). Returns each path's outcome, "direct" and "spark_sql"."""
    from conftest import unique_topic

    def own(path: str) -> dict[str, str]:
        return {role: unique_topic(f"{prefix}_{path}") for role, prefix in topics.items()}

    with monkeypatch.context() as patched:
        patched.setenv("DPONE_DIRECT_PATH", "on")
        direct = run("direct", **own("direct"))
        patched.setenv("DPONE_DIRECT_PATH", "off")
        theirs = own("spark_sql")
        return {"direct": direct, "spark_sql": spark_sql_outcome(names(tmp_path, **theirs, **fixed), lambda: run("spark_sql", **theirs))}
