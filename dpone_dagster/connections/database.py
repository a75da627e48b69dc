"""The database connection models: the Postgres state store and JDBC SQL sources."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, SecretStr, field_validator, model_validator

from dpone_dagster.connections.base import ConnectionModel, as_setting


class PostgresConnection(ConnectionModel):
    """A PostgreSQL database (the state store): discrete fields or a libpq `dsn`."""

    _url_fields: ClassVar[tuple[str, ...]] = ("dsn",)
    _kind: ClassVar[str] = "Postgres"

    host: str = "127.0.0.1"
    port: int = Field(default=5432, gt=0, lt=65536)
    user: str | None = None
    password: SecretStr | None = None
    database: str | None = None
    dsn: SecretStr | None = None

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for psycopg2.connect."""
        pairs = (
            ("host", "host"),
            ("port", "port"),
            ("user", "user"),
            ("password", "password"),
            ("dbname", "database"),
        )
        if self.dsn is None:
            chosen = pairs
        else:
            # psycopg2 lets keywords override the DSN: pass only fields set explicitly, never defaults.
            chosen = tuple(pair for pair in pairs if pair[1] in self.model_fields_set)
        kwargs: dict[str, Any] = {} if self.dsn is None else {"dsn": self.dsn.get_secret_value()}
        for keyword, field in chosen:
            value = getattr(self, field)
            if value is not None:
                kwargs[keyword] = value.get_secret_value() if isinstance(value, SecretStr) else value
        return kwargs


class JdbcConnection(ConnectionModel):
    """A SQL source reached over JDBC (mssql, postgres, mysql)."""

    _url_fields: ClassVar[tuple[str, ...]] = ("jdbc_url",)
    _kind: ClassVar[str] = "JDBC"

    host: str | None = None
    port: int | None = Field(default=None, gt=0, lt=65536)
    user: str | None = None
    password: SecretStr | None = None
    database: str | None = None
    jdbc_url: str | None = None
    driver: str | None = None
    # JDBC driver properties (encrypt, trustServerCertificate, ...).
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("properties", mode="before")
    @classmethod
    def _properties_as_strings(cls, value: Any) -> Any:
        return {str(k): as_setting(v) for k, v in value.items()} if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _reachable(self) -> JdbcConnection:
        if not self.host and not self.jdbc_url:
            raise ValueError("either host or jdbc_url must be set")
        return self
