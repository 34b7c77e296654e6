"""Who may see and decide which tenant's runs: bearer tokens, each bound to a tenant.

A surface that serves people or programs over a network (``tether ui``, the example
service) takes the tenant from the credential a request carries, never from a header or a
parameter the caller picks: a token bound to ``acme`` sees and decides acme's runs only; a
token bound to no tenant (None) is an operator's and sees every tenant's. Tokens are compared
in constant time, and an error about a token never repeats it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tether.errors import ConfigError

MIN_TOKEN_LENGTH = 16
"""Shorter tokens are refused: a guessable token protects nothing."""


@dataclass(frozen=True)
class Grant:
    """What a valid token allows."""

    tenant: str | None
    """The only tenant whose runs it reaches; None: every tenant's (an operator)."""

    @property
    def operator(self) -> bool:
        """Whether it reaches every tenant's runs."""
        return self.tenant is None


class Credentials:
    """Known tokens and the tenant each is bound to."""

    def __init__(self, tokens: Mapping[str, str | None]) -> None:
        if not tokens:
            raise ConfigError("no tokens given: a token is what lets a request in")
        checked: list[tuple[bytes, str | None]] = []
        for number, (token, tenant) in enumerate(tokens.items(), start=1):
            which = f"token {number}" if len(tokens) > 1 else "the token"
            checked.append((_token_bytes(token, which), _tenant(tenant, which)))
        self._tokens = checked

    @classmethod
    def generate(cls, tenant: str | None = None) -> tuple[Credentials, str]:
        """One new random token (bound to ``tenant``), to print for the person who started the server."""
        token = secrets.token_urlsafe(32)
        return cls({token: tenant}), token

    @classmethod
    def from_file(cls, path: str | Path) -> Credentials:
        """Tokens from a JSON object ``{"TOKEN": "TENANT", "OPERATOR-TOKEN": null}``."""
        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except OSError as error:
            raise ConfigError(f"cannot read the token file {file}: {error.strerror or error}") from None
        except ValueError as error:
            raise ConfigError(f"the token file {file} is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"the token file {file} must hold a JSON object of token: tenant (or null)")
        try:
            return cls(data)
        except ConfigError as error:
            raise ConfigError(f"the token file {file}: {error}") from None

    @property
    def tenants(self) -> set[str | None]:
        """Every tenant a token is bound to (None for an operator's)."""
        return {tenant for _, tenant in self._tokens}

    def grant(self, token: str | None) -> Grant | None:
        """What ``token`` allows, or None when it is not one of ours."""
        if not token:
            return None
        given = token.encode(errors="surrogatepass")
        found: Grant | None = None
        for known, tenant in self._tokens:  # every one compared, so timing tells nothing
            if hmac.compare_digest(given, known):
                found = Grant(tenant)
        return found


def derive(secret: bytes, token: str | bytes) -> str:
    """A token derived from ``token`` with ``secret`` (HMAC-SHA256, hex): the inspector's CSRF tokens."""
    raw = token if isinstance(token, bytes) else token.encode(errors="surrogatepass")
    return hmac.new(secret, raw, hashlib.sha256).hexdigest()


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _token_bytes(token: object, which: str) -> bytes:
    """A token checked for strength; the message names its position (``which``), never its text."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"{which} is too weak: a token needs at least {MIN_TOKEN_LENGTH} characters")
    if any(char.isspace() for char in token):
        raise ConfigError(f"{which} holds spaces: a token goes in a header as one word")
    return token.encode(errors="surrogatepass")


def _tenant(tenant: object, which: str) -> str | None:
    if tenant is None:
        return None
    if not isinstance(tenant, str):
        raise ConfigError(f"{which}: its tenant must be a string or null (every tenant), not {tenant!r}")
    if not tenant.strip():
        raise ConfigError(f"{which} has an empty tenant: name one, or null for every tenant")
    return tenant


__all__ = ["MIN_TOKEN_LENGTH", "Credentials", "Grant", "bearer", "derive"]
