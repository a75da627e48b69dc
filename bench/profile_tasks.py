"""One engine task, in this process, timed and optionally under cProfile: where does a Spark
task's Python time go?

    python -m bench.profile_tasks --records 250000 [--profile]

`reader`: kafka_reader.read_one_range over one partition slice (the default records_per_task).
`writer`: sinks.kafka.produce_batches over Arrow batches shaped like the engine's messages
(key = order_id text, value = JSON, no headers, partition -1), 10,000 rows per batch (Spark's
spark.sql.execution.arrow.maxRecordsPerBatch default).
Reported: wall seconds, process CPU seconds (all threads, librdkafka included), records/s.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from bench.common import create_topic, generate_events, order_event, parse_settings


def _measure(fn: Callable[[], int], profile: bool) -> dict[str, Any]:
    prof = cProfile.Profile() if profile else None
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    n = fn()
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    out: dict[str, Any] = {"records": n, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "per_s": round(n / wall)}
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        out["profile"] = buf.getvalue()
    return out


def profile_reader(bootstrap: str, topic: str, records: int, profile: bool, **settings: Any) -> dict[str, Any]:
    from dpone_dagster.sources.kafka_reader import ReaderSettings, read_one_range

    reader = read_one_range
    rs = ReaderSettings({"bootstrap.servers": bootstrap}, f"prof-{uuid.uuid4().hex[:6]}", **settings)

    def run() -> int:
        return sum(b.num_rows for b in reader(rs, topic, 0, 0, records))

    return _measure(run, profile)


def message_batches(records: int, rows: int = 10_000) -> list[pa.RecordBatch]:
    schema = pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            ("partition", pa.int32()),
        ]
    )
    batches = []
    for start in range(0, records, rows):
        ids = range(start, min(records, start + rows))
        batches.append(
            pa.RecordBatch.from_pydict(
                {
                    "key": [str(i).encode() for i in ids],
                    "value": [order_event(i) for i in ids],
                    "headers": [None] * len(ids),
                    "partition": [-1] * len(ids),
                },
                schema=schema,
            )
        )
    return batches


def profile_writer(bootstrap: str, topic: str, batches: list[pa.RecordBatch], profile: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    from dpone_dagster.kafka.config import producer_config
    from dpone_dagster.manifest.models import DeliveryOptions
    from dpone_dagster.sinks.kafka import ProducerSettings, produce_batches

    writer = produce_batches
    config = {**producer_config({"bootstrap.servers": bootstrap}, DeliveryOptions()), **overrides}
    settings = ProducerSettings(topic, tuple(config.items()))

    def run() -> int:
        stats = list(writer(settings, iter(batches)))
        delivered = sum(stats[0].column("delivered").to_pylist())
        failed = sum(stats[0].column("failed").to_pylist())
        assert failed == 0, stats[0].to_pydict()
        return delivered

    return _measure(run, profile)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile_tasks", description=__doc__)
    p.add_argument("--records", type=int, default=250_000)
    p.add_argument("--what", default="reader,writer")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--reader-setting", action="append", default=[], metavar="K=V", help="ReaderSettings field, e.g. batch_size=10000")
    p.add_argument("--consumer", action="append", default=[], metavar="K=V", help="librdkafka consumer override")
    p.add_argument("--producer", action="append", default=[], metavar="K=V", help="librdkafka producer override")
    p.add_argument("--bootstrap", help="use a running broker instead of starting one")
    args = p.parse_args(argv)

    from dpone_dagster.embedded_broker import EmbeddedBroker

    broker = None if args.bootstrap else EmbeddedBroker().start()
    bootstrap = args.bootstrap or broker.bootstrap_servers  # type: ignore[union-attr]
    try:
        results: list[dict[str, Any]] = []
        if "reader" in args.what:
            src = f"prof_src_{uuid.uuid4().hex[:6]}"
            create_topic(bootstrap, src, 1)
            generate_events(bootstrap, src, args.records, 1)
            settings = parse_settings(args.reader_setting)
            if args.consumer:
                settings["consumer_overrides"] = tuple(parse_settings(args.consumer).items())
            for rep in range(args.repeat):
                r = profile_reader(bootstrap, src, args.records, args.profile and rep == 0, **settings)
                results.append({"what": "reader", "rep": rep, **r})
        if "writer" in args.what:
            batches = message_batches(args.records)
            for rep in range(args.repeat):
                dst = f"prof_dst_{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, dst, 6)
                r = profile_writer(bootstrap, dst, batches, args.profile and rep == 0, parse_settings(args.producer))
                results.append({"what": "writer", "rep": rep, **r})
        for r in results:
            prof = r.pop("profile", None)
            print(json.dumps(r))
            if prof:
                print(prof)
    finally:
        if broker is not None:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
