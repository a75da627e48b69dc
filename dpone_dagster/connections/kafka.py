"""The Kafka connection model: librdkafka client settings and the Schema Registry client's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from dpone_dagster.connections.base import ConnectionModel, as_setting, reveal

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]

# librdkafka property -> KafkaConnection field, in client_config() order. "sasl.mechanism" is
# librdkafka's alias of "sasl.mechanisms"; both are accepted in input, only the canonical is emitted.
_KAFKA_CLIENT_KEYS = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
}
# Typed since TLS client certificates and OAUTHBEARER joined; the same names may still come as raw
# librdkafka settings when the typed field is unset.
_KAFKA_TLS_OAUTH_KEYS = {
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.key.password": "ssl_key_password",
    "ssl.endpoint.identification.algorithm": "ssl_endpoint_identification_algorithm",
    "sasl.oauthbearer.method": "sasl_oauthbearer_method",
    "sasl.oauthbearer.client.id": "sasl_oauthbearer_client_id",
    "sasl.oauthbearer.client.secret": "sasl_oauthbearer_client_secret",
    "sasl.oauthbearer.token.endpoint.url": "sasl_oauthbearer_token_endpoint_url",
    "sasl.oauthbearer.scope": "sasl_oauthbearer_scope",
    "sasl.oauthbearer.extensions": "sasl_oauthbearer_extensions",
    "sasl.oauthbearer.config": "sasl_oauthbearer_config",
}
KAFKA_TYPED_KEYS = {**_KAFKA_CLIENT_KEYS, "sasl.mechanism": "sasl_mechanism", **_KAFKA_TLS_OAUTH_KEYS}
_OIDC_FIELDS = ("sasl_oauthbearer_client_id", "sasl_oauthbearer_client_secret", "sasl_oauthbearer_token_endpoint_url")
_REGISTRY_OAUTH_FIELDS = (
    "schema_registry_oauth_client_id",
    "schema_registry_oauth_client_secret",
    "schema_registry_oauth_token_endpoint_url",
)
# Schema Registry client settings (confluent_kafka.schema_registry) -> KafkaConnection field.
# ssl.key.password is not a setting of that client: schema.registry.registry_client applies it.
_REGISTRY_TLS_KEYS = {
    "ssl.ca.location": "schema_registry_ssl_ca_location",
    "ssl.certificate.location": "schema_registry_ssl_certificate_location",
    "ssl.key.location": "schema_registry_ssl_key_location",
    "ssl.key.password": "schema_registry_ssl_key_password",
}


class KafkaConnection(ConnectionModel):
    """A Kafka cluster (and optionally its schema registry)."""

    _url_fields: ClassVar[tuple[str, ...]] = ("bootstrap_servers", "schema_registry_url")
    _kind: ClassVar[str] = "Kafka"

    bootstrap_servers: str = Field(min_length=1)
    security_protocol: SecurityProtocol | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    ssl_endpoint_identification_algorithm: str | None = None
    sasl_oauthbearer_method: str | None = None
    sasl_oauthbearer_client_id: str | None = None
    sasl_oauthbearer_client_secret: SecretStr | None = None
    sasl_oauthbearer_token_endpoint_url: str | None = None
    sasl_oauthbearer_scope: str | None = None
    sasl_oauthbearer_extensions: SecretStr | None = None
    sasl_oauthbearer_config: SecretStr | None = None
    client_id: str = "dpone"
    schema_registry_url: str | None = None
    schema_registry_username: str | None = None
    schema_registry_password: SecretStr | None = None
    schema_registry_ssl_ca_location: str | None = None
    schema_registry_ssl_certificate_location: str | None = None
    schema_registry_ssl_key_location: str | None = None
    schema_registry_ssl_key_password: SecretStr | None = None
    schema_registry_bearer_token: SecretStr | None = None
    schema_registry_oauth_client_id: str | None = None
    schema_registry_oauth_client_secret: SecretStr | None = None
    schema_registry_oauth_scope: str | None = None
    schema_registry_oauth_token_endpoint_url: str | None = None
    schema_registry_logical_cluster: str | None = None
    schema_registry_identity_pool_id: str | None = None
    # Raw librdkafka settings passed through unchanged.
    librdkafka: dict[str, str] = Field(default_factory=dict)

    @field_validator("security_protocol", mode="before")
    @classmethod
    def _upper_protocol(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("librdkafka", mode="before")
    @classmethod
    def _settings_as_strings(cls, value: Any) -> Any:
        return {str(k): as_setting(v) for k, v in value.items()} if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConnection:
        protocol = self.security_protocol or ""
        if (self.sasl_username is None) != (self.sasl_password is None):
            raise ValueError("sasl_username and sasl_password must be set together")
        if self.sasl_username is not None and not protocol.startswith("SASL_"):
            # librdkafka would ignore the credentials and connect without authenticating.
            raise ValueError(
                "SASL credentials are set but security_protocol is not SASL_SSL or SASL_PLAINTEXT"
            )
        oauth = [name for name in _KAFKA_TLS_OAUTH_KEYS.values() if "oauthbearer" in name and getattr(self, name)]
        if oauth and (self.sasl_mechanism or "").upper() != "OAUTHBEARER":
            raise ValueError(f"{', '.join(oauth)} set but sasl_mechanism is not OAUTHBEARER")
        if (self.sasl_oauthbearer_method or "").lower() == "oidc":
            missing = [name for name in _OIDC_FIELDS if not getattr(self, name)]
            if missing:
                raise ValueError(f"sasl_oauthbearer_method oidc needs {', '.join(missing)}")
        if (self.sasl_mechanism or "").upper() == "OAUTHBEARER" and not protocol.startswith("SASL_"):
            raise ValueError("sasl_mechanism OAUTHBEARER needs security_protocol SASL_SSL or SASL_PLAINTEXT")
        client_tls = [
            name for name in ("ssl_certificate_location", "ssl_key_location", "ssl_key_password") if getattr(self, name)
        ]
        if client_tls and not protocol.endswith("SSL"):
            # librdkafka would connect in plain text and never present the certificate.
            raise ValueError(f"{', '.join(client_tls)} set but security_protocol is not SSL or SASL_SSL")
        raw_duplicates = {key for key, field in _KAFKA_TLS_OAUTH_KEYS.items() if getattr(self, field) is not None}
        duplicated = sorted(set(self.librdkafka) & ((set(KAFKA_TYPED_KEYS) - set(_KAFKA_TLS_OAUTH_KEYS)) | raw_duplicates))
        if duplicated:
            fields = ", ".join(KAFKA_TYPED_KEYS[key] for key in duplicated)
            raise ValueError(
                f"librdkafka setting(s) {', '.join(duplicated)} duplicate typed fields: set {fields} instead"
            )
        self._check_registry()
        return self

    def _check_registry(self) -> None:
        if (self.schema_registry_username is None) != (self.schema_registry_password is None):
            raise ValueError("schema_registry_username and schema_registry_password must be set together")
        oauth = [name for name in _REGISTRY_OAUTH_FIELDS if getattr(self, name)]
        if oauth and len(oauth) != len(_REGISTRY_OAUTH_FIELDS):
            missing = [name for name in _REGISTRY_OAUTH_FIELDS if name not in oauth]
            raise ValueError(f"{', '.join(oauth)} set without {', '.join(missing)}")
        schemes = [
            label
            for label, present in (
                ("schema_registry_username/password (basic)", self.schema_registry_username is not None),
                ("schema_registry_bearer_token", self.schema_registry_bearer_token is not None),
                ("schema_registry_oauth_* (OAuth client credentials)", bool(oauth)),
            )
            if present
        ]
        if len(schemes) > 1:
            # The registry client sends one Authorization header; the others would be dropped silently.
            raise ValueError(f"choose one Schema Registry authentication: {' or '.join(schemes)}")
        if self.schema_registry_ssl_key_location and not self.schema_registry_ssl_certificate_location:
            raise ValueError("schema_registry_ssl_key_location needs schema_registry_ssl_certificate_location")
        if self.schema_registry_ssl_key_password is not None and not self.schema_registry_ssl_certificate_location:
            raise ValueError("schema_registry_ssl_key_password needs schema_registry_ssl_certificate_location")
        tls = [name for name in _REGISTRY_TLS_KEYS.values() if getattr(self, name)]
        url = (self.schema_registry_url or "").lower()
        if (tls or schemes) and not url:
            raise ValueError(f"{', '.join(tls + schemes)} set without schema_registry_url")
        if tls and url.startswith("http://"):
            raise ValueError(f"{', '.join(tls)} set but schema_registry_url is http://, not https://")

    def client_config(self) -> dict[str, str]:
        """The librdkafka configuration (confluent_kafka Producer/Consumer/AdminClient conf)."""
        config: dict[str, str] = {}
        for key, field in {**_KAFKA_CLIENT_KEYS, **_KAFKA_TLS_OAUTH_KEYS}.items():
            value = getattr(self, field)
            if value is not None:
                config[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        return {**config, **self.librdkafka}

    def schema_registry_config(self) -> dict[str, str] | None:
        """Settings for `schema.registry.registry_client` (confluent_kafka's SchemaRegistryClient conf,
        plus ssl.key.password), or None without a registry URL."""
        if not self.schema_registry_url:
            return None
        config = {"url": self.schema_registry_url}
        if self.schema_registry_username is not None:
            config["basic.auth.user.info"] = (
                f"{self.schema_registry_username}:{reveal(self.schema_registry_password)}"
            )
        for key, field in _REGISTRY_TLS_KEYS.items():
            value = getattr(self, field)
            if value is not None:
                config[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        if self.schema_registry_bearer_token is not None:
            config["bearer.auth.credentials.source"] = "STATIC_TOKEN"
            config["bearer.auth.token"] = self.schema_registry_bearer_token.get_secret_value()
        elif self.schema_registry_oauth_client_id:
            config["bearer.auth.credentials.source"] = "OAUTHBEARER"
            config["bearer.auth.client.id"] = self.schema_registry_oauth_client_id
            config["bearer.auth.client.secret"] = reveal(self.schema_registry_oauth_client_secret) or ""
            config["bearer.auth.scope"] = self.schema_registry_oauth_scope or ""
            config["bearer.auth.issuer.endpoint.url"] = self.schema_registry_oauth_token_endpoint_url or ""
        if "bearer.auth.credentials.source" in config:
            # Confluent Cloud routing headers; the client requires both keys, other registries ignore them.
            config["bearer.auth.logical.cluster"] = self.schema_registry_logical_cluster or ""
            config["bearer.auth.identity.pool.id"] = self.schema_registry_identity_pool_id or ""
        return config
