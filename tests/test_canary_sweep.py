"""No secret leaves the process: every secret field holds a unique canary, and no canary may appear
in any stdout or stderr, log, artifact, state, Dagster event log, run tag or metadata.

Real parts: `dpone` commands and `dagster asset materialize` in their own processes (with their own
Spark JVMs and Python workers), the embedded broker, an OpenBao (Vault API) server holding the state
store's connection, the machine's PostgreSQL (reached through a DSN holding a password; trust
authentication ignores it) and a JDBC read that fails after connecting. Faked: the embedded broker speaks neither SASL nor TLS, so the client spy
(tests/client_spy) creates the real Kafka clients without the security settings after recording
them; the registry URLs point nowhere (the pipeline reads JSON; `doctor` tries to reach them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import consume_all, create_topic, produce_json, unique_topic
from test_client_security import REPO, assert_no_credentials_in_children, dpone, records, spy_env
from test_connections import Vault, vault  # noqa: F401 - `vault`: the OpenBao server fixture

CANARIES = {
    # Short: a parser's error snippet shows ~36 characters around the mark.
    name: f"CNRY{index:02d}zq"
    for index, name in enumerate(
        (
            "kafka_sasl_password",
            "ssl_key_password",
            "registry_password",
            "registry_bearer_token",
            "sql_password",
            "jdbc_url_password",
            "state_dsn_password",
            "vault_token",
            "producer_ssl_key_pem",
            "producer_oauthbearer_config",
            "yaml_inline_password",
            "registry_ssl_key_password",
            "oauth_client_secret",
        )
    )
}
C = CANARIES


def connections(bootstrap: str, pg: dict) -> dict[str, dict[str, str]]:
    return {
        "cnry_src": {
            "bootstrap_servers": bootstrap,
            "client_id": "cnry-src",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": "svc",
            "sasl_password": C["kafka_sasl_password"],
            "ssl_ca_location": "/nonexistent/ca.pem",
            "ssl_certificate_location": "/nonexistent/client.pem",
            "ssl_key_location": "/nonexistent/client.key",
            "ssl_key_password": C["ssl_key_password"],
            "schema_registry_url": "https://sr.invalid:8081",
            "schema_registry_username": "sr-user",
            "schema_registry_password": C["registry_password"],
            "schema_registry_ssl_ca_location": "/nonexistent/sr-ca.pem",
            "schema_registry_ssl_certificate_location": "/nonexistent/sr-client.pem",
            "schema_registry_ssl_key_location": "/nonexistent/sr-client.key",
            "schema_registry_ssl_key_password": C["registry_ssl_key_password"],
        },
        "cnry_sink": {
            "bootstrap_servers": bootstrap,
            "client_id": "cnry-sink",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauthbearer_method": "oidc",
            "sasl_oauthbearer_client_id": "dpone",
            "sasl_oauthbearer_client_secret": C["oauth_client_secret"],
            "sasl_oauthbearer_token_endpoint_url": "https://idp.invalid/token",
            "schema_registry_url": "https://sr.invalid:8081",
            "schema_registry_bearer_token": C["registry_bearer_token"],
        },
        "cnry_sql": {
            "jdbc_url": f"jdbc:postgresql://{pg['host']}:{pg['port']}/{pg['dbname']}"
            f"?user={pg['user']}&password={C['jdbc_url_password']}",
            "user": pg["user"],
            "password": C["sql_password"],
        },
    }


def state_secret(pg: dict) -> dict[str, str]:
    """The state store's connection, kept in Vault."""
    return {
        "dsn": f"host={pg['host']} port={pg['port']} user={pg['user']} dbname={pg['dbname']} "
        f"password={C['state_dsn_password']}",
    }


