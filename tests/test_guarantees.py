"""Every guarantee a manifest declares either holds or the manifest is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_manifest

from dpone_dagster.cli import main
from dpone_dagster.errors import ConfigError
from dpone_dagster.kafka.config import check_producer_settings, effective_producer_settings
from dpone_dagster.manifest import parse_manifest


def manifest_with(delivery: str, strategy: str = "{mode: incremental_append}", source: str = "topic: src") -> str:
    return f"""
name: guarantees
source: {{type: kafka, connection_id: kafka_cluster, {source}}}
sink:
  type: kafka
  connection_id: kafka_cluster
  topic: dst
  strategy: {strategy}
  options:
    delivery: {delivery}
"""


def validate(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    path = write_manifest(tmp_path / "m.yaml", text)
    code = main(["validate", str(path)])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


# --------------------------------------------------------------------------- delivery settings


@pytest.mark.parametrize(
    ("delivery", "path"),
    [
        ("{mode: at_least_once, acks: '1'}", "sink.options.delivery.acks"),
        ("{mode: at_least_once, acks: 0}", "sink.options.delivery.acks"),
        ("{mode: at_least_once, acks: 1}", "sink.options.delivery.acks"),
        ("{mode: idempotent, acks: 1}", "sink.options.delivery.acks"),
        ("{mode: at_least_once, producer_config: {acks: 1}}", "sink.options.delivery.producer_config.acks"),
        (
            "{mode: at_least_once, producer_config: {request.required.acks: '0'}}",
            "sink.options.delivery.producer_config.request.required.acks",
        ),
        (
            "{mode: idempotent, producer_config: {enable.idempotence: false}}",
            "sink.options.delivery.producer_config.enable.idempotence",
        ),
        (
            "{mode: idempotent, producer_config: {max.in.flight.requests.per.connection: 10}}",
            "sink.options.delivery.producer_config.max.in.flight.requests.per.connection",
        ),
        ("{mode: idempotent, producer_config: {retries: 0}}", "sink.options.delivery.producer_config.retries"),
        (
            "{mode: exactly_once, producer_config: {enable.idempotence: 'false'}}",
            "sink.options.delivery.producer_config.enable.idempotence",
        ),
    ],
)
def test_validate_refuses_producer_settings_that_contradict_the_mode(tmp_path, capsys, delivery, path):
    code, output = validate(tmp_path, manifest_with(delivery), capsys)
    assert code == 2
    assert f"{path}:" in output


@pytest.mark.parametrize(
    "delivery",
    [
        "{mode: at_least_once, acks: -1}",
        "{mode: at_least_once, acks: all}",
        "{mode: idempotent, acks: -1}",
        "{mode: idempotent, producer_config: {max.in.flight.requests.per.connection: 5, retries: 3}}",
        "{mode: at_least_once, producer_config: {enable.idempotence: false, linger.ms: 5}}",
    ],
)
def test_validate_accepts_settings_that_keep_the_mode(tmp_path, capsys, delivery):
    code, output = validate(tmp_path, manifest_with(delivery), capsys)
    assert code == 0, output


def test_connection_overrides_that_contradict_the_mode_are_refused_before_a_run():
    manifest = parse_manifest(manifest_with("{mode: idempotent}"))
    with pytest.raises(ConfigError, match="sink connection 'kafka_cluster'.*max.in.flight"):
        check_producer_settings(manifest, {"bootstrap.servers": "x:1", "max.in.flight": "20"})
    # The engine's acks: all wins over a connection's acks under at_least_once: nothing to refuse.
    at_least_once = parse_manifest(manifest_with("{mode: at_least_once}"))
    check_producer_settings(at_least_once, {"bootstrap.servers": "x:1", "acks": "1"})


def test_effective_settings_show_every_override_and_no_credentials():
    manifest = parse_manifest(manifest_with("{mode: idempotent, producer_config: {linger.ms: 7, message.timeout.ms: 9000}}"))
    settings = effective_producer_settings(
        manifest, {"bootstrap.servers": "x:1", "sasl.password": "hunter2", "retries": "4", "compression.type": "lz4"}
    )
    assert settings["acks"] == "all" and settings["enable.idempotence"] is True
    assert settings["linger.ms"] == 7 and settings["message.timeout.ms"] == 9000
    assert settings["retries"] == "4" and settings["compression.type"] == "lz4"
    assert "sasl.password" not in settings and "bootstrap.servers" not in settings
