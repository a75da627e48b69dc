"""The `dpone` command: validate, plan, run, doctor, state, broker.

Exit codes: 0 success, 1 a run or required check failed, 2 configuration error (bad manifest,
missing credentials, unreachable service found before anything was produced).

Everything a command writes goes through `say`, which masks secrets (`redact.redact_text`); an
unexpected exception is reported as its redacted traceback, never Python's raw one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any, TextIO

from dpone_dagster.errors import ConfigError, RunFailed
from dpone_dagster.manifest import ManifestError, load_manifest
from dpone_dagster.redact import redact_text
from dpone_dagster.stdio import output, stdout_for_output_only

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def say(*parts: object, file: TextIO | None = None, flush: bool = False) -> None:
    """print() for every line a command shows: secrets masked."""
    print(redact_text(" ".join(str(part) for part in parts)), file=file or output(), flush=flush)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_CONFIG
    try:
        # JSON output is all of stdout: the Spark JVM and client libraries log to stderr then.
        with stdout_for_output_only(getattr(args, "format", None) == "json"):
            return int(args.handler(args))
    except ConfigError as exc:
        say(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except RunFailed as exc:
        say(f"run failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception:
        # Python's own report would print the exception text (which may echo a client's
        # configuration) unmasked.
        say(traceback.format_exc().rstrip(), file=sys.stderr)
        return EXIT_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpone", description="Bounded batch Kafka ETL on Spark")
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("validate", help="validate manifests (exit 0 valid, 2 invalid)")
    p.add_argument("manifests", nargs="+")
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("plan", help="show what a run would do (read-only)")
    p.add_argument("manifest")
    p.add_argument("--format", choices=("md", "json"), default="md")
    p.add_argument("--offline", action="store_true", help="do not contact the broker or state store")
    p.set_defaults(handler=cmd_plan)

    for name, target in (("run", sub), ("batch", None)):
        if target is None:
            batch = sub.add_parser("batch", help="alias group: `dpone batch run`")
            target = batch.add_subparsers(dest="batch_command")
            name = "run"
        p = target.add_parser(name, help="run the pipeline once")
        p.add_argument("manifest")
        p.add_argument("--format", choices=("text", "json"), default="text")
        p.add_argument("--start", help="time_window start (ISO 8601), overrides the manifest")
        p.add_argument("--end", help="time_window end (ISO 8601), overrides the manifest")
        p.set_defaults(handler=cmd_run)

    p = sub.add_parser("doctor", help="check Java, Spark, broker, registry, Postgres, extras")
    p.add_argument("--profile", default="local", choices=("local", "quick"))
    p.add_argument("--connection-id", default="kafka_cluster")
    p.add_argument("--state-connection-id", default="postgres_state")
    p.set_defaults(handler=cmd_doctor)

    state = sub.add_parser("state", help="inspect or rewind stored offsets")
    state_sub = state.add_subparsers(dest="state_command")
    p = state_sub.add_parser("show")
    p.add_argument("manifest")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=cmd_state_show)
    p = state_sub.add_parser("reset")
    p.add_argument("manifest")
    p.add_argument("--to", choices=("earliest",), default="earliest", help="forget stored offsets")
    p.add_argument("--offset", action="append", default=[], metavar="PARTITION=OFFSET", help="set exact offsets")
    p.add_argument("--yes", action="store_true", help="confirm the rewind")
    p.set_defaults(handler=cmd_state_reset)

    runs = sub.add_parser("runs", help="run artifacts written under observability.artifacts.path")
    runs_sub = runs.add_subparsers(dest="runs_command")
    p = runs_sub.add_parser("list")
    p.add_argument("manifest")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=cmd_runs_list)
    p = runs_sub.add_parser("show")
    p.add_argument("manifest")
    p.add_argument("run_id")
    p.set_defaults(handler=cmd_runs_show)

    schema = sub.add_parser("schema", help="source schema inference and the sink's physical schema plan")
    schema_sub = schema.add_subparsers(dest="schema_command")
    for name, handler in (("infer", cmd_schema_infer), ("physical-plan", cmd_schema_physical_plan)):
        p = schema_sub.add_parser(name)
        p.add_argument("--manifest", required=True)
        p.add_argument("--format", choices=("md", "json"), default="md")
        p.set_defaults(handler=handler)

    broker = sub.add_parser("broker", help="run the embedded Kafka-compatible broker (local development)")
    p = broker.add_subparsers(dest="broker_command").add_parser("start")
    p.add_argument("--port", type=int, default=None)
    p.set_defaults(handler=cmd_broker_start)

    server = sub.add_parser("spark-server", help="a long-lived local Spark Connect server for fast small runs")
    server_sub = server.add_subparsers(dest="server_command", required=True)
    p = server_sub.add_parser("start", help="start it (or report the one running) and print DPONE_SPARK_REMOTE")
    p.add_argument("--port", type=int, default=None, help="gRPC port (default 15002)")
    p.add_argument("--master", default=None, help="Spark master of the server (default DPONE_SPARK_MASTER or local[*])")
    p.set_defaults(handler=cmd_spark_server_start)
    for name, handler in (("stop", cmd_spark_server_stop), ("status", cmd_spark_server_status)):
        server_sub.add_parser(name).set_defaults(handler=handler)
    return parser


# --------------------------------------------------------------------------- commands


def cmd_validate(args: argparse.Namespace) -> int:
    status = EXIT_OK
    for path in args.manifests:
        try:
            manifest = load_manifest(path)
            say(f"ok: {path} ({manifest.name}: {manifest.source.type} -> kafka {manifest.sink.topic})")
        except ManifestError as exc:
            say(exc, file=sys.stderr)
            status = EXIT_CONFIG
    return status


def cmd_plan(args: argparse.Namespace) -> int:
    from dpone_dagster.engine.plan import build_plan, render_markdown

    plan = build_plan(load_manifest(args.manifest), probe=not args.offline)
    text = json.dumps(plan, indent=2, default=str) if args.format == "json" else render_markdown(plan)
    say(text)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from datetime import datetime

    from dpone_dagster.engine.run import RunRequest, resolve_connections, run_pipeline
    from dpone_dagster.sources.kafka import TimeWindow
    from dpone_dagster.spark.session import get_spark, jdbc_jars, spark_config_from_env, with_jars

    manifest = load_manifest(args.manifest)
    windows = None
    if args.start or args.end:
        if not (args.start and args.end):
            raise ConfigError("--start and --end go together")
        try:
            windows = [TimeWindow(_utc(datetime.fromisoformat(args.start)), _utc(datetime.fromisoformat(args.end)))]
        except ValueError as exc:
            raise ConfigError(f"--start/--end: {exc}; use ISO 8601, e.g. 2024-05-01T00:00:00Z") from None
    quiet = args.format == "json"

    def log(message: str) -> None:
        if not quiet:
            say(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    try:
        resolve_connections(manifest)  # missing credentials: exit 2 before a JVM starts
        spark = get_spark(with_jars(spark_config_from_env(), jdbc_jars([manifest])))
        result = run_pipeline(manifest, spark, RunRequest(windows=windows, log=log))
    except (RunFailed, ConfigError) as exc:
        if quiet:
            status = "failed" if isinstance(exc, RunFailed) else "config_error"
            say(json.dumps({"status": status, "pipeline": manifest.name, "error": redact_text(str(exc))}))
        raise
    if quiet:
        say(json.dumps(result.as_dict(), default=str))
    else:
        say(success_line(manifest.sink.topic, result))
    return EXIT_OK


def success_line(sink_topic: str, result: Any) -> str:
    return (
        f"success: run {result.run_id}: {result.rows_extracted} rows extracted, {result.messages_produced} "
        f"messages produced to {', '.join(result.target_topics(sink_topic))}; offsets {result.committed_offsets}"
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from dpone_dagster.doctor import failed_required, render_table, run_checks

    checks = run_checks(args.profile, args.connection_id, args.state_connection_id)
    say(render_table(checks))
    failed = failed_required(checks)
    if failed:
        say(f"\n{len(failed)} required check(s) failed: {', '.join(c.name for c in failed)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _offsets_view(manifest_path: str) -> tuple[Any, Any, Any]:
    from dpone_dagster.engine.offsets import OffsetStorage
    from dpone_dagster.manifest.models import KafkaSource
    from dpone_dagster.sources.kafka import default_group_id
    from dpone_dagster.state.open import open_manifest_state_store

    manifest = load_manifest(manifest_path)
    if not isinstance(manifest.source, KafkaSource):
        raise ConfigError("state show/reset of SQL watermarks: use the state table directly for now")
    store = open_manifest_state_store(manifest)
    client_config: dict[str, Any] = {}
    if manifest.source.options.offset_storage == "kafka":
        from dpone_dagster.connections import resolve_kafka

        client_config = resolve_kafka(manifest.source).client_config()
    return manifest, store, OffsetStorage(manifest, store, client_config, default_group_id(manifest))


def _control_topic_state(manifest: Any) -> dict[str, Any]:
    from dpone_dagster.state.open import open_manifest_state_store

    store = open_manifest_state_store(manifest)
    try:
        entries = store.load_all()
    finally:
        store.close()
    return {
        "pipeline": manifest.name,
        "state": "kafka_control_topic",
        "control_topic": manifest.sink.options.replication.control_topic.name,
        "offsets": {f"{topic}:{partition}": entry.offset for (topic, partition), entry in sorted(entries.items())},
    }


def cmd_state_show(args: argparse.Namespace) -> int:
    if (manifest := load_manifest(args.manifest)).state.type == "kafka_control_topic":
        data = _control_topic_state(manifest)
        say(json.dumps(data, indent=2) if args.format == "json" else "\n".join(f"{k}: next offset {v}" for k, v in data["offsets"].items()))
        return EXIT_OK
    manifest, store, offsets = _offsets_view(args.manifest)
    try:
        data = {
            "pipeline": manifest.name,
            "topic": offsets.topic,
            "group_id": offsets.group_id,
            "offset_storage": offsets.mode,
            "offsets": {str(p): o for p, o in sorted(offsets.load().items())},
            "last_runs": [r.to_json() for r in store.list_runs(manifest.name, limit=5)],
        }
    finally:
        store.close()
    if args.format == "json":
        say(json.dumps(data, indent=2, default=str))
    else:
        say(f"{data['pipeline']}: {data['topic']} (group {data['group_id']}, {data['offset_storage']})")
        for p, o in data["offsets"].items() or []:
            say(f"  partition {p}: next offset {o}")
        if not data["offsets"]:
            say("  no stored offsets (the next run starts from earliest)")
    return EXIT_OK


def cmd_state_reset(args: argparse.Namespace) -> int:
    exact = _parse_offsets(args.offset)
    if not args.yes:
        raise ConfigError("state reset rewinds stored offsets and re-reads data; confirm with --yes")
    if load_manifest(args.manifest).state.type == "kafka_control_topic":
        raise ConfigError(
            "offsets of exactly_once replication live in the control topic; rewind by producing a tombstone for "
            "the partition's control key, or start afresh with a new replication.control_topic.commit_group"
        )
    manifest, store, offsets = _offsets_view(args.manifest)
    try:
        if offsets.mode == "kafka":
            raise ConfigError("offset_storage: kafka — reset the consumer group with kafka-consumer-groups --reset-offsets")
        store.reset_offsets(offsets.topic, offsets.group_id, exact or None)
    finally:
        store.close()
    say(f"{manifest.name}: offsets {'set to ' + str(exact) if exact else 'cleared (next run starts from earliest)'}")
    return EXIT_OK


def cmd_runs_list(args: argparse.Namespace) -> int:
    from dpone_dagster.observability.artifacts import list_runs

    runs = list_runs(load_manifest(args.manifest).observability.artifacts.path)
    if args.format == "json":
        say(json.dumps(runs, indent=2, default=str))
        return EXIT_OK
    for run in runs:
        say(
            f"{run.get('run_id')}  {run.get('status'):8}  {run.get('started_at')}  "
            f"rows={run.get('rows')} messages={run.get('messages')}"
        )
    if not runs:
        say("no run artifacts (set observability.artifacts.enabled: true)")
    return EXIT_OK


def cmd_runs_show(args: argparse.Namespace) -> int:
    from dpone_dagster.observability.artifacts import show_run

    say(json.dumps(show_run(load_manifest(args.manifest).observability.artifacts.path, args.run_id), indent=2, default=str))
    return EXIT_OK


def cmd_schema_infer(args: argparse.Namespace) -> int:
    from dpone_dagster.schema.commands import infer, render

    say(render(infer(load_manifest(args.manifest)), args.format))
    return EXIT_OK


def cmd_schema_physical_plan(args: argparse.Namespace) -> int:
    from dpone_dagster.schema.commands import physical_plan, render

    say(render(physical_plan(load_manifest(args.manifest)), args.format))
    return EXIT_OK


def cmd_broker_start(args: argparse.Namespace) -> int:
    from dpone_dagster.embedded_broker import EmbeddedBroker

    with EmbeddedBroker(port=args.port) as broker:
        say(f"embedded broker on {broker.bootstrap_servers} (memory only; Ctrl-C stops it)", flush=True)
        say(f"export KAFKA_CLUSTER_BOOTSTRAP_SERVERS={broker.bootstrap_servers}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return EXIT_OK


def cmd_spark_server_start(args: argparse.Namespace) -> int:
    from dpone_dagster.spark import connect_server
    from dpone_dagster.spark.session import DEBIAN_JDBC_JARS, spark_config_from_env, with_jars

    # The server serves every pipeline: every JDBC driver installed goes on its classpath.
    jars = [jar for jar in DEBIAN_JDBC_JARS.values() if os.path.exists(jar)]
    conf = with_jars({k: v for k, v in spark_config_from_env().items() if k != "spark.remote"}, jars)
    status = connect_server.start(port=args.port or connect_server.DEFAULT_PORT, master=args.master, conf=conf)
    say(f"Spark Connect server running (pid {status.pid}, log {status.log})")
    say(f"export DPONE_SPARK_REMOTE={status.url}")
    return EXIT_OK


def cmd_spark_server_stop(args: argparse.Namespace) -> int:
    from dpone_dagster.spark import connect_server

    say("Spark Connect server stopped" if connect_server.stop() else "no Spark Connect server was running")
    return EXIT_OK


def cmd_spark_server_status(args: argparse.Namespace) -> int:
    from dpone_dagster.spark import connect_server

    status = connect_server.status()
    if not status.running:
        say("no Spark Connect server is running (start one with `dpone spark-server start`)")
        return EXIT_FAILED
    say(f"Spark Connect server running on {status.url} (pid {status.pid}, log {status.log})")
    return EXIT_OK


def _parse_offsets(values: list[str]) -> dict[int, int]:
    out: dict[int, int] = {}
    for value in values:
        try:
            partition, offset = (int(part) for part in value.split("=", 1))
            if partition < 0 or offset < 0:
                raise ValueError(value)
            out[partition] = offset
        except ValueError:
            raise ConfigError(
                f"--offset {value!r}: expected PARTITION=OFFSET (both >= 0), e.g. --offset 0=1200"
            ) from None
    return out


def _utc(value: Any) -> Any:
    from datetime import UTC

    return value if value.tzinfo else value.replace(tzinfo=UTC)


if __name__ == "__main__":
    sys.exit(main())