def kafka_manifest(name: str, src: str, dst: str, tmp: Path, create: bool = True) -> str:
    return f"""
name: {name}
source:
  type: kafka
  connection_id: cnry_src
  topic: {src}
  options:
    schema: [{{name: order_id, type: long}}, {{name: amount, type: double}}]
sink:
  type: kafka
  connection_id: cnry_sink
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options:
    create_topic: {{enabled: {str(create).lower()}, partitions: 1}}
    delivery:
      producer_config:
        ssl.key.pem: "-----BEGIN PRIVATE KEY-----\\n{C['producer_ssl_key_pem']}\\n-----END PRIVATE KEY-----"
        sasl.oauthbearer.config: "clientId=dpone clientSecret={C['producer_oauthbearer_config']}"
state: {{type: postgres, connection_id: cnry_state, connection_type: vault}}
observability: {{artifacts: {{enabled: true, path: {tmp / 'artifacts'}}}}}
"""


def sql_manifest(dst: str, tmp: Path) -> str:
    return f"""
name: cnry_sql
source:
  type: postgres
  connection_id: cnry_sql
  table: {{schema: public, name: cnry_missing_table}}
sink:
  type: kafka
  connection_id: cnry_sink
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options: {{create_topic: {{enabled: true, partitions: 1}}}}
state: {{type: local, path: {tmp / 'sql_state'}}}
observability: {{artifacts: {{enabled: true, path: {tmp / 'artifacts'}}}}}
"""


BROKEN_YAML = f"""
name: cnry_broken
source:
  type: kafka
  connection_type: params
  params: {{password: {C['yaml_inline_password']}, bootstrap_servers: b:9092, sasl_username: u
sink: {{type: kafka, topic: t}}
"""


def leaks(text: str) -> list[str]:
    return [name for name, canary in CANARIES.items() if canary in text]


