"""The one redaction of text and settings that leave the process.

Everything the project prints, logs, renders into a plan, writes into a run artifact or hands to
Dagster as metadata, tags or failure descriptions passes through `redact_text` (text) or
`redact_mapping` (settings). Both mask, with `MASK`:

- every secret value a connection of this process resolved (`SECRETS`, filled by the connection
  models and the Vault reader), raw and percent-encoded;
- values of settings whose *name* says they are a credential (`is_secret_key`: password, secret,
  token, ssl.key.pem, ssl.key.password, sasl.jaas.config, sasl.oauthbearer.config,
  basic.auth.user.info, ...), whether written `key=value`, `key: value` or as JSON / a Python repr;
- credentials inside URLs and DSNs: `user:password@` in bootstrap, registry and JDBC URLs, and
  `password=...` in libpq DSNs and JDBC URL properties;
- bearer / basic authorization values and inline PEM private keys.

Name- and shape-based masking catches a credential the process never resolved itself (a
librdkafka, JDBC or HTTP error echoing its configuration); the value registry catches a secret
that appears without its name.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus, unquote

__all__ = [
    "MASK",
    "SECRETS",
    "SecretRedactor",
    "is_secret_key",
    "redact",
    "redact_mapping",
    "redact_text",
    "url_passwords",
]

MASK = "**********"

# Words that make a setting's name a credential, matched against the name lower-cased with `_`
# and `-` read as `.` (so sasl_password, SASL-PASSWORD and sasl.password are one name).
_SECRET_WORDS = (
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "credential",
    "jaas",
    "key.pem",
    "private.key",
    "oauthbearer.config",
    "oauthbearer.extensions",
    "user.info",
    "apikey",
    "api.key",
    "authorization",
)
# A name ending like this holds where a credential is, not the credential (a path, a URL - whose own
# userinfo is masked by shape - or the name of an environment variable).
_REFERENCE_SUFFIXES = (".location", ".url", ".uri", ".endpoint", ".file", ".path", ".env.var", ".env")


def _normal(name: str) -> str:
    return re.sub(r"[_\-]", ".", name.lower())


def is_secret_key(name: str) -> bool:
    """Whether a setting called `name` holds a credential (its value is never shown)."""
    normal = _normal(str(name))
    if normal.endswith(_REFERENCE_SUFFIXES):
        return False
    return any(word in normal for word in _SECRET_WORDS)


# --------------------------------------------------------------------------- known values


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret, and its percent-encoded forms (URIs, DSNs), with MASK."""
    # Longest first, so a secret that contains a shorter one is masked whole.
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        for form in dict.fromkeys((secret, quote(secret, safe=""), quote_plus(secret))):
            text = text.replace(form, MASK)
    return text


class SecretRedactor:
    """A thread-safe set of secret values to scrub from text; its repr shows only a count."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, *secrets: str | None) -> None:
        with self._lock:
            # One- and two-character values would mask unrelated text everywhere; their shape
            # (name, URL, DSN) still masks them.
            self._secrets.update(s for s in secrets if s and len(s) > 2)

    def redact(self, text: str) -> str:
        with self._lock:
            secrets = tuple(self._secrets)
        return redact(text, secrets)

    def clear(self) -> None:
        with self._lock:
            self._secrets.clear()

    def __len__(self) -> int:
        return len(self._secrets)

    def __repr__(self) -> str:
        return f"SecretRedactor({len(self)} secrets)"


# Every connection model adds its secrets here when it is built (and the Vault reader its token).
SECRETS = SecretRedactor()


# --------------------------------------------------------------------------- shapes

_KEY_CHARS = r"[A-Za-z0-9_.\-]"
_WORD_PATTERNS = "|".join(re.escape(word).replace(r"\.", "[._-]") for word in _SECRET_WORDS)
_SECRET_NAME = rf"{_KEY_CHARS}*(?:{_WORD_PATTERNS}){_KEY_CHARS}*"
_QUOTED = r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'"
# name, then = or : (optionally after a closing quote of a JSON/repr key), then the value: quoted,
# or up to a separator of URLs, DSNs, JDBC properties, JSON and reprs.
_KEY_VALUE = re.compile(
    rf"(?i)(?<![A-Za-z0-9_.\-])(?P<name>{_SECRET_NAME})(?P<sep>[\"']?\s*[:=]\s*)"
    rf"(?P<value>{_QUOTED}|[^\s,;&\"'}}\])]+)"
)
# scheme://user:password@ (bootstrap lists, registry URLs, JDBC and libpq URIs).
_USERINFO = re.compile(r"(?i)(?P<head>\b[a-z][a-z0-9+._\-]*://[^\s/:@\"']*:)(?P<value>[^\s/@\"']*)@")
# An Authorization header's value, and a bearer token in prose (a token has a digit; "bearer tokens" has none).
_AUTH_HEADER = re.compile(
    r"(?i)(?P<head>\bauthorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic)|\bbearer)(?P<sep>\s+)"
    r"(?P<value>(?=[A-Za-z0-9._~+/=\-]*\d)[A-Za-z0-9._~+/=\-]{8,})"
)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN (?P<kind>[A-Z ]*PRIVATE KEY)-----.*?(?:-----END (?P=kind)-----|$)", re.DOTALL
)


def _mask_key_value(match: re.Match[str]) -> str:
    name, value = match.group("name"), match.group("value")
    if not is_secret_key(name) or value.lower() in ("null", "none", "true", "false", '""', "''"):
        return match.group(0)
    if value[:1] in "\"'":
        return f"{name}{match.group('sep')}{value[0]}{MASK}{value[0]}"
    if match.group("sep")[:1] in "\"'" and _NUMBER.fullmatch(value):
        # A quoted key with a bare number is JSON or a repr (a count, a TTL): masking it would break
        # the document, and every secret a connection holds is a string, hence quoted there.
        return match.group(0)
    return f"{name}{match.group('sep')}{MASK}"


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _mask_shapes(text: str) -> str:
    text = _PRIVATE_KEY.sub(MASK, text)
    text = _USERINFO.sub(lambda m: f"{m.group('head')}{MASK}@", text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group('head')}{m.group('sep')}{MASK}", text)
    return _KEY_VALUE.sub(_mask_key_value, text)


def redact_text(text: str, extra_secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret, `extra_secrets`, credential-named value and URL/DSN
    credential masked: the function every output of the process goes through."""
    text = redact(str(text), extra_secrets)
    return _mask_shapes(SECRETS.redact(text))


def redact_mapping(value: Any) -> Any:
    """A copy of a settings tree with credential-named values masked and every string redacted
    (plans, metadata, run records); keys, numbers and booleans are kept."""
    if isinstance(value, Mapping):
        return {
            key: (MASK if value[key] not in (None, "") else value[key])
            if is_secret_key(str(key)) and not isinstance(value[key], Mapping | list | tuple)
            else redact_mapping(value[key])
            for key in value
        }
    if isinstance(value, list | tuple):
        return [redact_mapping(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def url_passwords(text: str) -> list[str]:
    """Passwords embedded in a URI, a libpq DSN or a JDBC URL (raw and percent-decoded)."""
    found = [m.group("value") for m in _USERINFO.finditer(text)]
    found += [
        m.group("value").strip("'\"")
        for m in _KEY_VALUE.finditer(text)
        if _normal(m.group("name")).rsplit(".", 1)[-1] in ("password", "pwd", "passwd")
    ]
    return [value for value in found + [unquote(value) for value in found] if value]
