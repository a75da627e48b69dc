"""Every client a run creates gets its connection's SASL / TLS / OAUTHBEARER settings.

Kafka: `dpone run` runs in its own process (and its own Spark JVM and Python workers) with a spy on
the real confluent-kafka clients on PYTHONPATH (tests/client_spy/sitecustomize.py): the
configuration each Producer, Consumer and AdminClient was created with is recorded in the driver
and in every Spark task, together with the topics each producer wrote to. The embedded broker
speaks no SASL, so the spy creates the real client without the security settings *after*
recording them; the assertions are on the recorded dicts, i.e. on what the project passed. TLS is
also tested for real, end to end, in tests/test_tls.py.

Schema Registry: a local HTTPS endpoint that requires a client certificate and a bearer token
stands in for the registry's REST API (no registry server is installable here); the real
confluent-kafka registry client, built by `schema.registry.registry_client` from the connection,
must pass TLS (CA, client certificate, encrypted key with its password) and the token.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import consume_all, create_topic, produce_json, unique_topic

from dpone_dagster.connections import KafkaConnection, resolve_kafka
from dpone_dagster.errors import ConfigError
from dpone_dagster.schema.registry import registry_client

REPO = Path(__file__).resolve().parents[1]
# `python -m` with this checkout first on PYTHONPATH: the CLI, Spark's Python workers and the spy
# all import this working tree's package.
DPONE = [sys.executable, "-m", "dpone_dagster.cli"]
SPY = Path(__file__).resolve().parent / "client_spy"

# --------------------------------------------------------------------------- spy harness


def spy_env(spy_dir: Path, connections: dict[str, dict[str, str]], **extra: str) -> dict[str, str]:
    """The environment of a `dpone` process: no inherited connection variables, the spy on."""
    prefixes = tuple(f"{cid.upper()}_" for cid in connections) + ("DPONE_CONN_", "KAFKA_CLUSTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    for cid, fields in connections.items():
        env.update({f"{cid.upper()}_{name.upper()}": value for name, value in fields.items()})
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SPY), str(REPO), env.get("PYTHONPATH", "")])),
        "DPONE_TEST_CLIENT_SPY_DIR": str(spy_dir),
        "DPONE_TEST_CLIENT_SPY_PLAINTEXT": "1",
        "DPONE_SPARK_MASTER": "local[2]",
        "PYSPARK_PYTHON": sys.executable,
        **extra,
    }


def dpone(args: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DPONE, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def records(spy_dir: Path, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(spy_dir.glob(f"{prefix}-*.json"))]


def driver_pid(spy_dir: Path) -> int:
    (driver,) = [p for p in records(spy_dir, "process") if "pyspark" not in p["argv"]]
    return int(driver["pid"])


def librdkafka_view(fields: dict[str, str]) -> dict[str, str]:
    """The librdkafka settings a connection with these fields must hand to every client."""
    return resolve_kafka_fields(fields).client_config()


def resolve_kafka_fields(fields: dict[str, str]) -> KafkaConnection:
    ref = type("Ref", (), {"connection_id": "probe", "connection_type": "params", "params": fields})()
    return resolve_kafka(ref)


# --------------------------------------------------------------------------- connections under test

SCRAM_MTLS = {  # source: SASL/SCRAM over TLS with a client certificate
    "bootstrap_servers": "",
    "client_id": "dpone-src",
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "svc-src",
    "sasl_password": "scram-pass-4711",
    "ssl_ca_location": "/etc/dpone/ca.pem",
    "ssl_certificate_location": "/etc/dpone/client.pem",
    "ssl_key_location": "/etc/dpone/client.key",
    "ssl_key_password": "key-pass-4712",
}
OAUTH_OIDC = {  # sink: SASL/OAUTHBEARER (OIDC client credentials) over TLS
    "bootstrap_servers": "",
    "client_id": "dpone-sink",
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "OAUTHBEARER",
    "sasl_oauthbearer_method": "oidc",
    "sasl_oauthbearer_client_id": "dpone-app",
    "sasl_oauthbearer_client_secret": "oidc-secret-4713",
    "sasl_oauthbearer_token_endpoint_url": "https://idp.example/oauth2/token",
    "sasl_oauthbearer_scope": "kafka",
    "ssl_ca_location": "/etc/dpone/ca.pem",
}
PLAIN = {  # replication source: SASL/PLAIN
    "bootstrap_servers": "",
    "client_id": "dpone-plain",
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "PLAIN",
    "sasl_username": "svc-plain",
    "sasl_password": "plain-pass-4714",
}
SSL_ONLY = {  # replication target: TLS with a client certificate, no SASL
    "bootstrap_servers": "",
    "client_id": "dpone-ssl",
    "security_protocol": "SSL",
    "ssl_ca_location": "/etc/dpone/ca.pem",
    "ssl_certificate_location": "/etc/dpone/client.pem",
    "ssl_key_location": "/etc/dpone/client.key",
    "ssl_key_password": "key-pass-4715",
}


def with_bootstrap(fields: dict[str, str], bootstrap: str) -> dict[str, str]:
    return {**fields, "bootstrap_servers": bootstrap}


def test_client_config_carries_every_security_setting() -> None:
    assert librdkafka_view(with_bootstrap(SCRAM_MTLS, "b:9093")) == {
        "bootstrap.servers": "b:9093",
        "client.id": "dpone-src",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "svc-src",
        "sasl.password": "scram-pass-4711",
        "ssl.ca.location": "/etc/dpone/ca.pem",
        "ssl.certificate.location": "/etc/dpone/client.pem",
        "ssl.key.location": "/etc/dpone/client.key",
        "ssl.key.password": "key-pass-4712",
    }
    assert librdkafka_view(with_bootstrap(OAUTH_OIDC, "b:9093")) == {
        "bootstrap.servers": "b:9093",
        "client.id": "dpone-sink",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "OAUTHBEARER",
        "ssl.ca.location": "/etc/dpone/ca.pem",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "dpone-app",
        "sasl.oauthbearer.client.secret": "oidc-secret-4713",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token",
        "sasl.oauthbearer.scope": "kafka",
    }


def test_security_settings_that_would_be_ignored_are_refused() -> None:
    for fields, expected in (
        ({**PLAIN, "security_protocol": "PLAINTEXT"}, "security_protocol is not SASL_SSL or SASL_PLAINTEXT"),
        ({**SSL_ONLY, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}, "security_protocol is not SSL"),
        ({**OAUTH_OIDC, "sasl_oauthbearer_client_secret": ""}, "oidc needs sasl_oauthbearer_client_secret"),
        ({**OAUTH_OIDC, "sasl_mechanism": "PLAIN"}, "sasl_mechanism is not OAUTHBEARER"),
    ):
        with pytest.raises(ConfigError) as info:
            resolve_kafka_fields(with_bootstrap(fields, "b:9093"))
        assert expected in str(info.value)
        for secret in ("plain-pass-4714", "key-pass-4715", "oidc-secret-4713"):
            assert secret not in str(info.value)


def assert_clients_carry(clients: list[dict[str, Any]], connections: dict[str, dict[str, str]]) -> None:
    """Every recorded client belongs to one of `connections` (by client.id) and carries all of its
    security settings, exactly."""
    expected = {fields["client_id"]: librdkafka_view(fields) for fields in connections.values()}
    assert clients
    for client in clients:
        config = client["config"]
        assert config.get("client.id") in expected, f"a {client['kind']} without a connection's settings: {config}"
        wanted = expected[config["client.id"]]
        security = {k: v for k, v in wanted.items() if k.startswith(("security.", "sasl.", "ssl."))}
        got = {k: v for k, v in config.items() if k.startswith(("security.", "sasl.", "ssl."))}
        assert got == security, f"{client['kind']} in pid {client['pid']}"


def test_every_client_of_a_kafka_run_gets_its_connections_security_settings(broker, tmp_path: Path) -> None:
    bs = broker.bootstrap_servers
    src, dst, dlq = unique_topic("sec_src"), unique_topic("sec_dst"), unique_topic("sec_dlq")
    create_topic(bs, src, 2)
    produce_json(bs, src, [{"order_id": i, "amount": i * 1.5} for i in range(8)], partition=0)
    produce_json(bs, src, [b"{not json"], partition=1)  # a bad record: the dead-letter producer runs
    produce_json(bs, src, [{"order_id": 100, "amount": 1.0}], partition=1)
    manifest = tmp_path / "sec.yaml"
    manifest.write_text(f"""