def test_no_canary_leaves_the_process(broker, pg_database, vault: Vault, tmp_path: Path) -> None:  # noqa: F811
    bs = broker.bootstrap_servers
    vault.client.secrets.kv.v2.create_or_update_secret(path="dpone/connections/cnry_state", secret=state_secret(pg_database))
    vault.client.sys.create_or_update_policy(
        name="cnry-read", policy='path "secret/data/dpone/*" { capabilities = ["read"] }'
    )
    vault.client.auth.token.create(id=C["vault_token"], policies=["cnry-read"], ttl="1h")
    src, dst, dst_missing = unique_topic("cnry_src"), unique_topic("cnry_dst"), unique_topic("cnry_none")
    create_topic(bs, src, 2)
    produce_json(bs, src, [{"order_id": i, "amount": i / 2} for i in range(6)], partition=0)
    produce_json(bs, src, [{"order_id": 100, "amount": 1.0}], partition=1)

    manifests, spy, home = tmp_path / "manifests", tmp_path / "spy", tmp_path / "dagster_home"
    for d in (manifests, spy, home):
        d.mkdir()
    good = manifests / "cnry_good.yaml"
    good.write_text(kafka_manifest("cnry_good", src, dst, tmp_path))
    no_topic = tmp_path / "cnry_no_topic.yaml"  # fails in preflight, after the broker answered
    no_topic.write_text(kafka_manifest("cnry_no_topic", src, dst_missing, tmp_path, create=False))
    sql = tmp_path / "cnry_sql.yaml"  # fails in the JDBC read, after connecting
    sql.write_text(sql_manifest(unique_topic("cnry_sqldst"), tmp_path))
    broken = tmp_path / "cnry_broken.yaml"
    broken.write_text(BROKEN_YAML)

    env = spy_env(
        spy,
        connections(bs, pg_database),
        VAULT_TOKEN=C["vault_token"],
        VAULT_ADDR=vault.addr,
        DAGSTER_HOME=str(home),
        DPONE_MANIFESTS_DIR=str(manifests),
    )
    outputs: dict[str, str] = {}

    def call(label: str, args: list[str], expect: int | None = 0, command: list[str] | None = None) -> str:
        if command is None:
            proc = dpone(args, env)
        else:
            proc = subprocess.run(command + args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        outputs[label] = proc.stdout + "\n" + proc.stderr
        if expect is not None:
            assert proc.returncode == expect, f"{label}: exit {proc.returncode}\n{outputs[label][-3000:]}"
        return proc.stdout

    call("validate", ["validate", str(good), str(sql), str(broken)], expect=2)
    assert f"{broken}: invalid manifest" in outputs["validate"] and "not valid YAML at line 7" in outputs["validate"]
    plan = json.loads(call("plan json", ["plan", str(good), "--format", "json"]))
    assert plan["sink"]["delivery"]["producer"]["ssl.key.pem"] == "**********"
    call("plan md", ["plan", str(good), "--format", "md"])
    call("plan broken", ["plan", str(broken)], expect=2)
    call("run text", ["run", str(good)])
    summary = json.loads(call("run json", ["run", str(good), "--format", "json"]))
    assert summary["status"] == "success"
    assert sorted(r["value"]["order_id"] for r in consume_all(bs, dst)) == [*range(6), 100]
    call("run failing preflight", ["run", str(no_topic), "--format", "json"], expect=None)
    call("run failing jdbc", ["run", str(sql)], expect=None)
    assert "cnry_missing_table" in outputs["run failing jdbc"]  # the JDBC error was reached and reported
    call("run broken", ["run", str(broken)], expect=2)
    call("state show", ["state", "show", str(good)])
    call("state show json", ["state", "show", str(good), "--format", "json"])
    runs = json.loads(call("runs list", ["runs", "list", str(good), "--format", "json"]))
    assert runs
    for run in runs:
        call(f"runs show {run['run_id']}", ["runs", "show", str(good), run["run_id"]])
    call("doctor", ["doctor", "--profile", "quick", "--connection-id", "cnry_src",
                    "--state-connection-id", "cnry_state"], expect=None)

    dagster = [sys.executable, "-m", "dagster"]
    produce_json(bs, src, [{"order_id": 200, "amount": 2.0}], partition=0)
    call("dagster materialize", ["asset", "materialize", "-m", "dpone_dagster.definitions", "--select", "cnry_good"],
         command=dagster)
    assert 200 in [r["value"]["order_id"] for r in consume_all(bs, dst)]
    (manifests / "cnry_broken.yaml").write_text(BROKEN_YAML)
    call("dagster load broken", ["definitions", "validate", "-m", "dpone_dagster.definitions"], expect=None,
         command=dagster)
    assert "not valid YAML at line 7" in outputs["dagster load broken"]

    # stdout / stderr of every command
    leaked = {label: leaks(text) for label, text in outputs.items() if leaks(text)}
    assert not leaked, leaked
    # every file the commands wrote: artifacts, local state, the Dagster instance (event log, runs and
    # their tags, compute logs); the manifests and the spy's own records are the test's inputs.
    scanned = 0
    for path in tmp_path.rglob("*"):
        if not path.is_file() or manifests in path.parents or spy in path.parents or path.parent == tmp_path:
            continue
        scanned += 1
        assert not leaks(path.read_bytes().decode("utf-8", "replace")), path
    assert scanned >= 5
    # the state store's tables
    import psycopg2

    with psycopg2.connect(**pg_database) as conn, conn.cursor() as cur:
        cur.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema = 'etl_state'")
        tables = cur.fetchall()
        assert tables
        for schema, table in tables:
            cur.execute(f'SELECT * FROM "{schema}"."{table}"')
            assert not leaks(repr(cur.fetchall())), table
    # the Dagster event log, read back through the instance
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        dumped = [repr(entry) for run in runs for entry in instance.all_logs(run.run_id)]
        dumped += [repr(run.tags) for run in runs]
        assert len(dumped) > 10
        assert not [leaks(text) for text in dumped if leaks(text)]
    # nor in what Spark's JVM and Python workers inherited
    assert_no_credentials_in_children(spy, [C["vault_token"], C["kafka_sasl_password"], C["state_dsn_password"]])
    assert records(spy, "client")
