"""The frozen pydantic base of the connection models: registers every secret it holds with
`dpone_dagster.redact.SECRETS` and never shows one in repr, str or describe()."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SecretStr

from dpone_dagster.redact import MASK, SECRETS, is_secret_key, redact, url_passwords


def reveal(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def as_setting(value: Any) -> str:
    """A pass-through setting as the string librdkafka / JDBC expect (YAML true -> "true")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class ConnectionModel(BaseModel):
    # hide_input_in_errors: a ValidationError raised by direct construction must not quote a secret.
    model_config = ConfigDict(
        extra="forbid", frozen=True, coerce_numbers_to_str=True, hide_input_in_errors=True
    )
    # Fields holding a URI / DSN that may embed a password: shown with only that password masked.
    _url_fields: ClassVar[tuple[str, ...]] = ()
    _kind: ClassVar[str] = ""

    def model_post_init(self, context: Any, /) -> None:
        # Registered on construction, so every secret this process ever held can be scrubbed from logs.
        SECRETS.add(*self._secret_values())

    def _secret_values(self) -> list[str]:
        values: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            raw = value.get_secret_value() if isinstance(value, SecretStr) else value
            if name in self._url_fields and isinstance(raw, str):
                values += url_passwords(raw)
            elif isinstance(value, SecretStr):
                values.append(raw)
            elif isinstance(value, dict):
                values += [as_setting(v) for k, v in value.items() if is_secret_key(k)]
        return [v for v in values if v]

    def describe(self) -> dict[str, Any]:
        """Every field, with secrets masked: safe for plans, metadata and logs."""
        secrets = self._secret_values()
        summary: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                raw = value.get_secret_value()
                summary[name] = redact(raw, secrets) if name in self._url_fields else (MASK if raw else None)
            elif isinstance(value, dict):
                summary[name] = {
                    k: MASK if is_secret_key(k) else redact(as_setting(v), secrets) for k, v in value.items()
                }
            elif isinstance(value, str):
                summary[name] = redact(value, secrets)
            else:
                summary[name] = value
        return summary

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # pydantic builds both repr() and str() from this.
        return list(self.describe().items())
