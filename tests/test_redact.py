"""The one redaction of everything that leaves the process (dpone_dagster.redact), the YAML error
that never quotes the source, the plan's masking and what child processes inherit (child_env).

Pure functions: no broker, Spark or database.
"""

from __future__ import annotations

import json

import pytest

from dpone_dagster.child_env import child_environ, withheld_from_children
from dpone_dagster.manifest.loader import ManifestError, parse_manifest
from dpone_dagster.redact import MASK, SECRETS, is_secret_key, redact_mapping, redact_text


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "sasl.password",
        "sasl_password",
        "SASL-PASSWORD",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
        "sasl.jaas.config",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.extensions",
        "basic.auth.user.info",
        "bearer.auth.token",
        "schema_registry_bearer_token",
        "trustStorePassword",
        "VAULT_TOKEN",
    ],
)
def test_credential_names(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        "ssl.key.location",
        "ssl.ca.location",
        "sasl.oauthbearer.token.endpoint.url",
        "sasl.oauthbearer.scope",
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.method",
        "password_env_var",
        "bootstrap.servers",
        "socket.timeout.ms",
    ],
)
def test_names_that_are_not_credentials(name: str) -> None:
    assert not is_secret_key(name)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("bootstrap SASL_SSL://svc:url-pw-5101@b1:9093,b2:9093", "url-pw-5101"),
        ("registry https://sr-user:sr-pw-5102@sr.example:8081/subjects", "sr-pw-5102"),
        ("jdbc:postgresql://h:5432/db?user=u&password=jdbc-pw-5103&ssl=true", "jdbc-pw-5103"),
        ("jdbc:sqlserver://h:1433;databaseName=d;user=u;password=mssql-pw-5104;encrypt=true", "mssql-pw-5104"),
        ("host=pg port=5432 password='dsn pw 5105' user=u", "dsn pw 5105"),
        ("postgresql://u:p%40ss-5106@h/db", "p%40ss-5106"),
        ("ssl.key.pem=-----BEGIN PRIVATE KEY-----\nMIIpem5107\n-----END PRIVATE KEY-----", "MIIpem5107"),
        ("{'sasl.oauthbearer.config': 'clientSecret=oauth-5108 scope=a'}", "oauth-5108"),
        ('{"sasl.password": "json-5109"}', "json-5109"),
        ("sasl.jaas.config=org.apache.kafka.PlainLoginModule required password=jaas-5110;", "jaas-5110"),
        ("Authorization: Bearer tok5111abcdef", "tok5111abcdef"),
        ("basic.auth.user.info: sr:basic-5112", "basic-5112"),
    ],
)
def test_credentials_by_shape_are_masked(text: str, secret: str) -> None:
    """A credential the process never resolved (a client's error echoing its configuration)."""
    masked = redact_text(text)
    assert secret not in masked and MASK in masked


def test_known_values_are_masked_without_their_names() -> None:
    SECRETS.add("known-5113 value", "ab")  # two characters: too short to mask blindly
    try:
        assert redact_text("failed for known-5113 value at known-5113%20value") == f"failed for {MASK} at {MASK}"
        assert redact_text("tab stop") == "tab stop"
    finally:
        SECRETS.clear()


def test_ordinary_text_is_kept() -> None:
    for text in (
        "/work/dpone_dagster/spark/kafka_reader.py line 12",
        "token bucket refilled; bearer tokens are supported",
        "https://sr.example:8081/subjects/orders-value/versions",
        "sasl.oauthbearer.scope=kafka ssl.key.location=/etc/client.key",
    ):
        assert redact_text(text) == text


def test_redact_mapping_masks_credential_names_and_strings() -> None:
    settings = {
        "bootstrap.servers": "SASL_SSL://svc:map-5114@b:9093",
        "ssl.key.pem": "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----",
        "sasl.oauthbearer.config": "clientSecret=map-5115",
        "ssl.key.password": "map-5116",
        "ssl.key.location": "/etc/client.key",
        "nested": [{"password": "map-5117", "linger.ms": 5}],
        "empty.password": None,
    }
    masked = redact_mapping(settings)
    assert masked == {
        "bootstrap.servers": f"SASL_SSL://svc:{MASK}@b:9093",
        "ssl.key.pem": MASK,
        "sasl.oauthbearer.config": MASK,
        "ssl.key.password": MASK,
        "ssl.key.location": "/etc/client.key",
        "nested": [{"password": MASK, "linger.ms": 5}],
        "empty.password": None,
    }