name: sec_k2k
source:
  type: kafka
  connection_id: sec_src
  topic: {src}
  options:
    schema: [{{name: order_id, type: long}}, {{name: amount, type: double}}]
    on_error: dead_letter
    dead_letter: {{topic: {dlq}, create: true}}
sink:
  type: kafka
  connection_id: sec_sink
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options: {{create_topic: {{enabled: true, partitions: 1}}}}
state: {{type: local, path: {tmp_path / 'state'}}}
""")
    connections = {"sec_src": with_bootstrap(SCRAM_MTLS, bs), "sec_sink": with_bootstrap(OAUTH_OIDC, bs)}
    spy_dir = tmp_path / "spy"
    spy_dir.mkdir()
    env = spy_env(spy_dir, connections, VAULT_TOKEN=VAULT_TOKEN)
    proc = dpone(["run", str(manifest), "--format", "json"], env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert sorted(r["value"]["order_id"] for r in consume_all(bs, dst)) == [*range(8), 100]
    assert_no_credentials_in_children(spy_dir, [VAULT_TOKEN, "scram-pass-4711", "key-pass-4712", "oidc-secret-4713"])
    assert len(consume_all_raw(bs, dlq)) == 1

    clients = records(spy_dir, "client")
    assert_clients_carry(clients, connections)
    driver = driver_pid(spy_dir)
    roles = {
        (c["kind"], c["pid"] == driver, c["config"]["client.id"], tuple(c["topics"])) for c in clients
    }
    assert ("Consumer", False, "dpone-src", ()) in roles  # the read tasks
    assert ("Producer", False, "dpone-sink", (dst,)) in roles  # the load tasks
    assert ("Producer", False, "dpone-sink", (dlq,)) in roles  # the dead-letter tasks
    assert ("AdminClient", True, "dpone-sink", ()) in roles  # sink / dead-letter topic preflight
    assert any(kind == "Consumer" and on_driver and cid == "dpone-src" for kind, on_driver, cid, _ in roles)


VAULT_TOKEN = "vault-token-4724"


def assert_no_credentials_in_children(spy_dir: Path, secrets: list[str]) -> None:
    """The Spark JVM (a Python daemon's parent) and every Python worker: neither the command line nor
    the environment holds a credential of the run's process."""
    processes = records(spy_dir, "process")
    children = [p for p in processes if "pyspark" in p["argv"]]
    assert children, "no Spark Python process was recorded"
    for child in children:
        # The parent is the JVM or the Python daemon (both children of the run's process).
        dump = json.dumps({k: child[k] for k in ("argv", "environ", "parent_cmdline")}) + child["parent_environ"]
        for secret in secrets:
            assert secret not in dump, f"a credential in the environment of pid {child['pid']}"


def consume_all_raw(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from conftest import consume_raw

    return consume_raw(bootstrap, topic)


def test_every_client_of_an_exactly_once_replication_gets_the_settings(broker, tmp_path: Path) -> None:
    bs = broker.bootstrap_servers
    src, dst, control = unique_topic("secr_src"), unique_topic("secr_dst"), unique_topic("secr_ctl")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 2)
    produce_json(bs, src, [{"n": i} for i in range(5)], partition=0, key="a")
    produce_json(bs, src, [{"n": i} for i in range(5, 8)], partition=1, key="b")
    manifest = tmp_path / "eos.yaml"
    manifest.write_text(f"""
name: sec_eos
source: {{type: kafka, connection_id: sec_plain, topic: {src}}}
sink:
  type: kafka
  connection_id: sec_ssl
  topic: {dst}
  strategy: {{mode: incremental_append}}
  options:
    delivery: {{mode: exactly_once}}
    replication:
      control_topic: {{name: {control}, commit_group: grp_{src}}}
state: {{type: kafka_control_topic}}
""")
    connections = {"sec_plain": with_bootstrap(PLAIN, bs), "sec_ssl": with_bootstrap(SSL_ONLY, bs)}
    spy_dir = tmp_path / "spy"
    spy_dir.mkdir()
    proc = dpone(["run", str(manifest), "--format", "json"], spy_env(spy_dir, connections))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert sorted(r["value"]["n"] for r in consume_all(bs, dst)) == list(range(8))

    clients = records(spy_dir, "client")
    assert_clients_carry(clients, connections)
    driver = driver_pid(spy_dir)
    roles = {(c["kind"], c["pid"] == driver, c["config"]["client.id"]) for c in clients}
    transactional = [c for c in clients if "transactional.id" in c["config"]]
    assert transactional and all(c["config"]["client.id"] == "dpone-ssl" for c in transactional)
    assert ("Consumer", False, "dpone-plain") in roles  # tasks read the source
    assert ("Producer", False, "dpone-ssl") in roles  # tasks write records + control offsets
    assert ("AdminClient", True, "dpone-ssl") in roles  # control topic set-up on the target cluster


# --------------------------------------------------------------------------- Schema Registry over TLS

TOKEN = "sr-bearer-4716"
OAUTH_TOKEN = "oauth-issued-4717"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate whose key is encrypted."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=dpone test CA", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "san.cnf", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-passout", "pass:client-key-4718", "-keyout", "client.key",
             "-out", "client.csr", "-subj", "/CN=dpone", cwd=d)
    _openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "client.pem", "-days", "2", cwd=d)
    return {name: d / name for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


class _Registry(BaseHTTPRequestHandler):
    """GET /subjects answers ["orders-value"] to a request with a valid bearer token; POST
    /oauth/token issues OAUTH_TOKEN for the client credentials dpone-app / sr-oauth-4719."""

    seen: list[dict[str, str]] = []

    def log_message(self, *args: Any) -> None:  # keep the test output clean
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        type(self).seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
        if self.headers.get("Authorization") not in (f"Bearer {TOKEN}", f"Bearer {OAUTH_TOKEN}"):
            self._send(401, {"error_code": 40101, "message": "unauthorized"})
        elif self.path.rstrip("/").endswith("/subjects") or self.path.startswith("/subjects"):
            self._send(200, ["orders-value"])
        else:
            self._send(404, {"error_code": 40401, "message": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode()
        type(self).seen.append({"path": self.path, "authorization": self.headers.get("Authorization", ""), "body": body})
        self._send(200, {"access_token": OAUTH_TOKEN, "token_type": "bearer", "expires_in": 3600})


def _https_server(pki: dict[str, Path], mutual: bool) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["server.pem"], pki["server.key"])
    if mutual:  # no client certificate, no handshake
        context.load_verify_locations(pki["ca.pem"])
        context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def tls_registry(pki: dict[str, Path]) -> Iterator[str]:
    yield from _https_server(pki, mutual=True)


@pytest.fixture(scope="module")
def token_endpoint(pki: dict[str, Path]) -> Iterator[str]:
    """The identity provider: server TLS only (it knows nothing of the registry's client certificates)."""
    yield from _https_server(pki, mutual=False)


def registry_connection(url: str, pki: dict[str, Path], **fields: str) -> KafkaConnection:
    return KafkaConnection(
        bootstrap_servers="b:9092",
        schema_registry_url=url,
        schema_registry_ssl_ca_location=str(pki["ca.pem"]),
        schema_registry_ssl_certificate_location=str(pki["client.pem"]),
        schema_registry_ssl_key_location=str(pki["client.key"]),
        schema_registry_ssl_key_password="client-key-4718",
        **fields,
    )


def test_registry_client_speaks_mutual_tls_with_an_encrypted_key_and_a_bearer_token(tls_registry, pki) -> None:
    connection = registry_connection(tls_registry, pki, schema_registry_bearer_token=TOKEN)
    config = connection.schema_registry_config()
    assert config == {
        "url": tls_registry,
        "ssl.ca.location": str(pki["ca.pem"]),
        "ssl.certificate.location": str(pki["client.pem"]),
        "ssl.key.location": str(pki["client.key"]),
        "ssl.key.password": "client-key-4718",
        "bearer.auth.credentials.source": "STATIC_TOKEN",
        "bearer.auth.token": TOKEN,
        "bearer.auth.logical.cluster": "",
        "bearer.auth.identity.pool.id": "",
    }
    _Registry.seen.clear()
    assert registry_client(config).get_subjects() == ["orders-value"]
    assert _Registry.seen[-1]["authorization"] == f"Bearer {TOKEN}"
    assert "client-key-4718" not in repr(connection) and TOKEN not in repr(connection)


def test_registry_client_fetches_an_oauth_token_with_client_credentials(tls_registry, token_endpoint, pki) -> None:
    connection = registry_connection(
        tls_registry,
        pki,
        schema_registry_oauth_client_id="dpone-app",
        schema_registry_oauth_client_secret="sr-oauth-4719",
        schema_registry_oauth_scope="registry",
        schema_registry_oauth_token_endpoint_url=f"{token_endpoint}/oauth/token",
    )
    _Registry.seen.clear()
    # authlib's own HTTP client fetches the token; it trusts the test CA through SSL_CERT_FILE.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", str(pki["ca.pem"]))
        assert registry_client(connection.schema_registry_config()).get_subjects() == ["orders-value"]
    token_requests = [s for s in _Registry.seen if s["path"] == "/oauth/token"]
    assert token_requests and "grant_type=client_credentials" in token_requests[0]["body"]
    assert _Registry.seen[-1]["authorization"] == f"Bearer {OAUTH_TOKEN}"


def test_registry_tls_failures_are_clear_and_never_show_the_key_password(tls_registry, pki) -> None:
    wrong = KafkaConnection(
        bootstrap_servers="b:9092",
        schema_registry_url=tls_registry,
        schema_registry_ssl_ca_location=str(pki["ca.pem"]),
        schema_registry_ssl_certificate_location=str(pki["client.pem"]),
        schema_registry_ssl_key_location=str(pki["client.key"]),
        schema_registry_ssl_key_password="wrong-key-4720",
        schema_registry_bearer_token=TOKEN,
    )
    with pytest.raises(ConfigError) as info:
        registry_client(wrong.schema_registry_config())
    assert "schema registry TLS: cannot load" in str(info.value)
    assert "wrong-key-4720" not in str(info.value)
    # Without a client certificate the server refuses the handshake.
    anonymous = KafkaConnection(
        bootstrap_servers="b:9092",
        schema_registry_url=tls_registry,
        schema_registry_ssl_ca_location=str(pki["ca.pem"]),
        schema_registry_bearer_token=TOKEN,
    )
    with pytest.raises(Exception) as refused:
        registry_client(anonymous.schema_registry_config()).get_subjects()
    assert "ssl" in type(refused.value).__name__.lower() or "ssl" in str(refused.value).lower() or "connect" in str(refused.value).lower()


def test_registry_settings_that_would_be_ignored_are_refused(pki) -> None:
    for fields, expected in (
        ({"schema_registry_url": "http://sr:8081", "schema_registry_ssl_ca_location": "/ca.pem"}, "is http://"),
        ({"schema_registry_url": "https://sr", "schema_registry_ssl_key_location": "/k"}, "needs schema_registry_ssl_certificate_location"),
        (
            {"schema_registry_url": "https://sr", "schema_registry_username": "u", "schema_registry_password": "p-4721",
             "schema_registry_bearer_token": "t-4722"},
            "choose one Schema Registry authentication",
        ),
        ({"schema_registry_url": "https://sr", "schema_registry_oauth_client_id": "c"}, "set without"),
        ({"schema_registry_bearer_token": "t-4722"}, "without schema_registry_url"),
    ):
        with pytest.raises(ConfigError) as info:
            resolve_kafka_fields({"bootstrap_servers": "b:9092", **fields})
        assert expected in str(info.value)
        assert "p-4721" not in str(info.value) and "t-4722" not in str(info.value)


def test_registry_transport_errors_never_show_url_credentials() -> None:
    from dpone_dagster.schema.registry import registry_errors

    config = {"url": "http://sr-user:url-pw-4725@127.0.0.1:9"}  # nothing listens on port 9
    with pytest.raises(ConfigError) as info, registry_errors(config):
        registry_client(config).get_subjects()
    assert "127.0.0.1:9" in str(info.value)
    assert "url-pw-4725" not in str(info.value)