# --------------------------------------------------------------------------- YAML errors

INLINE = "inline-yaml-5118"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        # an unclosed flow mapping on the line that holds the password
        (f"name: x\nsource:\n  type: kafka\n  params: {{password: {INLINE}, user: u\nsink: {{}}\n", "line 5, column 5"),
        (f"name: x\nsource: [a, b\n  password: {INLINE}\n", "line 3, column 11"),
        (f"name: x\n\tpassword: {INLINE}\n", "line 2, column 1"),
        (f"name: 'x\npassword: {INLINE}\n", "line 3, column 1"),
        (f"a: b\n  password: {INLINE}: x\n", "line 2, column 11"),
    ],
)
def test_yaml_error_names_file_line_column_never_the_source(text: str, where: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, source="manifests/broken.yaml")
    message = str(info.value)
    assert message.startswith("manifests/broken.yaml: invalid manifest (1 problem(s)):")
    assert f"not valid YAML at {where}: " in message
    assert "Fix: correct the YAML syntax there" in message
    assert INLINE not in message and "password" not in message
    # Nothing chained either: a traceback would print the parser's own text.
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_yaml_error_with_a_bad_character_gives_the_position() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(f"name: x\x07 password: {INLINE}\n", source="m.yaml")
    assert "not valid YAML at byte 7: unacceptable character #x0007" in str(info.value)
    assert INLINE not in str(info.value)


# --------------------------------------------------------------------------- child processes


def test_child_environment_keeps_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    SECRETS.add("resolved-5119")
    try:
        environ = {
            "PATH": "/usr/bin",
            "HOME": "/root",
            "PYSPARK_PYTHON": "/venv/bin/python",
            "VAULT_TOKEN": "vault-5120",
            "VAULT_ADDR": "https://vault.example:8200",
            "DPONE_CONN_KAFKA_CLUSTER_BOOTSTRAP_SERVERS": "b:9092",
            "KAFKA_CLUSTER_SASL_PASSWORD": "env-5121",
            "AIRFLOW_CONN_DWH": "postgresql://u:airflow-5122@h/db",
            "SOME_URL": "https://u:url-5123@h",
            "INNOCENT_NAME": "resolved-5119",
            "AWS_SECRET_ACCESS_KEY": "aws-5124",
        }
        kept = child_environ(environ)
        assert kept == {"PATH": "/usr/bin", "HOME": "/root", "PYSPARK_PYTHON": "/venv/bin/python",
                        "VAULT_ADDR": "https://vault.example:8200"}
        # A child that needs one gets it by name; VAULT_TOKEN never.
        monkeypatch.setenv("DPONE_CHILD_ENV_KEEP", "AWS_SECRET_ACCESS_KEY,VAULT_TOKEN")
        kept = child_environ(environ)
        assert kept["AWS_SECRET_ACCESS_KEY"] == "aws-5124" and "VAULT_TOKEN" not in kept
    finally:
        SECRETS.clear()


def test_withheld_variables_come_back_after_the_block() -> None:
    environ = {"PATH": "/usr/bin", "VAULT_TOKEN": "vault-5125", "X_PASSWORD": "x-5126"}
    with withheld_from_children(environ):
        assert environ == {"PATH": "/usr/bin"}
    assert environ == {"PATH": "/usr/bin", "VAULT_TOKEN": "vault-5125", "X_PASSWORD": "x-5126"}
    assert json.dumps(environ)  # still a plain mapping


def test_json_output_stays_json() -> None:
    document = {"token_count": 5, "ttl_seconds_token": 1.5, "sasl.password": "json-5127", "secret_rows": None}
    masked = json.loads(redact_text(json.dumps(document)))
    assert masked == {"token_count": 5, "ttl_seconds_token": 1.5, "sasl.password": MASK, "secret_rows": None}
    # outside JSON a bare number is still a credential's value (password=123456 in a DSN)
    assert redact_text("host=h password=123456") == f"host=h password={MASK}"
